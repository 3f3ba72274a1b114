"""Spark stays out of the terminal (issue 20, section 2), each case run as a real command.

Every case checks stdout and stderr for the noise the issue lists: no Python traceback, no
Java stack frame, no py4j line, no line of Spark's own (its start-up and shutdown lines,
log4j lines). Each Spark command costs seconds of JVM start-up, so the cases share runs:
one slow test interrupts a backup under a pseudo-terminal, resumes it, and exports it.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from nodeprocutil import NodeProcess
from noiseutil import assert_no_noise
from termutil import render

REPO = Path(__file__).resolve().parents[2]

def env_for(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["DCPTOOL_PASSWORD"] = "password"
    for k in ("DCPTOOL_SPARK_MASTER", "DCPTOOL_SPARK_LOG", "DCPTOOL_FAULT", "NO_COLOR"):
        env.pop(k, None)
    env.update(extra)
    return env


class Run:
    def __init__(self, rc: int, out: str, err: str, seconds: float, closed_at_exit: bool):
        self.rc, self.out, self.err, self.seconds = rc, out, err, seconds
        #: stdout and stderr reached end-of-file within moments of the command's exit: no
        #: process it started (the JVM, Spark's Python workers) still holds them
        self.closed_at_exit = closed_at_exit


def run(args: list[str], *, timeout: float = 120, **extra: str) -> Run:
    """`python -m dcptool ARGS` with pipes (not a terminal)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env_for(**extra))
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}

    def drain(name, f):
        for block in iter(lambda: f.read1(65536), b""):
            chunks[name].append(block)

    readers = [threading.Thread(target=drain, args=("out", proc.stdout)),
               threading.Thread(target=drain, args=("err", proc.stderr))]
    for r in readers:
        r.start()
    rc = proc.wait(timeout=timeout)
    seconds = time.monotonic() - t0
    for r in readers:
        r.join(timeout=3)
    closed = not any(r.is_alive() for r in readers)
    if not closed:  # let the holders go so the test does not hang
        for r in readers:
            r.join(timeout=60)
    return Run(rc, b"".join(chunks["out"]).decode(errors="replace"),
               b"".join(chunks["err"]).decode(errors="replace"), seconds, closed)


def pty_session(args: list[str], interrupt_when, *, timeout: float = 120,
                columns: int | None = None, **extra: str) -> tuple[int, bytes, bytes]:
    """Run `python -m dcptool ARGS` on a pseudo-terminal (`columns` wide, when given); once
    `interrupt_when(output so far)` is true, type Ctrl-C. Returns (exit status, the bytes
    the terminal got before Ctrl-C, the bytes after it). The output is read until the
    terminal has no writer left, so whatever any process the command started writes, even
    after the command exited, is in it."""
    if columns is not None:
        extra = {"COLUMNS": str(columns), **extra}
    env = env_for(**extra)
    pid, fd = os.forkpty()
    if pid == 0:  # the child: a session leader on the pty, the foreground process group
        try:
            os.execve(sys.executable, [sys.executable, "-m", "dcptool", *args], env)
        finally:
            os._exit(127)
    if columns is not None:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    before, after = bytearray(), bytearray()
    sent = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sent and interrupt_when(bytes(before)):
                os.write(fd, b"\x03")  # the terminal turns it into SIGINT for the foreground
                sent = True
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: no process holds the terminal any more
                    break
                if not data:
                    break
                (after if sent else before).extend(data)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"dcptool {' '.join(args)} did not end; output: {bytes(before + after)!r}")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), bytes(before), bytes(after)


def pty_run(args: list[str], interrupt_when, *, timeout: float = 120, **extra: str):
    """`pty_session` for a command that draws nothing (--no-progress): (exit status, output
    before Ctrl-C, output after it as text, without the terminal's echo of the key)."""
    rc, before, after = pty_session(args, lambda _: interrupt_when(), timeout=timeout, **extra)
    text = after.decode(errors="replace").replace("\r\n", "\n")
    if text.startswith("^C"):  # the terminal's own echo of the key (ECHOCTL)
        text = text[2:]
    return rc, before.decode(errors="replace"), text


