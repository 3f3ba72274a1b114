"""The wire's fast paths: plain-int constants and precompiled structs for the hot loops.

The typed codec (`frame.py`, `messages.py`) is the reference: bytes in, messages out,
errors that name the field. A few loops cannot afford a `Frame` or a message object per
packet: the node's DCP producer (`node.stream`, `node.producer`), the node's write path
(`node.ingest`) and its replies (`node.connection`), the client's DCP consumer
(`client.session`) and the restore's *_WITH_META writer (`pipeline.metawriter`). They use
what this module holds instead, and only this module:

* magics, opcodes and datatype bits as plain ints (an `IntEnum` member costs an attribute
  lookup and a slower comparison in a loop; a hot loop binds these to locals);
* structs of a header and its extras in one precompiled format, built from the codec's own
  `HEADER` / `ALT_HEADER` and extras formats, so one `pack` or `unpack_from` covers both;
* builders of the producer's DCP messages (`mutation`, `deletion`, `system_event`,
  `seqno_advanced`, ...), with and without a stream id (flexible framing, magic 0x08), and `response` for a reply header;
* `vbuckets_of`, the vbucket of each key of a batch in one pass.

Sizes are full wire sizes, which is also what DCP flow control counts.
`tests/protocol/test_wire.py` checks every struct and builder here against the codec.
"""
from __future__ import annotations

import struct

from .constants import Datatype, Magic, MetaOption, Opcode
from .frame import ALT_HEADER, HEADER
from .messages import (
    DELETION_V1_EXTRAS,
    DELETION_V2_EXTRAS,
    EXPIRATION_EXTRAS,
    MARKER_V1,
    MUTATION_EXTRAS,
    MUTATION_SEQNO_EXTRAS,
    STORE_EXTRAS,
    U32,
    U64,
    WITH_META_EXTRAS,
)
from .vbucket import vbuckets_of

# -- plain ints ------------------------------------------------------------------------------

REQ = int(Magic.REQUEST)            # 0x80
RES = int(Magic.RESPONSE)           # 0x81
ALT_REQ = int(Magic.ALT_REQUEST)    # 0x08
ALT_RES = int(Magic.ALT_RESPONSE)   # 0x18

#: the opcodes the fast paths handle, one name per `Opcode` member
OP_SET = int(Opcode.SET)
OP_SETQ = int(Opcode.SETQ)
OP_NOOP = int(Opcode.NOOP)
OP_SET_WITH_META = int(Opcode.SET_WITH_META)
OP_SETQ_WITH_META = int(Opcode.SETQ_WITH_META)
OP_DEL_WITH_META = int(Opcode.DEL_WITH_META)
OP_DELQ_WITH_META = int(Opcode.DELQ_WITH_META)
OP_DCP_STREAM_REQ = int(Opcode.DCP_STREAM_REQ)
OP_DCP_STREAM_END = int(Opcode.DCP_STREAM_END)
OP_DCP_SNAPSHOT_MARKER = int(Opcode.DCP_SNAPSHOT_MARKER)
OP_DCP_MUTATION = int(Opcode.DCP_MUTATION)
OP_DCP_DELETION = int(Opcode.DCP_DELETION)
OP_DCP_EXPIRATION = int(Opcode.DCP_EXPIRATION)
OP_DCP_SET_VBUCKET_STATE = int(Opcode.DCP_SET_VBUCKET_STATE)
OP_DCP_NOOP = int(Opcode.DCP_NOOP)
OP_DCP_SEQNO_ADVANCED = int(Opcode.DCP_SEQNO_ADVANCED)
OP_DCP_SYSTEM_EVENT = int(Opcode.DCP_SYSTEM_EVENT)

DT_JSON = int(Datatype.JSON)        # 0x01
DT_SNAPPY = int(Datatype.SNAPPY)    # 0x02
DT_XATTR = int(Datatype.XATTR)      # 0x04

META_SKIP_CONFLICT_RESOLUTION = int(MetaOption.SKIP_CONFLICT_RESOLUTION)
META_IS_EXPIRATION = int(MetaOption.IS_EXPIRATION)

# -- extras ----------------------------------------------------------------------------------

#: SET/DEL_WITH_META extras with the trailing 4-byte options (flags, expiry, rev, cas, options)
WITH_META_OPTIONS_EXTRAS = struct.Struct(WITH_META_EXTRAS.format + "I")

HEADER_LEN = HEADER.size                                # 24
MUTATION_EXTLEN = MUTATION_EXTRAS.size                  # 31
DELETION_V1_EXTLEN = DELETION_V1_EXTRAS.size            # 18
DELETION_V2_EXTLEN = DELETION_V2_EXTRAS.size            # 21
EXPIRATION_EXTLEN = EXPIRATION_EXTRAS.size              # 20
MARKER_V1_EXTLEN = MARKER_V1.size                       # 20
WITH_META_EXTLEN = WITH_META_EXTRAS.size                # 24
WITH_META_OPTIONS_EXTLEN = WITH_META_OPTIONS_EXTRAS.size  # 28
SEQNO_EXTLEN = MUTATION_SEQNO_EXTRAS.size               # 16
#: a stream id in flexible framing: frame info byte 0x22 (id 2, length 2) and the id
SID_FRAME = 0x22
SID_EXTRA = 3

