"""The vbucket of a key: Couchbase's CRC32 hash."""
from __future__ import annotations

import zlib
from typing import Iterable

_crc32 = zlib.crc32


def vbucket_of(key: bytes | str, vbuckets: int = 1024) -> int:
    """((crc32(key) >> 16) & 0x7fff) % vbuckets, the mapping Couchbase clients use."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % vbuckets


def vbuckets_of(keys: Iterable[bytes], vbuckets: int) -> list[int]:
    """`vbucket_of` of each key (bytes) of a batch, in one pass without a call per key."""
    return [((c >> 16) & 0x7FFF) % vbuckets for c in map(_crc32, keys)]
