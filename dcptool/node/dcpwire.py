"""DCP messages a producer sends, built with precompiled structs (header and extras in one).

The streaming path calls these structs directly; the helpers below are for the less
frequent messages and for stream-id (flexible framing, magic 0x08) variants. Sizes
are full wire sizes, which is also what flow control counts (fact sheet 7.1).
"""
from __future__ import annotations

import struct

from dcptool.protocol.constants import Opcode

REQ = 0x80
ALT_REQ = 0x08
OP_MUTATION = int(Opcode.DCP_MUTATION)
OP_DELETION = int(Opcode.DCP_DELETION)
OP_EXPIRATION = int(Opcode.DCP_EXPIRATION)
OP_MARKER = int(Opcode.DCP_SNAPSHOT_MARKER)
OP_STREAM_END = int(Opcode.DCP_STREAM_END)
OP_NOOP = int(Opcode.DCP_NOOP)
OP_SET_VBUCKET_STATE = int(Opcode.DCP_SET_VBUCKET_STATE)

# header (magic, opcode, keylen, extlen, datatype, vbucket, bodylen, opaque, cas) + extras
MUTATION = struct.Struct(">BBHBBHIIQQQIIIHB")   # 24 + 31
DELETION_V1 = struct.Struct(">BBHBBHIIQQQH")    # 24 + 18
DELETION_V2 = struct.Struct(">BBHBBHIIQQQIB")   # 24 + 21
EXPIRATION = struct.Struct(">BBHBBHIIQQQI")     # 24 + 20
MARKER_V1 = struct.Struct(">BBHBBHIIQQQI")      # 24 + 20
STREAM_END = struct.Struct(">BBHBBHIIQI")       # 24 + 4
NOOP = struct.Struct(">BBHBBHIIQ")              # 24
SET_VBUCKET_STATE = struct.Struct(">BBHBBHIIQB")  # 24 + 1

# the same with flexible framing: (magic, opcode, framing len, keylen, extlen, datatype,
# vbucket, bodylen, opaque, cas, frame info 0x22, stream id) + extras
SID_MUTATION = struct.Struct(">BBBBBBHIIQBHQQIIIHB")
SID_DELETION_V1 = struct.Struct(">BBBBBBHIIQBHQQH")
SID_DELETION_V2 = struct.Struct(">BBBBBBHIIQBHQQIB")
SID_EXPIRATION = struct.Struct(">BBBBBBHIIQBHQQI")
SID_MARKER_V1 = struct.Struct(">BBBBBBHIIQBHQQI")
SID_STREAM_END = struct.Struct(">BBBBBBHIIQBHI")
SID_SET_VBUCKET_STATE = struct.Struct(">BBBBBBHIIQBHB")
SID_FRAME = 0x22  # frame info id 2 (stream id), length 2

MUTATION_BASE = 55
DELETION_V1_BASE = 42
DELETION_V2_BASE = 45
EXPIRATION_BASE = 44
MARKER_SIZE = 44
STREAM_END_SIZE = 28
SET_VBUCKET_STATE_SIZE = 25
SID_EXTRA = 3


def marker(vb: int, opaque: int, start: int, end: int, flags: int, sid: int | None = None) -> bytes:
    if sid is None:
        return MARKER_V1.pack(REQ, OP_MARKER, 0, 20, 0, vb, 20, opaque, 0, start, end, flags)
    return SID_MARKER_V1.pack(ALT_REQ, OP_MARKER, 3, 0, 20, 0, vb, 23, opaque, 0, SID_FRAME, sid,
                              start, end, flags)


def stream_end(vb: int, opaque: int, reason: int, sid: int | None = None) -> bytes:
    if sid is None:
        return STREAM_END.pack(REQ, OP_STREAM_END, 0, 4, 0, vb, 4, opaque, 0, reason)
    return SID_STREAM_END.pack(ALT_REQ, OP_STREAM_END, 3, 0, 4, 0, vb, 7, opaque, 0, SID_FRAME,
                               sid, reason)


def set_vbucket_state(vb: int, opaque: int, state: int, sid: int | None = None) -> bytes:
    """DCP_SET_VBUCKET_STATE (0x5b), takeover streams only: extras = 1 byte state."""
    if sid is None:
        return SET_VBUCKET_STATE.pack(REQ, OP_SET_VBUCKET_STATE, 0, 1, 0, vb, 1, opaque, 0, state)
    return SID_SET_VBUCKET_STATE.pack(ALT_REQ, OP_SET_VBUCKET_STATE, 3, 0, 1, 0, vb, 4, opaque, 0,
                                      SID_FRAME, sid, state)


def noop(opaque: int) -> bytes:
    return NOOP.pack(REQ, OP_NOOP, 0, 0, 0, 0, 0, opaque, 0)


def mutation(vb: int, opaque: int, key: bytes, value: bytes, datatype: int, cas: int, seqno: int,
             rev: int, flags: int, expiry: int, sid: int | None = None) -> list[bytes]:
    kl = len(key)
    body = 31 + kl + len(value)
    if sid is None:
        head = MUTATION.pack(REQ, OP_MUTATION, kl, 31, datatype, vb, body, opaque, cas, seqno, rev,
                             flags, expiry, 0, 0, 0)
    else:
        head = SID_MUTATION.pack(ALT_REQ, OP_MUTATION, 3, kl, 31, datatype, vb, body + 3, opaque,
                                 cas, SID_FRAME, sid, seqno, rev, flags, expiry, 0, 0, 0)
    return [head, key, value]


def deletion(vb: int, opaque: int, key: bytes, value: bytes, datatype: int, cas: int, seqno: int,
             rev: int, delete_time: int | None, sid: int | None = None) -> list[bytes]:
    """DELETION V1 (delete_time None) or V2."""
    kl = len(key)
    if delete_time is None:
        body = 18 + kl + len(value)
        if sid is None:
            head = DELETION_V1.pack(REQ, OP_DELETION, kl, 18, datatype, vb, body, opaque, cas,
                                    seqno, rev, 0)
        else:
            head = SID_DELETION_V1.pack(ALT_REQ, OP_DELETION, 3, kl, 18, datatype, vb, body + 3,
                                        opaque, cas, SID_FRAME, sid, seqno, rev, 0)
    else:
        body = 21 + kl + len(value)
        if sid is None:
            head = DELETION_V2.pack(REQ, OP_DELETION, kl, 21, datatype, vb, body, opaque, cas,
                                    seqno, rev, delete_time, 0)
        else:
            head = SID_DELETION_V2.pack(ALT_REQ, OP_DELETION, 3, kl, 21, datatype, vb, body + 3,
                                        opaque, cas, SID_FRAME, sid, seqno, rev, delete_time, 0)
    return [head, key, value]


def expiration(vb: int, opaque: int, key: bytes, value: bytes, datatype: int, cas: int,
               seqno: int, rev: int, delete_time: int, sid: int | None = None) -> list[bytes]:
    kl = len(key)
    body = 20 + kl + len(value)
    if sid is None:
        head = EXPIRATION.pack(REQ, OP_EXPIRATION, kl, 20, datatype, vb, body, opaque, cas, seqno,
                               rev, delete_time)
    else:
        head = SID_EXPIRATION.pack(ALT_REQ, OP_EXPIRATION, 3, kl, 20, datatype, vb, body + 3,
                                   opaque, cas, SID_FRAME, sid, seqno, rev, delete_time)
    return [head, key, value]
