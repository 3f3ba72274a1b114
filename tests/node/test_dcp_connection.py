"""DCP connection-level behaviour: open flags, controls, flow control, noop, close, state changes."""
from __future__ import annotations

import struct
import time

import pytest

from dcptool.protocol.constants import (
    DcpOpenFlag,
    Opcode,
    Status,
    StreamEndReason,
    StreamFlag,
)
from dcptool.protocol.messages import DcpDeletion, DcpExpiration, DcpMutation, DcpStreamEnd

from dcptool.protocol import encode_stream_id

from .dcputil import connect, dcp_connect, high_seqno, vb_uuid
from .mcbputil import wait_persisted


def xattr_value(body: bytes, pairs: dict[bytes, bytes]) -> bytes:
    blob = b"".join(struct.pack(">I", len(k) + len(v) + 2) + k + b"\x00" + v + b"\x00"
                    for k, v in pairs.items())
    return struct.pack(">I", len(blob)) + blob + body


# -- DCP_OPEN -------------------------------------------------------------------------------


@pytest.mark.parametrize("flags,status", [
    (0x001, Status.SUCCESS),
    (0x001 | 0x004 | 0x020, Status.SUCCESS),
    (0x001 | 0x002, Status.EINVAL),                 # the old Notifier bit
    (0x001 | 0x010, Status.EINVAL),
    (0x001 | 0x080, Status.EINVAL),                 # PiTR, removed
    (0x001 | 0x008 | 0x040, Status.EINVAL),         # NoValue and NoValueWithUnderlyingDatatype
    (0x001 | 0x100, Status.EINVAL),                 # deleted user xattrs need IncludeXattrs
    (0x001 | 0x400, Status.EINVAL),
])
def test_dcp_open_flag_validation(shared_node, flags, status):
    with connect(shared_node) as c:
        f = c.call(Opcode.DCP_OPEN, key=b"open-test", extras=struct.pack(">II", 0, flags))
        assert f.status == status


def test_dcp_open_twice_and_dcp_commands_on_a_plain_connection(shared_node):
    with connect(shared_node) as c:
        for op in (Opcode.DCP_CONTROL, Opcode.DCP_GET_FAILOVER_LOG, Opcode.DCP_CLOSE_STREAM):
            kw = {"key": b"enable_noop", "value": b"true"} if op == Opcode.DCP_CONTROL else {}
            assert c.call(op, **kw).status == Status.EINVAL
        # the failover log is still available through 0x96 on any connection
        assert c.call(Opcode.GET_FAILOVER_LOG, vbucket=0).status == Status.SUCCESS
    with dcp_connect(shared_node, "twice") as c:
        assert c.open("twice-again").status == Status.EINVAL


def test_a_second_connection_with_the_same_name_replaces_the_first(shared_node):
    first = dcp_connect(shared_node, "same-name")
    second = dcp_connect(shared_node, "same-name")
    with pytest.raises(ConnectionError):
        first.recv(timeout=5)
    assert second.stream_req(0, end=0).status == Status.SUCCESS
    first.close()
    second.close()


def test_controls_known_unknown_and_nul_padded(shared_node):
    with dcp_connect(shared_node, "controls") as c:
        ok = [("connection_buffer_size", "4000000"), ("enable_noop", "true"),
              ("set_noop_interval", "180"), ("set_priority", "medium"),
              ("enable_expiry_opcode", "true"), ("send_stream_end_on_client_close_stream", "true"),
              ("supports_cursor_dropping", "true"), ("supports_hifi_MFU", "true"),
              ("supports_cursor_dropping_vulcan", "true")]
        for k, v in ok:
            assert c.control(k, v).status == Status.SUCCESS, k
        # libdcp pads its value with NUL bytes
        assert c.control("connection_buffer_size", b"20971520\x00\x00").status == Status.SUCCESS
        bad = [("enable_ext_metadata", "true"), ("no_such_key", "1"), ("set_priority", "urgent"),
               ("connection_buffer_size", "lots"), ("set_noop_interval", "zero"),
               ("force_value_compression", "true")]
        for k, v in bad:
            assert c.control(k, v).status == Status.EINVAL, k
        assert c.control("stream_buffer_size", "1000").status == Status.NOT_SUPPORTED


# -- stream requests ---------------------------------------------------------------------------


