"""Sub-document commands: the single-path lookups and mutations (SUBDOC_GET ...
SUBDOC_COUNTER, SUBDOC_GET_COUNT) and SUBDOC_MULTI_LOOKUP / SUBDOC_MULTI_MUTATION, as
kv_engine frames and answers them (docs/SubDocument.md in kv_engine; the JSON work is
`dcptool.node.subdoc`).

**Framing.** A single-path request's extras are the path length (u16) and the path flags
(u8), then optionally an expiry (u32) and the doc flags (u8): 3, 4, 7 or 8 bytes; the body
is the key, the path and the value. A multi-path request's extras are an optional expiry
(mutations only) and optional doc flags: 0, 1, 4 or 5 bytes; after the key come its specs
(opcode u8, path flags u8, path length u16, for mutations a value length u32, the path,
the value). At most 16 specs; lookups and mutations are not mixed (INVALID_COMBO), and
specs on xattrs come first (INVALID_XATTR_ORDER).

**Flags.** Path flags: MKDIR_P (0x01) creates missing dictionaries on the way, XATTR_PATH
(0x04) addresses an extended attribute (the path's first component is the attribute's
name), EXPAND_MACROS (0x10, with XATTR_PATH only) expands `"${Mutation.CAS}"`,
`"${Mutation.seqno}"` and `"${Mutation.value_crc32c}"` in the value to the new version's
CAS and seqno (16 hex digits of the little-endian bytes of the value, after `0x`, as
kv_engine writes them) and the CRC32-C of its body. Doc flags: MKDOC (0x01) creates a
missing document (SET semantics), ADD (0x02) creates it and fails if it exists (not with a
CAS, nor with MKDOC), ACCESS_DELETED (0x04) lets lookups read a deleted document's xattrs
(SUCCESS_DELETED); CREATE_AS_DELETED and REVIVE_DOCUMENT are NOT_SUPPORTED.

**Virtual xattrs** (lookups): `$document` (CAS, vbucket_uuid, seqno, revid, exptime,
flags, value_bytes, value_crc32c, deleted, datatype, last_modified), `$XTOC` (the names of
the document's xattrs) and `$vbucket` (`HLC.now`, `HLC.mode`); another `$` name is
XATTR_UNKNOWN_VATTR and no mutation may touch them (XATTR_CANT_MODIFY_VATTR).

**Answers.** A single lookup answers the value (GET, GET_COUNT) or nothing (EXISTS); a
single mutation answers its CAS (with the vbucket uuid and seqno when MutationSeqno was
negotiated) and, for COUNTER, the new number. A multi lookup answers one result per spec
(status u16, length u32, value) with SUCCESS, or MULTI_PATH_FAILURE when a path failed. A
multi mutation is all or nothing: on success a result (index u8, status u16, length u32,
value) for each spec that has a value (COUNTER); on failure MULTI_PATH_FAILURE with the
index and status of the first failing spec, and nothing stored. A mutation without an
expiry leaves the document without one, as a SET does.

Every successful mutation is one new version of the document (a new seqno and CAS), so
DCP streams, backups and replicas see it like any write.
"""
from __future__ import annotations

import copy
import json
import struct
import time

import crc32c

from dcptool.protocol.constants import Datatype, Opcode, Status

from .. import decisions, subdoc
from ..access import Privilege
from ..item import ITEM_MUTATION, split_xattrs
from .common import cap_expiry, command
from .kv import LOCKED_CAS, key_and_vbucket, mutation_extras

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_LOOKUP_SPEC = struct.Struct(">BBH")
_MUTATION_SPEC = struct.Struct(">BBHI")
_LOOKUP_RESULT = struct.Struct(">HI")
_MUTATION_RESULT = struct.Struct(">BHI")
_FAILURE = struct.Struct(">BH")
_XATTR = int(Datatype.XATTR)
_JSON = int(Datatype.JSON)

