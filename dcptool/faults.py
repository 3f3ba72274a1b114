"""Fault injection for the crash and fault tests: `DCPTOOL_FAULT` names where to fail.

The variable holds one or more comma-separated specs; unset (the normal case), every
fault point returns at once. The points (see docs/reliability.md):

    stall-after-vbuckets:N        a backup task sleeps once it has closed N vbuckets
    stall-restore-after-windows:N a restore task sleeps once the node has confirmed the
                                  first N windows of writes it sent
    kill-mid-stream:N             SIGKILL the process group once a process received N events
    kill-mid-file:N               at the Nth zstd frame a process writes to a segment file,
                                  write only its first half, fsync, then SIGKILL the group
                                  (an object being uploaded: SIGKILL the group before it)
    kill-before-manifest-rename   SIGKILL the group after manifest.json's temporary file is
                                  written and fsynced, before the rename commits it
    kill-after-removal-step:N     SIGKILL the group after the Nth step of a removal (merge,
                                  remove, prune): a merged backup published, or one
                                  backup taken out of backups/
    enospc-after-bytes:N          a segment write fails with OSError(ENOSPC) once a process
                                  has written N bytes of frames
    pause-after-progress:MS       a task of restore, export, merge, prune, remove or
                                  verify --against waits MS milliseconds after each write
                                  of its progress file (read by the driver, carried to
                                  the tasks: a small run is seen between 0 and its total)

The kill points end the whole process group (driver, JVM, Spark workers) as `kill -9`
would: run the dcptool command under test in a session of its own. Counts are per
process (each Spark worker counts its own events and bytes).
"""
from __future__ import annotations

import errno
import os
import signal
import time
from typing import Any

_totals: dict[str, int] = {}


def _specs() -> list[tuple[str, int]]:
    out = []
    for part in os.environ.get("DCPTOOL_FAULT", "").split(","):
        name, _, arg = part.strip().partition(":")
        if name:
            out.append((name, int(arg) if arg else 1))
    return out


def _kill() -> None:
    # Spark's python worker daemon makes a process group of its own inside the dcptool
    # process's session: end the session leader's group (driver, JVM) when the leader is
    # the dcptool command, then our own group
    sid = os.getsid(0)
    try:
        with open(f"/proc/{sid}/cmdline", "rb") as f:
            leader = f.read()
    except OSError:
        leader = b""
    if b"dcptool" in leader and sid != os.getpgrp():
        os.killpg(sid, signal.SIGKILL)
    os.killpg(os.getpgrp(), signal.SIGKILL)
    time.sleep(60)  # not reached: the signal ends this process too


def progress_pause() -> float:
    """Seconds a counting task waits after each progress write (pause-after-progress:MS;
    0 without it)."""
    if "DCPTOOL_FAULT" not in os.environ:
        return 0.0
    return sum(n for name, n in _specs() if name == "pause-after-progress") / 1000.0


def fault_point(where: str, count: int = 0, **ctx: Any) -> None:
    """Fail here if DCPTOOL_FAULT asks for it. `where` is the point's name:

    "vbucket-closed" (count: vbuckets a task closed; ctx flush: writes the task's progress
    before a stall), "restore-window" (count: windows of writes a restore
    task sent; ctx flush: waits until the node has confirmed them), "events" (count: events just
    received; totalled per process), "frame" (ctx fd, data: a frame about to be written to
    a segment file), "rename" (ctx path: a file about to be renamed into place),
    "removal-step" (a merged backup was published, or one backup was taken out of backups/).
    """
    if "DCPTOOL_FAULT" not in os.environ:
        return
    for name, n in _specs():
        if name == "stall-after-vbuckets" and where == "vbucket-closed" and count >= n:
            if ctx.get("flush") is not None:  # what the task did so far shows while it stalls
                ctx["flush"]()
            time.sleep(600)
        elif name == "stall-restore-after-windows" and where == "restore-window" \
                and count >= n:
            if ctx.get("flush") is not None:
                ctx["flush"]()
            time.sleep(600)
        elif name == "kill-mid-stream" and where == "events":
            total = _totals["events"] = _totals.get("events", 0) + count
            if total >= n:
                _kill()
        elif name == "kill-mid-file" and where == "frame":
            total = _totals["frames"] = _totals.get("frames", 0) + 1
            if total >= n:
                data = ctx["data"]
                if ctx.get("fd", -1) >= 0:  # a local file gets half the frame; an object
                    # being uploaded is cut where it stands (its upload stays open)
                    os.write(ctx["fd"], data[:max(1, len(data) // 2)])
                    os.fsync(ctx["fd"])
                _kill()
        elif name == "kill-before-manifest-rename" and where == "rename" \
                and os.path.basename(str(ctx.get("path"))) == "manifest.json":
            _kill()
        elif name == "kill-after-removal-step" and where == "removal-step":
            total = _totals["removal-steps"] = _totals.get("removal-steps", 0) + 1
            if total >= n:
                _kill()
        elif name == "enospc-after-bytes" and where == "frame":
            total = _totals["bytes"] = _totals.get("bytes", 0) + len(ctx["data"])
            if total > n:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
