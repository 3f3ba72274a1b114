"""Messages that declare their layout (extras struct, key, value) get body() and parse()
from the declaration: the bytes follow the struct, and malformed sections raise
ProtocolError naming the section or field, in the documented order."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from dcptool.protocol import ProtocolError, decode_frame, decode_message
from dcptool.protocol import messages as m
from dcptool.protocol.constants import Magic, Opcode
from dcptool.protocol.frame import Frame, encode_frame

#: every message class that declares its layout rather than writing body()/parse()
DECLARED = sorted(
    (c for c in vars(m).values()
     if isinstance(c, type) and issubclass(c, m.Layout) and c not in (m.Layout,)
     and any(n in vars(c) for n in m._LAYOUT_NAMES)),
    key=lambda c: c.__name__)


def test_the_fixed_layout_messages_declare_instead_of_writing_pairs():
    names = {c.__name__ for c in DECLARED}
    assert {"DcpMutation", "DcpExpiration", "DcpStreamReq", "DcpOpen", "Set", "CompactDb",
            "DcpBufferAck", "DcpStreamEnd", "GetErrorMap", "StreamReqRollback",
            "FailoverLogResponse"} <= names
    assert len(DECLARED) >= 25
    for cls in DECLARED:
        # the generated methods, not hand-written ones
        assert "def parse" in m._layout_source(cls)[0]
        assert cls.parse.__func__.__code__.co_filename == "<string>", cls
        assert cls.body.__code__.co_filename == "<string>", cls


def test_body_is_the_declared_struct():
    msg = m.DcpMutation(key=b"k", value=b"v", by_seqno=7, rev_seqno=2, flags=3, expiry=4,
                        lock_time=5, nru=1)
    assert msg.body() == (struct.pack(">QQIIIHB", 7, 2, 3, 4, 5, 0, 1), b"k", b"v")
    compact = m.CompactDb(purge_before_ts=1, purge_before_seq=2, drop_deletes=1, db_file_id=9)
    assert compact.body() == (struct.pack(">QQBBHI", 1, 2, 1, 0, 9, 0), b"", b"")
    assert m.DcpOpen(name="n", flags=1, seqno_reserved=2).body() == (
        struct.pack(">II", 2, 1), b"n", b"")


def _req(op, extras=b"", key=b"", value=b""):
    return decode_frame(encode_frame(Magic.REQUEST, op, 0, 1, extras=extras, key=key,
                                     value=value))[0]


def _err(frame) -> tuple[str, str]:
    with pytest.raises(ProtocolError) as err:
        decode_message(frame)
    return err.value.field, err.value.reason


def test_malformed_sections_name_the_section_in_order():
    mut = struct.pack(">QQIIIHB", 5, 1, 0, 0, 0, 0, 0)
    # extras length first, even when the key is missing too
    assert _err(_req(Opcode.DCP_MUTATION, mut[:30])) == ("extras", "length 30, expected 31")
    assert _err(_req(Opcode.DCP_MUTATION, mut)) == ("key", "key is missing")
    # a reserved item and a field that must not be 0 are named
    bad_nmeta = struct.pack(">QQIIIHB", 5, 1, 0, 0, 0, 2, 0)
    assert _err(_req(Opcode.DCP_MUTATION, bad_nmeta, b"k")) == ("nmeta", "must be 0")
    zero_seqno = struct.pack(">QQIIIHB", 0, 1, 0, 0, 0, 0, 0)
    assert _err(_req(Opcode.DCP_MUTATION, zero_seqno, b"k")) == ("by_seqno", "must be non-zero")
    # sections that must be empty, before a missing key
    assert _err(_req(Opcode.GET, b"x", b"", b"v")) == ("extras", "must be empty, got 1 bytes")
    assert _err(_req(Opcode.GET, b"", b"", b"v")) == ("value", "must be empty, got 1 bytes")
    assert _err(_req(Opcode.GET)) == ("key", "key is missing")
    assert _err(_req(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, b"\0\0\0\1", b"k", b"v")) == (
        "key", "must be empty, got 1 bytes")
    # a value that must not be missing, and a value that is one number
    assert _err(_req(Opcode.DCP_CONTROL, b"", b"name")) == ("value", "control value is missing")
    assert _err(_req(Opcode.GET_ERROR_MAP, value=b"\0")) == ("value", "length 1, expected 2")


def test_padding_is_sent_as_zero_and_ignored_when_read():
    extras = struct.pack(">QQBBHI", 1, 2, 1, 0xAA, 9, 0xBBBB)
    msg = decode_message(_req(Opcode.COMPACT_DB, extras))
    assert msg == m.CompactDb(opaque=1, purge_before_ts=1, purge_before_seq=2, drop_deletes=1,
                              db_file_id=9)


def test_a_layout_that_does_not_match_its_struct_is_refused_when_declared():
    with pytest.raises(TypeError, match="EXTRAS_FIELDS does not name every item"):
        @dataclass(frozen=True, slots=True, kw_only=True)
        class Wrong(m.Request):  # noqa: F841
            EXTRAS = struct.Struct(">QI")
            EXTRAS_FIELDS = ("a",)
            a: int = 0
    with pytest.raises(TypeError, match="NON_ZERO and MUST_BE_ZERO name extras items"):
        @dataclass(frozen=True, slots=True, kw_only=True)
        class Wrong2(m.Request):  # noqa: F841
            EXTRAS = struct.Struct(">I")
            EXTRAS_FIELDS = ("a",)
            NON_ZERO = ("b",)
            a: int = 0


def test_a_declared_message_round_trips_through_a_frame():
    msg = m.DcpStreamReq(vbucket=3, opaque=4, flags=1, start_seqno=5, end_seqno=9,
                         vbucket_uuid=77, snap_start_seqno=5, snap_end_seqno=5, value=b"{}")
    frame, used = decode_frame(msg.encode())
    assert isinstance(frame, Frame) and used == len(msg.encode())
    assert decode_message(frame) == msg
