"""Permissions audit: whatever dcptool creates in an archive (backups, incremental backups,
merges, exports' and restores' run logs, the lock) is mode 0600 and every directory 0700,
whatever the umask (0o022 and 0o000); the node's data directory likewise (users file,
cluster map, database, node.json, logs).

The umask-0 run is a subprocess started with umask 0 (its Spark workers inherit it); the
0o022 run goes in-process through the session's Spark.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from docutil import load, opts_for

from dcptool.cli.app import main

REPO = Path(__file__).resolve().parents[2]


def bad_modes(root: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """Every file not 0600 and every directory not 0700 under (and including) `root`."""
    out = []
    for p in [root, *sorted(root.rglob("*"))]:
        if p.is_symlink() or p.name in skip:
            continue
        mode = p.stat().st_mode & 0o777
        want = 0o700 if p.is_dir() else 0o600
        if mode != want:
            out.append(f"{p.relative_to(root.parent)}: {mode:o}")
    return out


def _kinds(archive: Path) -> set[str]:
    return {p.name.split("-")[0] for p in (archive / "logs").glob("*.log")}


@pytest.fixture
def node(tmp_path):
    """A node started under umask 0 (it inherits the umask of this process at start)."""
    from nodeprocutil import NodeProcess

    n = NodeProcess(tmp_path / "node", vbuckets=8)
    old = os.umask(0)
    try:
        n.start()
    finally:
        os.umask(old)
    yield n
    n.stop()


def _write(node, prefix: str, count: int = 100) -> None:
    with opts_for(node).connect() as conn:
        load(conn, {f"{prefix}{i}": {"n": i} for i in range(count)}, node.vbuckets)


def test_archive_and_node_modes_under_umask_0(node, tmp_path):
    archive = tmp_path / "archive"
    script = textwrap.dedent(f"""
        import sys
        from dcptool.cli.app import main

        def run(*args):
            try:
                main(list(args))
            except SystemExit as exc:
                if exc.code:
                    sys.exit(f"{{args}} exited {{exc.code}}")

        addr = {f"{node.host}:{node.port}"!r}
        run("backup", "-c", addr, {str(archive)!r})
        run("doc", "load", "-c", addr, "--count", "50", "--prefix", "more")
        run("backup", "-c", addr, {str(archive)!r})
        run("merge", {str(archive)!r})
        run("export", {str(archive)!r}, {str(tmp_path / "out.jsonl")!r}, "--format", "jsonl")
        run("restore", {str(archive)!r}, "-c", addr, "--dry-run")
        run("verify", {str(archive)!r})
    """)
    _write(node, "doc")
    env = dict(os.environ, DCPTOOL_PASSWORD=node.password, NO_COLOR="1")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=600, env=env, cwd=REPO, umask=0, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _kinds(archive) >= {"backup", "merge", "restore"}, list((archive / "logs").iterdir())
    assert bad_modes(archive) == []
    # the node, started under umask 0: its directory, users file, database and logs
    assert (node.data_dir / "users.json").exists()
    # (node.stderr.log is the test harness's redirect of the node's stderr, not the node's)
    assert bad_modes(node.data_dir, skip=("node.stderr.log",)) == []


def test_archive_modes_under_umask_022_in_process(node, tmp_path, spark, monkeypatch, capfd):
    archive = tmp_path / "archive"
    monkeypatch.setenv("DCPTOOL_PASSWORD", node.password)
    addr = f"{node.host}:{node.port}"
    _write(node, "doc")
    old = os.umask(0o022)
    try:
        for i, args in enumerate((["backup", "-c", addr, str(archive)],
                                  ["backup", "-c", addr, str(archive)],
                                  ["merge", str(archive)],
                                  ["restore", str(archive), "-c", addr, "--dry-run"])):
            if i == 1:
                _write(node, "more", 30)
            with pytest.raises(SystemExit) as exc:
                main(args)
            assert exc.value.code in (0, None), (args, capfd.readouterr().err)
    finally:
        os.umask(old)
    assert _kinds(archive) >= {"backup", "merge", "restore"}
    assert bad_modes(archive) == []
    # the lock exists only while a writer holds it: take it under umask 0 and look
    from dcptool.archive import Archive

    old = os.umask(0)
    try:
        with Archive.open(archive).lock("permissions test"):
            assert ((archive / "lock").stat().st_mode & 0o777) == 0o600
    finally:
        os.umask(old)
