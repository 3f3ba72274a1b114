"""The vbucket of a key: Couchbase's CRC32 hash."""
from __future__ import annotations

import zlib


def vbucket_of(key: bytes | str, vbuckets: int = 1024) -> int:
    """((crc32(key) >> 16) & 0x7fff) % vbuckets, the mapping Couchbase clients use."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % vbuckets
