"""Snappy-compressed values: datatype bit 0x02.

A connection that negotiated HELLO Snappy (feature 0x0a) may carry values as raw Snappy
blocks (a varint of the uncompressed length, then the elements; never the framed stream
format) marked with datatype bit 0x02; when the value also has xattrs (bit 0x04), the
whole value, xattr section and body, is one compressed block. These helpers wrap cramjam's
raw block codec for both sides: the client decompresses what a node sends, the reference
node inflates what clients write and compresses what a DCP stream asks to get compressed.
Errors are the codec's ProtocolError (field `value`).
"""
from __future__ import annotations

import cramjam

from .constants import Datatype
from .errors import ProtocolError

#: the datatype bit of a snappy-compressed value
SNAPPY = int(Datatype.SNAPPY)

_decompress_raw = cramjam.snappy.decompress_raw
_compress_raw = cramjam.snappy.compress_raw
_declared_len = cramjam.snappy.decompress_raw_len


class SnappyTooLarge(ProtocolError):
    """A block that declares more bytes than the caller accepts."""


def decompress(value, max_len: int | None = None) -> bytes:
    """The bytes a raw Snappy block (bytes, bytearray or memoryview) holds.

    An empty value stays empty (there is nothing to decompress; a writer that must refuse
    it checks first). With `max_len`, the length the block declares is read before
    anything is allocated, and a larger one raises SnappyTooLarge. Raises ProtocolError
    when the block is not valid Snappy.
    """
    if not len(value):
        return b""
    try:
        if max_len is not None and _declared_len(value) > max_len:
            raise SnappyTooLarge("value", f"decompresses to more than {max_len} bytes")
        return bytes(_decompress_raw(value))
    except ProtocolError:
        raise
    except Exception as exc:  # cramjam raises its own types for corrupt blocks
        raise ProtocolError("value", f"not a valid snappy block ({exc})") from None


def compress(value) -> bytes:
    """`value` as one raw Snappy block."""
    return bytes(_compress_raw(value))


def compress_if_smaller(value) -> bytes | None:
    """`value` compressed, or None when compressing would not make it smaller.

    kv_engine's Item::compressValue keeps a value uncompressed when its compressed form
    is larger than the original (engines/ep/src/item.cc).
    """
    out = bytes(_compress_raw(value))
    return out if len(out) <= len(value) else None


def plain(value, datatype: int) -> tuple[bytes, int]:
    """(value, datatype) with a snappy-compressed value decompressed and bit 0x02 cleared;
    anything else unchanged."""
    if datatype & SNAPPY:
        return decompress(value), datatype & ~SNAPPY
    return value, datatype


__all__ = ["SNAPPY", "SnappyTooLarge", "compress", "compress_if_smaller", "decompress",
           "plain"]