# -- a header and its extras in one struct ------------------------------------------------------


def _joined(head: struct.Struct, *parts: str | struct.Struct) -> struct.Struct:
    fmt = head.format
    for p in parts:
        fmt += (p.format if isinstance(p, struct.Struct) else p).lstrip(">")
    return struct.Struct(fmt)


# (magic, opcode, keylen, extlen, datatype, vbucket, bodylen, opaque, cas) + extras
MUTATION = _joined(HEADER, MUTATION_EXTRAS)             # 24 + 31
DELETION_V1 = _joined(HEADER, DELETION_V1_EXTRAS)       # 24 + 18
DELETION_V2 = _joined(HEADER, DELETION_V2_EXTRAS)       # 24 + 21
EXPIRATION = _joined(HEADER, EXPIRATION_EXTRAS)         # 24 + 20
MARKER = _joined(HEADER, MARKER_V1)                     # 24 + 20
STREAM_END = _joined(HEADER, U32)                       # 24 + 4
SET_VBUCKET_STATE = _joined(HEADER, "B")                # 24 + 1
SYSTEM_EVENT = _joined(HEADER, "QIB")                   # 24 + 13 (seqno, event, version)
SEQNO_ADVANCED = _joined(HEADER, U64)                   # 24 + 8
WITH_META = _joined(HEADER, WITH_META_EXTRAS)           # 24 + 24
WITH_META_OPTIONS = _joined(HEADER, WITH_META_OPTIONS_EXTRAS)  # 24 + 28

# the same with a stream id: (magic, opcode, framing len, keylen, extlen, datatype, vbucket,
# bodylen, opaque, cas, frame info 0x22, stream id) + extras
SID_MUTATION = _joined(ALT_HEADER, "BH", MUTATION_EXTRAS)
SID_DELETION_V1 = _joined(ALT_HEADER, "BH", DELETION_V1_EXTRAS)
SID_DELETION_V2 = _joined(ALT_HEADER, "BH", DELETION_V2_EXTRAS)
SID_EXPIRATION = _joined(ALT_HEADER, "BH", EXPIRATION_EXTRAS)
SID_MARKER = _joined(ALT_HEADER, "BH", MARKER_V1)
SID_STREAM_END = _joined(ALT_HEADER, "BH", U32)
SID_SET_VBUCKET_STATE = _joined(ALT_HEADER, "BH", "B")
SID_SYSTEM_EVENT = _joined(ALT_HEADER, "BH", "QIB")
SID_SEQNO_ADVANCED = _joined(ALT_HEADER, "BH", U64)

MUTATION_BASE = MUTATION.size                   # 55: a mutation's bytes before its key
DELETION_V1_BASE = DELETION_V1.size             # 42
DELETION_V2_BASE = DELETION_V2.size             # 45
EXPIRATION_BASE = EXPIRATION.size               # 44
MARKER_SIZE = MARKER.size                       # 44
STREAM_END_SIZE = STREAM_END.size               # 28
SET_VBUCKET_STATE_SIZE = SET_VBUCKET_STATE.size  # 25
SYSTEM_EVENT_BASE = SYSTEM_EVENT.size           # 37: a system event's bytes before its key
SEQNO_ADVANCED_SIZE = SEQNO_ADVANCED.size       # 32

# -- builders -----------------------------------------------------------------------------------


def response(opcode: int, status: int, opaque: int, cas: int = 0) -> bytes:
    """The header of a reply without a body."""
    return HEADER.pack(RES, opcode, 0, 0, 0, status, 0, opaque, cas)


def marker(vb: int, opaque: int, start: int, end: int, flags: int, sid: int | None = None) -> bytes:
    if sid is None:
        return MARKER.pack(REQ, OP_DCP_SNAPSHOT_MARKER, 0, 20, 0, vb, 20, opaque, 0, start, end,
                           flags)
    return SID_MARKER.pack(ALT_REQ, OP_DCP_SNAPSHOT_MARKER, 3, 0, 20, 0, vb, 23, opaque, 0,
                           SID_FRAME, sid, start, end, flags)


def stream_end(vb: int, opaque: int, reason: int, sid: int | None = None) -> bytes:
    if sid is None:
        return STREAM_END.pack(REQ, OP_DCP_STREAM_END, 0, 4, 0, vb, 4, opaque, 0, reason)
    return SID_STREAM_END.pack(ALT_REQ, OP_DCP_STREAM_END, 3, 0, 4, 0, vb, 7, opaque, 0,
                               SID_FRAME, sid, reason)


