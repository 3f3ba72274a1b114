"""What a DCP client gets of a stored value: the producer stream's payload rules."""
from __future__ import annotations

import struct

from dcptool.node.item import (ITEM_DELETION, ITEM_EXPIRATION, ITEM_MUTATION, split_xattrs,
                               valid_xattr_blob)
from dcptool.node.stream import payload


def xattrs(body: bytes) -> bytes:
    pair = b"_sys\x00{}\x00"
    blob = struct.pack(">I", len(pair)) + pair
    return struct.pack(">I", len(blob)) + blob + body


def test_payload_rules_for_xattrs_and_no_value():
    v = xattrs(b'{"a":1}')
    assert valid_xattr_blob(v)
    blob, body = split_xattrs(v)
    assert body == b'{"a":1}'
    kw = dict(include_xattrs=False, no_value=False, keep_datatype=False)
    assert payload(v, 0x05, ITEM_MUTATION, **kw) == (b'{"a":1}', 0x01)
    assert payload(v, 0x05, ITEM_MUTATION, **{**kw, "include_xattrs": True}) == (v, 0x05)
    assert payload(v, 0x05, ITEM_MUTATION, **{**kw, "no_value": True}) == (b"", 0x00)
    assert payload(v, 0x05, ITEM_MUTATION, include_xattrs=True, no_value=True,
                   keep_datatype=False) == (blob, 0x04)
    assert payload(b'{"a":1}', 0x01, ITEM_MUTATION, include_xattrs=False, no_value=True,
                   keep_datatype=True) == (b"", 0x01)
    assert payload(b"", 0, ITEM_DELETION, **kw) == (b"", 0)
    assert payload(xattrs(b""), 0x04, ITEM_EXPIRATION, **{**kw, "include_xattrs": True}) == (xattrs(b""), 0x04)
    assert not valid_xattr_blob(b"\x00\x00\x00\x09abc")
