"""Running dcptool's CLI inside the test process."""
from __future__ import annotations

import pytest

from dcptool.cli.app import main


def cli(capsys, *args) -> tuple[int, str, str]:
    """`dcptool ARGS` in this process (the test session's Spark): (exit status, out, err)."""
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def run_dcptool(env: dict[str, str], *args, timeout: float = 240):
    """`dcptool ARGS` as a process of its own with `env` (its own Spark): CompletedProcess
    with text output."""
    import zygote

    return zygote.run(args, env=env, timeout=timeout)


def run_as_cluster_user(*args, password: str, ok: bool = True,
                        env: dict[str, str] | None = None, timeout: float = 240):
    """`dcptool ARGS` forked from the warm zygote with `env` (default: this process's),
    `password` in DCPTOOL_PASSWORD and no DCPTOOL_BUCKET (without -b a backup is of every
    bucket, as a user's is); asserts exit 0 unless `ok` is False."""
    import os

    e = dict(os.environ if env is None else env)
    e["DCPTOOL_PASSWORD"] = password
    e.pop("DCPTOOL_BUCKET", None)
    r = run_dcptool(e, *args, timeout=timeout)
    if ok:
        assert r.returncode == 0, (args, r.stderr)
    return r


def one_error_line(res) -> str:
    """The one line a failed command printed on stderr (no traceback, nothing else)."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("dcptool: error: "), lines[0]
    assert "Traceback" not in res.stderr
    return lines[0]


def documented_under(heading: str) -> dict:
    """docs/json-output.md's first JSON example after the line `heading` (e.g.
    "### dcptool prune of a cluster archive")."""
    import json
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "json-output.md").read_text()
    at = text.index(heading)
    block = text[text.index("```json\n", at) + 8:]
    return json.loads(block[:block.index("```")])


def documented_examples(json_doc) -> dict[str, dict]:
    """docs/json-output.md: section title (`dcptool backup`) -> the first JSON example of
    the section."""
    import json
    import re
    from pathlib import Path

    out: dict[str, dict] = {}
    title = None
    text = Path(json_doc).read_text()
    for m in re.finditer(r"^## (dcptool [a-z -]+)$|^```json\n(.*?)^```", text, re.S | re.M):
        if m.group(1):
            title = m.group(1).strip()
        elif title and title not in out:
            out[title] = json.loads(m.group(2))
    return out
