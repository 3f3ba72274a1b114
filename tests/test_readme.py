"""Every command in README.md, run as written, in README order, against real nodes.

How the README's code blocks are run:

* The first block (install, then `dcptool quickstart`; install with the test tools, then
  `pytest`) must stay exactly as it is. `dcptool quickstart` runs here as written; the two
  `pip install` lines are what CI (`.ci/run`) and the packaging test in tests/cli/test_help.py
  exercise, and `pytest` is this very run.
* Every other ```sh or ```python block is preceded by a marker:
  `<!-- readme-test: run -->` blocks run in order in one scratch directory, sharing the
  environment that their `export` lines set (`run-in-checkout` blocks run in the checkout:
  they read its man/ and completions/); `<!-- readme-test: parse-only (why) -->` blocks
  need something a test machine does not have (a Couchbase Server, a Spark cluster), so each
  of their dcptool command lines is parsed by the CLI's own parser (every command and option
  must exist, every required argument be there) without running.
* `dcptool node start ... &` starts a real node with tests/nodeprocutil.py's NodeProcess (same
  --data and --vbuckets) on a free port; the port the README names (11210, or its --port) is
  then replaced by the real one in later lines. The placeholders of the "Archives as Spark
  data" section (`/backups/default`, `/tmp/docs`, `couchbase://127.0.0.1`) stand for the
  tour's archive, a scratch directory and the tour's first node.
* dcptool command lines run in this process through `dcptool.cli.app.main`, the function the
  `dcptool` script calls, with the line's arguments as the shell would split them (so Spark
  jobs use the test session's SparkSession, the `spark` fixture, and the run starts Spark
  once; and no line pays for a new interpreter). Lines with shell syntax (pipes,
  redirections) and other programs (`ls`, `man`, `echo`, `source`) run in bash as typed, with
  a `dcptool` on PATH that runs this checkout. The Python blocks run in this process too.
  (The `dcptool` script itself is exercised by tests/cli/test_help.py.)
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cliutil import documented_examples

import docgen

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
JSON_DOC = REPO / "docs" / "json-output.md"

TOP_BLOCK = ["pip install -e . && dcptool quickstart", "pip install -e '.[test]' && pytest"]
SPARK_COMMANDS = {"backup", "restore", "merge", "export", "quickstart"}
SHELL_SYNTAX = re.compile(r"[|<>;&`]|\$\(")
MARK = re.compile(r"<!--\s*readme-test:\s*([a-z-]+)")
DEFAULT_PORT = 11210


@dataclass
class Block:
    lang: str
    lines: list[str]
    mode: str | None
    lineno: int

    def commands(self) -> list[str]:
        """Shell command lines: continuations joined, blank and comment-only lines dropped."""
        out: list[str] = []
        buf = ""
        for raw in self.lines:
            line = raw.rstrip()
            if line.endswith("\\"):
                buf += line[:-1] + " "
                continue
            line = buf + line
            buf = ""
            if line.strip() and not line.strip().startswith("#"):
                out.append(line.strip())
        return out


def readme_blocks(text: str | None = None) -> list[Block]:
    lines = (text if text is not None else README.read_text()).splitlines()
    blocks: list[Block] = []
    i = 0
    last_mark: tuple[int, str] | None = None
    while i < len(lines):
        line = lines[i]
        m = MARK.search(line)
        if m:
            last_mark = (i, m.group(1))
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence:
            start = i
            body = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            # a marker counts when only blank lines separate it from the fence
            mode = None
            if last_mark is not None and all(not ln.strip() for ln in lines[last_mark[0] + 1:start]):
                mode = last_mark[1]
            blocks.append(Block(fence.group(1), body, mode, start + 1))
        i += 1
    return blocks


# -- what the README must look like -------------------------------------------------------


def test_the_top_block_is_the_install_and_test_commands():
    first = readme_blocks()[0]
    assert first.lang == "sh"
    assert [c for c in first.commands()] == TOP_BLOCK


def test_every_other_block_is_run_or_parsed():
    for b in readme_blocks()[1:]:
        assert b.lang in ("sh", "python"), f"README.md:{b.lineno}: ```{b.lang} block"
        assert b.mode in ("run", "run-in-checkout", "parse-only"), \
            f"README.md:{b.lineno}: block without a <!-- readme-test: MODE --> marker"


def test_parse_only_blocks_name_real_commands_and_options():
    checked = 0
    for b in readme_blocks():
        if b.mode != "parse-only":
            continue
        for line in b.commands():
            if line.startswith("export "):
                continue
            argv = docgen.command_argv(line)
            assert argv is not None, f"README.md:{b.lineno}: not a dcptool command: {line}"
            docgen.parse_args(argv)  # raises the CLI's usage error
            checked += 1
    assert checked >= 4


def test_a_bad_option_in_a_parse_only_block_would_be_caught():
    with pytest.raises(Exception, match="no-such-option|No such option"):
        docgen.parse_args(["backup", "/b", "--no-such-option"])


# -- running it ------------------------------------------------------------------------------


@dataclass
class Ran:
    line: str
    where: str           # "bash" or "in-process"
    code: int
    stdout: str
    stderr: str
    seconds: float = 0.0


@dataclass
class Tour:
    root: Path
    spark: object
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)
    nodes: list = field(default_factory=list)
    ran: list[Ran] = field(default_factory=list)
    bin: Path | None = None
    spark_seconds: float = 0.0

    # substitutions: README ports and placeholders -> this run's nodes and directories
    def substitute(self, line: str) -> str:
        def port(m: re.Match) -> str:
            p = int(m.group(2))
            return f"{m.group(1)}:{self.ports.get(p, p)}"

        line = re.sub(r"(127\.0\.0\.1):(\d+)", port, line)
        if DEFAULT_PORT in self.ports:
            line = re.sub(r"couchbase://127\.0\.0\.1(?![:\d])",
                          f"couchbase://127.0.0.1:{self.ports[DEFAULT_PORT]}", line)
        line = line.replace("/backups/default", "tour/archive").replace("/tmp/docs", "tour/docs")
        return line

    def start_node(self, line: str) -> None:
        from nodeprocutil import NodeProcess

        words = shlex.split(line, comments=True)
        assert words[-1] == "&", line
        args = words[3:-1]
        opts = dict(zip(args[::2], args[1::2]))
        data = self.root / opts["--data"]
        node = NodeProcess(data, vbuckets=int(opts.get("--vbuckets", 1024)),
                           password=self.env["DCPTOOL_PASSWORD"])
        node.start()
        self.nodes.append(node)
        self.ports[int(opts.get("--port", DEFAULT_PORT))] = node.port

    def bash(self, line: str, cwd: Path | None = None) -> Ran:
        p = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=cwd or self.root, env=self.env,
                           capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        return Ran(line, "bash", p.returncode, p.stdout, p.stderr)

    def in_process(self, argv: list[str], line: str) -> Ran:
        from dcptool.cli.app import main

        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # has .buffer, as stdout has
        err = io.StringIO()
        code = 0
        with pytest.MonkeyPatch.context() as mp:
            for k in [k for k in os.environ if k.startswith("DCPTOOL_")]:
                mp.delenv(k)
            for k, v in self.env.items():
                mp.setenv(k, v)
            mp.chdir(self.root)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    main(argv)
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out.flush()
        return Ran(line, "in-process", code, out.buffer.getvalue().decode("utf-8", "replace"),
                   err.getvalue())

    def python(self, code: str, lineno: int) -> Ran:
        out = io.StringIO()
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(self.root)
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"README.md:{lineno}", "exec"), {"__name__": "__readme__"})
        return Ran(f"<python block at README.md:{lineno}>", "in-process", 0, out.getvalue(), "")

    def run_line(self, line: str, *, in_checkout: bool = False) -> None:
        t0 = time.monotonic()
        line = self.substitute(line)
        words = shlex.split(line, comments=True)
        if words[:3] == ["dcptool", "node", "start"]:
            self.start_node(line)
            return
        if words and words[0] == "export":
            for assignment in words[1:]:
                k, _, v = assignment.partition("=")
                self.env[k] = os.path.expandvars(v)
            return
        argv = docgen.command_argv(line)
        shell = bool(SHELL_SYNTAX.search(line.split(" #")[0]))
        if argv is not None and not shell:
            with pytest.MonkeyPatch.context() as mp:
                for k, v in self.env.items():
                    mp.setenv(k, v)
                argv = [os.path.expandvars(a) for a in argv]
            ran = self.in_process(argv, line)
        else:
            assert not (argv and (argv[0] in SPARK_COMMANDS or "--against" in argv)), \
                f"a Spark job must run in this process, without shell syntax: {line}"
            ran = self.bash(line, cwd=REPO if in_checkout else None)
        ran.seconds = time.monotonic() - t0
        self.ran.append(ran)
        assert ran.code == 0, (f"`{line}` ({ran.where}) exited {ran.code}\n"
                               f"stdout:\n{ran.stdout[-3000:]}\nstderr:\n{ran.stderr[-3000:]}")

    def close(self) -> None:
        for n in self.nodes:
            try:
                n.stop(timeout=15)
            except Exception:  # pragma: no cover
                n.kill()


def _shim(directory: Path) -> Path:
    """A `dcptool` on PATH that is this checkout's, run by this interpreter."""
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "dcptool"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m dcptool \"$@\"\n")
    shim.chmod(0o755)
    return directory


