"""The wire's fast paths (`dcptool.protocol.wire`), checked against the typed codec."""
from __future__ import annotations

import random

from dcptool.protocol import decode_frame, decode_message, encode_frame, vbucket_of
from dcptool.protocol import wire as w
from dcptool.protocol.constants import Magic, Opcode, Status
from dcptool.protocol.messages import (
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpNoop,
    DcpSetVbucketState,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DelWithMeta,
    SetWithMeta,
)


def one(data: bytes):
    frame, used = decode_frame(data)
    assert used == len(data)
    return decode_message(frame)


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
        sv = one(w.set_vbucket_state(7, 9, 2, sid))
        assert isinstance(sv, DcpSetVbucketState) and (sv.vbucket, sv.opaque, sv.state,
                                                       sv.stream_id) == (7, 9, 2, sid)


def test_builders_match_the_codecs_encoding_byte_for_byte():
    assert b"".join(w.mutation(3, 4, b"k", b"v", 1, 5, 6, 7, 8, 9)) == DcpMutation(
        vbucket=3, opaque=4, key=b"k", value=b"v", datatype=1, cas=5, by_seqno=6, rev_seqno=7,
        flags=8, expiry=9).encode()
    assert b"".join(w.deletion(3, 4, b"k", b"", 0, 5, 6, 7, 11)) == DcpDeletion(
        vbucket=3, opaque=4, key=b"k", cas=5, by_seqno=6, rev_seqno=7, delete_time=11).encode()
    assert b"".join(w.deletion(3, 4, b"k", b"", 0, 5, 6, 7, None)) == DcpDeletion(
        vbucket=3, opaque=4, key=b"k", cas=5, by_seqno=6, rev_seqno=7,
        delete_time=None).encode()
    assert b"".join(w.expiration(3, 4, b"k", b"", 0, 5, 6, 7, 11)) == DcpExpiration(
        vbucket=3, opaque=4, key=b"k", cas=5, by_seqno=6, rev_seqno=7, delete_time=11).encode()
    assert w.marker(3, 4, 10, 20, 1) == DcpSnapshotMarker(
        vbucket=3, opaque=4, start_seqno=10, end_seqno=20, flags=1).encode()
    assert w.stream_end(3, 4, 1) == DcpStreamEnd(vbucket=3, opaque=4, reason=1).encode()
    assert w.set_vbucket_state(3, 4, 1) == DcpSetVbucketState(vbucket=3, opaque=4,
                                                              state=1).encode()
    assert w.noop(77) == DcpNoop(opaque=77).encode()
    assert isinstance(one(w.noop(77)), DcpNoop)


def test_sizes_are_the_wire_sizes():
    assert (w.HEADER_LEN, w.MUTATION_EXTLEN, w.DELETION_V1_EXTLEN, w.DELETION_V2_EXTLEN,
            w.EXPIRATION_EXTLEN, w.MARKER_V1_EXTLEN, w.WITH_META_EXTLEN,
            w.WITH_META_OPTIONS_EXTLEN, w.SEQNO_EXTLEN) == (24, 31, 18, 21, 20, 20, 24, 28, 16)
    assert (w.MUTATION_BASE, w.DELETION_V1_BASE, w.DELETION_V2_BASE, w.EXPIRATION_BASE,
            w.MARKER_SIZE, w.STREAM_END_SIZE, w.SET_VBUCKET_STATE_SIZE) == (
        55, 42, 45, 44, 44, 28, 25)
    assert len(w.marker(0, 0, 0, 0, 0)) == w.MARKER_SIZE
    assert len(w.marker(0, 0, 0, 0, 0, 1)) == w.MARKER_SIZE + w.SID_EXTRA
    assert len(w.stream_end(0, 0, 0, 1)) == w.STREAM_END_SIZE + w.SID_EXTRA
    assert len(w.set_vbucket_state(0, 0, 1, 1)) == w.SET_VBUCKET_STATE_SIZE + w.SID_EXTRA
    assert len(w.mutation(0, 0, b"", b"", 0, 0, 0, 0, 0, 0, 1)[0]) == w.MUTATION_BASE + w.SID_EXTRA


