"""The archive lock: one writer (backup, purge, merge) at a time.

The lock is the file ARCHIVE/lock, created with O_EXCL and holding JSON with the holder's
pid, host, start time, purpose and a random token. A lock whose holder ran on this host and
whose pid no longer exists is stale and is broken automatically; a lock held from another
host is never broken automatically (its pid means nothing here).

On object storage (a store with `lock_leases`) the lock is the object ARCHIVE/lock,
created with a conditional write (If-None-Match: *), so of two writers exactly one creates
it. It holds a lease: an `expires` time that the holder renews (a thread rewrites the
object every third of the lease) while it works. A lock whose lease ran out is stale, from whatever host, and is
broken; a holder that was killed therefore blocks the archive for one lease at most
(DCPTOOL_S3_LOCK_LEASE seconds, 120 by default), and not at all for the next run on its
own host, which sees that the holder's pid is gone (as with a local lock).
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from typing import Any

from dcptool.procs import pid_alive

from .errors import ArchiveLockedError
from . import storage
from .format import FILE_MODE, LOCK_FILE, iso_time, utc_now

#: an unreadable lock file (a holder killed between create and write) older than this is stale
UNREADABLE_STALE_SECONDS = 60.0


def lease_seconds() -> float:
    """How long an object-storage lock holds without renewal."""
    try:
        return max(1.0, float(os.environ.get("DCPTOOL_S3_LOCK_LEASE", "120")))
    except ValueError:
        return 120.0


class ArchiveLock:
    """Hold with `acquire()`/`release()` or as a context manager."""

    def __init__(self, archive_path: Any, purpose: str):
        self.archive_path = storage.location(archive_path)
        self.path = self.archive_path / LOCK_FILE
        self.purpose = purpose
        self.token = secrets.token_hex(8)
        self.held = False
        # a lease its holder renews where a holder's pid cannot be checked (object storage)
        self.leased = storage.store_of(self.path).lock_leases
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()

    def _content(self) -> bytes:
        info: dict[str, Any] = {
            "pid": os.getpid(), "host": socket.gethostname(), "time": iso_time(utc_now()),
            "purpose": self.purpose, "token": self.token,
        }
        if self.leased:
            info["expires"] = time.time() + lease_seconds()
        return json.dumps(info).encode()

    def holder(self) -> dict[str, Any] | None:
        """The current holder's record, {} when the file is unreadable, None when unlocked."""
        try:
            data = storage.read_bytes(self.path)[:4096]
        except FileNotFoundError:
            return None
        try:
            info = json.loads(data)
            return info if isinstance(info, dict) else {}
        except ValueError:
            return {}

    def _is_stale(self, info: dict[str, Any]) -> bool:
        if self.leased:
            expires = info.get("expires")
            if not isinstance(expires, (int, float)) or expires < time.time():
                return True  # the lease ran out (or the object is unreadable: none to renew)
        elif not info:
            try:
                return storage.age_seconds(self.path) > UNREADABLE_STALE_SECONDS
            except FileNotFoundError:
                return True
        if info.get("host") != socket.gethostname():
            return False
        pid = info.get("pid")
        return isinstance(pid, int) and not pid_alive(pid)

    def acquire(self) -> "ArchiveLock":
        for _attempt in range(3):
            try:
                # O_EXCL locally (the file removed again if its content cannot be written,
                # e.g. on a full disk: an empty lock would shut the next run out);
                # If-None-Match: * on S3
                storage.create_exclusive(self.path, self._content(), FILE_MODE)
            except FileExistsError:
                info = self.holder()
                if info is None:
                    continue  # released meanwhile
                if self._is_stale(info):
                    storage.break_file(self.path)
                    continue
                who = (f"pid {info.get('pid')} on {info.get('host')} since {info.get('time')} "
                       f"({info.get('purpose')})") if info else "an unknown process"
                hint = ("wait for it to finish; a lock its holder stops renewing expires "
                        f"after {lease_seconds():.0f} s") if self.leased else \
                    f"wait for it to finish; if that process is gone, delete {self.path}"
                raise ArchiveLockedError(f"archive {self.archive_path} is locked by {who}",
                                         hint=hint)
            self.held = True
            if self.leased:
                self._stop.clear()
                self._renewer = threading.Thread(target=self._renew,
                                                 name="dcptool-lock-lease", daemon=True)
                self._renewer.start()
            return self
        raise ArchiveLockedError(f"archive {self.archive_path}: could not take the lock")

    def _renew(self) -> None:
        """Rewrite the lock object with a new lease while it is held (and still ours)."""
        while not self._stop.wait(lease_seconds() / 3):
            try:
                info = self.holder()
                if not info or info.get("token") != self.token:
                    return
                storage.atomic_write_bytes(self.path, self._content())
            except Exception:  # a failed renewal is retried at the next tick
                continue

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=10)
            self._renewer = None
        info = self.holder()
        if info and info.get("token") == self.token:
            storage.unlink(self.path)

    def __enter__(self) -> "ArchiveLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