@pytest.fixture(scope="module")
def tour(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    t = Tour(root, spark)
    t.bin = _shim(root / ".bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DCPTOOL_")}
    env["PATH"] = f"{t.bin}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["COLUMNS"] = "120"
    env["MANPAGER"] = env["PAGER"] = "cat"
    t.env = env
    t0 = time.monotonic()
    spark.range(1).count()  # the session is up (its start-up is not the README's)
    t.spark_seconds = time.monotonic() - t0
    try:
        blocks = readme_blocks()
        # the top block: `dcptool quickstart` as written (pip and pytest: see the docstring)
        t.run_line("dcptool quickstart")
        for b in blocks[1:]:
            if b.mode not in ("run", "run-in-checkout"):
                continue
            if b.lang == "python":
                t0 = time.monotonic()
                t.ran.append(t.python("\n".join(b.lines), b.lineno))
                t.ran[-1].seconds = time.monotonic() - t0
            else:
                for line in b.commands():
                    t.run_line(line, in_checkout=b.mode == "run-in-checkout")
        yield t
    finally:
        t.close()


def _ran(tour: Tour, fragment: str) -> Ran:
    hits = [r for r in tour.ran if fragment in r.line]
    assert hits, f"no README command contains {fragment!r}"
    return hits[-1]


