"""The worked byte sequences of the fact sheet (section 9) decode to the stated fields."""
from dcptool.protocol import (
    DcpBufferAck,
    DcpControl,
    DcpDeletion,
    DcpMutation,
    DcpNoop,
    DcpOpen,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpStreamReq,
    GenericResponse,
    StreamReqOk,
    StreamReqRollback,
    decode_frame,
    decode_message,
)
from dcptool.protocol.constants import DcpOpenFlag, Opcode, SnapshotFlag, Status


def _msg(hexstr: str):
    raw = bytes.fromhex("".join(hexstr.split()))
    frame, used = decode_frame(raw)
    assert used == len(raw)
    msg = decode_message(frame)
    assert msg.encode() == raw
    return msg


def test_example1_stream_req_and_ok():
    req = _msg("""80 53 00 00 30 00 00 00 00 00 00 30 00 00 00 01 00 00 00 00 00 00 00 00
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00""")
    assert isinstance(req, DcpStreamReq)
    assert (req.vbucket, req.opaque, req.start_seqno, req.end_seqno) == (0, 1, 0, 2**64 - 1)
    assert (req.vbucket_uuid, req.snap_start_seqno, req.snap_end_seqno, req.flags) == (0, 0, 0, 0)
    ok = _msg("""81 53 00 00 00 00 00 00 00 00 00 10 00 00 00 01 00 00 00 00 00 00 00 00
        00 00 3a 4f 8c 2e 7b 15 00 00 00 00 00 00 00 00""")
    assert isinstance(ok, StreamReqOk)
    assert ok.opaque == 1 and ok.failover_log == ((0x00003A4F8C2E7B15, 0),)


def test_example2_snapshot_marker_v1():
    m = _msg("""80 56 00 00 14 00 00 00 00 00 00 14 00 00 00 01 00 00 00 00 00 00 00 00
        00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00 01""")
    assert isinstance(m, DcpSnapshotMarker)
    assert (m.start_seqno, m.end_seqno, m.flags, m.version) == (0, 1, SnapshotFlag.MEMORY, "1")


def test_example3_mutation():
    m = _msg("""80 57 00 01 1f 00 00 00 00 00 00 21 00 00 00 01 17 e2 c5 a4 b1 00 00 00
        00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00
        00 00 00 00 00 00 00 6b 76""")
    assert isinstance(m, DcpMutation)
    assert (m.key, m.value, m.by_seqno, m.rev_seqno, m.cas) == (b"k", b"v", 1, 1, 0x17E2C5A4B1000000)
    assert m.to_frame().size == 57


def test_example4_rollback():
    m = _msg("81 53 00 00 00 00 00 23 00 00 00 08 00 00 00 01 00 00 00 00 00 00 00 00 "
             "00 00 00 00 00 00 00 00")
    assert isinstance(m, StreamReqRollback)
    assert m.status == Status.ROLLBACK and m.rollback_seqno == 0 and m.opaque == 1


def test_example5_noop_and_reply():
    req = _msg("80 5c 00 00 00 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 00 00 00 00")
    assert isinstance(req, DcpNoop) and req.opaque == 0x05000000
    rsp = _msg("81 5c 00 00 00 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 00 00 00 00")
    assert isinstance(rsp, GenericResponse) and rsp.opcode == Opcode.DCP_NOOP
    assert rsp.opaque == req.opaque and rsp.status == 0


def test_example6_dcp_open():
    m = _msg("80 50 00 07 08 00 00 00 00 00 00 0f 00 00 00 00 00 00 00 00 00 00 00 00 "
             "00 00 00 00 00 00 00 01 74 6f 6f 6c 6b 69 74")
    assert isinstance(m, DcpOpen) and m.name == "toolkit" and m.flags == DcpOpenFlag.PRODUCER


def test_example7_control():
    m = _msg("80 5e 00 0b 00 00 00 00 00 00 00 0f 00 00 00 02 00 00 00 00 00 00 00 00 "
             "65 6e 61 62 6c 65 5f 6e 6f 6f 70 74 72 75 65")
    assert isinstance(m, DcpControl) and (m.key, m.value_text, m.opaque) == ("enable_noop", "true", 2)


def test_example8_buffer_ack():
    m = _msg("80 5d 00 00 04 00 00 00 00 00 00 04 00 00 00 00 00 00 00 00 00 00 00 00 00 00 10 00")
    assert isinstance(m, DcpBufferAck) and m.bytes_to_ack == 4096


def test_example9_stream_end():
    m = _msg("80 55 00 00 04 00 00 00 00 00 00 04 00 00 00 01 00 00 00 00 00 00 00 00 00 00 00 00")
    assert isinstance(m, DcpStreamEnd) and m.reason == 0 and m.opaque == 1


def test_example10_deletion_v2():
    m = _msg("""80 58 00 01 15 00 00 00 00 00 00 16 00 00 00 01 17 e2 c5 a4 b2 00 00 00
        00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 02 00 00 00 00 00 6b""")
    assert isinstance(m, DcpDeletion)
    assert (m.key, m.by_seqno, m.rev_seqno, m.delete_time) == (b"k", 2, 2, 0)
    assert m.to_frame().size == 46
