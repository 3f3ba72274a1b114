"""One node per data directory.

Two nodes on one directory would each assign seqno 1 in the same vbucket and each flush
over the other's writes, so a write one of them acknowledged could be gone after a
restart. A node therefore holds an exclusive `flock` on `DIR/node.lock` from before it
touches the directory until its process ends. The kernel drops the lock when the process
dies, however it dies, so there is never a stale lock to break by hand; the file's
content (the holder's pid) is only there to name the holder in an error message.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from dcptool.errors import DcptoolError

LOCK_FILE = "node.lock"
#: where a running node writes its pid and addresses (`Node._write_node_file`)
NODE_FILE = "node.json"
#: the exit status of a start refused because another node holds the directory
EXIT_IN_USE = 3


class DataDirInUse(DcptoolError):
    """Another running node holds the data directory."""

    exit_code = EXIT_IN_USE


class DataDirLock:
    """The exclusive lock on one node data directory; `acquire()` or use as a context
    manager. The lock lives as long as this object's file descriptor."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "DataDirLock":
        """Take the lock, or raise `DataDirInUse` naming the running node."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirInUse(f"{self.data_dir} is in use by {describe_holder(self.data_dir)}",
                               hint="stop that node first, or give this one another --data")
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({"pid": os.getpid(), "since": time.time()}) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "DataDirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_locked(data_dir: str | os.PathLike[str]) -> bool:
    """Does a live process hold `data_dir`'s node lock (without taking it)?"""
    try:
        fd = os.open(Path(data_dir) / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock if it was granted
    return False


def holder(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What the lock file and node.json say about the holder: pid and, once it listens,
    host and port ({} when nothing is readable)."""
    data_dir = Path(data_dir)
    info: dict[str, Any] = {}
    try:
        doc = json.loads((data_dir / LOCK_FILE).read_text())
        if isinstance(doc, dict) and isinstance(doc.get("pid"), int):
            info["pid"] = doc["pid"]
    except (OSError, ValueError):
        pass
    try:
        node = json.loads((data_dir / NODE_FILE).read_text())
    except (OSError, ValueError):
        node = None
    if isinstance(node, dict) and node.get("pid") == info.get("pid"):
        for key in ("host", "port"):
            if key in node:
                info[key] = node[key]
    return info


def describe_holder(data_dir: str | os.PathLike[str]) -> str:
    """"a running node (pid 123, listening on 127.0.0.1:11210)" or as much as is known."""
    info = holder(data_dir)
    parts = []
    if "pid" in info:
        parts.append(f"pid {info['pid']}")
    if "host" in info and "port" in info:
        parts.append(f"listening on {info['host']}:{info['port']}")
    elif "pid" in info:
        parts.append("still starting")
    return "a running node" + (f" ({', '.join(parts)})" if parts else "")