def test_the_readme_runs_as_written(tour):
    assert len(tour.ran) >= 25
    assert len(tour.nodes) == 2


def test_the_tour_does_what_it_says(tour):
    root = tour.root
    # quickstart made its archive (the Spark section reads it)
    assert (root / "dcptool-quickstart" / "archive" / "archive.json").is_file()
    # writes, and the restore into the second node
    assert json.loads(_ran(tour, "doc get airline_10 -c").stdout)["country"] == "Canada"
    # tail: every document from the beginning, then only what changed since
    changes = [json.loads(x) for x in (root / "tour" / "changes.jsonl").read_text().splitlines()]
    assert sum(c["type"] == "mutation" for c in changes) >= 1001
    resumed = _ran(tour, "tail --state tour/tail.state --until-idle 1")
    assert "airline_10" in resumed.stdout and "sample::" not in resumed.stdout
    # four backups (the third after scopes and collections were made, the fourth while an
    # engine ran: here in this process, whose Spark runs already; tests/cli/test_engine.py
    # runs commands on an engine), two restores into the second node; every run left a log
    logs = sorted(p.name for p in
                  (root / "tour" / "archive" / "buckets" / "default" / "logs").iterdir())
    assert sum(n.startswith("backup-") for n in logs) == 4
    on_engine = _ran(tour, "engine status")
    assert on_engine.stdout.startswith("engine running: pid "), on_engine.stdout
    assert sum(n.startswith("restore-") for n in logs) == 2
    # collections: tail --collection saw only inventory.airlines (its creation and the
    # document); the restore created inventory.carriers on the second node and wrote the
    # airline there; examine names the collection
    lines = [json.loads(x) for x in _ran(tour, "tail --from beginning --collection "
                                                "inventory.airlines").stdout.splitlines()]
    assert {(x.get("scope"), x.get("collection")) for x in lines
            if x["type"] in ("mutation", "system_event") and "collection_id" in x} == {
        ("inventory", "airlines")}
    assert any(x["type"] == "mutation" and x["key"] == "airline_10" for x in lines)
    assert "40-Mile Air" in _ran(tour, "--collection inventory.carriers -c").stdout
    mapped = _ran(tour, "--map-data inventory.airlines=")
    assert "inventory.carriers" in mapped.stdout + mapped.stderr  # "created on the target: "
    assert "airlines" in _ran(tour, "examine tour/archive airline_10 --collection").stdout
    assert "backup-" in _ran(tour, "ls tour/archive/buckets/default/logs").stdout
    # a backup without -b made a cluster archive of every bucket
    assert json.loads((root / "tour" / "archive" / "archive.json").read_text())["format"] \
        == "dcptool-cluster-archive"
    # verify --against the restored node matched
    assert "OK" in _ran(tour, "verify tour/archive --against").stdout
    # each backup registered the archive's watermark on the node
    assert "dcptool-backup:default" in _ran(tour, "dcptool watermark list").stdout
    # examine saw the deletion
    assert "deletion" in _ran(tour, "examine tour/archive sample::7").stdout
    # the Spark query printed its table
    first_python = next(r for r in tour.ran if r.line.startswith("<python block"))
    assert "vbucket" in first_python.stdout and "count" in first_python.stdout
    # man page and completion lines
    assert "DCPTOOL-BACKUP" in _ran(tour, "man -l man/dcptool-backup.1").stdout


