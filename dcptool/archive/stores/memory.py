"""The memory store: files in a dictionary of this process (``mem://NAME/PREFIX``,
`MemPath` locations), for tests of the archive code that need no disk and no server.

It behaves as object storage does: no directories (a prefix is present while a file lies
under it), files written whole (a file being written is invisible until it is closed, and
one aborted leaves nothing), a conditional create for the lock. Nothing is shared with
another process, so a Spark task in an executor of its own does not see it.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from .base import KeyPath, NewFile, Store

SCHEME = "mem://"


class MemPath(KeyPath):
    """A key (or key prefix) of a named in-memory space."""

    __slots__ = ()

    scheme = SCHEME


class _MemNewFile(NewFile):
    """Bytes held until close() stores them all at once; abort() drops them."""

    def __init__(self, store: "MemoryStore", path: MemPath):
        self._store = store
        self._path = path
        self._buf: bytearray | None = bytearray()

    def write(self, data: bytes) -> None:
        self._buf += data  # type: ignore[operator]

    def close(self, sync: bool = True) -> None:
        if self._buf is None:
            return
        data, self._buf = bytes(self._buf), None
        self._store.put(self._path, data)

    def abort(self) -> None:
        self._buf = None

    def take(self) -> bytes | None:
        if self._buf is None:
            return None
        data, self._buf = bytes(self._buf), None
        return data


class MemoryStore(Store):
    """{(name, key): (bytes, time written)}, behind one lock."""

    scheme = SCHEME
    location_type = MemPath
    packs = True  # (as object storage: the packing code runs without a server)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], tuple[bytes, float]] = {}

    def parse(self, text: str) -> MemPath:
        return MemPath.parse(text)  # type: ignore[return-value]

    def clear(self, name: str | None = None) -> None:
        """Forget every file (of the space `name`, or of all)."""
        with self._lock:
            for k in [k for k in self._files if name is None or k[0] == name]:
                del self._files[k]

    def _get(self, path: Any) -> bytes:
        try:
            return self._files[path.bucket, path.key][0]
        except KeyError:
            raise FileNotFoundError(str(path)) from None

    # -- reading -----------------------------------------------------------------------------

    def list_sizes(self, path: Any, *, dirs: bool = False) -> dict[str, int]:
        prefix = f"{path.key}/" if path.key else ""
        out: dict[str, int] = {}
        with self._lock:
            for (bucket, key), (data, _t) in self._files.items():
                if bucket != path.bucket or not key.startswith(prefix):
                    continue
                name, sub, _rest = key[len(prefix):].partition("/")
                if not sub:
                    out[name] = len(data)
                elif dirs:
                    out.setdefault(name, -1)
        return out

    def stat(self, path: Any) -> int:
        return len(self._get(path))

    def read_bytes(self, path: Any) -> bytes:
        return self._get(path)

    def read_range(self, path: Any, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        return self._get(path)[offset:offset + length]

    def identity(self, path: Any) -> tuple[Any, ...]:
        with self._lock:
            try:
                data, t = self._files[path.bucket, path.key]
            except KeyError:
                raise FileNotFoundError(str(path)) from None
        return (str(path), len(data), t, id(data))

    def age_seconds(self, path: Any) -> float:
        with self._lock:
            try:
                return time.time() - self._files[path.bucket, path.key][1]
            except KeyError:
                raise FileNotFoundError(str(path)) from None

    # -- writing -----------------------------------------------------------------------------

    def write_new(self, path: Any, mode: int = 0o600, *, hold: bool = False) -> NewFile:
        return _MemNewFile(self, path)

    def put(self, path: Any, data: bytes, *, if_absent: bool = False) -> None:
        with self._lock:
            k = (path.bucket, path.key)
            if if_absent and k in self._files:
                raise FileExistsError(str(path))
            self._files[k] = (bytes(data), time.time())

    def unlink(self, path: Any, *, missing_ok: bool = True) -> None:
        with self._lock:
            self._files.pop((path.bucket, path.key), None)

    def remove_tree(self, path: Any) -> None:
        prefix = f"{path.key}/" if path.key else ""
        with self._lock:
            for k in [k for k in self._files if k[0] == path.bucket and k[1].startswith(prefix)]:
                del self._files[k]


MEMORY = MemoryStore()
MemPath.store = MEMORY

__all__ = ["MemoryStore", "MEMORY", "MemPath", "SCHEME"]