# path flags
MKDIR_P = 0x01
XATTR_PATH = 0x04
EXPAND_MACROS = 0x10
_PATH_FLAGS = MKDIR_P | XATTR_PATH | EXPAND_MACROS
# doc flags
MKDOC = 0x01
ADD = 0x02
ACCESS_DELETED = 0x04
CREATE_AS_DELETED = 0x08
REVIVE = 0x10
_DOC_FLAGS = MKDOC | ADD | ACCESS_DELETED | CREATE_AS_DELETED | REVIVE
MAX_SPECS = 16

# whole-document opcodes inside multi-path requests
_WHOLE_GET = 0x00
_WHOLE_SET = 0x01
_WHOLE_DELETE = 0x04

_LOOKUPS = frozenset({Opcode.SUBDOC_GET, Opcode.SUBDOC_EXISTS, Opcode.SUBDOC_GET_COUNT})
_MUTATIONS = frozenset({
    Opcode.SUBDOC_DICT_ADD, Opcode.SUBDOC_DICT_UPSERT, Opcode.SUBDOC_DELETE,
    Opcode.SUBDOC_REPLACE, Opcode.SUBDOC_ARRAY_PUSH_LAST, Opcode.SUBDOC_ARRAY_PUSH_FIRST,
    Opcode.SUBDOC_ARRAY_INSERT, Opcode.SUBDOC_ARRAY_ADD_UNIQUE, Opcode.SUBDOC_COUNTER,
})
#: mutations that take no value
_NO_VALUE = frozenset({Opcode.SUBDOC_DELETE, _WHOLE_DELETE})
_ARRAY_OPS = frozenset({Opcode.SUBDOC_ARRAY_PUSH_LAST, Opcode.SUBDOC_ARRAY_PUSH_FIRST,
                        Opcode.SUBDOC_ARRAY_ADD_UNIQUE, Opcode.SUBDOC_ARRAY_INSERT})
#: operations whose path may not be empty (the array pushes and GET_COUNT may name the
#: root)
_NEEDS_PATH = frozenset({
    Opcode.SUBDOC_GET, Opcode.SUBDOC_EXISTS, Opcode.SUBDOC_DICT_ADD,
    Opcode.SUBDOC_DICT_UPSERT, Opcode.SUBDOC_DELETE, Opcode.SUBDOC_REPLACE,
    Opcode.SUBDOC_ARRAY_INSERT, Opcode.SUBDOC_COUNTER,
})


class _Fail(Exception):
    """A request-level failure: answer `status` (through `conn.error`)."""

    def __init__(self, status: int) -> None:
        super().__init__(hex(status))
        self.status = status


class _Spec:
    __slots__ = ("op", "flags", "path", "value", "comps")

    def __init__(self, op: int, flags: int, path: bytes, value: bytes) -> None:
        self.op, self.flags, self.path, self.value = op, flags, path, value
        self.comps = None


# -- xattrs ------------------------------------------------------------------------------


def decode_xattrs(blob: bytes) -> dict[str, bytes]:
    """{name: JSON text} of an xattr section (its 4-byte length included)."""
    out: dict[str, bytes] = {}
    p, end = 4, len(blob)
    while p < end:
        n = _U32.unpack_from(blob, p)[0]
        pair = blob[p + 4:p + 4 + n]
        k, v, _ = pair.split(b"\x00", 2)
        out[k.decode()] = v
        p += 4 + n
    return out


def encode_xattrs(xattrs: dict[str, bytes]) -> bytes:
    if not xattrs:
        return b""
    parts = []
    for k, v in xattrs.items():
        pair = k.encode() + b"\x00" + v + b"\x00"
        parts.append(_U32.pack(len(pair)) + pair)
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def _macro_hex(n: int) -> str:
    return "0x" + n.to_bytes(8, "little").hex()


