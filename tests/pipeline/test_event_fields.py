"""The named field positions of the session's event tuples (client.events EV_*), checked
against the typed codec: the same bytes fed to a tuple session and a typed session give
tuples whose named fields hold the typed messages' values."""
from __future__ import annotations

from dcptool.client import DcpSession, Position, SessionConfig
from dcptool.client import events as E
from dcptool.protocol import FrameDecoder, decode_message, encode_frame
from dcptool.protocol.constants import Magic
from dcptool.protocol.messages import (
    DcpControl,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpOpen,
    DcpSnapshotMarker,
    DcpStreamReq,
    StreamReqOk,
)

UUID = 0x4242


def _session(typed: bool) -> tuple[DcpSession, int]:
    s = DcpSession(SessionConfig(typed=typed))
    s.add_stream(5, Position())
    dec = FrameDecoder()
    dec.feed(s.data_to_send())
    replies, opaque = b"", None
    for m in map(decode_message, dec):
        if isinstance(m, (DcpOpen, DcpControl)):
            replies += encode_frame(Magic.RESPONSE, m.opcode, 0, m.opaque)
        elif isinstance(m, DcpStreamReq):
            opaque = m.opaque
    assert s.feed(replies) == [] and opaque is not None
    return s, opaque


def _stream(op: int) -> bytes:
    return (StreamReqOk(opaque=op, failover_log=((UUID, 0),)).encode()
            + DcpSnapshotMarker(vbucket=5, opaque=op, start_seqno=0, end_seqno=3,
                                flags=1).encode()
            + DcpMutation(vbucket=5, opaque=op, by_seqno=1, rev_seqno=6, key=b"a", value=b"va",
                          cas=11, flags=0xBEEF, expiry=1234, datatype=1).encode()
            + DcpDeletion(vbucket=5, opaque=op, by_seqno=2, rev_seqno=7, key=b"b",
                          delete_time=77, cas=12).encode()
            + DcpExpiration(vbucket=5, opaque=op, by_seqno=3, rev_seqno=8, key=b"c",
                            delete_time=88, cas=13).encode())


def test_named_fields_hold_what_the_typed_messages_say():
    plain, op1 = _session(False)
    typed, op2 = _session(True)
    tuples = plain.feed(_stream(op1))
    messages = typed.feed(_stream(op2))
    assert [ev[E.EV_KIND] for ev in tuples] == [E.STREAM_OPEN, E.SNAPSHOT, E.MUTATION,
                                                E.DELETION, E.EXPIRATION]
    opened = tuples[0]
    assert opened[E.EV_VBUCKET] == 5
    assert opened[E.EV_OPEN_FAILOVER_LOG] == ((UUID, 0),)
    assert opened[E.EV_OPEN_POSITION] == Position()
    snap, snap_msg = tuples[1], messages[1][2]
    assert (snap[E.EV_SNAP_START], snap[E.EV_SNAP_END], snap[E.EV_SNAP_FLAGS]) == (
        snap_msg.start_seqno, snap_msg.end_seqno, snap_msg.flags)
    for ev, (_kind, vb, msg) in zip(tuples[2:], messages[2:]):
        assert len(ev) == E.RECORD_FIELDS
        assert ev[E.EV_VBUCKET] == vb == msg.vbucket
        assert ev[E.EV_SEQNO] == msg.by_seqno
        assert ev[E.EV_REV_SEQNO] == msg.rev_seqno
        assert ev[E.EV_CAS] == msg.cas
        assert ev[E.EV_DATATYPE] == msg.datatype
        assert ev[E.EV_KEY] == msg.key
        assert bytes(ev[E.EV_VALUE]) == bytes(msg.value)
        if isinstance(msg, DcpMutation):
            assert (ev[E.EV_FLAGS], ev[E.EV_EXPIRY]) == (msg.flags, msg.expiry)
        else:  # deletions and expirations: no flags, the delete time in the expiry slot
            assert (ev[E.EV_FLAGS], ev[E.EV_EXPIRY]) == (0, msg.delete_time)
