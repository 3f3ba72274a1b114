"""Progress and numbers a person can trust: a progress bar for every long Spark command on
a terminal (ending at 100%), items/s without Spark's start-up, one size everywhere, the
restore's summary, tables that fit 80 columns, expiry as a time, backup id prefixes and
plurals."""
from __future__ import annotations

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time

import pytest
from cliutil import cli
from docutil import load, opts_for

from dcptool.cli.app import main
from dcptool.pipeline.backup import run_backup

VBS = 16
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_terminal(monkeypatch, *args, columns: int = 120) -> tuple[int, str, str]:
    """`dcptool ARGS` in this process (the session's Spark) with stderr on a pseudo-terminal:
    (exit status, stdout, what the terminal showed, escapes removed)."""
    master, slave = pty.openpty()
    screen = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    term = os.fdopen(slave, "w", buffering=1)
    out = io.StringIO()
    monkeypatch.setenv("COLUMNS", str(columns))
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, term
    try:
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in args])
    finally:
        term.flush()
        sys.stdout, sys.stderr = saved
        term.close()
        reader.join(5)
        os.close(master)
    return exc.value.code, out.getvalue(), ANSI.sub("", bytes(screen).decode(errors="replace"))


def percentages(text: str, label: str) -> list[int]:
    return [int(p) for p in re.findall(rf"{label}\s.*?(\d+)%", text)]


@pytest.fixture(scope="module")
def archive(shared_node, spark, tmp_path_factory):
    """An archive of two backups of the shared node: a full one and a 2-item incremental."""
    path = tmp_path_factory.mktemp("progress") / "archive"
    with opts_for(shared_node).connect() as conn:
        load(conn, {f"p::{i}": {"i": i} for i in range(400)}, VBS)
    run_backup(opts_for(shared_node), path, spark=spark, watermark=False)
    with opts_for(shared_node).connect() as conn:
        load(conn, {"p::1": {"again": 1}, "p::2": {"again": 2}}, VBS)
    run_backup(opts_for(shared_node), path, spark=spark, watermark=False)
    return path


def test_spark_commands_draw_a_bar_that_ends_at_100(archive, shared_node, spark, tmp_path,
                                                   monkeypatch):
    monkeypatch.setenv("DCPTOOL_PASSWORD", shared_node.password)
    target = f"{shared_node.host}:{shared_node.port}"
    for label, args in (
            ("compare", ("verify", archive, "--against", "-c", target)),
            ("restore", ("restore", archive, "-c", target, "--force-updates")),
            ("dry run", ("restore", archive, "--dry-run"))):
        rc, out, screen = on_terminal(monkeypatch, *args)
        assert rc == 0, screen
        seen = percentages(screen, label)
        assert seen and seen[-1] == 100, screen
        assert all(a <= b for a, b in zip(seen, seen[1:])), seen  # never goes back
        assert re.search(rf"{label}\s.*100%\s+(\d+)/\1 tasks", screen), screen
        assert "Traceback" not in screen
    # --json and --no-progress: nothing drawn
    rc, out, screen = on_terminal(monkeypatch, "restore", archive, "--dry-run", "--json")
    assert rc == 0 and "%" not in screen and json.loads(out)["dry_run"] is True
    rc, out, screen = on_terminal(monkeypatch, "restore", archive, "--dry-run", "--no-progress")
    assert rc == 0 and "%" not in screen


def process_on_terminal(*args, columns: int = 120, timeout: float = 240
                        ) -> tuple[int, str, str]:
    """`dcptool ARGS` as a process of its own (its own Spark) with stderr on a
    pseudo-terminal: (exit status, stdout, what the terminal showed, escapes removed)."""
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS=str(columns))
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    screen = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    chunk = b""
                if chunk:
                    screen.extend(chunk)
                    continue
            if proc.poll() is not None and not r:
                break
        out = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return (proc.returncode, out.decode(errors="replace"),
            ANSI.sub("", bytes(screen).decode(errors="replace")))


def test_export_draws_a_bar_that_ends_at_100(archive, tmp_path):
    rc, out, screen = process_on_terminal("export", archive, tmp_path / "out", "--format",
                                          "jsonl", "--master", "local[2]")
    assert rc == 0, screen
    seen = percentages(screen, "export")
    assert seen and seen[-1] == 100 and seen == sorted(seen), screen
    assert "exported 402 records" in out


def test_merge_and_prune_draw_a_bar_that_ends_at_100(shared_node, spark, tmp_path, monkeypatch):
    path = tmp_path / "archive"
    for i in range(3):
        with opts_for(shared_node).connect() as conn:
            load(conn, {f"m::{i}": {"i": i}}, VBS)
        run_backup(opts_for(shared_node), path, spark=spark, watermark=False)
    rc, out, screen = on_terminal(monkeypatch, "prune", path, "--keep-last", "2")
    assert rc == 0, screen
    assert percentages(screen, "prune")[-1] == 100, screen
    assert "keep 2 backups, remove 1 (0 deleted, 1 merged into 1 kept backup)" in out
    rc, out, screen = on_terminal(monkeypatch, "merge", path)
    assert rc == 0, screen
    assert percentages(screen, "merge")[-1] == 100, screen
    assert "merged 2 backups" in out