def test_plain_ints_are_the_protocols_values():
    assert (w.REQ, w.RES, w.ALT_REQ, w.ALT_RES) == (Magic.REQUEST, Magic.RESPONSE,
                                                    Magic.ALT_REQUEST, Magic.ALT_RESPONSE)
    for name in dir(w):
        if name.startswith("OP_"):
            value = getattr(w, name)
            assert type(value) is int and value == Opcode[name[3:]], name
    assert (w.DT_JSON, w.DT_SNAPPY, w.DT_XATTR) == (1, 2, 4)


def test_response_header_is_the_codecs_response():
    data = w.response(int(Opcode.SETQ_WITH_META), int(Status.KEY_EEXISTS), 0x01020304, 99)
    assert data == encode_frame(Magic.RESPONSE, Opcode.SETQ_WITH_META, Status.KEY_EEXISTS,
                                0x01020304, 99)
    frame, used = decode_frame(data)
    assert used == 24 and frame.magic == 0x81 and frame.status == Status.KEY_EEXISTS
    seqno = w.HEADER.pack(w.RES, w.OP_SET, 0, w.SEQNO_EXTLEN, 0, 0, 16, 5, 6) + \
        w.MUTATION_SEQNO_EXTRAS.pack(0xAB, 42)
    assert seqno == encode_frame(Magic.RESPONSE, Opcode.SET, 0, 5, 6,
                                 extras=w.MUTATION_SEQNO_EXTRAS.pack(0xAB, 42))


def test_with_meta_requests_decode_as_the_codecs_messages():
    key, value = b"doc-1", b'{"a":1}'
    kl = len(key)
    plain = w.WITH_META.pack(w.REQ, w.OP_SETQ_WITH_META, kl, 24, 1, 12, 24 + kl + len(value), 7,
                             0, 0x11, 1_700_000_000, 3, 0xCAFE) + key + value
    m = one(plain)
    assert isinstance(m, SetWithMeta) and m.quiet
    assert (m.vbucket, m.opaque, m.key, m.value, m.flags, m.expiry, m.rev_seqno, m.meta_cas,
            m.options) == (12, 7, key, value, 0x11, 1_700_000_000, 3, 0xCAFE, None)
    assert plain == SetWithMeta(vbucket=12, opaque=7, datatype=1, key=key, value=value,
                                flags=0x11, expiry=1_700_000_000, rev_seqno=3, meta_cas=0xCAFE,
                                quiet=True).encode()
    opts = w.WITH_META_OPTIONS.pack(w.REQ, w.OP_DELQ_WITH_META, kl, 28, 0, 3, 28 + kl, 8, 0, 0,
                                    99, 4, 0xBEEF, w.META_IS_EXPIRATION) + key
    d = one(opts)
    assert isinstance(d, DelWithMeta) and d.quiet and d.options == w.META_IS_EXPIRATION
    assert (d.expiry, d.rev_seqno, d.meta_cas) == (99, 4, 0xBEEF)
    # the node's unpack of the extras reads what the codec wrote
    ext = SetWithMeta(key=key, flags=1, expiry=2, rev_seqno=3, meta_cas=4, options=8).body()[0]
    assert w.WITH_META_OPTIONS_EXTRAS.unpack(ext) == (1, 2, 3, 4, 8)
    assert w.WITH_META_EXTRAS.unpack(ext[:24]) == (1, 2, 3, 4)


def test_vbuckets_of_is_vbucket_of_for_every_key():
    rnd = random.Random(5)
    keys = [b"", b"k", b"doc-1"] + [rnd.randbytes(rnd.randrange(1, 40)) for _ in range(500)]
    for n in (1, 16, 64, 1024):
        assert w.vbuckets_of(keys, n) == [vbucket_of(k, n) for k in keys]
    assert w.vbuckets_of(iter(keys), 1024) == [vbucket_of(k) for k in keys]
