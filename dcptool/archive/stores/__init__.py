"""The stores an archive's files can live in, and the one place that picks a store.

`store_of(location)` answers which `Store` (base.py) keeps a location: by the location's
type (a `pathlib.Path` is local, an `S3Path` is S3's, a `MemPath` the memory store's, a
pack `Member` goes to its pack's store), or by the scheme of a string. `location(text)`
turns what a user typed into a location of the store its scheme names (no scheme: a
local path).

Adding a store is one module: a `Store` subclass with its location type (a `KeyPath`
subclass for a store of keys), and one line in `STORES` below.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from .base import (PACKS, KeyPath, Member, NewFile, RangedReader, StorageError, Store,
                   file_size, range_held)
from .local import LOCAL, LocalStore
from .memory import MEMORY, MemoryStore, MemPath
from .s3 import S3, S3Path, S3Settings, S3Store

#: every store with a scheme, in the order their schemes are tried
STORES: tuple[Store, ...] = (S3, MEMORY)


class MemberStore(Store):
    """Pack members (`Member`) read as the files they stand for, from their pack's store
    (through the pack cache while a `pack_cache()` scope is open)."""

    location_type = Member

    def stat(self, path: Any) -> int:
        return range_held(path.offset, path.size, store_of(path.pack).stat(path.pack))

    def open_read(self, path: Any) -> BinaryIO:
        store = store_of(path.pack)
        data = PACKS.load(store, path.pack)
        if data is not None:
            return _CachedMember(path, data)  # type: ignore[return-value]
        return store.open_member(path)

    def read_bytes(self, path: Any) -> bytes:
        with self.open_read(path) as f:
            return f.read()

    def read_range(self, path: Any, offset: int, length: int) -> bytes:
        with self.open_read(path) as f:
            f.seek(offset)
            return f.read(length)


class _CachedMember(RangedReader):
    """A member read from its pack's bytes in the pack cache."""

    def __init__(self, member: Member, data: bytes):
        super().__init__()
        self._m = member
        self._buf = memoryview(data)[member.offset:member.offset + member.size]
        self._size = len(self._buf)


MEMBERS = MemberStore()

_BY_TYPE: dict[type, Store] = {Member: MEMBERS, Path: LOCAL, type(Path()): LOCAL}
for _s in (LOCAL, *STORES):
    _BY_TYPE[_s.location_type] = _s


def store_of(where: Any) -> Store:
    """The store that keeps a location (or a string naming one; anything else is a
    local path)."""
    store = _BY_TYPE.get(type(where))
    if store is not None:
        return store
    if isinstance(where, str):
        for s in STORES:
            if where.startswith(s.scheme):  # type: ignore[arg-type]
                return s
        return LOCAL
    for t, s in _BY_TYPE.items():
        if isinstance(where, t):
            _BY_TYPE[type(where)] = s
            return s
    return LOCAL


def location(path: Any) -> Any:
    """A location for what a user or a task names: SCHEME://... or a local path."""
    if type(path) in _BY_TYPE or isinstance(path, (Path, KeyPath, Member)):
        return path
    text = os.fspath(path)
    if isinstance(text, str):
        for s in STORES:
            if text.startswith(s.scheme):  # type: ignore[arg-type]
                return s.parse(text)
    return Path(text)


__all__ = ["Store", "LocalStore", "S3Store", "MemoryStore", "MemberStore", "LOCAL", "S3",
           "MEMORY", "MEMBERS", "STORES", "S3Path", "S3Settings", "MemPath", "KeyPath",
           "Member", "NewFile", "StorageError", "store_of", "location", "file_size",
           "range_held"]
