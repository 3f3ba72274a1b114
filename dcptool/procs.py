"""Processes on this host: whether a pid from a lock or state file still runs."""
from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int, *, cmdline_contains: bytes | None = None) -> bool:
    """Whether process `pid` exists (one we may not signal counts as alive, a zombie not).

    With `cmdline_contains`, a process whose command line (read from /proc, where there is
    one) lacks those bytes counts as gone: the pid was reused by another program.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (ended, not yet reaped by its parent) is gone
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except (OSError, IndexError):
        pass
    if cmdline_contains is None:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return cmdline_contains in cmdline
