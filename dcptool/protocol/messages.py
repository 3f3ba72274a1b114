"""Typed messages: small frozen dataclasses with encode and decode.

Every message knows how to turn itself into a `Frame` (`to_frame`, `encode`) and how
to be read from one (`from_frame`). `decode_message` picks the type from the magic,
opcode and status of a frame. Malformed sections raise `ProtocolError` naming the field.

Document keys are `bytes`; names (bucket, mechanism, control keys) are `str`.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .constants import Magic, Opcode, Status
from .errors import ProtocolError
from .frame import Frame, encode_stream_id, split_stream_id

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
OPEN_EXTRAS = struct.Struct(">II")
STORE_EXTRAS = struct.Struct(">II")
MUTATION_EXTRAS = struct.Struct(">QQIIIHB")  # 31 bytes
DELETION_V1_EXTRAS = struct.Struct(">QQH")  # 18 bytes
DELETION_V2_EXTRAS = struct.Struct(">QQIB")  # 21 bytes
EXPIRATION_EXTRAS = struct.Struct(">QQI")  # 20 bytes
STREAM_REQ_EXTRAS = struct.Struct(">IIQQQQQ")  # 48 bytes
MARKER_V1 = struct.Struct(">QQI")  # 20 bytes
MARKER_V20 = struct.Struct(">QQIQQ")  # 36 bytes
MARKER_V22 = struct.Struct(">QQIQQQQ")  # 52 bytes
WITH_META_EXTRAS = struct.Struct(">IIQQ")  # 24 bytes
GET_META_RSP = struct.Struct(">IIIQ")  # 20 bytes
FAILOVER_ENTRY = struct.Struct(">QQ")
VB_SEQNO = struct.Struct(">HQ")
COMPACT_EXTRAS = struct.Struct(">QQBBHI")  # 24 bytes
CLUSTER_CONFIG_EXTRAS = struct.Struct(">qq")
MUTATION_SEQNO_EXTRAS = struct.Struct(">QQ")


def _name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _raw(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def _expect_len(section: str, data: bytes, *allowed: int) -> None:
    if len(data) not in allowed:
        want = " or ".join(str(a) for a in allowed)
        raise ProtocolError(section, f"length {len(data)}, expected {want}")


def _no(section: str, data: bytes) -> None:
    if data:
        raise ProtocolError(section, f"must be empty, got {len(data)} bytes")


def _failover_entries(value: bytes) -> tuple[tuple[int, int], ...]:
    if len(value) % 16:
        raise ProtocolError("value", f"failover log length {len(value)} is not a multiple of 16")
    return tuple(FAILOVER_ENTRY.iter_unpack(value))


def _encode_failover(entries) -> bytes:
    return b"".join(FAILOVER_ENTRY.pack(u, s) for u, s in entries)


# ---------------------------------------------------------------------------
# base classes


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """Common header fields of a request (magic 0x80, or 0x08 with frame infos)."""

    OPCODE: ClassVar[int] = -1

    vbucket: int = 0
    opaque: int = 0
    cas: int = 0
    datatype: int = 0
    stream_id: int | None = None
    framing_rest: bytes = b""  # frame infos other than the stream id, verbatim

    @property
    def opcode(self) -> int:
        return self.OPCODE

    def body(self) -> tuple[bytes, bytes, bytes]:
        """(extras, key, value)"""
        return b"", b"", b""

    def to_frame(self) -> Frame:
        extras, key, value = self.body()
        framing = (encode_stream_id(self.stream_id) if self.stream_id is not None else b"") + self.framing_rest
        return Frame(Magic.REQUEST, self.opcode, self.vbucket, self.opaque, self.cas,
                     self.datatype, framing, extras, key, value)

    def encode(self) -> bytes:
        return self.to_frame().encode()

    @classmethod
    def parse(cls, frame: Frame) -> dict[str, Any]:
        """The message-specific fields of `frame`."""
        _no("extras", frame.extras)
        _no("key", frame.key)
        _no("value", frame.value)
        return {}

    @classmethod
    def from_frame(cls, frame: Frame):
        sid, rest = split_stream_id(frame.framing)
        return cls(vbucket=frame.specific, opaque=frame.opaque, cas=frame.cas,
                   datatype=frame.datatype, stream_id=sid, framing_rest=rest, **cls.parse(frame))


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """Common header fields of a response (magic 0x81, or 0x18)."""

    OPCODE: ClassVar[int] = -1

    status: int = Status.SUCCESS
    opaque: int = 0
    cas: int = 0
    datatype: int = 0
    framing: bytes = b""

    @property
    def opcode(self) -> int:
        return self.OPCODE

    def body(self) -> tuple[bytes, bytes, bytes]:
        return b"", b"", b""

    def to_frame(self) -> Frame:
        extras, key, value = self.body()
        return Frame(Magic.RESPONSE, self.opcode, self.status, self.opaque, self.cas,
                     self.datatype, self.framing, extras, key, value)

    def encode(self) -> bytes:
        return self.to_frame().encode()

    @classmethod
    def parse(cls, frame: Frame) -> dict[str, Any]:
        _no("extras", frame.extras)
        _no("key", frame.key)
        _no("value", frame.value)
        return {}

    @classmethod
    def from_frame(cls, frame: Frame):
        return cls(status=frame.specific, opaque=frame.opaque, cas=frame.cas,
                   datatype=frame.datatype, framing=frame.framing, **cls.parse(frame))


@dataclass(frozen=True, slots=True, kw_only=True)
class GenericRequest(Request):
    """A request with no typed layout here (or an unknown opcode): sections kept raw."""

    op: int
    extras: bytes = b""
    key: bytes = b""
    value: bytes = b""

    @property
    def opcode(self) -> int:
        return self.op

    def body(self):
        return self.extras, self.key, self.value

    @classmethod
    def from_frame(cls, frame: Frame):
        sid, rest = split_stream_id(frame.framing)
        return cls(op=frame.opcode, vbucket=frame.specific, opaque=frame.opaque, cas=frame.cas,
                   datatype=frame.datatype, stream_id=sid, framing_rest=rest,
                   extras=frame.extras, key=frame.key, value=frame.value)


@dataclass(frozen=True, slots=True, kw_only=True)
class GenericResponse(Response):
    """Any response: status plus raw sections (errors, SET/DELETE results, SASL, ...)."""

    op: int
    extras: bytes = b""
    key: bytes = b""
    value: bytes = b""

    @property
    def opcode(self) -> int:
        return self.op

    def body(self):
        return self.extras, self.key, self.value

    @property
    def mutation_seqno(self) -> tuple[int, int] | None:
        """(vbucket uuid, seqno) of a mutation response when MutationSeqno was negotiated."""
        if len(self.extras) == 16:
            return MUTATION_SEQNO_EXTRAS.unpack(self.extras)
        return None

    @classmethod
    def from_frame(cls, frame: Frame):
        return cls(op=frame.opcode, status=frame.specific, opaque=frame.opaque, cas=frame.cas,
                   datatype=frame.datatype, framing=frame.framing, extras=frame.extras,
                   key=frame.key, value=frame.value)


# ---------------------------------------------------------------------------
# connection set-up


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Request):
    OPCODE: ClassVar[int] = Opcode.HELLO
    user_agent: str = ""
    features: tuple[int, ...] = ()

    def body(self):
        return b"", _raw(self.user_agent), b"".join(U16.pack(f) for f in self.features)

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        if len(frame.value) % 2:
            raise ProtocolError("value", "HELLO feature list has an odd length")
        return {"user_agent": _name(frame.key),
                "features": tuple(f for (f,) in U16.iter_unpack(frame.value))}


@dataclass(frozen=True, slots=True, kw_only=True)
class HelloResponse(Response):
    OPCODE: ClassVar[int] = Opcode.HELLO
    features: tuple[int, ...] = ()

    def body(self):
        return b"", b"", b"".join(U16.pack(f) for f in self.features)

    @classmethod
    def parse(cls, frame):
        if len(frame.value) % 2:
            raise ProtocolError("value", "HELLO feature list has an odd length")
        return {"features": tuple(f for (f,) in U16.iter_unpack(frame.value))}


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslListMechs(Request):
    OPCODE: ClassVar[int] = Opcode.SASL_LIST_MECHS


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslListMechsResponse(Response):
    OPCODE: ClassVar[int] = Opcode.SASL_LIST_MECHS
    mechanisms: tuple[str, ...] = ()

    def body(self):
        return b"", b"", " ".join(self.mechanisms).encode()

    @classmethod
    def parse(cls, frame):
        return {"mechanisms": tuple(_name(frame.value).split())}


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslAuth(Request):
    OPCODE: ClassVar[int] = Opcode.SASL_AUTH
    mechanism: str = ""
    payload: bytes = b""

    def body(self):
        return b"", _raw(self.mechanism), self.payload

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        if not frame.key:
            raise ProtocolError("key", "SASL mechanism name is missing")
        return {"mechanism": _name(frame.key), "payload": frame.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslStep(SaslAuth):
    OPCODE: ClassVar[int] = Opcode.SASL_STEP


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectBucket(Request):
    OPCODE: ClassVar[int] = Opcode.SELECT_BUCKET
    bucket: str = ""

    def body(self):
        return b"", _raw(self.bucket), b""

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        _no("value", frame.value)
        if not frame.key:
            raise ProtocolError("key", "bucket name is missing")
        return {"bucket": _name(frame.key)}


@dataclass(frozen=True, slots=True, kw_only=True)
class GetErrorMap(Request):
    OPCODE: ClassVar[int] = Opcode.GET_ERROR_MAP
    version: int = 1

    def body(self):
        return b"", b"", U16.pack(self.version)

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        _no("key", frame.key)
        _expect_len("value", frame.value, 2)
        return {"version": U16.unpack(frame.value)[0]}


@dataclass(frozen=True, slots=True, kw_only=True)
class Version(Request):
    OPCODE: ClassVar[int] = Opcode.VERSION


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionResponse(Response):
    OPCODE: ClassVar[int] = Opcode.VERSION
    version: str = ""

    def body(self):
        return b"", b"", _raw(self.version)

    @classmethod
    def parse(cls, frame):
        return {"version": _name(frame.value)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Noop(Request):
    OPCODE: ClassVar[int] = Opcode.NOOP


@dataclass(frozen=True, slots=True, kw_only=True)
class Quit(Request):
    OPCODE: ClassVar[int] = Opcode.QUIT


@dataclass(frozen=True, slots=True, kw_only=True)
class Stat(Request):
    OPCODE: ClassVar[int] = Opcode.STAT
    group: str = ""
    payload: bytes = b""

    def body(self):
        return b"", _raw(self.group), self.payload

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        return {"group": _name(frame.key), "payload": frame.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class StatResponse(Response):
    """One statistic; a response with an empty key ends the group."""

    OPCODE: ClassVar[int] = Opcode.STAT
    key: str = ""
    value: bytes = b""

    def body(self):
        return b"", _raw(self.key), self.value

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        return {"key": _name(frame.key), "value": frame.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class GetClusterConfig(Request):
    OPCODE: ClassVar[int] = Opcode.GET_CLUSTER_CONFIG
    epoch: int | None = None
    revision: int | None = None

    def body(self):
        if self.epoch is None:
            return b"", b"", b""
        return CLUSTER_CONFIG_EXTRAS.pack(self.epoch, self.revision or 0), b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 0, 16)
        _no("key", frame.key)
        _no("value", frame.value)
        if frame.extras:
            e, r = CLUSTER_CONFIG_EXTRAS.unpack(frame.extras)
            return {"epoch": e, "revision": r}
        return {}


# ---------------------------------------------------------------------------
# key-value


@dataclass(frozen=True, slots=True, kw_only=True)
class Get(Request):
    OPCODE: ClassVar[int] = Opcode.GET
    key: bytes = b""

    def body(self):
        return b"", self.key, b""

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        _no("value", frame.value)
        if not frame.key:
            raise ProtocolError("key", "key is missing")
        return {"key": frame.key}


@dataclass(frozen=True, slots=True, kw_only=True)
class GetResponse(Response):
    OPCODE: ClassVar[int] = Opcode.GET
    flags: int = 0
    value: bytes = b""

    def body(self):
        return U32.pack(self.flags), b"", self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 4)
        return {"flags": U32.unpack(frame.extras)[0], "value": frame.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class Set(Request):
    OPCODE: ClassVar[int] = Opcode.SET
    key: bytes = b""
    value: bytes = b""
    flags: int = 0
    expiry: int = 0

    def body(self):
        return STORE_EXTRAS.pack(self.flags, self.expiry), self.key, self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 8)
        if not frame.key:
            raise ProtocolError("key", "key is missing")
        flags, expiry = STORE_EXTRAS.unpack(frame.extras)
        return {"key": frame.key, "value": frame.value, "flags": flags, "expiry": expiry}


@dataclass(frozen=True, slots=True, kw_only=True)
class Add(Set):
    OPCODE: ClassVar[int] = Opcode.ADD


@dataclass(frozen=True, slots=True, kw_only=True)
class Replace(Set):
    OPCODE: ClassVar[int] = Opcode.REPLACE


@dataclass(frozen=True, slots=True, kw_only=True)
class Delete(Request):
    OPCODE: ClassVar[int] = Opcode.DELETE
    key: bytes = b""

    def body(self):
        return b"", self.key, b""

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        _no("value", frame.value)
        if not frame.key:
            raise ProtocolError("key", "key is missing")
        return {"key": frame.key}


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMeta(Request):
    OPCODE: ClassVar[int] = Opcode.GET_META
    key: bytes = b""
    version: int | None = None  # 2 = also return the datatype

    def body(self):
        return (b"" if self.version is None else bytes([self.version])), self.key, b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 0, 1)
        _no("value", frame.value)
        if not frame.key:
            raise ProtocolError("key", "key is missing")
        version = frame.extras[0] if frame.extras else None
        if version is not None and version > 2:
            raise ProtocolError("extras", f"GET_META version {version} is not 0, 1 or 2")
        return {"key": frame.key, "version": version}


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMetaResponse(Response):
    OPCODE: ClassVar[int] = Opcode.GET_META
    deleted: int = 0
    flags: int = 0
    expiry: int = 0
    rev_seqno: int = 0
    doc_datatype: int | None = None

    def body(self):
        ext = GET_META_RSP.pack(self.deleted, self.flags, self.expiry, self.rev_seqno)
        if self.doc_datatype is not None:
            ext += bytes([self.doc_datatype])
        return ext, b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 20, 21)
        d, f, e, r = GET_META_RSP.unpack_from(frame.extras)
        dt = frame.extras[20] if len(frame.extras) == 21 else None
        return {"deleted": d, "flags": f, "expiry": e, "rev_seqno": r, "doc_datatype": dt}


@dataclass(frozen=True, slots=True, kw_only=True)
class SetWithMeta(Request):
    """SET_WITH_META (or SETQ_WITH_META when `quiet`): store a document with its metadata.

    Header `cas` compares against the existing document; `meta_cas` is the CAS to store.
    """

    OPCODE: ClassVar[int] = Opcode.SET_WITH_META
    QUIET_OPCODE: ClassVar[int] = Opcode.SETQ_WITH_META
    key: bytes = b""
    value: bytes = b""
    flags: int = 0
    expiry: int = 0
    rev_seqno: int = 0
    meta_cas: int = 0
    options: int | None = None
    nmeta: int | None = None
    quiet: bool = False

    @property
    def opcode(self) -> int:
        return self.QUIET_OPCODE if self.quiet else self.OPCODE

    def body(self):
        ext = WITH_META_EXTRAS.pack(self.flags, self.expiry, self.rev_seqno, self.meta_cas)
        if self.options is not None:
            ext += U32.pack(self.options)
        if self.nmeta is not None:
            ext += U16.pack(self.nmeta)
        return ext, self.key, self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 24, 26, 28, 30)
        if not frame.key:
            raise ProtocolError("key", "key is missing")
        flags, expiry, rev, mcas = WITH_META_EXTRAS.unpack_from(frame.extras)
        n = len(frame.extras)
        options = U32.unpack_from(frame.extras, 24)[0] if n in (28, 30) else None
        nmeta = U16.unpack_from(frame.extras, n - 2)[0] if n in (26, 30) else None
        return {"key": frame.key, "value": frame.value, "flags": flags, "expiry": expiry,
                "rev_seqno": rev, "meta_cas": mcas, "options": options, "nmeta": nmeta,
                "quiet": frame.opcode == cls.QUIET_OPCODE}


@dataclass(frozen=True, slots=True, kw_only=True)
class DelWithMeta(SetWithMeta):
    """DEL_WITH_META (DELQ_WITH_META when `quiet`); `expiry` carries the delete time."""

    OPCODE: ClassVar[int] = Opcode.DEL_WITH_META
    QUIET_OPCODE: ClassVar[int] = Opcode.DELQ_WITH_META


@dataclass(frozen=True, slots=True, kw_only=True)
class GetAllVbSeqnos(Request):
    OPCODE: ClassVar[int] = Opcode.GET_ALL_VB_SEQNOS
    state: int | None = None
    collection: int | None = None

    def body(self):
        if self.state is None:
            return b"", b"", b""
        ext = U32.pack(self.state)
        if self.collection is not None:
            ext += U32.pack(self.collection)
        return ext, b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 0, 4, 8)
        _no("key", frame.key)
        _no("value", frame.value)
        state = U32.unpack_from(frame.extras)[0] if frame.extras else None
        coll = U32.unpack_from(frame.extras, 4)[0] if len(frame.extras) == 8 else None
        return {"state": state, "collection": coll}


@dataclass(frozen=True, slots=True, kw_only=True)
class GetAllVbSeqnosResponse(Response):
    OPCODE: ClassVar[int] = Opcode.GET_ALL_VB_SEQNOS
    entries: tuple[tuple[int, int], ...] = ()

    def body(self):
        return b"", b"", b"".join(VB_SEQNO.pack(v, s) for v, s in self.entries)

    @classmethod
    def parse(cls, frame):
        if len(frame.value) % 10:
            raise ProtocolError("value", f"length {len(frame.value)} is not a multiple of 10")
        return {"entries": tuple(VB_SEQNO.iter_unpack(frame.value))}


@dataclass(frozen=True, slots=True, kw_only=True)
class GetFailoverLog(Request):
    """GET_FAILOVER_LOG (0x96): usable on any authenticated connection."""

    OPCODE: ClassVar[int] = Opcode.GET_FAILOVER_LOG


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpGetFailoverLog(Request):
    """DCP_GET_FAILOVER_LOG (0x54): needs an open DCP connection."""

    OPCODE: ClassVar[int] = Opcode.DCP_GET_FAILOVER_LOG


@dataclass(frozen=True, slots=True, kw_only=True)
class FailoverLogResponse(Response):
    """A failover log, newest entry first, as (vbucket uuid, seqno) pairs."""

    op: int = Opcode.GET_FAILOVER_LOG
    entries: tuple[tuple[int, int], ...] = ()

    @property
    def opcode(self) -> int:
        return self.op

    def body(self):
        return b"", b"", _encode_failover(self.entries)

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        _no("key", frame.key)
        return {"op": frame.opcode, "entries": _failover_entries(frame.value)}


@dataclass(frozen=True, slots=True, kw_only=True)
class SetVbucket(Request):
    OPCODE: ClassVar[int] = Opcode.SET_VBUCKET
    state: int = 1
    value: bytes = b""

    def body(self):
        return bytes([self.state]), b"", self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 1)
        _no("key", frame.key)
        return {"state": frame.extras[0], "value": frame.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactDb(Request):
    OPCODE: ClassVar[int] = Opcode.COMPACT_DB
    purge_before_ts: int = 0
    purge_before_seq: int = 0
    drop_deletes: int = 0
    db_file_id: int = 0

    def body(self):
        return COMPACT_EXTRAS.pack(self.purge_before_ts, self.purge_before_seq,
                                   self.drop_deletes, 0, self.db_file_id, 0), b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 24)
        _no("key", frame.key)
        _no("value", frame.value)
        ts, seq, drop, _pad, vb, _pad2 = COMPACT_EXTRAS.unpack(frame.extras)
        return {"purge_before_ts": ts, "purge_before_seq": seq, "drop_deletes": drop,
                "db_file_id": vb}


@dataclass(frozen=True, slots=True, kw_only=True)
class HwtRequest(Request):
    """HWT_REGISTER (0xe4), HWT_LIST (0xe5) and HWT_REMOVE (0xe6): dcptool's high watermark
    table extension (docs/protocol-extensions.md). No extras, no key; the value is one
    JSON object (HWT_LIST may send none). The answer is a JSON object too."""

    op: int = Opcode.HWT_LIST
    value: bytes = b""

    @property
    def opcode(self) -> int:
        return self.op

    def body(self):
        return b"", b"", self.value

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        _no("key", frame.key)
        if frame.value:
            _json_object(frame.value)
        return {"op": frame.opcode, "value": frame.value}

    def document(self) -> dict[str, Any] | None:
        """The value as a dict (None when there is no value)."""
        return _json_object(self.value) if self.value else None

    @classmethod
    def make(cls, op: int, doc: dict[str, Any] | None = None, **header: Any) -> "HwtRequest":
        """A request carrying `doc` as compact JSON (datatype JSON)."""
        if doc is None:
            return cls(op=op, **header)
        raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode("utf-8")
        return cls(op=op, value=raw, datatype=0x01, **header)


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("value", f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("value", "must be a JSON object")
    return doc


# ---------------------------------------------------------------------------
# DCP, client to producer


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpOpen(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_OPEN
    name: str = ""
    flags: int = 0
    seqno_reserved: int = 0
    value: bytes = b""

    def body(self):
        return OPEN_EXTRAS.pack(self.seqno_reserved, self.flags), _raw(self.name), self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 8)
        if not frame.key:
            raise ProtocolError("key", "DCP connection name is missing")
        reserved, flags = OPEN_EXTRAS.unpack(frame.extras)
        return {"name": _name(frame.key), "flags": flags, "seqno_reserved": reserved,
                "value": frame.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpControl(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_CONTROL
    key: str = ""
    value: bytes = b""

    @property
    def value_text(self) -> str:
        """The setting as text, without the NUL padding some clients send."""
        return self.value.rstrip(b"\x00").decode("utf-8", "replace")

    def body(self):
        return b"", _raw(self.key), self.value

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        if not frame.key:
            raise ProtocolError("key", "control name is missing")
        if not frame.value:
            raise ProtocolError("value", "control value is missing")
        return {"key": _name(frame.key), "value": frame.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpAddStream(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_ADD_STREAM
    flags: int = 0

    def body(self):
        return U32.pack(self.flags), b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 4)
        _no("key", frame.key)
        _no("value", frame.value)
        return {"flags": U32.unpack(frame.extras)[0]}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpAddStreamResponse(Response):
    OPCODE: ClassVar[int] = Opcode.DCP_ADD_STREAM
    stream_opaque: int = 0

    def body(self):
        return U32.pack(self.stream_opaque), b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 4)
        return {"stream_opaque": U32.unpack(frame.extras)[0]}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpStreamReq(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_STREAM_REQ
    flags: int = 0
    reserved: int = 0
    start_seqno: int = 0
    end_seqno: int = 0xFFFFFFFFFFFFFFFF
    vbucket_uuid: int = 0
    snap_start_seqno: int = 0
    snap_end_seqno: int = 0
    value: bytes = b""

    def body(self):
        return STREAM_REQ_EXTRAS.pack(self.flags, self.reserved, self.start_seqno, self.end_seqno,
                                      self.vbucket_uuid, self.snap_start_seqno,
                                      self.snap_end_seqno), b"", self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 48)
        _no("key", frame.key)
        f, r, s, e, u, ss, se = STREAM_REQ_EXTRAS.unpack(frame.extras)
        return {"flags": f, "reserved": r, "start_seqno": s, "end_seqno": e, "vbucket_uuid": u,
                "snap_start_seqno": ss, "snap_end_seqno": se, "value": frame.value}


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReqOk(Response):
    """Successful STREAM_REQ: the vbucket's failover log, newest first."""

    OPCODE: ClassVar[int] = Opcode.DCP_STREAM_REQ
    failover_log: tuple[tuple[int, int], ...] = ()

    def body(self):
        return b"", b"", _encode_failover(self.failover_log)

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        _no("key", frame.key)
        return {"failover_log": _failover_entries(frame.value)}


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReqRollback(Response):
    """STREAM_REQ answered ROLLBACK: the client must roll back to at most this seqno."""

    OPCODE: ClassVar[int] = Opcode.DCP_STREAM_REQ
    status: int = Status.ROLLBACK
    rollback_seqno: int = 0

    def body(self):
        return b"", b"", U64.pack(self.rollback_seqno)

    @classmethod
    def parse(cls, frame):
        _no("extras", frame.extras)
        _no("key", frame.key)
        _expect_len("value", frame.value, 8)
        return {"rollback_seqno": U64.unpack(frame.value)[0]}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpCloseStream(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_CLOSE_STREAM


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpBufferAck(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_BUFFER_ACKNOWLEDGEMENT
    bytes_to_ack: int = 0

    def body(self):
        return U32.pack(self.bytes_to_ack), b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 4)
        _no("key", frame.key)
        _no("value", frame.value)
        return {"bytes_to_ack": U32.unpack(frame.extras)[0]}


# ---------------------------------------------------------------------------
# DCP, producer to client


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpStreamEnd(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_STREAM_END
    reason: int = 0

    def body(self):
        return U32.pack(self.reason), b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 4)
        _no("key", frame.key)
        _no("value", frame.value)
        return {"reason": U32.unpack(frame.extras)[0]}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpSnapshotMarker(Request):
    """A snapshot marker. `version` "1" is the 20-byte extras form; "2.0"/"2.2" carry a value."""

    OPCODE: ClassVar[int] = Opcode.DCP_SNAPSHOT_MARKER
    start_seqno: int = 0
    end_seqno: int = 0
    flags: int = 0
    version: str = "1"
    max_visible_seqno: int = 0
    high_completed_seqno: int = 0
    purge_seqno: int = 0
    high_prepared_seqno: int = 0

    def body(self):
        if self.version == "1":
            return MARKER_V1.pack(self.start_seqno, self.end_seqno, self.flags), b"", b""
        if self.version == "2.0":
            return b"\x00", b"", MARKER_V20.pack(self.start_seqno, self.end_seqno, self.flags,
                                                 self.max_visible_seqno, self.high_completed_seqno)
        if self.version == "2.2":
            return b"\x02", b"", MARKER_V22.pack(self.start_seqno, self.end_seqno, self.flags,
                                                 self.max_visible_seqno, self.high_completed_seqno,
                                                 self.purge_seqno, self.high_prepared_seqno)
        raise ProtocolError("version", f"unknown snapshot marker version {self.version!r}")

    @classmethod
    def parse(cls, frame):
        _no("key", frame.key)
        if len(frame.extras) == 20:
            _no("value", frame.value)
            s, e, f = MARKER_V1.unpack(frame.extras)
            return {"start_seqno": s, "end_seqno": e, "flags": f, "version": "1"}
        _expect_len("extras", frame.extras, 20, 1)
        ver = frame.extras[0]
        if ver == 0:
            _expect_len("value", frame.value, 36)
            s, e, f, mvs, hcs = MARKER_V20.unpack(frame.value)
            return {"start_seqno": s, "end_seqno": e, "flags": f, "version": "2.0",
                    "max_visible_seqno": mvs, "high_completed_seqno": hcs}
        if ver == 2:
            _expect_len("value", frame.value, 52)
            s, e, f, mvs, hcs, ps, hps = MARKER_V22.unpack(frame.value)
            return {"start_seqno": s, "end_seqno": e, "flags": f, "version": "2.2",
                    "max_visible_seqno": mvs, "high_completed_seqno": hcs, "purge_seqno": ps,
                    "high_prepared_seqno": hps}
        raise ProtocolError("extras", f"unknown snapshot marker version byte {ver}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpMutation(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_MUTATION
    key: bytes = b""
    value: bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    flags: int = 0
    expiry: int = 0
    lock_time: int = 0
    nru: int = 0

    def body(self):
        return MUTATION_EXTRAS.pack(self.by_seqno, self.rev_seqno, self.flags, self.expiry,
                                    self.lock_time, 0, self.nru), self.key, self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 31)
        if not frame.key:
            raise ProtocolError("key", "key is missing")
        s, r, f, e, lt, nmeta, nru = MUTATION_EXTRAS.unpack(frame.extras)
        if nmeta:
            raise ProtocolError("nmeta", "must be 0")
        if s == 0:
            raise ProtocolError("by_seqno", "must be non-zero")
        return {"key": frame.key, "value": frame.value, "by_seqno": s, "rev_seqno": r,
                "flags": f, "expiry": e, "lock_time": lt, "nru": nru}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpDeletion(Request):
    """DCP_DELETION: V1 (18-byte extras) when `delete_time` is None, else V2 (21 bytes)."""

    OPCODE: ClassVar[int] = Opcode.DCP_DELETION
    key: bytes = b""
    value: bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    delete_time: int | None = None

    def body(self):
        if self.delete_time is None:
            ext = DELETION_V1_EXTRAS.pack(self.by_seqno, self.rev_seqno, 0)
        else:
            ext = DELETION_V2_EXTRAS.pack(self.by_seqno, self.rev_seqno, self.delete_time, 0)
        return ext, self.key, self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 18, 21)
        if not frame.key:
            raise ProtocolError("key", "key is missing")
        if len(frame.extras) == 18:
            s, r, nmeta = DELETION_V1_EXTRAS.unpack(frame.extras)
            if nmeta:
                raise ProtocolError("nmeta", "must be 0")
            dt = None
        else:
            s, r, dt, _unused = DELETION_V2_EXTRAS.unpack(frame.extras)
        return {"key": frame.key, "value": frame.value, "by_seqno": s, "rev_seqno": r,
                "delete_time": dt}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpExpiration(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_EXPIRATION
    key: bytes = b""
    value: bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    delete_time: int = 0

    def body(self):
        return EXPIRATION_EXTRAS.pack(self.by_seqno, self.rev_seqno, self.delete_time), self.key, self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 20)
        if not frame.key:
            raise ProtocolError("key", "key is missing")
        s, r, dt = EXPIRATION_EXTRAS.unpack(frame.extras)
        return {"key": frame.key, "value": frame.value, "by_seqno": s, "rev_seqno": r,
                "delete_time": dt}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpSetVbucketState(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_SET_VBUCKET_STATE
    state: int = 1

    def body(self):
        return bytes([self.state]), b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 1)
        _no("key", frame.key)
        _no("value", frame.value)
        return {"state": frame.extras[0]}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpNoop(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_NOOP


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpSeqnoAdvanced(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_SEQNO_ADVANCED
    by_seqno: int = 0

    def body(self):
        return U64.pack(self.by_seqno), b"", b""

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 8)
        _no("key", frame.key)
        _no("value", frame.value)
        return {"by_seqno": U64.unpack(frame.extras)[0]}


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpSystemEvent(Request):
    """DCP_SYSTEM_EVENT (0x5f): extras by_seqno u64, event u32, version u8; key and value
    per event (`dcptool.protocol.collections.SystemEvent` decodes them)."""

    OPCODE: ClassVar[int] = Opcode.DCP_SYSTEM_EVENT
    by_seqno: int = 0
    event: int = 0
    version: int = 0
    key: bytes = b""
    value: bytes = b""

    def body(self):
        return _SYSEV.pack(self.by_seqno, self.event, self.version), self.key, self.value

    @classmethod
    def parse(cls, frame):
        _expect_len("extras", frame.extras, 13)
        by_seqno, event, version = _SYSEV.unpack(frame.extras)
        return {"by_seqno": by_seqno, "event": event, "version": version,
                "key": bytes(frame.key), "value": bytes(frame.value)}


_SYSEV = struct.Struct(">QIB")


# ---------------------------------------------------------------------------
# dispatch

REQUEST_TYPES: dict[int, type[Request]] = {
    cls.OPCODE: cls
    for cls in (
        Hello, SaslListMechs, SaslAuth, SaslStep, SelectBucket, GetErrorMap, Version, Noop, Quit,
        Stat, GetClusterConfig, Get, Set, Add, Replace, Delete, GetMeta, SetWithMeta, DelWithMeta,
        GetAllVbSeqnos, GetFailoverLog, DcpGetFailoverLog, SetVbucket, CompactDb, DcpOpen,
        DcpControl, DcpAddStream, DcpStreamReq, DcpCloseStream, DcpBufferAck, DcpStreamEnd,
        DcpSnapshotMarker, DcpMutation, DcpDeletion, DcpExpiration, DcpSetVbucketState, DcpNoop,
        DcpSeqnoAdvanced, DcpSystemEvent,
    )
}
REQUEST_TYPES[Opcode.SETQ_WITH_META] = SetWithMeta
for _op in (Opcode.HWT_REGISTER, Opcode.HWT_LIST, Opcode.HWT_REMOVE):
    REQUEST_TYPES[_op] = HwtRequest
REQUEST_TYPES[Opcode.DELQ_WITH_META] = DelWithMeta

SUCCESS_RESPONSE_TYPES: dict[int, type[Response]] = {
    Opcode.HELLO: HelloResponse,
    Opcode.SASL_LIST_MECHS: SaslListMechsResponse,
    Opcode.VERSION: VersionResponse,
    Opcode.STAT: StatResponse,
    Opcode.GET: GetResponse,
    Opcode.GET_META: GetMetaResponse,
    Opcode.GET_ALL_VB_SEQNOS: GetAllVbSeqnosResponse,
    Opcode.GET_FAILOVER_LOG: FailoverLogResponse,
    Opcode.DCP_GET_FAILOVER_LOG: FailoverLogResponse,
    Opcode.DCP_ADD_STREAM: DcpAddStreamResponse,
    Opcode.DCP_STREAM_REQ: StreamReqOk,
}


def decode_message(frame: Frame) -> Request | Response:
    """The typed message a frame holds. Raises ProtocolError when its sections are malformed."""
    if frame.is_request:
        cls = REQUEST_TYPES.get(frame.opcode, GenericRequest)
        return cls.from_frame(frame)
    if frame.opcode == Opcode.DCP_STREAM_REQ and frame.specific == Status.ROLLBACK:
        return StreamReqRollback.from_frame(frame)
    if frame.specific == Status.SUCCESS:
        cls = SUCCESS_RESPONSE_TYPES.get(frame.opcode)
        if cls is not None:
            return cls.from_frame(frame)
    return GenericResponse.from_frame(frame)


def message_fields(msg: Request | Response) -> dict[str, Any]:
    """The message's fields by name (for display and JSON)."""
    return {f.name: getattr(msg, f.name) for f in fields(msg)}
