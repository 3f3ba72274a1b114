"""The producer's frame builders and payload rules, checked against the codec."""
from __future__ import annotations

import struct

from dcptool.node import dcpwire as w
from dcptool.node.item import (ITEM_DELETION, ITEM_EXPIRATION, ITEM_MUTATION, split_xattrs,
                               valid_xattr_blob)
from dcptool.node.stream import payload
from dcptool.protocol import decode_frame, decode_message
from dcptool.protocol.messages import (
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpSnapshotMarker,
    DcpStreamEnd,
)


def one(data: bytes):
    frame, used = decode_frame(data)
    assert used == len(data)
    return decode_message(frame)


def xattrs(body: bytes) -> bytes:
    pair = b"_sys\x00{}\x00"
    blob = struct.pack(">I", len(pair)) + pair
    return struct.pack(">I", len(blob)) + blob + body


def test_fact_sheet_example_3_mutation_bytes():
    data = b"".join(w.mutation(0, 1, b"k", b"v", 0, 0x17E2C5A4B1000000, 1, 1, 0, 0))
    assert data.hex() == ("80570001" "1f000000" "00000021" "00000001" "17e2c5a4b1000000"
                          "0000000000000001" "0000000000000001" "0000000000000000"
                          "00000000" "000000" "6b" "76")
    assert len(data) == w.MUTATION_BASE + 2


def test_fact_sheet_examples_2_9_10_marker_stream_end_deletion():
    assert w.marker(0, 1, 0, 1, 1).hex() == (
        "80560000140000000000001400000001" "0000000000000000" "0000000000000000"
        "0000000000000001" "00000001")
    assert w.stream_end(0, 1, 0).hex() == (
        "80550000040000000000000400000001" "0000000000000000" "00000000")
    d = b"".join(w.deletion(0, 1, b"k", b"", 0, 0x17E2C5A4B2000000, 2, 2, 0))
    assert len(d) == 46 and d[4] == 21


def test_builders_round_trip_through_the_codec_with_and_without_stream_ids():
    for sid in (None, 513):
        m = one(b"".join(w.mutation(7, 0xDEADBEEF, b"key", b"value", 1, 99, 5, 3, 0x01020304,
                                    1_700_000_000, sid)))
        assert isinstance(m, DcpMutation)
        assert (m.vbucket, m.opaque, m.key, m.value, m.datatype, m.cas, m.by_seqno, m.rev_seqno,
                m.flags, m.expiry, m.stream_id) == (7, 0xDEADBEEF, b"key", b"value", 1, 99, 5, 3,
                                                    0x01020304, 1_700_000_000, sid)
        d1 = one(b"".join(w.deletion(7, 1, b"k", b"", 0, 5, 6, 2, None, sid)))
        d2 = one(b"".join(w.deletion(7, 1, b"k", b"", 0, 5, 6, 2, 1234, sid)))
        assert isinstance(d1, DcpDeletion) and d1.delete_time is None and d1.stream_id == sid
        assert d2.delete_time == 1234 and d2.by_seqno == 6
        e = one(b"".join(w.expiration(7, 1, b"k", b"", 0, 5, 6, 2, 99, sid)))
        assert isinstance(e, DcpExpiration) and e.delete_time == 99
        mk = one(w.marker(7, 1, 10, 20, 5, sid))
        assert isinstance(mk, DcpSnapshotMarker) and (mk.start_seqno, mk.end_seqno, mk.flags,
                                                      mk.stream_id) == (10, 20, 5, sid)
        se = one(w.stream_end(7, 1, 2, sid))
        assert isinstance(se, DcpStreamEnd) and se.reason == 2 and se.stream_id == sid


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
    assert payload(xattrs(b""), 0x04, ITEM_EXPIRATION,
                   **{**kw, "include_xattrs": True}) == (xattrs(b""), 0x04)
    assert not valid_xattr_blob(b"\x00\x00\x00\x09abc")