def test_stream_request_errors(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as kv:
        for i in range(5):
            kv.set(b"e%d" % i, b"v", vbucket=0)
        kv.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=2)  # replica
        kv.call(Opcode.SET_VBUCKET, extras=b"\x04", vbucket=3)  # dead
        uuid = vb_uuid(kv, 0)
    with dcp_connect(node) as c:
        assert c.stream_req(9).status == Status.NOT_MY_VBUCKET
        assert c.stream_req(3).status == Status.NOT_MY_VBUCKET
        assert c.stream_req(2, flags=StreamFlag.ACTIVE_VB_ONLY).status == Status.NOT_MY_VBUCKET
        assert c.stream_req(2, end=0).status == Status.SUCCESS  # replicas may be streamed
        assert c.stream_req(0, start=3, end=2, uuid=uuid).status == Status.ERANGE
        assert c.stream_req(0, start=3, uuid=uuid, snap_start=4, snap_end=5).status == Status.ERANGE
        assert c.stream_req(0, start=9, uuid=uuid).status == Status.ROLLBACK
        assert c.stream_req(0).status == Status.SUCCESS
        assert c.stream_req(0, opaque=99).status == Status.KEY_EEXISTS
        # takeover streams only from an active vbucket; cache transfer is not supported
        assert c.stream_req(2, flags=StreamFlag.TAKEOVER).status == Status.NOT_MY_VBUCKET
        assert c.stream_req(1, flags=StreamFlag.CACHE_TRANSFER).status == Status.NOT_SUPPORTED
        # libdcp's unswapped flags (0x30000000) are tolerated
        assert c.stream_req(1, flags=0x30000000, end=0).status == Status.SUCCESS


def test_noop_is_required_before_streaming_xattrs(shared_node):
    with dcp_connect(shared_node, "x-no-noop", flags=0x1 | 0x4) as c:
        assert c.stream_req(0).status == Status.NOT_SUPPORTED
        assert c.control("enable_noop", "true").status == Status.SUCCESS
        assert c.stream_req(0, end=0).status == Status.SUCCESS


def test_to_latest_disk_only_and_from_latest(node_factory):
    node = node_factory(vbuckets=4, extra_args=("--flush-interval", "3600"))
    with connect(node) as kv:
        for i in range(10):
            kv.set(b"t%d" % i, b"v", vbucket=0)
        with dcp_connect(node) as c:
            assert c.stream_req(0, flags=StreamFlag.TO_LATEST).status == Status.SUCCESS
            kv.set(b"late", b"v", vbucket=0)
            c.drain()
            assert c.log(0).seqnos() == list(range(1, 11)), "ends at the high seqno of the request"
            # nothing was persisted: a disk-only stream ends at once
            assert c.stream_req(0, flags=StreamFlag.DISK_ONLY, opaque=5).status == Status.SUCCESS
            c.drain(streams=2)
            assert c.log(0, 5).items == [] and c.log(0, 5).end == StreamEndReason.OK
            # from latest: nothing old, only what comes next
            assert c.stream_req(0, flags=StreamFlag.FROM_LATEST, opaque=6).status == Status.SUCCESS
            kv.set(b"next", b"v", vbucket=0)
            c.read_n(2)
            assert c.log(0, 6).seqnos() == [12]


# -- what a stream carries --------------------------------------------------------------------


def _docs_with_xattrs_deletes_and_expiry(node):
    with connect(node) as kv:
        kv.set(b"plain", b'{"a":1}', vbucket=0)                              # 1
        kv.set(b"withx", xattr_value(b'{"b":2}', {b"_sys": b'{"x":1}'}), vbucket=0,
               datatype=0x05)                                                # 2
        kv.set(b"gone", b"v", vbucket=0)                                     # 3
        kv.delete(b"gone", vbucket=0)                                        # 4
        kv.set(b"ttl", b"v", vbucket=0, expiry=int(time.time()) - 10)        # 5
        assert kv.get(b"ttl", vbucket=0).status == Status.KEY_ENOENT         # 6: expired