# -- docs/json-output.md: each command's output has exactly the documented fields --------------


def _json_of(ran: Ran) -> dict:
    lines = [ln for ln in ran.stdout.splitlines() if ln.strip()]
    try:
        return json.loads(ran.stdout)
    except ValueError:
        return json.loads(lines[0])


#: sections whose commands this test does not run: quickstart ran at the top (its object is
#: checked below), cluster commands need several nodes, and registering or removing
#: watermarks would change what the tour's node keeps (their own tests cover them)
NOT_CHECKED_HERE = {"dcptool quickstart", "dcptool cluster create", "dcptool cluster status",
                    "dcptool cluster failover", "dcptool cluster move",
                    "dcptool watermark register",
                    "dcptool watermark remove",
                    # adding or removing users would change the tour node's users
                    # (tests/security/test_users_cli.py covers them)
                    "dcptool node user add", "dcptool node user remove",
                    "dcptool node group add", "dcptool node group remove",
                    # the tour's archive is not encrypted (tests/cli/test_encrypted_cli.py
                    # checks these against docs/json-output.md)
                    "dcptool key add", "dcptool key list", "dcptool key remove"}


def test_json_output_has_the_documented_fields(tour):
    docs = documented_examples(JSON_DOC)
    node = f"127.0.0.1:{tour.ports[DEFAULT_PORT]}"
    node2 = f"127.0.0.1:{tour.ports[11211]}"
    lines = {
        "dcptool backup": f"dcptool backup tour/one -b default -c {node} --json",
        "dcptool restore": f"dcptool restore tour/one -c {node2} --dry-run --json",
        "dcptool info": "dcptool info tour/one --json",
        "dcptool verify": "dcptool verify tour/one --json",
        "dcptool examine": "dcptool examine tour/one airline_10 --json",
        "dcptool export": "dcptool export tour/one tour/export-json --json",
        "dcptool failover-log": f"dcptool failover-log -c {node} --vbuckets 0-1 --json",
        "dcptool tail": f"dcptool tail -c {node} --from beginning --vbuckets 0 --count 1 --json "
                        "--until-idle 1",
        "dcptool decode": "dcptool decode get.hex --json",
        "dcptool doc set": f"dcptool doc set json::1 '{{\"a\": 1}}' -c {node2} --json",
        "dcptool doc get": f"dcptool doc get json::1 -c {node2} --json",
        "dcptool doc delete": f"dcptool doc delete json::1 -c {node2} --json",
        "dcptool doc load": f"dcptool doc load --count 3 --prefix json:: -c {node2} --json",
        "dcptool node status": "dcptool node status --data tour/node --json",
        "dcptool node user list": "dcptool node user list --data tour/node --json",
        "dcptool node group list": "dcptool node group list --data tour/node --json",
        "dcptool watermark list": f"dcptool watermark list -c {node} --json",
        "dcptool merge": "dcptool merge tour/one --json",
        "dcptool prune": "dcptool prune tour/one --keep-last 1 --dry-run --json",
        "dcptool remove": "dcptool remove tour/one --older-than 1000d --dry-run --json",
        "dcptool collection list": f"dcptool collection list -c {node2} --json",
        "dcptool collection create": f"dcptool collection create jsonscope -c {node2} --json",
        "dcptool collection drop": f"dcptool collection drop jsonscope -c {node2} --json",
        "dcptool bucket create": f"dcptool bucket create jsonbucket -c {node2} --json",
        "dcptool bucket edit": f"dcptool bucket edit jsonbucket --max-ttl 60 -c {node2} --json",
        "dcptool bucket list": f"dcptool bucket list -c {node2} --json",
        "dcptool bucket drop": f"dcptool bucket drop jsonbucket -c {node2} --json",
        "dcptool engine start": "dcptool engine start --json",
        "dcptool engine status": "dcptool engine status --json",
        "dcptool engine stop": "dcptool engine stop --json",
    }
    # the documented shapes of the archive commands are a bucket archive's (-b): one with
    # a backup already, so that the checked one is incremental and merge has two to fold
    tour.run_line(f"dcptool backup tour/one -b default -c {node} -q")
    missing = sorted(set(docs) - set(lines) - NOT_CHECKED_HERE)
    assert not missing, f"documented but not checked here: {missing}"
    for title, line in lines.items():
        assert title in docs, f"docs/json-output.md has no example for {title}"
        before = len(tour.ran)
        tour.run_line(line)
        ran = tour.ran[before]
        if title == "dcptool tail":  # JSON lines: compare a mutation with the example
            objs = [json.loads(x) for x in ran.stdout.splitlines() if x.strip()]
            got = next(o for o in objs if o["type"] == "mutation")
        else:
            got = _json_of(ran)
        want = docs[title]
        if isinstance(want, list):  # a list of objects (bucket list): compare one with one
            assert isinstance(got, list) and got, (title, got)
            got, want = got[0], want[0]
        assert set(got) == set(want), (title, sorted(set(got) ^ set(want)))
    # quickstart: the run at the top printed steps; its JSON holds the documented fields
    qs = docs["dcptool quickstart"]
    assert set(qs) == {"nodes", "loaded", "backups", "changed", "restore", "dir", "archive"}


def test_every_command_with_json_output_is_documented():
    docs = documented_examples(JSON_DOC)
    tree = docgen.load_tree()
    for c in tree.walk():
        if any("--json" in p.opts for p in c.options):
            assert c.name in docs, f"docs/json-output.md has no section '## {c.name}'"


def test_report_durations(tour, capsys):
    """Not a check: the slowest README commands, shown with -s to keep the tour fast."""
    slow = sorted(tour.ran, key=lambda r: -r.seconds)[:12]
    print(f"\nREADME commands: {len(tour.ran)}, {sum(r.seconds for r in tour.ran):.1f}s "
          f"(first Spark job {tour.spark_seconds:.1f}s)")
    with capsys.disabled():
        print("\nslowest README commands:", *(f"  {r.seconds:6.1f}s  {r.line}" for r in slow),
              sep="\n")