def _vattr_document(vb, item, xattrs: dict, body: bytes) -> dict:
    dt = []
    if item.datatype & _JSON:
        dt.append("json")
    if xattrs:
        dt.append("xattr")
    return {
        "CAS": "0x%016x" % item.cas,
        "vbucket_uuid": "0x%016x" % vb.uuid,
        "seqno": "0x%016x" % item.seqno,
        "revid": str(item.rev),
        "exptime": item.expiry,
        "flags": item.flags,
        "value_bytes": len(body),
        "value_crc32c": "0x%08x" % crc32c.crc32c(body),
        "deleted": item.op != ITEM_MUTATION,
        "datatype": dt or ["raw"],
        "last_modified": str(item.cas // 1_000_000_000),  # the CAS's clock, in seconds
    }


# -- parsing requests --------------------------------------------------------------------


def _single(frame) -> tuple[list[_Spec], int, int | None]:
    """The spec, doc flags and expiry (None: none given) of a single-path request."""
    extras = frame.extras
    n = len(extras)
    if n not in (3, 4, 7, 8):
        raise _Fail(Status.EINVAL)
    plen, pflags = _U16.unpack_from(extras)[0], extras[2]
    expiry = _U32.unpack_from(extras, 3)[0] if n >= 7 else None
    dflags = extras[-1] if n in (4, 8) else 0
    value = frame.value
    if plen > len(value):
        raise _Fail(Status.EINVAL)
    return [_Spec(frame.opcode, pflags, bytes(value[:plen]), bytes(value[plen:]))], dflags, expiry


def _multi(frame, mutation: bool) -> tuple[list[_Spec], int, int | None]:
    extras = frame.extras
    n = len(extras)
    if n not in ((0, 1, 4, 5) if mutation else (0, 1)):
        raise _Fail(Status.EINVAL)
    expiry = _U32.unpack_from(extras)[0] if n >= 4 else None
    dflags = extras[-1] if n in (1, 5) else 0
    body = bytes(frame.value)
    specs: list[_Spec] = []
    p = 0
    hdr = _MUTATION_SPEC if mutation else _LOOKUP_SPEC
    while p < len(body):
        if p + hdr.size > len(body):
            raise _Fail(Status.EINVAL)
        if mutation:
            op, pflags, plen, vlen = hdr.unpack_from(body, p)
        else:
            op, pflags, plen = hdr.unpack_from(body, p)
            vlen = 0
        p += hdr.size
        if p + plen + vlen > len(body):
            raise _Fail(Status.EINVAL)
        specs.append(_Spec(op, pflags, body[p:p + plen], body[p + plen:p + plen + vlen]))
        p += plen + vlen
    if not specs:
        raise _Fail(Status.EINVAL)
    if len(specs) > MAX_SPECS:
        raise _Fail(Status.SUBDOC_INVALID_COMBO)
    return specs, dflags, expiry


def _validate(specs: list[_Spec], dflags: int, mutation: bool, cas: int) -> None:
    if dflags & ~_DOC_FLAGS:
        raise _Fail(Status.EINVAL)
    if dflags & (CREATE_AS_DELETED | REVIVE):
        raise _Fail(Status.NOT_SUPPORTED)
    if dflags & MKDOC and dflags & ADD:
        raise _Fail(Status.EINVAL)
    if dflags & ADD and cas:
        raise _Fail(Status.EINVAL)
    if not mutation and dflags & (MKDOC | ADD):
        raise _Fail(Status.EINVAL)
    seen_body = False
    for s in specs:
        allowed = (_MUTATIONS | {_WHOLE_SET, _WHOLE_DELETE}) if mutation \
            else (_LOOKUPS | {_WHOLE_GET})
        if s.op not in allowed:
            raise _Fail(Status.SUBDOC_INVALID_COMBO)
        if s.flags & ~_PATH_FLAGS:
            raise _Fail(Status.EINVAL)
        if s.flags & EXPAND_MACROS and not s.flags & XATTR_PATH:
            raise _Fail(Status.SUBDOC_XATTR_INVALID_FLAG_COMBO)
        if s.op in (_WHOLE_GET, _WHOLE_SET, _WHOLE_DELETE):
            if s.path or s.flags & XATTR_PATH:
                raise _Fail(Status.EINVAL)
        if s.op in _NO_VALUE and s.value:
            raise _Fail(Status.EINVAL)
        if s.op in _NEEDS_PATH and not s.path:
            raise _Fail(Status.EINVAL)
        if s.flags & XATTR_PATH:
            if seen_body:
                raise _Fail(Status.SUBDOC_INVALID_XATTR_ORDER)
            if not s.path:
                raise _Fail(Status.EINVAL)
        else:
            seen_body = True


# -- the document a request works on -----------------------------------------------------


class _Doc:
    """A document opened for a request: its xattrs and body, parsed when first needed."""

    def __init__(self, vb, item, root=None) -> None:
        self.vb = vb
        self.item = item
        if item is not None and item.datatype & _XATTR:
            blob, body = split_xattrs(item.value)
            self.xattrs = {k: v for k, v in decode_xattrs(blob).items()}
        else:
            self.xattrs = {}
            body = item.value if item is not None else b""
        self.raw_body = body
        self._body = root  # a new document's empty root, else parsed on demand
        self._xattr_values: dict | None = None
        self.body_changed = root is not None
        self.xattrs_changed = False

    @property
    def body(self):
        if self._body is None:
            self._body = subdoc.parse_document(self.raw_body)
        return self._body

    @body.setter
    def body(self, value) -> None:
        self._body = value
        self.body_changed = True

    def xattr_values(self) -> dict:
        """{name: parsed JSON} of the user and system xattrs (virtual ones excluded)."""
        if self._xattr_values is None:
            vals = {}
            for k, v in self.xattrs.items():
                try:
                    vals[k] = json.loads(v)
                except ValueError:
                    raise subdoc.SubdocError(subdoc.DOC_NOT_JSON) from None
            self._xattr_values = vals
        return self._xattr_values

    def vattr(self, name: str):
        if name == "$document":
            return _vattr_document(self.vb, self.item, self.xattrs, self.raw_body)
        if name == "$XTOC":
            return list(self.xattrs)
        if name == "$vbucket":
            return {"HLC": {"now": str(int(time.time())), "mode": "real"}}
        raise subdoc.SubdocError(Status.SUBDOC_XATTR_UNKNOWN_VATTR)


def _comps(spec: _Spec) -> list:
    if spec.comps is None:
        spec.comps = subdoc.parse_path(spec.path)
    return spec.comps


def _lookup(doc: _Doc, spec: _Spec) -> bytes:
    """The value a lookup spec answers (b"" for EXISTS); SubdocError on failure."""
    if spec.op == _WHOLE_GET:
        return doc.raw_body
    comps = _comps(spec)
    if spec.flags & XATTR_PATH:
        name = comps[0] if comps and isinstance(comps[0], str) else None
        if name is None:
            raise subdoc.SubdocError(subdoc.PATH_EINVAL)
        if name.startswith("$"):
            target, rest = {name: doc.vattr(name)}, comps
        else:
            target, rest = doc.xattr_values(), comps
    else:
        if not comps and spec.op != Opcode.SUBDOC_GET_COUNT:
            raise subdoc.SubdocError(subdoc.PATH_EINVAL)
        target, rest = doc.body, comps
    if spec.op == Opcode.SUBDOC_GET:
        return subdoc.op_get(target, rest)
    if spec.op == Opcode.SUBDOC_EXISTS:
        subdoc.op_exists(target, rest)
        return b""
    return subdoc.op_get_count(target, rest)


def _mutate(doc: _Doc, spec: _Spec, mkdir_p: bool) -> bytes | None:
    """Apply one mutation spec to `doc`; the value it answers (COUNTER), else None."""
    op = spec.op
    if op == _WHOLE_SET:
        doc.raw_body = spec.value
        doc._body = None
        doc.body_changed = True
        return None
    if op == _WHOLE_DELETE:
        raise AssertionError("whole-document delete is handled by the caller")
    comps = _comps(spec)
    mkdir_p = mkdir_p or bool(spec.flags & MKDIR_P)
    if spec.flags & XATTR_PATH:
        if not comps or not isinstance(comps[0], str):
            raise subdoc.SubdocError(subdoc.PATH_EINVAL)
        if comps[0].startswith("$"):
            raise subdoc.SubdocError(Status.SUBDOC_XATTR_CANT_MODIFY_VATTR)
        target = doc.xattr_values()
        doc.xattrs_changed = True
    else:
        target = doc.body
        doc.body_changed = True
    if op == Opcode.SUBDOC_DICT_ADD:
        return subdoc.op_dict_add(target, comps, spec.value, mkdir_p=mkdir_p)
    if op == Opcode.SUBDOC_DICT_UPSERT:
        return subdoc.op_dict_add(target, comps, spec.value, mkdir_p=mkdir_p, upsert=True)
    if op == Opcode.SUBDOC_DELETE:
        return subdoc.op_delete(target, comps)
    if op == Opcode.SUBDOC_REPLACE:
        return subdoc.op_replace(target, comps, spec.value)
    if op == Opcode.SUBDOC_ARRAY_PUSH_LAST:
        return subdoc.op_array_push(target, comps, spec.value, first=False, mkdir_p=mkdir_p)
    if op == Opcode.SUBDOC_ARRAY_PUSH_FIRST:
        return subdoc.op_array_push(target, comps, spec.value, first=True, mkdir_p=mkdir_p)
    if op == Opcode.SUBDOC_ARRAY_INSERT:
        return subdoc.op_array_insert(target, comps, spec.value)
    if op == Opcode.SUBDOC_ARRAY_ADD_UNIQUE:
        return subdoc.op_array_add_unique(target, comps, spec.value, mkdir_p=mkdir_p)
    return subdoc.op_counter(target, comps, spec.value, mkdir_p=mkdir_p)


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def _expand_macros(value, macros: dict):
    if isinstance(value, str):
        if value.startswith("${"):
            if value not in macros:
                raise subdoc.SubdocError(Status.SUBDOC_XATTR_UNKNOWN_MACRO)
            return macros[value]
        return value
    if isinstance(value, list):
        return [_expand_macros(v, macros) for v in value]
    if isinstance(value, dict):
        return {k: _expand_macros(v, macros) for k, v in value.items()}
    return value


# -- handlers ----------------------------------------------------------------------------


def _open(conn, frame, multi: bool, mutation: bool):
    """(key, vbucket, specs, doc flags, expiry), or None after answering."""
    try:
        if multi:
            specs, dflags, expiry = _multi(frame, mutation)
        else:
            specs, dflags, expiry = _single(frame)
            if not mutation and expiry is not None:
                raise _Fail(Status.EINVAL)
        _validate(specs, dflags, mutation, frame.cas)
    except _Fail as e:
        conn.error(frame, e.status)
        return None
    opened = key_and_vbucket(conn, frame)
    if opened is None:
        return None
    return (*opened, specs, dflags, expiry)


@command(Opcode.SUBDOC_GET, Opcode.SUBDOC_EXISTS, Opcode.SUBDOC_GET_COUNT,
         Opcode.SUBDOC_MULTI_LOOKUP, decode=False, privilege=Privilege.READ)
def lookup(conn, frame) -> None:
    multi = frame.opcode == Opcode.SUBDOC_MULTI_LOOKUP
    opened = _open(conn, frame, multi, False)
    if opened is None:
        return
    key, vb, specs, dflags, _expiry = opened
    now = time.time()
    item = vb.get(key, now)
    deleted = False
    if item is None and dflags & ACCESS_DELETED:
        item = vb.get_meta(key, now)
        deleted = item is not None
    if item is None:
        conn.reply(frame, Status.KEY_ENOENT)
        return
    doc = _Doc(vb, item)
    cas = LOCKED_CAS if vb.locks and vb.lock_cas(key, now) else item.cas
    if not multi:
        spec = specs[0]
        try:
            value = _lookup(doc, spec)
        except subdoc.SubdocError as e:
            conn.reply(frame, e.status)
            return
        status = Status.SUBDOC_SUCCESS_DELETED if deleted else Status.SUCCESS
        dt = _JSON if (conn.json and spec.op == Opcode.SUBDOC_GET) else 0
        conn.reply(frame, status, value=value, cas=cas, datatype=dt)
        return
    out = []
    failed = False
    for spec in specs:
        try:
            value, status = _lookup(doc, spec), 0
        except subdoc.SubdocError as e:
            value, status, failed = b"", e.status, True
        out.append(_LOOKUP_RESULT.pack(status, len(value)) + value)
    if deleted:
        status = Status.SUBDOC_MULTI_PATH_FAILURE_DELETED if failed \
            else Status.SUBDOC_SUCCESS_DELETED
    else:
        status = Status.SUBDOC_MULTI_PATH_FAILURE if failed else Status.SUCCESS
    conn.reply(frame, status, value=b"".join(out), cas=cas)


@command(*sorted(_MUTATIONS), Opcode.SUBDOC_MULTI_MUTATION, decode=False,
         privilege=Privilege.WRITE)
def mutation(conn, frame) -> None:
    multi = frame.opcode == Opcode.SUBDOC_MULTI_MUTATION
    opened = _open(conn, frame, multi, True)
    if opened is None:
        return
    key, vb, specs, dflags, expiry = opened
    now = time.time()
    old = vb.get(key, now)
    held = _may_mutate(conn, frame, vb, key, old, dflags, now)
    if held is None:
        return
    doc = _doc_to_mutate(conn, frame, multi, vb, old, specs)
    if doc is None:
        return
    if any(s.op == _WHOLE_DELETE for s in specs):
        _whole_delete(conn, frame, vb, key, old, held, specs, multi)
        return
    applied = _apply_specs(conn, frame, multi, doc, specs, mkdir_p=bool(dflags & (MKDOC | ADD)))
    if applied is None:
        return
    results, expand = applied
    body, body_json = _new_body(doc, old)
    xattrs_cas = _new_xattrs(conn, frame, multi, vb, doc, expand, body)
    if xattrs_cas is None:
        return
    xattrs, new_cas = xattrs_cas
    blob = encode_xattrs(xattrs)
    dt = (_XATTR if blob else 0) | (_JSON if body_json else 0)
    exp = _new_expiry(conn, key, expiry, now)
    flags = old.flags if old is not None else 0
    if len(blob) + len(body) > 20 * 1024 * 1024:
        conn.reply(frame, Status.E2BIG)
        return
    conn.wrote = True
    res = vb.store(key, blob + body, flags, exp, dt, cas=held or (old.cas if old else 0),
                   mode=2 if old is not None else 1, now=now, new_cas=new_cas)
    if res.status:
        conn.error(frame, res.status)
        return
    _answer_mutation(conn, frame, multi, vb, res.item, results)


def _may_mutate(conn, frame, vb, key, old, dflags, now) -> int | None:
    """The document's lock CAS (0: not locked) when the mutation may go ahead; None when
    it was answered already (exists/not found under the doc flags, locked, CAS mismatch)."""
    if old is not None and dflags & ADD:
        conn.reply(frame, Status.KEY_EEXISTS)
        return None
    if old is None and not dflags & (MKDOC | ADD):
        conn.reply(frame, Status.KEY_ENOENT)
        return None
    held = vb.lock_cas(key, now) if (old is not None and vb.locks) else 0
    if held and frame.cas != held:
        conn.error(frame, Status.LOCKED)
        return None
    if old is not None and not held and frame.cas and frame.cas != old.cas:
        conn.reply(frame, Status.KEY_EEXISTS)
        return None
    if old is None and frame.cas:
        conn.reply(frame, Status.KEY_ENOENT)
        return None
    return held


def _doc_to_mutate(conn, frame, multi, vb, old, specs) -> "_Doc | None":
    """The document the specs change: a parsed copy of `old`, or a new one whose root
    (object or array) the first body spec decides (None: answered with its error)."""
    if old is not None:
        # the specs change parsed copies: nothing is stored unless every one succeeds
        return _Doc(vb, old)
    first_body = next((s for s in specs if not s.flags & XATTR_PATH), None)
    try:
        comps = _comps(first_body) if first_body is not None and first_body.op not in (
            _WHOLE_SET, _WHOLE_DELETE) else []
    except subdoc.SubdocError as e:
        _answer_failure(conn, frame, multi, 0, e.status)
        return None
    root = subdoc.root_for(first_body is not None and first_body.op in _ARRAY_OPS, comps)
    return _Doc(vb, None, root)


def _apply_specs(conn, frame, multi, doc, specs, *, mkdir_p: bool):
    """Apply every spec to `doc`: (the results to answer, the xattrs whose macros to
    expand), or None when one failed (answered with its index and status)."""
    results = []
    expand = []
    for i, spec in enumerate(specs):
        try:
            value = _mutate(doc, spec, mkdir_p)
        except subdoc.SubdocError as e:
            _answer_failure(conn, frame, multi, i, e.status)
            return None
        if spec.flags & EXPAND_MACROS:
            expand.append(_comps(spec)[0])
        if value is not None:
            results.append((i, value))
    return results, expand


def _new_body(doc, old) -> tuple[bytes, bool]:
    """The new version's body and whether it is JSON."""
    if doc.body_changed and doc._body is not None:
        return subdoc.dumps(doc._body), True
    if doc.body_changed:  # a whole-document SET
        return doc.raw_body, _is_json(doc.raw_body)
    return doc.raw_body, old is not None and bool(old.datatype & _JSON)


def _new_xattrs(conn, frame, multi, vb, doc, expand, body):
    """The new version's xattrs and its CAS when they changed (0: the store picks it), the
    macros of `expand` expanded; None when an expansion failed (answered)."""
    if not doc.xattrs_changed:
        return doc.xattrs, 0
    xvals = doc.xattr_values()
    new_cas = vb.next_cas()
    if expand:
        macros = {
            "${Mutation.CAS}": _macro_hex(new_cas),
            "${Mutation.seqno}": _macro_hex(vb.high_seqno + 1),
            "${Mutation.value_crc32c}": "0x%08x" % crc32c.crc32c(body),
        }
        try:
            for name in expand:
                if name in xvals:
                    xvals[name] = _expand_macros(xvals[name], macros)
        except subdoc.SubdocError as e:
            _answer_failure(conn, frame, multi, 0, e.status)
            return None
    return {k: subdoc.dumps(v) for k, v in xvals.items()}, new_cas


def _new_expiry(conn, key, expiry, now: float) -> int:
    """The new version's absolute expiry (0: none), capped by its collection's max TTL."""
    exp = 0 if expiry is None else decisions.absolute_expiry(expiry, int(now))
    if key[0] or conn.bucket.max_ttl:
        exp = cap_expiry(conn.bucket, key, exp, int(now))
    return exp


def _answer_mutation(conn, frame, multi, vb, item, results) -> None:
    extras = mutation_extras(conn, vb, item)
    if not multi:
        value = results[0][1] if results else b""
        conn.reply(frame, extras=extras, value=value, cas=item.cas,
                   datatype=_JSON if (value and conn.json) else 0)
        return
    out = b"".join(_MUTATION_RESULT.pack(i, 0, len(v)) + v for i, v in results)
    conn.reply(frame, extras=extras, value=out, cas=item.cas)


def _whole_delete(conn, frame, vb, key, old, held, specs, multi) -> None:
    """A multi mutation's whole-document DELETE: the document is deleted (its other specs
    may only be xattr ones, which the deletion drops with it)."""
    if old is None:
        conn.reply(frame, Status.KEY_ENOENT)
        return
    if any(s.op != _WHOLE_DELETE and not s.flags & XATTR_PATH for s in specs):
        conn.error(frame, Status.SUBDOC_INVALID_COMBO)
        return
    conn.wrote = True
    res = vb.delete(key, cas=held or frame.cas)
    if res.status:
        conn.error(frame, res.status)
        return
    conn.reply(frame, extras=mutation_extras(conn, vb, res.item), cas=res.item.cas)


def _answer_failure(conn, frame, multi: bool, index: int, status: int) -> None:
    if multi:
        conn.reply(frame, Status.SUBDOC_MULTI_PATH_FAILURE, value=_FAILURE.pack(index, status))
    else:
        conn.reply(frame, status)
