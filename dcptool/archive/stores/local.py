"""The local store: an archive in a directory of this machine's filesystem (`pathlib.Path`
locations). Files are written in place (O_EXCL) and fsynced; a file replaced atomically is a
temporary file renamed over it; a directory is renamed at once."""
from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

from dcptool.faults import fault_point

from . import base
from .base import Member, MemberReader, NewFile, Store, named, range_held


def write_all(fd: int, data: bytes, path: Any = None) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise named(exc, path) from None


class LocalNewFile(NewFile):
    def __init__(self, path: Path, mode: int):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)

    def write(self, data: bytes) -> None:
        write_all(self.fd, data, self.path)

    def close(self, sync: bool = True) -> None:
        if self.fd < 0:
            return
        try:
            if sync:
                try:
                    os.fsync(self.fd)
                except OSError as exc:
                    raise named(exc, self.path) from None
        finally:
            os.close(self.fd)
            self.fd = -1

    def abort(self) -> None:
        self.close(sync=False)


class HeldLocalFile(NewFile):
    """A local file kept in memory until it passes PART_BYTES (as an object upload keeps
    its first part), so a small one can still be taken (`take`) instead of written."""

    def __init__(self, path: Path, mode: int):
        self._path = path
        self._mode = mode
        self._buf: bytearray | None = bytearray()
        self._file: LocalNewFile | None = None

    def _spill(self) -> LocalNewFile:
        if self._file is None:
            self._file = LocalNewFile(self._path, self._mode)
            self.fd = self._file.fd
            buf, self._buf = self._buf, None
            if buf:
                self._file.write(bytes(buf))
        return self._file

    def write(self, data: bytes) -> None:
        if self._file is not None:
            self._file.write(data)
            return
        self._buf += data  # type: ignore[operator]
        if len(self._buf) >= base.PART_BYTES:  # type: ignore[arg-type]
            self._spill()

    def close(self, sync: bool = True) -> None:
        self._spill().close(sync)

    def abort(self) -> None:
        if self._file is not None:
            self._file.abort()
        self._buf = None

    def take(self) -> bytes | None:
        if self._file is not None or self._buf is None:
            return None
        data, self._buf = bytes(self._buf), None
        return data


def _find_syncfs():
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).syncfs
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


_syncfs = _find_syncfs() if sys.platform.startswith("linux") else None


class LocalStore(Store):
    """Files under a local directory."""

    scheme = None
    location_type = Path
    local = True
    dirs = True
    partial_visible = True

    def parse(self, text: str) -> Path:
        return Path(text)

    # -- reading -----------------------------------------------------------------------------

    def listdir(self, path: Any) -> list[str]:
        return os.listdir(path)

    def list_sizes(self, path: Any, *, dirs: bool = False) -> dict[str, int]:
        out: dict[str, int] = {}
        with os.scandir(path) as it:
            for e in it:
                if e.is_file():
                    out[e.name] = e.stat().st_size
                elif dirs and e.is_dir():
                    out[e.name] = -1
        return out

    def is_dir(self, path: Any) -> bool:
        return os.path.isdir(path)

    def stat(self, path: Any) -> int:
        return os.stat(path).st_size

    def read_bytes(self, path: Any) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_range(self, path: Any, offset: int, length: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    def open_read(self, path: Any) -> BinaryIO:
        return open(path, "rb", buffering=0)

    def open_member(self, member: Member) -> BinaryIO:
        # (FileNotFoundError when the pack is missing; read through the page cache)
        size = range_held(member.offset, member.size, self.stat(member.pack))
        return MemberReader(self, member, b"", size, ahead=1 << 20)  # type: ignore[return-value]

    def identity(self, path: Any) -> tuple[Any, ...]:
        st = os.stat(path)
        return (str(path.absolute()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def age_seconds(self, path: Any) -> float:
        return time.time() - os.stat(path).st_mtime

    def absolute(self, path: Any) -> Path:
        return Path(os.path.abspath(os.fspath(path)))

    # -- writing -----------------------------------------------------------------------------

    def write_new(self, path: Any, mode: int = 0o600, *, hold: bool = False) -> NewFile:
        """FileExistsError when the file exists. `hold`: a file stays in memory while it is
        small, so that `take` can still have it."""
        if hold:
            return HeldLocalFile(path, mode)
        return LocalNewFile(path, mode)

    def put(self, path: Any, data: bytes, *, if_absent: bool = False) -> None:
        if if_absent:
            self.create_exclusive(path, data)
        else:
            self.atomic_write_bytes(path, data)

    def unlink(self, path: Any, *, missing_ok: bool = True) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_tree(self, path: Any) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def sync_filesystem(self, path: Any) -> None:
        """syncfs(2) of the filesystem holding the path (os.sync() where there is none)."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _syncfs is not None and _syncfs(fd) == 0:
                return
            os.sync()
        finally:
            os.close(fd)

    def sync_dir(self, path: Any) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def prepare_dir(self, path: Any, mode: int = 0o700) -> None:
        if path.is_dir():
            os.chmod(path, mode)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self.make_dir(path, mode)

    def make_dir(self, path: Any, mode: int = 0o700) -> None:
        """(and fsync its parent)"""
        os.mkdir(path, mode)
        os.chmod(path, mode)
        self.sync_dir(Path(os.path.dirname(os.path.abspath(path))))

    def break_file(self, path: Any) -> None:
        """Renamed aside first, so of two processes that break it at once one removes it
        and the other finds it gone."""
        import secrets

        aside = path.with_name(f"{path.name}.stale-{secrets.token_hex(4)}")
        try:
            os.rename(path, aside)
            os.unlink(aside)
        except FileNotFoundError:
            pass

    def atomic_write_bytes(self, path: Any, data: bytes, *, durable: bool = True,
                           mode: int = 0o600) -> None:
        """A temporary file renamed over it, fsynced unless durable=False."""
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, mode)
            write_all(fd, data, path)
            if durable:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    raise named(exc, path) from None
            os.close(fd)
            fd = -1
            fault_point("rename", path=path)  # DCPTOOL_FAULT: kill-before-manifest-rename
            os.replace(tmp, path)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        if durable:
            self.sync_dir(path.parent)

    def create_exclusive(self, path: Any, data: bytes, mode: int = 0o600) -> None:
        """A complete temporary file hard-linked to its name (link(2) fails when the name
        exists), so a reader never sees it half-written; where the filesystem has no hard
        links, O_EXCL, the file removed again if its content cannot be written (an empty
        lock would shut the next run out)."""
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            try:
                os.fchmod(fd, mode)
                write_all(fd, data, path)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP,
                                     errno.EMLINK):
                    raise named(exc, path) from None
            else:
                self.sync_dir(path.parent)
                return
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        f = LocalNewFile(path, mode)
        try:
            f.write(data)
            f.close(sync=True)
        except BaseException:
            f.abort()
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            raise
        self.sync_dir(path.parent)

    def replace_prefix_bytes(self, path: Any, keep: int, tail: bytes) -> None:
        """Truncated and appended to."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, keep)
            os.lseek(fd, keep, os.SEEK_SET)
            write_all(fd, tail)
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename_dir(self, src: Any, dst: Any, *, last: str | None = None) -> None:
        """One atomic rename."""
        os.rename(src, dst)


LOCAL = LocalStore()

__all__ = ["LocalStore", "LOCAL", "LocalNewFile", "HeldLocalFile", "write_all"]
