"""Property tests: round trips, hostile input, and chunked feeding."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcptool.protocol import (
    FrameDecoder,
    ProtocolError,
    decode_frame,
    decode_message,
)
from dcptool.protocol import messages as m
from dcptool.protocol.constants import Opcode, Status

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)
blob = st.binary(max_size=64)
key = st.binary(min_size=1, max_size=64)
name = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
opt_name = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
failover = st.lists(st.tuples(u64, u64), max_size=5).map(tuple)

COMMON_REQ = dict(vbucket=u16, opaque=u32, cas=u64, datatype=u8,
                  stream_id=st.none() | u16)
COMMON_RSP = dict(opaque=u32, cas=u64, datatype=u8)


def req(cls, **kw):
    return st.builds(cls, **COMMON_REQ, **kw)


def rsp(cls, status=st.just(Status.SUCCESS), **kw):
    return st.builds(cls, status=status, **COMMON_RSP, **kw)


SET_KW = dict(key=key, value=blob, flags=u32, expiry=u32)
WITH_META_KW = dict(key=key, value=blob, flags=u32, expiry=u32, rev_seqno=u64, meta_cas=u64,
                    options=st.none() | u32, nmeta=st.none() | u16, quiet=st.booleans())
typed_success_ops = set(m.SUCCESS_RESPONSE_TYPES)

MESSAGES = st.one_of(
    req(m.Hello, user_agent=opt_name, features=st.lists(u16, max_size=8).map(tuple)),
    req(m.SaslListMechs),
    req(m.SaslAuth, mechanism=name, payload=blob),
    req(m.SaslStep, mechanism=name, payload=blob),
    req(m.SelectBucket, bucket=name),
    req(m.GetErrorMap, version=u16),
    req(m.Version), req(m.Noop), req(m.Quit),
    req(m.Stat, group=opt_name, payload=blob),
    req(m.GetClusterConfig, epoch=st.none()) ,
    req(m.GetClusterConfig, epoch=st.integers(-2**63, 2**63 - 1), revision=st.integers(-2**63, 2**63 - 1)),
    req(m.Get, key=key), req(m.Set, **SET_KW), req(m.Add, **SET_KW), req(m.Replace, **SET_KW),
    req(m.Delete, key=key),
    req(m.GetMeta, key=key, version=st.none() | st.integers(0, 2)),
    req(m.SetWithMeta, **WITH_META_KW), req(m.DelWithMeta, **WITH_META_KW),
    req(m.GetAllVbSeqnos, state=st.none()),
    req(m.GetAllVbSeqnos, state=u32, collection=st.none() | u32),
    req(m.GetFailoverLog), req(m.DcpGetFailoverLog),
    req(m.SetVbucket, state=st.integers(1, 4), value=blob),
    req(m.CompactDb, purge_before_ts=u64, purge_before_seq=u64, drop_deletes=u8, db_file_id=u16),
    req(m.DcpOpen, name=name, flags=u32, seqno_reserved=u32, value=blob),
    req(m.DcpControl, key=name, value=st.binary(min_size=1, max_size=20)),
    req(m.DcpAddStream, flags=u32),
    req(m.DcpStreamReq, flags=u32, reserved=u32, start_seqno=u64, end_seqno=u64,
        vbucket_uuid=u64, snap_start_seqno=u64, snap_end_seqno=u64, value=blob),
    req(m.DcpCloseStream), req(m.DcpBufferAck, bytes_to_ack=u32),
    req(m.DcpStreamEnd, reason=u32),
    req(m.DcpSnapshotMarker, start_seqno=u64, end_seqno=u64, flags=u32, version=st.just("1")),
    req(m.DcpSnapshotMarker, start_seqno=u64, end_seqno=u64, flags=u32, version=st.just("2.0"),
        max_visible_seqno=u64, high_completed_seqno=u64),
    req(m.DcpSnapshotMarker, start_seqno=u64, end_seqno=u64, flags=u32, version=st.just("2.2"),
        max_visible_seqno=u64, high_completed_seqno=u64, purge_seqno=u64, high_prepared_seqno=u64),
    req(m.DcpMutation, key=key, value=blob, by_seqno=st.integers(1, 2**64 - 1), rev_seqno=u64,
        flags=u32, expiry=u32, lock_time=u32, nru=u8),
    req(m.DcpDeletion, key=key, value=blob, by_seqno=u64, rev_seqno=u64, delete_time=st.none() | u32),
    req(m.DcpExpiration, key=key, value=blob, by_seqno=u64, rev_seqno=u64, delete_time=u32),
    req(m.DcpSetVbucketState, state=st.integers(1, 4)),
    req(m.DcpNoop), req(m.DcpSeqnoAdvanced, by_seqno=u64),
    req(m.DcpSystemEvent, by_seqno=u64, event=u32, version=u8, key=st.binary(max_size=40),
        value=blob),
    req(m.GenericRequest, op=st.sampled_from([0x60, 0x62, 0x65, 0xBA, 0xC3]),
        extras=blob, key=st.binary(max_size=40), value=blob),
    rsp(m.HelloResponse, features=st.lists(u16, max_size=8).map(tuple)),
    rsp(m.SaslListMechsResponse,
        mechanisms=st.lists(st.from_regex(r"[A-Z0-9-]{1,12}", fullmatch=True), max_size=4).map(tuple)),
    rsp(m.VersionResponse, version=opt_name),
    rsp(m.StatResponse, key=opt_name, value=blob),
    rsp(m.GetResponse, flags=u32, value=blob),
    rsp(m.GetMetaResponse, deleted=u32, flags=u32, expiry=u32, rev_seqno=u64,
        doc_datatype=st.none() | u8),
    rsp(m.GetAllVbSeqnosResponse, entries=st.lists(st.tuples(u16, u64), max_size=6).map(tuple)),
    rsp(m.FailoverLogResponse, op=st.sampled_from([Opcode.GET_FAILOVER_LOG, Opcode.DCP_GET_FAILOVER_LOG]),
        entries=failover),
    rsp(m.DcpAddStreamResponse, stream_opaque=u32),
    rsp(m.StreamReqOk, failover_log=failover),
    rsp(m.StreamReqRollback, status=st.just(Status.ROLLBACK), rollback_seqno=u64),
    st.builds(m.GenericResponse, op=u8.filter(lambda o: o not in typed_success_ops),
              status=u16.filter(lambda s: s != Status.ROLLBACK), **COMMON_RSP,
              extras=blob, key=st.binary(max_size=40), value=blob),
    st.builds(m.GenericResponse, op=st.sampled_from(sorted(typed_success_ops)),
              status=u16.filter(lambda s: s not in (Status.SUCCESS, Status.ROLLBACK)), **COMMON_RSP,
              extras=blob, key=st.binary(max_size=40), value=blob),
)


@given(MESSAGES)
@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
def test_encode_then_decode_is_identity(msg):
    raw = msg.encode()
    frame, used = decode_frame(raw)
    assert used == len(raw)
    assert decode_message(frame) == msg


def _consume(data: bytes) -> int:
    """Feed hostile bytes through the decoder; only ProtocolError may escape."""
    dec = FrameDecoder(max_body=1 << 16)
    dec.feed(data)
    n = 0
    for _ in range(len(data) + 1):  # bounded: every step consumes at least 24 bytes or stops
        try:
            frame = dec.next_frame()
        except ProtocolError as exc:
            if exc.frame_size and not exc.framing_lost and exc.frame_size <= dec.buffered:
                dec.skip(exc.frame_size)
                continue
            break
        if frame is None:
            break
        n += 1
        try:
            decode_message(frame)
        except ProtocolError:
            pass
    return n


@given(st.binary(max_size=400))
@settings(max_examples=800)
def test_random_bytes_raise_only_protocol_error(data):
    _consume(data)


@given(MESSAGES, st.data())
@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
def test_truncated_and_bitflipped_frames(msg, data):
    raw = bytearray(msg.encode())
    cut = data.draw(st.integers(0, len(raw)))
    _consume(bytes(raw[:cut]))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    _consume(bytes(raw))


@given(st.lists(MESSAGES, min_size=1, max_size=12), st.data())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_random_chunking_yields_the_same_frames(msgs, data):
    stream = b"".join(x.encode() for x in msgs)
    dec = FrameDecoder()
    got = []
    pos = 0
    while pos < len(stream):
        step = data.draw(st.integers(1, 64))
        dec.feed(stream[pos:pos + step])
        pos += step
        got.extend(dec)
    assert dec.buffered == 0
    assert [decode_message(f) for f in got] == msgs


def test_oversized_body_rejected_before_buffering():
    dec = FrameDecoder(max_body=1000)
    header = bytes.fromhex("80 01 00 01 08 00 00 00".replace(" ", "")) + (5000).to_bytes(4, "big") + bytes(12)
    dec.feed(header)  # only the header: the declared body is already too large
    try:
        dec.next_frame()
    except ProtocolError as exc:
        assert exc.field == "body_length" and exc.framing_lost
    else:
        raise AssertionError("oversized body accepted")


def test_unknown_magic_loses_framing():
    dec = FrameDecoder()
    dec.feed(b"\x42" + bytes(23))
    try:
        dec.next_frame()
    except ProtocolError as exc:
        assert exc.field == "magic" and exc.framing_lost
    else:
        raise AssertionError("unknown magic accepted")


def test_inconsistent_lengths_are_skippable():
    # keylen 10 but body length 4: the frame boundary is known, so a reader can skip it
    bad = bytes([0x80, 0x00, 0x00, 0x0A, 0, 0, 0, 0]) + (4).to_bytes(4, "big") + bytes(12) + b"abcd"
    good = m.Noop(opaque=7).encode()
    dec = FrameDecoder()
    dec.feed(bad + good)
    try:
        dec.next_frame()
    except ProtocolError as exc:
        assert exc.field == "body_length" and not exc.framing_lost and exc.frame_size == 28
        dec.skip(exc.frame_size)
    assert decode_message(dec.next_frame()) == m.Noop(opaque=7)


def test_stream_id_uses_flexible_framing():
    msg = m.DcpMutation(key=b"k", value=b"v", by_seqno=1, stream_id=0x1234)
    raw = msg.encode()
    assert raw[0] == 0x08 and raw[2] == 3 and raw[3] == 1 and raw[24:27] == b"\x22\x12\x34"
    assert decode_message(decode_frame(raw)[0]).stream_id == 0x1234
