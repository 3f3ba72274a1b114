"""Typed messages: small frozen dataclasses with encode and decode.

Every message knows how to turn itself into a `Frame` (`to_frame`, `encode`) and how
to be read from one (`from_frame`). `decode_message` picks the type from the magic,
opcode and status of a frame. Malformed sections raise `ProtocolError` naming the field.

Most messages have one fixed layout: an extras struct, and a key and a value that are
either absent or one field each. Such a message declares that layout once, as class
attributes (`EXTRAS` with `EXTRAS_FIELDS`, `KEY`, `VALUE`, ...; see `Layout`), and its
`body()` (message -> sections) and `parse()` (sections -> fields) follow from the
declaration. Only the messages whose extras vary (optional tails, versions) write their
own `body()` and `parse()`.

Document keys are `bytes`; names (bucket, mechanism, control keys) are `str`.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar

from .constants import Magic, Opcode, Status
from .errors import ProtocolError
from .frame import Frame, encode_stream_id, split_stream_id

U8 = struct.Struct(">B")
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
SYSTEM_EVENT_EXTRAS = struct.Struct(">QIB")  # 13 bytes


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


def _features(value: bytes) -> tuple[int, ...]:
    if len(value) % 2:
        raise ProtocolError("value", "HELLO feature list has an odd length")
    return tuple(f for (f,) in U16.iter_unpack(value))


def _encode_features(features) -> bytes:
    return b"".join(U16.pack(f) for f in features)


def _vb_seqnos(value: bytes) -> tuple[tuple[int, int], ...]:
    if len(value) % 10:
        raise ProtocolError("value", f"length {len(value)} is not a multiple of 10")
    return tuple(VB_SEQNO.iter_unpack(value))


def _encode_vb_seqnos(entries) -> bytes:
    return b"".join(VB_SEQNO.pack(v, s) for v, s in entries)


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("value", f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("value", "must be a JSON object")
    return doc


def _json_or_nothing(raw: bytes) -> bytes:
    """`raw` itself, once it is known to be empty or one JSON object."""
    if raw:
        _json_object(raw)
    return raw


# ---------------------------------------------------------------------------
# layouts


@dataclass(frozen=True, slots=True)
class Section:
    """How a message carries its key or its value: in the field `field`.

    `missing`, when set, is the error an empty section raises. `decode` turns the bytes
    into the field's value and `encode` back (None: the bytes are the value); `decode`
    raises `ProtocolError` naming the section when the bytes are malformed.
    """

    field: str
    missing: str | None = None
    decode: Callable[[bytes], Any] | None = None
    encode: Callable[[Any], bytes] | None = None


def _text(field: str, missing: str | None = None) -> Section:
    """A section holding a name (UTF-8, undecodable bytes kept as surrogates)."""
    return Section(field, missing, _name, _raw)


def _number(field: str, st: struct.Struct) -> Section:
    """A value section holding exactly one number of `st`."""
    def decode(raw: bytes) -> int:
        _expect_len("value", raw, st.size)
        return st.unpack(raw)[0]
    return Section(field, None, decode, st.pack)


_LAYOUT_NAMES = ("EXTRAS", "EXTRAS_FIELDS", "KEY", "VALUE", "UNCHECKED", "MUST_BE_ZERO",
                 "NON_ZERO", "OP_FIELD")


class Layout:
    """What a message's sections hold, declared once per class; `body()` and `parse()`
    follow from it (`_derive`) unless the class writes its own.

    - `EXTRAS`: the struct the extras are (None: the extras must be empty), and
      `EXTRAS_FIELDS` the message field each of its items fills, in order. None names a
      padding item (sent as 0, ignored when read); a name in `MUST_BE_ZERO` is a reserved
      item (sent as 0, any other value read is an error naming it).
    - `KEY`, `VALUE`: a `Section`, or None when the section must be empty.
    - `UNCHECKED`: the sections ("extras", "key", "value") the message neither reads nor
      checks (responses that ignore what a server may add).
    - `NON_ZERO`: extras items that must not read 0.
    - `OP_FIELD`: the message is one class for several opcodes, kept in its `op` field.

    A decoded message checks, in this order: the extras' length; the sections that must
    be empty; the sections that must not be; the key's and value's contents; the extras'
    reserved items; `NON_ZERO`.
    """

    __slots__ = ()

    EXTRAS: ClassVar[struct.Struct | None] = None
    EXTRAS_FIELDS: ClassVar[tuple[str | None, ...]] = ()
    KEY: ClassVar[Section | None] = None
    VALUE: ClassVar[Section | None] = None
    UNCHECKED: ClassVar[tuple[str, ...]] = ()
    MUST_BE_ZERO: ClassVar[tuple[str, ...]] = ()
    NON_ZERO: ClassVar[tuple[str, ...]] = ()
    OP_FIELD: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        if any(name in own for name in _LAYOUT_NAMES):
            _derive(cls)


def _derive(cls: type) -> None:
    """Give `cls` the `body()` and `parse()` its declared layout implies (those it does
    not write itself).

    They are compiled from the declaration into the code one would write by hand for it
    (one struct pack or unpack, no loop over the fields), as `dataclasses` compiles
    `__init__`: they run once per message the typed codec decodes or encodes, and cost
    what hand-written ones would. `_layout_source(cls)` shows the code.
    """
    source, namespace = _layout_source(cls)
    exec(source, namespace)  # noqa: S102 - generated from the class's own declaration
    own = vars(cls)
    for name in ("body", "parse"):
        if name not in own:
            fn = namespace[name]
            fn.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, classmethod(fn) if name == "parse" else fn)


def _layout_source(cls: type) -> tuple[str, dict[str, Any]]:
    """The source of `body` and `parse` for a class's declared layout, and the globals it
    needs (see `Layout` for the order of the checks)."""
    st, names = cls.EXTRAS, cls.EXTRAS_FIELDS
    key, value, unchecked = cls.KEY, cls.VALUE, cls.UNCHECKED
    must_be_zero, non_zero = cls.MUST_BE_ZERO, cls.NON_ZERO
    namespace: dict[str, Any] = {"_st": st, "_no": _no, "_expect_len": _expect_len,
                                 "ProtocolError": ProtocolError}
    sections = (("key", key), ("value", value))
    for n in (*names, *(s.field for _, s in sections if s is not None), *must_be_zero, *non_zero):
        if n is not None and not n.isidentifier():
            raise TypeError(f"{cls.__name__}: {n!r} is not a field name")
    if st is None and names:
        raise TypeError(f"{cls.__name__}: EXTRAS_FIELDS without EXTRAS")
    if st is not None and len(names) != len(st.unpack(bytes(st.size))):
        raise TypeError(f"{cls.__name__}: EXTRAS_FIELDS does not name every item of EXTRAS")
    if not set(non_zero) <= set(names) or not set(must_be_zero) <= set(names):
        raise TypeError(f"{cls.__name__}: NON_ZERO and MUST_BE_ZERO name extras items")

    # body(): (extras, key, value)
    def encoded(tag: str, section: Section | None) -> str:
        if section is None:
            return 'b""'
        if section.encode is None:
            return f"self.{section.field}"
        namespace[f"_{tag}_encode"] = section.encode
        return f"_{tag}_encode(self.{section.field})"

    extras = 'b""'
    if st is not None:
        items = ", ".join("0" if n is None or n in must_be_zero else f"self.{n}" for n in names)
        extras = f"_st.pack({items})"
    lines = ["def body(self):",
             f"    return {extras}, {encoded('key', key)}, {encoded('value', value)}",
             "",
             "def parse(cls, frame):"]

    # parse(): the checks, then the fields
    if st is not None:
        lines.append(f'    if len(frame.extras) != {st.size}: '
                     f'_expect_len("extras", frame.extras, {st.size})')
    elif "extras" not in unchecked:
        lines.append('    if frame.extras: _no("extras", frame.extras)')
    for tag, section in sections:
        if section is None and tag not in unchecked:
            lines.append(f'    if frame.{tag}: _no("{tag}", frame.{tag})')
    for tag, section in sections:
        if section is not None and section.missing is not None:
            lines.append(f"    if not frame.{tag}: raise ProtocolError({tag!r}, {section.missing!r})")
    fields_out = []
    for tag, section in sections:
        if section is None:
            continue
        if section.decode is None:
            fields_out.append(f"{section.field!r}: frame.{tag}")
        else:
            namespace[f"_{tag}_decode"] = section.decode
            lines.append(f"    {tag} = _{tag}_decode(frame.{tag})")
            fields_out.append(f"{section.field!r}: {tag}")
    if st is not None:
        targets = ", ".join(f"_pad{i}" if n is None else f"x_{n}" for i, n in enumerate(names))
        lines.append(f"    {targets}, = _st.unpack(frame.extras)")
        for n in must_be_zero:
            lines.append(f'    if x_{n}: raise ProtocolError({n!r}, "must be 0")')
        fields_out += [f"{n!r}: x_{n}" for n in names if n is not None and n not in must_be_zero]
    for n in non_zero:
        lines.append(f'    if x_{n} == 0: raise ProtocolError({n!r}, "must be non-zero")')
    if cls.OP_FIELD:
        fields_out.append("'op': frame.opcode")
    lines.append("    return {" + ", ".join(fields_out) + "}")
    return "\n".join(lines) + "\n", namespace


# ---------------------------------------------------------------------------
# base classes


@dataclass(frozen=True, slots=True, kw_only=True)
class Request(Layout):
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

    def to_frame(self) -> Frame:
        extras, key, value = self.body()
        framing = (encode_stream_id(self.stream_id) if self.stream_id is not None else b"") + self.framing_rest
        return Frame(Magic.REQUEST, self.opcode, self.vbucket, self.opaque, self.cas,
                     self.datatype, framing, extras, key, value)

    def encode(self) -> bytes:
        return self.to_frame().encode()

    @classmethod
    def from_frame(cls, frame: Frame):
        sid, rest = split_stream_id(frame.framing)
        return cls(vbucket=frame.specific, opaque=frame.opaque, cas=frame.cas,
                   datatype=frame.datatype, stream_id=sid, framing_rest=rest, **cls.parse(frame))


@dataclass(frozen=True, slots=True, kw_only=True)
class Response(Layout):
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

    def to_frame(self) -> Frame:
        extras, key, value = self.body()
        return Frame(Magic.RESPONSE, self.opcode, self.status, self.opaque, self.cas,
                     self.datatype, self.framing, extras, key, value)

    def encode(self) -> bytes:
        return self.to_frame().encode()

    @classmethod
    def from_frame(cls, frame: Frame):
        return cls(status=frame.specific, opaque=frame.opaque, cas=frame.cas,
                   datatype=frame.datatype, framing=frame.framing, **cls.parse(frame))


_derive(Request)
_derive(Response)
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
    KEY = _text("user_agent")
    VALUE = Section("features", None, _features, _encode_features)
    user_agent: str = ""
    features: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HelloResponse(Response):
    OPCODE: ClassVar[int] = Opcode.HELLO
    UNCHECKED = ("extras", "key")
    VALUE = Section("features", None, _features, _encode_features)
    features: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslListMechs(Request):
    OPCODE: ClassVar[int] = Opcode.SASL_LIST_MECHS


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslListMechsResponse(Response):
    OPCODE: ClassVar[int] = Opcode.SASL_LIST_MECHS
    UNCHECKED = ("extras", "key")
    VALUE = Section("mechanisms", None, lambda raw: tuple(_name(raw).split()),
                    lambda mechanisms: " ".join(mechanisms).encode())
    mechanisms: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslAuth(Request):
    OPCODE: ClassVar[int] = Opcode.SASL_AUTH
    KEY = _text("mechanism", missing="SASL mechanism name is missing")
    VALUE = Section("payload")
    mechanism: str = ""
    payload: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class SaslStep(SaslAuth):
    OPCODE: ClassVar[int] = Opcode.SASL_STEP


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectBucket(Request):
    OPCODE: ClassVar[int] = Opcode.SELECT_BUCKET
    KEY = _text("bucket", missing="bucket name is missing")
    bucket: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetErrorMap(Request):
    OPCODE: ClassVar[int] = Opcode.GET_ERROR_MAP
    VALUE = _number("version", U16)
    version: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Version(Request):
    OPCODE: ClassVar[int] = Opcode.VERSION


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionResponse(Response):
    OPCODE: ClassVar[int] = Opcode.VERSION
    UNCHECKED = ("extras", "key")
    VALUE = _text("version")
    version: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Noop(Request):
    OPCODE: ClassVar[int] = Opcode.NOOP


@dataclass(frozen=True, slots=True, kw_only=True)
class Quit(Request):
    OPCODE: ClassVar[int] = Opcode.QUIT


@dataclass(frozen=True, slots=True, kw_only=True)
class Stat(Request):
    OPCODE: ClassVar[int] = Opcode.STAT
    KEY = _text("group")
    VALUE = Section("payload")
    group: str = ""
    payload: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatResponse(Response):
    """One statistic; a response with an empty key ends the group."""

    OPCODE: ClassVar[int] = Opcode.STAT
    KEY = _text("key")
    VALUE = Section("value")
    key: str = ""
    value: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetClusterConfig(Request):
    """Extras optional: none, or the epoch and revision the client already has."""

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
    KEY = Section("key", missing="key is missing")
    key: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetResponse(Response):
    OPCODE: ClassVar[int] = Opcode.GET
    EXTRAS = U32
    EXTRAS_FIELDS = ("flags",)
    UNCHECKED = ("key",)
    VALUE = Section("value")
    flags: int = 0
    value: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class Set(Request):
    OPCODE: ClassVar[int] = Opcode.SET
    EXTRAS = STORE_EXTRAS
    EXTRAS_FIELDS = ("flags", "expiry")
    KEY = Section("key", missing="key is missing")
    VALUE = Section("value")
    key: bytes = b""
    value: bytes = b""
    flags: int = 0
    expiry: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Add(Set):
    OPCODE: ClassVar[int] = Opcode.ADD


@dataclass(frozen=True, slots=True, kw_only=True)
class Replace(Set):
    OPCODE: ClassVar[int] = Opcode.REPLACE


@dataclass(frozen=True, slots=True, kw_only=True)
class Delete(Request):
    OPCODE: ClassVar[int] = Opcode.DELETE
    KEY = Section("key", missing="key is missing")
    key: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMeta(Request):
    """Extras optional: none, or the one-byte version (2 = also return the datatype)."""

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
    """Extras: 20 bytes, and the document's datatype as a 21st when version 2 asked."""

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
    Extras: 24 bytes, then optional options (u32) and nmeta (u16).
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
    """Extras optional: none, a vbucket state (u32), or a state and a collection id."""

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
    UNCHECKED = ("extras", "key")
    VALUE = Section("entries", None, _vb_seqnos, _encode_vb_seqnos)
    entries: tuple[tuple[int, int], ...] = ()


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

    OP_FIELD = True
    VALUE = Section("entries", None, _failover_entries, _encode_failover)
    op: int = Opcode.GET_FAILOVER_LOG
    entries: tuple[tuple[int, int], ...] = ()

    @property
    def opcode(self) -> int:
        return self.op