@pytest.mark.parametrize("flags,expiry_opcode", [
    (0x1, False), (0x1 | 0x20, False), (0x1 | 0x20, True), (0x1 | 0x4, False),
    (0x1 | 0x8, False), (0x1 | 0x4 | 0x8, False),
])
def test_mutations_deletions_expirations_xattrs_and_no_value(node_factory, flags, expiry_opcode):
    node = node_factory(vbuckets=1)
    _docs_with_xattrs_deletes_and_expiry(node)
    with dcp_connect(node, flags=flags) as c:
        c.control("enable_noop", "true")
        if expiry_opcode:
            assert c.control("enable_expiry_opcode", "true").status == Status.SUCCESS
        assert c.stream_req(0, end=6).status == Status.SUCCESS
        c.drain()
        items = {i.key: i for i in c.log(0).items}
    xattrs = bool(flags & DcpOpenFlag.INCLUDE_XATTRS)
    no_value = bool(flags & DcpOpenFlag.NO_VALUE)
    delete_times = bool(flags & DcpOpenFlag.INCLUDE_DELETE_TIMES)
    plain, withx = items[b"plain"], items[b"withx"]
    assert isinstance(plain, DcpMutation) and plain.by_seqno == 1 and plain.rev_seqno == 1
    assert plain.value == (b"" if no_value else b'{"a":1}')
    assert plain.datatype == (0 if no_value else 0x01)
    if xattrs:
        blob = xattr_value(b"", {b"_sys": b'{"x":1}'})
        assert withx.value == blob + (b"" if no_value else b'{"b":2}')
        assert withx.datatype & 0x04
    else:
        assert withx.value == (b"" if no_value else b'{"b":2}')
        assert not withx.datatype & 0x04
    gone = items[b"gone"]
    assert isinstance(gone, DcpDeletion) and gone.by_seqno == 4
    assert (gone.delete_time is not None) == delete_times
    ttl = items[b"ttl"]
    assert ttl.by_seqno == 6
    if expiry_opcode and delete_times:
        assert isinstance(ttl, DcpExpiration)
    else:
        assert isinstance(ttl, DcpDeletion)


# -- closing and ending streams ---------------------------------------------------------------


def test_close_stream_with_and_without_stream_end(shared_node):
    with dcp_connect(shared_node, "closer") as c:
        assert c.stream_req(1).status == Status.SUCCESS
        assert c.call(Opcode.DCP_CLOSE_STREAM, vbucket=1).status == Status.SUCCESS
        assert c.call(Opcode.DCP_CLOSE_STREAM, vbucket=1).status == Status.KEY_ENOENT
        c.control("send_stream_end_on_client_close_stream", "true")
        assert c.stream_req(1, opaque=77).status == Status.SUCCESS
        assert c.call(Opcode.DCP_CLOSE_STREAM, vbucket=1).status == Status.SUCCESS
        c.drain(streams=1)
        assert c.log(1, 77).end == StreamEndReason.CLOSED
        # the vbucket can be streamed again
        assert c.stream_req(1, opaque=78, end=0).status == Status.SUCCESS


def test_a_vbucket_state_change_ends_its_streams(node_factory):
    node = node_factory(vbuckets=4)
    with dcp_connect(node) as c, connect(node) as kv:
        assert c.stream_req(2).status == Status.SUCCESS
        assert c.stream_req(3).status == Status.SUCCESS
        kv.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=2)
        msg = c.next_message(timeout=5)
        assert isinstance(msg, DcpStreamEnd) and msg.vbucket == 2
        assert msg.reason == StreamEndReason.STATE_CHANGED
        kv.set(b"k", b"v", vbucket=3)
        c.read_n(2)
        assert c.log(3).seqnos() == [1]


def test_streams_on_one_connection_over_many_vbuckets_with_stream_end_at_end(node_factory):
    node = node_factory(vbuckets=16)
    with connect(node) as kv:
        for i in range(400):
            kv.set(b"many-%d" % i, b"v")
        highs = {vb: high_seqno(kv, vb) for vb in range(16)}
    with dcp_connect(node) as c:
        for vb in range(16):
            assert c.stream_req(vb, end=highs[vb]).status == Status.SUCCESS
        c.drain(streams=16)
        for vb in range(16):
            log = c.log(vb)
            log.check_consistent()
            assert log.seqnos() == list(range(1, highs[vb] + 1))
            assert log.end == StreamEndReason.OK


# -- flow control --------------------------------------------------------------------------------


def test_flow_control_stops_once_the_buffer_is_outstanding(node_factory):
    """The node sends while less than the buffer is unacknowledged, so it may overshoot by
    one message (fact sheet 7.1, kv_engine's BufferLog), never more."""
    node = node_factory(vbuckets=8)
    with connect(node) as kv:
        for i in range(3000):
            kv.set(b"fc-%d" % i, b"x" * (50 + i % 400))
        highs = {vb: high_seqno(kv, vb) for vb in range(8)}
        wait_persisted(kv)
    node.restart()  # half from disk, half from memory
    with connect(node) as kv:
        for i in range(3000, 4000):
            kv.set(b"fc-%d" % i, b"y" * 300)
        highs = {vb: high_seqno(kv, vb) for vb in range(8)}
    buffer_size = 20000
    with dcp_connect(node, "fc") as c:
        assert c.control("connection_buffer_size", str(buffer_size)).status == Status.SUCCESS
        for vb in range(8):
            assert c.stream_req(vb, end=highs[vb]).status == Status.SUCCESS
        # read everything the node is willing to send without acking: it must stop
        with pytest.raises(TimeoutError):
            while True:
                c.next_message(timeout=0.5)
        largest = 55 + len(b"fc-3999") + 450  # the largest message: a mutation's frame
        assert buffer_size <= c.received_bytes < buffer_size + largest
        # then ack in uneven steps and check the bound all along
        c.drain(streams=8, ack_every=7000)
        assert c.max_unacked < buffer_size + largest
        for vb in range(8):
            assert c.log(vb).seqnos()[-1] == highs[vb]
        stats = c.stats("dcp")
        assert int(stats["eq_dcpq:fc:max_unacked_bytes_seen"]) < buffer_size + largest