def set_vbucket_state(vb: int, opaque: int, state: int, sid: int | None = None) -> bytes:
    """DCP_SET_VBUCKET_STATE (0x5b), takeover streams only: extras = 1 byte state."""
    if sid is None:
        return SET_VBUCKET_STATE.pack(REQ, OP_DCP_SET_VBUCKET_STATE, 0, 1, 0, vb, 1, opaque, 0,
                                      state)
    return SID_SET_VBUCKET_STATE.pack(ALT_REQ, OP_DCP_SET_VBUCKET_STATE, 3, 0, 1, 0, vb, 4,
                                      opaque, 0, SID_FRAME, sid, state)


def noop(opaque: int) -> bytes:
    return HEADER.pack(REQ, OP_DCP_NOOP, 0, 0, 0, 0, 0, opaque, 0)


def mutation(vb: int, opaque: int, key: bytes, value: bytes, datatype: int, cas: int, seqno: int,
             rev: int, flags: int, expiry: int, sid: int | None = None) -> list[bytes]:
    kl = len(key)
    body = 31 + kl + len(value)
    if sid is None:
        head = MUTATION.pack(REQ, OP_DCP_MUTATION, kl, 31, datatype, vb, body, opaque, cas, seqno,
                             rev, flags, expiry, 0, 0, 0)
    else:
        head = SID_MUTATION.pack(ALT_REQ, OP_DCP_MUTATION, 3, kl, 31, datatype, vb, body + 3,
                                 opaque, cas, SID_FRAME, sid, seqno, rev, flags, expiry, 0, 0, 0)
    return [head, key, value]


def deletion(vb: int, opaque: int, key: bytes, value: bytes, datatype: int, cas: int, seqno: int,
             rev: int, delete_time: int | None, sid: int | None = None) -> list[bytes]:
    """DELETION V1 (delete_time None) or V2."""
    kl = len(key)
    if delete_time is None:
        body = 18 + kl + len(value)
        if sid is None:
            head = DELETION_V1.pack(REQ, OP_DCP_DELETION, kl, 18, datatype, vb, body, opaque, cas,
                                    seqno, rev, 0)
        else:
            head = SID_DELETION_V1.pack(ALT_REQ, OP_DCP_DELETION, 3, kl, 18, datatype, vb,
                                        body + 3, opaque, cas, SID_FRAME, sid, seqno, rev, 0)
    else:
        body = 21 + kl + len(value)
        if sid is None:
            head = DELETION_V2.pack(REQ, OP_DCP_DELETION, kl, 21, datatype, vb, body, opaque, cas,
                                    seqno, rev, delete_time, 0)
        else:
            head = SID_DELETION_V2.pack(ALT_REQ, OP_DCP_DELETION, 3, kl, 21, datatype, vb,
                                        body + 3, opaque, cas, SID_FRAME, sid, seqno, rev,
                                        delete_time, 0)
    return [head, key, value]


def expiration(vb: int, opaque: int, key: bytes, value: bytes, datatype: int, cas: int,
               seqno: int, rev: int, delete_time: int, sid: int | None = None) -> list[bytes]:
    kl = len(key)
    body = 20 + kl + len(value)
    if sid is None:
        head = EXPIRATION.pack(REQ, OP_DCP_EXPIRATION, kl, 20, datatype, vb, body, opaque, cas,
                               seqno, rev, delete_time)
    else:
        head = SID_EXPIRATION.pack(ALT_REQ, OP_DCP_EXPIRATION, 3, kl, 20, datatype, vb, body + 3,
                                   opaque, cas, SID_FRAME, sid, seqno, rev, delete_time)
    return [head, key, value]



def system_event(vb: int, opaque: int, seqno: int, event: int, version: int, key: bytes,
                 value: bytes, sid: int | None = None) -> list[bytes]:
    """DCP_SYSTEM_EVENT (0x5f): extras by_seqno u64, event u32, version u8; key and value
    as `SystemEvent.encode()` gives them."""
    kl = len(key)
    body = 13 + kl + len(value)
    if sid is None:
        head = SYSTEM_EVENT.pack(REQ, OP_DCP_SYSTEM_EVENT, kl, 13, 0, vb, body, opaque, 0, seqno,
                                 event, version)
    else:
        head = SID_SYSTEM_EVENT.pack(ALT_REQ, OP_DCP_SYSTEM_EVENT, 3, kl, 13, 0, vb, body + 3,
                                     opaque, 0, SID_FRAME, sid, seqno, event, version)
    return [head, key, value]


def seqno_advanced(vb: int, opaque: int, seqno: int, sid: int | None = None) -> bytes:
    """DCP_SEQNO_ADVANCED (0x64): extras by_seqno u64, no key or value."""
    if sid is None:
        return SEQNO_ADVANCED.pack(REQ, OP_DCP_SEQNO_ADVANCED, 0, 8, 0, vb, 8, opaque, 0, seqno)
    return SID_SEQNO_ADVANCED.pack(ALT_REQ, OP_DCP_SEQNO_ADVANCED, 3, 0, 8, 0, vb, 11, opaque, 0,
                                   SID_FRAME, sid, seqno)