@dataclass(frozen=True, slots=True, kw_only=True)
class SetVbucket(Request):
    OPCODE: ClassVar[int] = Opcode.SET_VBUCKET
    EXTRAS = U8
    EXTRAS_FIELDS = ("state",)
    VALUE = Section("value")
    state: int = 1
    value: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactDb(Request):
    OPCODE: ClassVar[int] = Opcode.COMPACT_DB
    EXTRAS = COMPACT_EXTRAS
    EXTRAS_FIELDS = ("purge_before_ts", "purge_before_seq", "drop_deletes", None, "db_file_id", None)
    purge_before_ts: int = 0
    purge_before_seq: int = 0
    drop_deletes: int = 0
    db_file_id: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class HwtRequest(Request):
    """HWT_REGISTER (0xe4), HWT_LIST (0xe5) and HWT_REMOVE (0xe6): dcptool's high watermark
    table extension (docs/protocol-extensions.md). No extras, no key; the value is one
    JSON object (HWT_LIST may send none). The answer is a JSON object too."""

    OP_FIELD = True
    VALUE = Section("value", None, _json_or_nothing)
    op: int = Opcode.HWT_LIST
    value: bytes = b""

    @property
    def opcode(self) -> int:
        return self.op

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


# ---------------------------------------------------------------------------
# DCP, client to producer


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpOpen(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_OPEN
    EXTRAS = OPEN_EXTRAS
    EXTRAS_FIELDS = ("seqno_reserved", "flags")
    KEY = _text("name", missing="DCP connection name is missing")
    VALUE = Section("value")
    name: str = ""
    flags: int = 0
    seqno_reserved: int = 0
    value: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpControl(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_CONTROL
    KEY = _text("key", missing="control name is missing")
    VALUE = Section("value", missing="control value is missing")
    key: str = ""
    value: bytes = b""

    @property
    def value_text(self) -> str:
        """The setting as text, without the NUL padding some clients send."""
        return self.value.rstrip(b"\x00").decode("utf-8", "replace")


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpAddStream(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_ADD_STREAM
    EXTRAS = U32
    EXTRAS_FIELDS = ("flags",)
    flags: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpAddStreamResponse(Response):
    OPCODE: ClassVar[int] = Opcode.DCP_ADD_STREAM
    EXTRAS = U32
    EXTRAS_FIELDS = ("stream_opaque",)
    UNCHECKED = ("key", "value")
    stream_opaque: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpStreamReq(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_STREAM_REQ
    EXTRAS = STREAM_REQ_EXTRAS
    EXTRAS_FIELDS = ("flags", "reserved", "start_seqno", "end_seqno", "vbucket_uuid",
                     "snap_start_seqno", "snap_end_seqno")
    VALUE = Section("value")
    flags: int = 0
    reserved: int = 0
    start_seqno: int = 0
    end_seqno: int = 0xFFFFFFFFFFFFFFFF
    vbucket_uuid: int = 0
    snap_start_seqno: int = 0
    snap_end_seqno: int = 0
    value: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReqOk(Response):
    """Successful STREAM_REQ: the vbucket's failover log, newest first."""

    OPCODE: ClassVar[int] = Opcode.DCP_STREAM_REQ
    VALUE = Section("failover_log", None, _failover_entries, _encode_failover)
    failover_log: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReqRollback(Response):
    """STREAM_REQ answered ROLLBACK: the client must roll back to at most this seqno."""

    OPCODE: ClassVar[int] = Opcode.DCP_STREAM_REQ
    VALUE = _number("rollback_seqno", U64)
    status: int = Status.ROLLBACK
    rollback_seqno: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpCloseStream(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_CLOSE_STREAM


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpBufferAck(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_BUFFER_ACKNOWLEDGEMENT
    EXTRAS = U32
    EXTRAS_FIELDS = ("bytes_to_ack",)
    bytes_to_ack: int = 0


# ---------------------------------------------------------------------------
# DCP, producer to client


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpStreamEnd(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_STREAM_END
    EXTRAS = U32
    EXTRAS_FIELDS = ("reason",)
    reason: int = 0


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
    EXTRAS = MUTATION_EXTRAS
    EXTRAS_FIELDS = ("by_seqno", "rev_seqno", "flags", "expiry", "lock_time", "nmeta", "nru")
    MUST_BE_ZERO = ("nmeta",)
    NON_ZERO = ("by_seqno",)
    KEY = Section("key", missing="key is missing")
    VALUE = Section("value")
    key: bytes = b""
    value: bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    flags: int = 0
    expiry: int = 0
    lock_time: int = 0
    nru: int = 0


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
    EXTRAS = EXPIRATION_EXTRAS
    EXTRAS_FIELDS = ("by_seqno", "rev_seqno", "delete_time")
    KEY = Section("key", missing="key is missing")
    VALUE = Section("value")
    key: bytes = b""
    value: bytes = b""
    by_seqno: int = 0
    rev_seqno: int = 0
    delete_time: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpSetVbucketState(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_SET_VBUCKET_STATE
    EXTRAS = U8
    EXTRAS_FIELDS = ("state",)
    state: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpNoop(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_NOOP


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpSeqnoAdvanced(Request):
    OPCODE: ClassVar[int] = Opcode.DCP_SEQNO_ADVANCED
    EXTRAS = U64
    EXTRAS_FIELDS = ("by_seqno",)
    by_seqno: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DcpSystemEvent(Request):
    """DCP_SYSTEM_EVENT (0x5f): extras by_seqno u64, event u32, version u8; key and value
    per event (`dcptool.protocol.collections.SystemEvent` decodes them)."""

    OPCODE: ClassVar[int] = Opcode.DCP_SYSTEM_EVENT
    EXTRAS = SYSTEM_EVENT_EXTRAS
    EXTRAS_FIELDS = ("by_seqno", "event", "version")
    KEY = Section("key", None, bytes)
    VALUE = Section("value", None, bytes)
    by_seqno: int = 0
    event: int = 0
    version: int = 0
    key: bytes = b""
    value: bytes = b""


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