def jvm_of(marker: str) -> bool:
    """Whether a JVM runs whose parent's command line holds `marker` (a command's JVM)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            if "(java)" not in stat:
                continue
            ppid = stat.rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    return True
        except OSError:
            continue
    return False


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProcess(tmp_path_factory.mktemp("quiet-node") / "node", vbuckets=16)
    n.start()
    r = run(["doc", "load", "--count", "4000", "-c", f"{n.host}:{n.port}", "-q"])
    assert r.rc == 0, r.err
    yield n
    n.stop(timeout=15)


def partials(archive: Path) -> list[Path]:
    d = archive / "backups"
    if not d.is_dir():
        return []
    return [b for b in d.iterdir() if b.is_dir() and not (b / "manifest.json").exists()]


# -- without Spark starting: fast ------------------------------------------------------------


def test_the_screen_renderer_plays_what_a_terminal_shows():
    """termutil.render, which the Ctrl-C test below reads the screen with: the cursor waits
    at the right margin, so what follows a full line wraps; \\r, erasing and moving up."""
    # a line as wide as the terminal, then the echo of Ctrl-C: the echo starts a new row,
    # and a redraw from column 0 lands there, leaving the full line above
    assert render(b"abcd^C\r\x1b[2Kabcd", 4) == ["abcd", "abcd"]
    # two columns left free: the echo stays on the line, the redraw covers it
    assert render(b"ab^C\r\x1b[2Kab\r\n\r\x1b[1A\x1b[2Kdone\r\n", 4) == ["done", ""]
    assert render(b"\x1b[1mbold\x1b[0m x\x1b[?25h\r\x1b[Kno", 10) == ["no"]
    assert render(b"long line\r\n", 4) == ["long", " lin", "e", ""]


def test_unreachable_master_one_line_fast_no_partial_backup_json_too(node, tmp_path):
    archive = tmp_path / "arch"
    master = f"spark://127.0.0.1:{closed_port()}"
    cluster = f"{node.host}:{node.port}"
    r = run(["backup", "-c", cluster, str(archive), "--master", master, "--no-progress"])
    assert r.rc == 1
    assert r.seconds < 15
    assert r.out == ""
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcptool: error: cannot reach the Spark master"), r.err
    assert master in lines[0]
    assert partials(archive) == []
    assert_no_noise(r.out, r.err)
    assert r.closed_at_exit

    # the same with --json: the error is one JSON object on stderr, with the same status
    r = run(["backup", "-c", cluster, str(archive), "--json"], DCPTOOL_SPARK_MASTER=master)
    assert r.rc == 1 and r.out == ""
    doc = json.loads(r.err)
    assert set(doc) == {"error", "hint", "exit_code"}
    assert doc["exit_code"] == 1 and doc["error"].startswith("cannot reach the Spark master")
    assert partials(archive) == []
    assert_no_noise(r.out, r.err)


def test_json_errors_keep_the_exit_codes(tmp_path):
    r = run(["info", str(tmp_path / "nothing"), "--json"])  # no such archive: usage, 2
    assert r.rc == 2
    doc = json.loads(r.err)
    assert doc["exit_code"] == 2 and "no archive" in doc["error"] and doc["hint"] is None
    r = run(["info", str(tmp_path), "--jsn", "--json"])  # a usage error of click's
    assert r.rc == 2
    doc = json.loads(r.err)
    assert doc == {"error": "no such option: --jsn", "hint": "did you mean --json?", "exit_code": 2}
    r = run(["info", str(tmp_path / "nothing")])  # without --json: the usual line
    assert r.rc == 2 and r.err.startswith("dcptool: error: no archive")


def test_quiet_and_verbose_after_the_command_name(tmp_path):
    r = run(["info", str(tmp_path / "nothing"), "-q", "-v"])
    assert r.rc == 2
    assert "--quiet and --verbose exclude each other" in r.err
    r = run(["-q", "info", str(tmp_path / "nothing"), "-v"])
    assert r.rc == 2 and "exclude each other" in r.err
    for flags in (["-vv"], ["--quiet"]):
        r = run(["info", str(tmp_path / "nothing"), *flags])
        assert r.rc == 2 and "no such option" not in r.err, (flags, r.err)
    # not shown in the command's help (the root's help names them)
    r = run(["info", "--help"])
    assert "--quiet" not in r.out and "--verbose" not in r.out
    r = run(["--help"])
    assert "-q and -v may also follow the command name" in " ".join(r.out.split())


# -- with Spark ---------------------------------------------------------------------------


def assert_kept_and_resumed(after: str, archive: Path) -> None:
    """The one line of a backup ended by Ctrl-C says that its partial backup is kept and
    that the next backup resumes it; the run log ends with the same words."""
    lines = after.strip().splitlines()
    assert len(lines) == 1, after
    assert_kept_line(lines[0], archive)


def assert_kept_line(line: str, archive: Path) -> None:
    """`line` says that the partial backup is kept and that the next backup resumes it,
    and the run log ends with the same words."""
    m = re.fullmatch(r"dcptool: error: interrupted: partial backup (\S+) is kept; the next "
                     r"backup of this archive resumes it", line)
    assert m, line
    assert (archive / "backups" / m.group(1)).is_dir()
    assert not (archive / "backups" / m.group(1) / "manifest.json").exists()
    log = sorted((archive / "logs").glob("backup-*.log"))[-1].read_text().splitlines()
    assert log[-1].endswith(f" ERROR interrupted: partial backup {m.group(1)} is kept; the "
                            "next backup of this archive resumes it"), log[-3:]


@pytest.mark.slow
def test_ctrl_c_resume_export_no_spark_noise(node, tmp_path):
    archive = tmp_path / "arch"
    cluster = f"{node.host}:{node.port}"

    # 1. Ctrl-C while the JVM starts: one line, 130, nothing after the command ends
    rc, before, after = pty_run(["backup", "-c", cluster, str(archive), "--no-progress"],
                                lambda: jvm_of(str(archive)))
    assert rc == 130, (before, after)
    assert_kept_and_resumed(after, archive)
    assert_no_noise(before, after)

    # 2. Ctrl-C while tasks stream (a task stalls after one vbucket, so some are done and
    #    some are not): the same, and the partial backup is left to resume
    def streaming() -> bool:
        return any(p.name.endswith(".done.json") for b in partials(archive) for p in b.iterdir())

    rc, before, after = pty_run(["backup", "-c", cluster, str(archive), "--no-progress",
                                 "--partitions", "2"], streaming, DCPTOOL_FAULT="stall-after-vbuckets:1")
    assert rc == 130, (before, after)
    assert_kept_and_resumed(after, archive)
    assert_no_noise(before, after)
    assert len(partials(archive)) == 1
    assert not (archive / "lock").exists()

    # 3. the next backup resumes it; -q after the command name leaves stderr empty (no
    #    note, no Spark line), and the command's output is closed when it exits (no
    #    Spark worker can print after it)
    spark_log = tmp_path / "spark.log"
    r = run(["backup", "-c", cluster, str(archive), "-q"], DCPTOOL_SPARK_LOG=str(spark_log))
    assert r.rc == 0, r.err
    # Spark did print its start-up line: into DCPTOOL_SPARK_LOG, not the terminal
    assert "Using incubator modules" in spark_log.read_text()
    assert r.err == ""
    assert re.search(r"resumed\s*\S\s*(True|yes)", r.out), r.out
    assert_no_noise(r.out, r.err)
    assert r.closed_at_exit
    assert partials(archive) == []
    info = json.loads(run(["info", str(archive), "--json"]).out)
    backups = info["backups"]
    assert len(backups) == 1 and backups[0]["mutations"] == 4000, info

    # 4. export (another Spark command) in normal verbosity: its own output only
    r = run(["export", str(archive), str(tmp_path / "out"), "--format", "jsonl"])
    assert r.rc == 0, r.err
    assert_no_noise(r.out, r.err)
    assert r.closed_at_exit


BAR = ("━", "╺", "╸", "%")  # what a progress bar draws (rich's bar and its percentage)


@pytest.mark.slow
def test_ctrl_c_takes_the_backup_bar_off_the_screen(node, tmp_path):
    """Ctrl-C typed while a backup's progress bar fills an 80-column terminal: once the
    terminal has played everything it got (carriage returns, erased lines, the echo of
    the key), the line that says the partial backup is kept and resumed starts at column 0
    of a line of its own, and nothing of the bar is left on the screen."""
    archive = tmp_path / "arch"
    columns = 80

    def bar_streaming(out: bytes) -> bool:  # a task stalls after one vbucket; the bar shows it
        done = any(p.name.endswith(".done.json") for b in partials(archive) for p in b.iterdir())
        return done and b"vbuckets" in out and b"%" in out

    rc, before, after = pty_session(["backup", "-c", f"{node.host}:{node.port}", str(archive),
                                     "--partitions", "2"], bar_streaming, columns=columns,
                                    DCPTOOL_FAULT="stall-after-vbuckets:1")
    assert rc == 130, (before, after)
    # the bar was on the screen when the key was typed
    shown = [r for r in render(before, columns) if r.strip()]
    assert shown and "backup" in shown[-1] and any(c in shown[-1] for c in BAR), shown
    screen = render(before + after, columns)
    while screen and not screen[-1]:
        screen.pop()
    starts = [i for i, r in enumerate(screen) if r.startswith("dcptool: ")]
    assert len(starts) == 1, screen
    first = starts[0]
    # nothing else on the screen: no fragment of the bar above the note, nor on its rows
    assert all(not r for r in screen[:first]), screen
    assert not any(c in r for r in screen[first:] for c in BAR), screen
    # one line, from column 0 on (the terminal wraps it at 80 columns: its rows read on)
    line = "".join(r.ljust(columns) for r in screen[first:-1]) + screen[-1]
    assert_kept_line(line, archive)
    assert_no_noise(before.decode(errors="replace"), after.decode(errors="replace"))


def test_a_restore_refused_before_any_work_leaves_no_bar_behind(node, spark, tmp_path):
    """A restore that fails while it prepares (here: a --to-time before the archive's
    window) on a terminal: the screen shows the error line alone, not a "preparing" bar
    above it that never moved."""
    from docutil import opts_for

    from dcptool.pipeline.backup import run_backup

    archive = tmp_path / "arch"
    run_backup(opts_for(node), str(archive), spark=spark, watermark=False)
    columns = 80
    rc, before, after = pty_session(["restore", str(archive), "-c", f"{node.host}:{node.port}",
                                     "--to-time", "2001-01-01T00:00:00Z"], lambda _: False,
                                    columns=columns)
    assert rc == 2, before
    screen = [r for r in render(before, columns) if r.strip()]
    assert screen and screen[0].startswith("dcptool: error: --to-time"), screen
    assert "before the archive's window" in "".join(screen), screen
    assert not any(c in r for r in screen for c in BAR) and "preparing" not in "".join(screen)


@pytest.mark.slow
def test_ctrl_c_during_a_restore_logs_interrupted(node, spark, tmp_path):
    """Ctrl-C while a restore's tasks write: one line, 130, and the restore's run log says
    interrupted (not the refused connection to the JVM the interruption killed)."""
    from docutil import opts_for

    from dcptool.client.ops import get_vbucket_seqnos
    from dcptool.pipeline.backup import run_backup

    archive = tmp_path / "arch"
    run_backup(opts_for(node), str(archive), spark=spark, watermark=False)
    with NodeProcess(tmp_path / "dst", vbuckets=16) as dst:
        def writing() -> bool:  # a task's first window is written; it stalls
            with opts_for(dst).connect() as conn:
                return any(get_vbucket_seqnos(conn).values())

        # (--no-progress: the bar, taken off the screen at Ctrl-C, would still be in the
        # bytes the terminal got)
        rc, before, after = pty_run(["restore", str(archive), "-c", f"{dst.host}:{dst.port}",
                                     "--no-progress"],
                                    writing, timeout=400,
                                    DCPTOOL_FAULT="stall-restore-after-windows:1")
    assert rc == 130, (before, after)
    assert after.strip().splitlines() == ["dcptool: error: interrupted"], after
    assert_no_noise(before, after)
    log = sorted((archive / "logs").glob("restore-*.log"))[-1].read_text()
    errors = [ln for ln in log.splitlines() if " ERROR " in ln]
    assert errors and errors[-1].endswith(" ERROR interrupted"), log[-2000:]
    assert "refused" not in log.lower(), log[-2000:]


def test_workers_import_the_drivers_dcptool_whatever_the_directory(node, tmp_path):
    """A backup run from a directory holding a folder named dcptool (the parent of a clone):
    Spark starts its Python workers there, and they must import the dcptool the driver
    runs, not that folder."""
    work = tmp_path / "work"
    (work / "dcptool").mkdir(parents=True)
    (work / "dcptool" / "__init__.py").write_text("raise ImportError('the folder in the "
                                                  "current directory was imported')\n")
    # as the installed `dcptool` script runs it: its own directory heads the driver's path
    launcher = tmp_path / "bin" / "dcptool"
    launcher.parent.mkdir()
    launcher.write_text("from dcptool.cli.app import main\nmain()\n")
    archive = tmp_path / "arch"
    p = subprocess.run([sys.executable, str(launcher), "backup", "-c", f"{node.host}:{node.port}",
                        str(archive), "--no-progress", "--no-watermark", "--json"], cwd=work,
                       env=env_for(), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["mutations"] == 4000
    assert_no_noise(p.stdout, p.stderr)


def test_executors_see_the_archive_check(spark, tmp_path):
    from dcptool.pipeline.runtime import (PROBE_PREFIX, check_executors_see, not_shared,
                                          probe_failures)

    (tmp_path / "archive.json").write_text('{"x": 1}')
    # the driver's view and the tasks' agree: nothing to say; the probe file is removed
    check_executors_see(spark, tmp_path, write=True, always=True)
    check_executors_see(spark, tmp_path, name="archive.json", always=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PROBE_PREFIX)]
    # tasks that find another file under the same name, or none (another machine's
    # filesystem): one entry per host, the host named
    import hashlib

    other = hashlib.sha256(b"the driver's copy").hexdigest()
    got = probe_failures(spark, str(tmp_path), "archive.json", other, tasks=4)
    assert got == [f"{socket.gethostname()}: {tmp_path / 'archive.json'} differs from the driver's"]
    got = probe_failures(spark, str(tmp_path / "elsewhere"), "archive.json", other, tasks=4)
    assert len(got) == 1 and "No such file or directory" in got[0]
    # a local master shares the driver's machine: not checked (no Spark job, so a directory
    # the driver does not have either passes)
    check_executors_see(spark, tmp_path / "elsewhere", name="archive.json")
    # what the user reads: one line, naming the host and the requirement
    err = not_shared("/backups/a", got + ["host2: Permission denied"])
    assert "\n" not in err.message and socket.gethostname() in err.message
    assert "and 1 more hosts" in err.message
    assert "shared by the driver and every executor" in err.message