# -- noop -----------------------------------------------------------------------------------------


def test_a_client_that_ignores_noop_is_disconnected(shared_node):
    c = dcp_connect(shared_node, "deaf")
    c.answer_noops = False
    assert c.control("enable_noop", "true").status == Status.SUCCESS
    assert c.control("set_noop_interval", "0.5").status == Status.SUCCESS
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        while time.monotonic() - t0 < 10:
            c.next_message(timeout=10)
    assert c.noops >= 1
    assert 0.9 < time.monotonic() - t0 < 8
    c.close()


def test_a_client_that_answers_noop_stays(shared_node):
    with dcp_connect(shared_node, "polite") as c:
        assert c.control("enable_noop", "true").status == Status.SUCCESS
        assert c.control("set_noop_interval", "0.3").status == Status.SUCCESS
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            with pytest.raises(TimeoutError):
                c.next_message(timeout=0.2)
        assert c.noops >= 3
        assert c.call(Opcode.NOOP).status == Status.SUCCESS


def test_stream_ids_allow_several_streams_per_vbucket(node_factory):
    node = node_factory(vbuckets=2)
    with connect(node) as kv:
        for i in range(3):
            kv.set(b"sid-%d" % i, b"v", vbucket=1)
    forever = struct.pack(">IIQQQQQ", 0, 0, 0, 2**64 - 1, 0, 0, 0)
    with dcp_connect(node, "sids") as c:
        assert c.control("enable_stream_id", "true").status == Status.SUCCESS
        assert c.stream_req(1).status == Status.DCP_STREAM_ID_INVALID  # no stream id
        for sid, opaque in ((7, 70), (9, 90)):
            f = c.call(Opcode.DCP_STREAM_REQ, vbucket=1, opaque=opaque,
                       framing=encode_stream_id(sid), extras=forever)
            assert f.status == Status.SUCCESS
        f = c.call(Opcode.DCP_STREAM_REQ, vbucket=1, opaque=71, framing=encode_stream_id(7),
                   extras=forever)
        assert f.status == Status.KEY_EEXISTS
        frames = [c.recv(timeout=5) for _ in range(8)]
        assert all(f.magic == 0x08 for f in frames), "every stream message carries its id"
        by_sid = {}
        for f in frames:
            m = c.decode(f)
            by_sid.setdefault(m.stream_id, []).append(type(m).__name__)
        assert set(by_sid) == {7, 9}
        for kinds in by_sid.values():
            assert kinds == ["DcpSnapshotMarker"] + ["DcpMutation"] * 3
        assert c.call(Opcode.DCP_CLOSE_STREAM, vbucket=1).status == Status.DCP_STREAM_ID_INVALID
        f = c.call(Opcode.DCP_CLOSE_STREAM, vbucket=1, framing=encode_stream_id(9))
        assert f.status == Status.SUCCESS
        f = c.call(Opcode.DCP_CLOSE_STREAM, vbucket=1, framing=encode_stream_id(9))
        assert f.status == Status.KEY_ENOENT


@pytest.mark.parametrize("buffer_size", [0, 100_000])
def test_documents_larger_than_the_quantum_or_the_buffer_still_flow(node_factory, buffer_size):
    node = node_factory(vbuckets=1)
    big = [bytes([65 + i]) * (1024 * 1024 + i) for i in range(3)]
    with connect(node) as kv:
        for i, v in enumerate(big):
            assert kv.set(b"big-%d" % i, v, vbucket=0).status == Status.SUCCESS
    with dcp_connect(node, "big") as c:
        if buffer_size:
            assert c.control("connection_buffer_size", str(buffer_size)).status == Status.SUCCESS
        assert c.stream_req(0, end=3).status == Status.SUCCESS
        c.drain(ack_every=1, timeout=30)
        assert [i.value for i in c.log(0).items] == big
