"""The archive lock: one writer (backup, purge, merge) at a time.

The lock is the file ARCHIVE/lock, created with O_EXCL and holding JSON with the holder's
pid, host, start time, purpose and a random token. A lock whose holder ran on this host and
whose pid no longer exists is stale and is broken automatically; a lock held from another
host is never broken automatically (its pid means nothing here).
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from dcptool.procs import pid_alive

from .errors import ArchiveLockedError
from .format import FILE_MODE, LOCK_FILE, fsync_dir, iso_time, utc_now

#: an unreadable lock file (a holder killed between create and write) older than this is stale
UNREADABLE_STALE_SECONDS = 60.0


class ArchiveLock:
    """Hold with `acquire()`/`release()` or as a context manager."""

    def __init__(self, archive_path: str | os.PathLike[str], purpose: str):
        self.archive_path = Path(archive_path)
        self.path = self.archive_path / LOCK_FILE
        self.purpose = purpose
        self.token = secrets.token_hex(8)
        self.held = False

    def _content(self) -> bytes:
        return json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "time": iso_time(utc_now()),
            "purpose": self.purpose, "token": self.token,
        }).encode()

    def holder(self) -> dict[str, Any] | None:
        """The current holder's record, {} when the file is unreadable, None when unlocked."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(4096)
        except FileNotFoundError:
            return None
        try:
            info = json.loads(data)
            return info if isinstance(info, dict) else {}
        except ValueError:
            return {}

    def _is_stale(self, info: dict[str, Any]) -> bool:
        if not info:
            try:
                age = time.time() - os.stat(self.path).st_mtime
            except FileNotFoundError:
                return True
            return age > UNREADABLE_STALE_SECONDS
        if info.get("host") != socket.gethostname():
            return False
        pid = info.get("pid")
        return isinstance(pid, int) and not pid_alive(pid)

    def acquire(self) -> "ArchiveLock":
        for _attempt in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                             FILE_MODE)
            except FileExistsError:
                info = self.holder()
                if info is None:
                    continue  # released meanwhile
                if self._is_stale(info):
                    # break it by renaming first, so two breakers cannot both win
                    aside = self.path.with_name(f"{LOCK_FILE}.stale-{secrets.token_hex(4)}")
                    try:
                        os.rename(self.path, aside)
                        os.unlink(aside)
                    except FileNotFoundError:
                        pass
                    continue
                who = (f"pid {info.get('pid')} on {info.get('host')} since {info.get('time')} "
                       f"({info.get('purpose')})") if info else "an unknown process"
                raise ArchiveLockedError(
                    f"archive {self.archive_path} is locked by {who}",
                    hint=f"wait for it to finish; if that process is gone, delete {self.path}")
            try:
                data = self._content()
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except BaseException:
                # e.g. a full disk: the empty file we created would lock the next run out
                os.close(fd)
                fd = -1
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                raise
            finally:
                if fd >= 0:
                    os.close(fd)
            fsync_dir(self.archive_path)
            self.held = True
            return self
        raise ArchiveLockedError(f"archive {self.archive_path}: could not take the lock")

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        info = self.holder()
        if info and info.get("token") == self.token:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "ArchiveLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
