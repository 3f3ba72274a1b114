"""The sans-I/O session, fed with bytes a producer would send: handshake, records as tuples
and as typed messages, positions (consistent and per message), NOOP replies, buffer acks,
rollback (callback, override, fail_on_rollback), stream-end re-requests and errors.
Split points anywhere in the byte stream give the same events."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from dcptool.client import (
    DELETION, EXPIRATION, MUTATION, ROLLBACK, SNAPSHOT, STREAM_END, STREAM_OPEN,
    DcpSession, NotMyVbucketError, Position, RollbackError, SessionConfig, StreamError,
)
from dcptool.protocol import FrameDecoder, decode_message, encode_frame
from dcptool.protocol.constants import Magic, Opcode, Status, StreamEndReason
from dcptool.protocol.messages import (
    DcpBufferAck, DcpControl, DcpDeletion, DcpExpiration, DcpMutation, DcpNoop, DcpOpen,
    DcpSnapshotMarker, DcpStreamEnd, DcpStreamReq, StreamReqOk, StreamReqRollback,
)

W, X = 0x1111, 0x2222


def sent(session: DcpSession) -> list:
    dec = FrameDecoder()
    dec.feed(session.data_to_send())
    return [decode_message(f) for f in dec]


def ok(msg) -> bytes:
    return encode_frame(Magic.RESPONSE, msg.opcode, 0, msg.opaque)


def handshake(session: DcpSession) -> dict[int, DcpStreamReq]:
    """Answer DCP_OPEN and the controls with success; return the stream requests by vbucket."""
    reqs = {}
    replies = b""
    for m in sent(session):
        if isinstance(m, (DcpOpen, DcpControl)):
            replies += ok(m)
        elif isinstance(m, DcpStreamReq):
            reqs[m.vbucket] = m
    assert session.feed(replies) == []
    return reqs


def mutation(vb, opaque, seq, key=b"k", value=b"v", **kw):
    return DcpMutation(vbucket=vb, opaque=opaque, by_seqno=seq, rev_seqno=kw.pop("rev", 1),
                       key=key, value=value, cas=kw.pop("cas", 99), flags=kw.pop("flags", 7),
                       expiry=kw.pop("expiry", 0), **kw).encode()


def marker(vb, opaque, s, e, flags=1):
    return DcpSnapshotMarker(vbucket=vb, opaque=opaque, start_seqno=s, end_seqno=e, flags=flags).encode()


def accept(req, log=((W, 0),)):
    return StreamReqOk(opaque=req.opaque, failover_log=log).encode()


def test_handshake_sends_open_and_controls():
    s = DcpSession(SessionConfig(name="t1", no_value=True, buffer_size=1000, noop_interval=5))
    s.start()
    msgs = sent(s)
    assert isinstance(msgs[0], DcpOpen) and msgs[0].name == "t1"
    assert msgs[0].flags == 0x01 | 0x08 | 0x20  # producer, no value, delete times
    controls = {m.key: m.value for m in msgs[1:]}
    assert controls["connection_buffer_size"] == b"1000"
    assert controls["enable_noop"] == b"true"
    assert controls["set_noop_interval"] == b"5"
    assert controls["enable_expiry_opcode"] == b"true"
    assert controls["send_stream_end_on_client_close_stream"] == b"true"


def test_records_snapshots_and_positions():
    s = DcpSession(SessionConfig())
    s.add_stream(3, Position())
    req = handshake(s)[3]
    assert (req.start_seqno, req.vbucket_uuid, req.end_seqno) == (0, 0, 2**64 - 1)
    op = req.opaque
    data = (accept(req) + marker(3, op, 0, 3) + mutation(3, op, 1, b"a", b"va", rev=5, cas=11,
            flags=0xDEADBEEF, expiry=1234, datatype=1)
            + DcpDeletion(vbucket=3, opaque=op, by_seqno=2, rev_seqno=2, key=b"b", delete_time=77,
                          cas=12).encode()
            + DcpExpiration(vbucket=3, opaque=op, by_seqno=3, rev_seqno=4, key=b"c",
                            delete_time=88, cas=13).encode())
    ev = s.feed(data)
    assert ev[0] == (STREAM_OPEN, 3, ((W, 0),), Position())
    assert ev[1] == (SNAPSHOT, 3, 0, 3, 1)
    assert ev[2] == (MUTATION, 3, 1, 5, 11, 0xDEADBEEF, 1234, 1, b"a", b"va")
    assert ev[3] == (DELETION, 3, 2, 2, 12, 0, 77, 0, b"b", b"")
    assert ev[4] == (EXPIRATION, 3, 3, 4, 13, 0, 88, 0, b"c", b"")
    p = s.position(3)
    assert (p.uuid, p.seqno, p.snap_start, p.snap_end) == (W, 3, 3, 3)
    assert p.failover_log == ((W, 0),)
    # a second snapshot, half received
    s.feed(marker(3, op, 4, 6) + mutation(3, op, 4) + mutation(3, op, 5))
    consistent = s.position(3)
    assert (consistent.seqno, consistent.snap_start, consistent.snap_end) == (3, 3, 3)
    live = s.position(3, consistent=False)
    assert (live.seqno, live.snap_start, live.snap_end) == (5, 4, 6)
    assert 3 in consistent.snapshot_ends


def test_snapshot_complete_when_next_marker_arrives_without_reaching_end():
    s = DcpSession()
    s.add_stream(0)
    req = handshake(s)[0]
    op = req.opaque
    # the node says the snapshot ends at 10 but the last item in it is 8 (e.g. deduplicated)
    s.feed(accept(req) + marker(0, op, 0, 10) + mutation(0, op, 8))
    assert s.position(0).seqno == 0
    s.feed(marker(0, op, 11, 12))
    assert s.position(0).seqno == 10


def test_typed_records():
    s = DcpSession(SessionConfig(typed=True))
    s.add_stream(1)
    req = handshake(s)[1]
    ev = s.feed(accept(req) + marker(1, req.opaque, 0, 1) + mutation(1, req.opaque, 1, b"k", b"v"))
    kind, vb, msg = ev[2]
    assert (kind, vb) == (MUTATION, 1)
    assert isinstance(msg, DcpMutation) and msg.key == b"k" and msg.by_seqno == 1
    assert isinstance(ev[1][2], DcpSnapshotMarker)


def test_memoryview_values_when_not_copying():
    s = DcpSession(SessionConfig(copy_values=False))
    s.add_stream(1)
    req = handshake(s)[1]
    ev = s.feed(accept(req) + marker(1, req.opaque, 0, 1) + mutation(1, req.opaque, 1, b"k", b"xyz"))
    assert isinstance(ev[2][9], memoryview) and bytes(ev[2][9]) == b"xyz"


def test_noop_is_answered_with_same_opaque():
    s = DcpSession()
    s.start()
    handshake(s)
    raw_opaque = 0x05000000  # the node's counter in host order: echo the bytes unchanged
    s.feed(DcpNoop(opaque=raw_opaque).encode())
    out = s.data_to_send()
    assert out == encode_frame(Magic.RESPONSE, Opcode.DCP_NOOP, 0, raw_opaque)
    assert s.noops_answered == 1


def test_buffer_ack_after_ratio_of_window():
    s = DcpSession(SessionConfig(buffer_size=1000, ack_ratio=0.5))
    s.add_stream(0)
    req = handshake(s)[0]
    s.feed(accept(req))
    assert s.data_to_send() == b""  # responses are not flow controlled
    one = mutation(0, req.opaque, 1, b"k" * 10, b"v" * 200)
    s.feed(marker(0, req.opaque, 0, 10) + one)
    assert s.data_to_send() == b""  # 44 + 265 < 500
    s.feed(mutation(0, req.opaque, 2, b"k" * 10, b"v" * 200))
    msgs = sent(s)
    assert len(msgs) == 1 and isinstance(msgs[0], DcpBufferAck)
    assert msgs[0].bytes_to_ack == 44 + 2 * len(one)


def test_rollback_reports_moves_and_re_requests():
    seen = []
    s = DcpSession(on_rollback=lambda info: seen.append(info))
    start = Position(W, 1000, 1000, 1000, ((W, 0),), (500, 900, 1000))
    s.add_stream(0, start)
    req = handshake(s)[0]
    assert (req.start_seqno, req.vbucket_uuid, req.snap_start_seqno, req.snap_end_seqno) == \
        (1000, W, 1000, 1000)
    ev = s.feed(StreamReqRollback(opaque=req.opaque, rollback_seqno=900).encode())
    assert ev[0][:3] == (ROLLBACK, 0, 900)
    info = ev[0][3]
    assert info.before == start and info.after.seqno == 900 and seen == [info]
    (again,) = sent(s)
    assert isinstance(again, DcpStreamReq)
    assert (again.start_seqno, again.snap_start_seqno, again.snap_end_seqno, again.vbucket_uuid) == \
        (900, 900, 900, W)
    ev = s.feed(accept(again, ((X, 900), (W, 0))) + marker(0, again.opaque, 900, 901)
                + mutation(0, again.opaque, 901))
    assert ev[0][0] == STREAM_OPEN
    p = s.position(0)
    assert (p.uuid, p.seqno) == (X, 901)


def test_rollback_callback_may_choose_an_earlier_position():
    s = DcpSession(on_rollback=lambda info: Position.at(W, 400, ((W, 0),)))
    s.add_stream(0, Position(W, 1000, 1000, 1000, ((W, 0),), (1000,)))
    req = handshake(s)[0]
    ev = s.feed(StreamReqRollback(opaque=req.opaque, rollback_seqno=900).encode())
    assert ev[0][3].after.seqno == 400
    assert sent(s)[0].start_seqno == 400


def test_rollback_callback_above_rollback_seqno_is_refused():
    s = DcpSession(on_rollback=lambda info: Position.at(W, 950, ((W, 0),)))
    s.add_stream(0, Position(W, 1000, 1000, 1000, ((W, 0),), (1000,)))
    req = handshake(s)[0]
    s.feed(StreamReqRollback(opaque=req.opaque, rollback_seqno=900).encode())
    assert isinstance(s.take_error(), StreamError)


def test_fail_on_rollback():
    s = DcpSession(SessionConfig(fail_on_rollback=True))
    s.add_stream(5, Position(W, 10, 10, 10, ((W, 0),)))
    req = handshake(s)[5]
    assert s.feed(StreamReqRollback(opaque=req.opaque, rollback_seqno=0).encode()) == []
    err = s.take_error()
    assert isinstance(err, RollbackError) and err.vbucket == 5 and "vbucket 5" in str(err)
    assert s.done


def test_repeated_rollback_falls_back_to_zero():
    s = DcpSession()
    s.add_stream(0, Position(W, 1000, 1000, 1000, ((W, 0),), (900, 1000)))
    req = handshake(s)[0]
    s.feed(StreamReqRollback(opaque=req.opaque, rollback_seqno=950).encode())
    again = sent(s)[0]
    assert again.start_seqno == 900
    # the node asks again for a point at or above where we are: go to 0
    s.feed(StreamReqRollback(opaque=again.opaque, rollback_seqno=900).encode())
    assert sent(s)[0].start_seqno == 0


@pytest.mark.parametrize("reason", [StreamEndReason.STATE_CHANGED, StreamEndReason.SLOW])
def test_stream_end_retry_re_requests_from_position(reason):
    s = DcpSession()
    s.add_stream(2)
    req = handshake(s)[2]
    op = req.opaque
    s.feed(accept(req) + marker(2, op, 0, 5) + mutation(2, op, 1) + mutation(2, op, 2))
    ev = s.feed(DcpStreamEnd(vbucket=2, opaque=op, reason=reason).encode())
    assert ev == [(STREAM_END, 2, int(reason), True)]
    (again,) = sent(s)
    assert (again.start_seqno, again.snap_start_seqno, again.snap_end_seqno, again.vbucket_uuid) \
        == (2, 0, 5, W)
    assert not s.done


def test_stream_end_ok_finishes_at_snapshot_end():
    s = DcpSession()
    s.add_stream(2, end_seqno=3)
    req = handshake(s)[2]
    assert req.end_seqno == 3
    op = req.opaque
    s.feed(accept(req) + marker(2, op, 0, 4) + mutation(2, op, 2))
    ev = s.feed(DcpStreamEnd(vbucket=2, opaque=op, reason=0).encode())
    assert ev == [(STREAM_END, 2, 0, False)]
    assert s.done and s.position(2).seqno == 4


def test_position_beyond_end_still_asks_node():
    s = DcpSession()
    s.add_stream(0, Position.at(W, 50, ((W, 0),)), end_seqno=10)
    req = handshake(s)[0]
    assert (req.start_seqno, req.end_seqno) == (50, 50)


def test_not_my_vbucket_names_vbucket():
    s = DcpSession(address="n:1")
    s.add_stream(7)
    s.add_stream(8)
    reqs = handshake(s)
    ev = s.feed(encode_frame(Magic.RESPONSE, Opcode.DCP_STREAM_REQ, Status.NOT_MY_VBUCKET,
                             reqs[7].opaque) + accept(reqs[8]))
    assert ev == [(STREAM_OPEN, 8, ((W, 0),), Position())]
    err = s.take_error()
    assert isinstance(err, NotMyVbucketError) and err.vbucket == 7 and "n:1" in str(err)
    assert not s.done  # vbucket 8 goes on


def test_refused_dcp_open_is_an_error():
    s = DcpSession()
    s.start()
    replies = b""
    for m in sent(s):
        replies += encode_frame(Magic.RESPONSE, m.opcode,
                                Status.EACCESS if isinstance(m, DcpOpen) else 0, m.opaque)
    s.feed(replies)
    assert "refused to open a DCP connection" in str(s.take_error())


def test_close_stream_waits_for_stream_end():
    s = DcpSession()
    s.add_stream(0)
    req = handshake(s)[0]
    s.feed(accept(req))
    s.close_stream(0)
    (close,) = sent(s)
    assert s.feed(ok(close)) == []
    ev = s.feed(DcpStreamEnd(vbucket=0, opaque=req.opaque, reason=1).encode())
    assert ev == [(STREAM_END, 0, 1, False)] and s.done


def _stream_bytes():
    s = DcpSession()
    s.add_stream(0)
    s.add_stream(1)
    reqs = handshake(s)
    data = accept(reqs[0]) + accept(reqs[1])
    for vb in (0, 1):
        op = reqs[vb].opaque
        data += marker(vb, op, 0, 20)
        for i in range(1, 21):
            data += mutation(vb, op, i, b"key%d" % i, b"x" * (i * 7))
        data += DcpNoop(opaque=i).encode()
    return s, data


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3000), max_size=30))
def test_any_split_gives_same_events(cuts):
    whole_session, data = _stream_bytes()
    expected = whole_session.feed(data)
    s, _ = _stream_bytes()
    got = []
    prev = 0
    for c in sorted(set(c for c in cuts if c < len(data))) + [len(data)]:
        got += s.feed(data[prev:c])
        prev = c
    assert got == expected
    assert s.positions() == whole_session.positions()


def test_temporary_failure_waits_and_is_retried():
    s = DcpSession(SessionConfig(max_temporary_failures=2))
    s.add_stream(4, Position.at(W, 3, ((W, 0),)))
    req = handshake(s)[4]
    s.feed(encode_frame(Magic.RESPONSE, Opcode.DCP_STREAM_REQ, Status.ETMPFAIL, req.opaque))
    assert s.waiting() == [4] and s.errors == [] and not s.done
    assert s.data_to_send() == b""
    s.retry_waiting()
    (again,) = sent(s)
    assert again.vbucket == 4 and again.start_seqno == 3
    s.feed(encode_frame(Magic.RESPONSE, Opcode.DCP_STREAM_REQ, Status.ENOMEM, again.opaque))
    s.retry_waiting()
    (third,) = sent(s)
    s.feed(encode_frame(Magic.RESPONSE, Opcode.DCP_STREAM_REQ, Status.ETMPFAIL, third.opaque))
    err = s.take_error()
    assert isinstance(err, StreamError) and err.vbucket == 4 and "ETMPFAIL" in str(err)
