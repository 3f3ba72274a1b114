"""One version of one document, as the node keeps it in memory and on disk."""
from __future__ import annotations

import struct

#: `Item.op` values: what the version is
ITEM_MUTATION = 0
ITEM_DELETION = 1
ITEM_EXPIRATION = 2
#: a collections system event (`dcptool.node.sysevent`): never a document, never read by
#: GET; DCP sends it as DCP_SYSTEM_EVENT to collection-aware streams only
ITEM_SYSTEM = 3

#: rough per-item overhead (object, slots, list and dict slots) used for memory accounting
ITEM_OVERHEAD = 120

_XATTR_LEN = struct.Struct(">I")


class Item:
    """A document version: the key, the value and the metadata DCP and the meta commands carry.

    Items are immutable once queued: the hash table, the open checkpoint, the flusher
    queue and any stream's snapshot may all hold the same object.

    * `seqno` is the vbucket's sequence number of this change; `rev` the key's revision seqno.
    * `expiry` is absolute unix seconds (0 = never); `flags` the 4 document flag bytes as u32.
    * `op` is ITEM_MUTATION, ITEM_DELETION or ITEM_EXPIRATION; tombstones keep `delete_time`
      (unix seconds).
    * `value` may start with an xattr blob when `datatype` has the XATTR bit.
    """

    __slots__ = ("key", "value", "seqno", "rev", "cas", "flags", "expiry", "datatype", "op",
                 "delete_time")

    def __init__(self, key: bytes, value: bytes, seqno: int, rev: int, cas: int, flags: int,
                 expiry: int, datatype: int, op: int = ITEM_MUTATION, delete_time: int = 0) -> None:
        self.key = key
        self.value = value
        self.seqno = seqno
        self.rev = rev
        self.cas = cas
        self.flags = flags
        self.expiry = expiry
        self.datatype = datatype
        self.op = op
        self.delete_time = delete_time

    @property
    def deleted(self) -> bool:
        return self.op != ITEM_MUTATION

    @property
    def size(self) -> int:
        return len(self.key) + len(self.value) + ITEM_OVERHEAD

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        kind = ("mutation", "deletion", "expiration")[self.op]
        return (f"Item({kind} key={self.key!r} seqno={self.seqno} rev={self.rev} cas={self.cas:#x} "
                f"len={len(self.value)})")


def split_xattrs(value: bytes) -> tuple[bytes, bytes]:
    """(xattr blob including its 4-byte length, body) of a value whose datatype has XATTR."""
    if len(value) < 4:
        return b"", value
    n = _XATTR_LEN.unpack_from(value)[0]
    end = 4 + n
    if end > len(value):
        return b"", value
    return value[:end], value[end:]


def valid_xattr_blob(value: bytes) -> bool:
    """Is `value` a well-formed xattr section followed by a body? (fact sheet 1.5)"""
    if len(value) < 4:
        return False
    total = _XATTR_LEN.unpack_from(value)[0]
    end = 4 + total
    if end > len(value):
        return False
    p = 4
    while p < end:
        if p + 4 > end:
            return False
        n = _XATTR_LEN.unpack_from(value, p)[0]
        p += 4
        pair = value[p:p + n]
        if p + n > end or pair.count(b"\x00") != 2 or not pair.endswith(b"\x00") or pair[0] == 0:
            return False
        p += n
    return p == end
