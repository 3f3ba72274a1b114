"""Key-value commands: GET, SET, ADD, REPLACE, DELETE, APPEND, PREPEND and their quiet forms.

These are the ingest hot path, so they read the `Frame` directly instead of building a
typed message. Expiry follows the memcached convention (relative up to 30 days);
a non-zero request CAS must match the stored one. With MutationSeqno negotiated a
successful mutation answers with the vbucket uuid and the seqno it got.

A value with the SNAPPY datatype bit (only from a connection that negotiated Snappy) is
decompressed first (`inflated`) and then checked and stored like any other: the node
keeps values decompressed, so reads never carry the bit (docs/snappy.md).

Keys are doc keys inside the node (`common.request_doc_key`): a legacy connection's key
gets the default collection's prefix, a collections connection's key is checked (EINVAL,
UNKNOWN_COLLECTION). Answers that carry a key (GETK) echo the key as the client sent it.
A collection's max TTL, or else the bucket's maxTTL, caps the expiry of SET/ADD/REPLACE
(`common.cap_expiry`).
"""
from __future__ import annotations

import json
import struct
import time

from dcptool.protocol.constants import DATATYPE_MASK, Datatype, Opcode, Status, VBucketState
from dcptool.protocol.errors import ProtocolError
from dcptool.protocol.snappy import SnappyTooLarge, decompress

from .. import decisions
from ..access import Privilege
from ..item import split_xattrs, valid_xattr_blob
from .common import cap_expiry, command, not_my_vbucket, request_doc_key

# plain ints on the hot path (IntFlag arithmetic costs microseconds)
_JSON = int(Datatype.JSON)
_SNAPPY = int(Datatype.SNAPPY)
_XATTR = int(Datatype.XATTR)
_BAD_DATATYPE = ~DATATYPE_MASK | _SNAPPY
_ACTIVE = int(VBucketState.ACTIVE)
_STORE_EXTRAS = struct.Struct(">II")
_FLAGS = struct.Struct(">I")
_SEQNO_EXTRAS = struct.Struct(">QQ")
MAX_KEY = 250
MAX_VALUE = 20 * 1024 * 1024
#: the CAS every client sees in a GET while a document is locked (GET_LOCKED)
LOCKED_CAS = 0xFFFFFFFFFFFFFFFF

_SET_MODE = {
    Opcode.SET: 0, Opcode.SETQ: 0,
    Opcode.ADD: 1, Opcode.ADDQ: 1,
    Opcode.REPLACE: 2, Opcode.REPLACEQ: 2,
}
_QUIET = frozenset({Opcode.SETQ, Opcode.ADDQ, Opcode.REPLACEQ, Opcode.DELETEQ,
                    Opcode.GETQ, Opcode.GETKQ, Opcode.APPENDQ, Opcode.PREPENDQ})
#: APPEND/PREPEND take raw, JSON or Snappy values, never XATTR (kv_engine's
#: append_prepend_validator in daemon/mcbp_validators.cc has the same mask)
_APPEND_DATATYPES = _JSON | _SNAPPY
_APPENDS = frozenset({Opcode.APPEND, Opcode.APPENDQ})


def active_vbucket(conn, frame):
    """The active vbucket a key request addresses, or None after answering NOT_MY_VBUCKET."""
    vb = conn.bucket.vbuckets.get(frame.specific)
    if vb is None or vb.state != _ACTIVE:
        not_my_vbucket(conn, frame)
        return None
    return vb


def key_and_vbucket(conn, frame) -> tuple[bytes, object] | None:
    """(doc key, active vbucket) of a key request, or None after answering (EINVAL,
    UNKNOWN_COLLECTION, NOT_MY_VBUCKET)."""
    key = request_doc_key(conn, frame, frame.key)
    if key is None:
        return None
    vb = active_vbucket(conn, frame)
    if vb is None:
        return None
    return key, vb


def inflated(conn, frame, value: bytes) -> bytes | None:
    """The decompressed value of a request whose datatype has SNAPPY, or None after
    answering an error.

    As kv_engine's request validator does (McbpValidator::verify_header in
    daemon/mcbp_validators.cc): a datatype above 0x07 or a bit the connection did not
    negotiate is EINVAL, a value that does not inflate is EINVAL, and only then are the
    xattrs of the inflated value checked (by the caller). A value that inflates to more
    than the largest document is E2BIG, as the engine answers for any oversized item.
    """
    if frame.datatype & ~DATATYPE_MASK or not conn.snappy:
        conn.reply(frame, Status.EINVAL)
        return None
    if not value:  # not a Snappy block: it lacks even the length varint
        conn.reply(frame, Status.EINVAL)
        return None
    try:
        return decompress(value, MAX_VALUE)
    except SnappyTooLarge:
        conn.reply(frame, Status.E2BIG)
    except ProtocolError:
        conn.reply(frame, Status.EINVAL)
    return None


def _is_json(body: bytes) -> bool:
    """Is `body` a JSON object or array (white space around it allowed)?"""
    if body.lstrip(b" \t\r\n")[:1] not in (b"{", b"["):
        return False
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def datatype_allowed(conn, frame, value: bytes, dt: int) -> bool:
    """False after answering EINVAL (unknown bits, SNAPPY still set, XATTR on a connection
    that did not negotiate it) or XATTR_EINVAL (a malformed xattr blob)."""
    if dt & _BAD_DATATYPE:
        conn.reply(frame, Status.EINVAL)
        return False
    if dt & _XATTR:
        if not conn.xattr:
            conn.reply(frame, Status.EINVAL)
            return False
        if not valid_xattr_blob(value):
            conn.reply(frame, Status.XATTR_EINVAL)
            return False
    return True


def check_datatype(conn, frame, value: bytes, dt: int | None = None) -> int | None:
    """The datatype to store for a client's value, or None after answering an error.

    `dt` is the request's datatype once a compressed value was inflated (without SNAPPY).
    """
    if dt is None:
        dt = frame.datatype
    if not datatype_allowed(conn, frame, value, dt):
        return None
    if dt & _JSON:
        if not conn.json:
            conn.reply(frame, Status.EINVAL)
            return None
    elif value[:1] in (b"{", b"[") and not dt & _XATTR:
        try:
            json.loads(value)
            dt |= _JSON
        except ValueError:
            pass
    return dt


def mutation_extras(conn, vb, item) -> bytes:
    if conn.mutation_seqno:
        return _SEQNO_EXTRAS.pack(vb.uuid, item.seqno)
    return b""


def answer_write(conn, frame, vb, res, quiet: bool) -> None:
    """The answer to a write that ran: its failure status; else nothing when `quiet`, or
    the new CAS (with the vbucket uuid and seqno when MutationSeqno was negotiated)."""
    if res.status:
        conn.error(frame, res.status)  # LOCKED is KEY_EEXISTS to a client without XERROR
    elif not quiet:
        item = res.item
        conn.reply(frame, cas=item.cas, extras=mutation_extras(conn, vb, item))


@command(Opcode.SET, Opcode.ADD, Opcode.REPLACE, Opcode.SETQ, Opcode.ADDQ, Opcode.REPLACEQ,
         decode=False, privilege=Privilege.WRITE)
def store(conn, frame) -> None:
    extras = frame.extras
    if len(extras) != 8:
        conn.reply(frame, Status.EINVAL)
        return
    key = request_doc_key(conn, frame, frame.key)
    if key is None:
        return
    value = frame.value
    if len(value) > MAX_VALUE:
        conn.reply(frame, Status.E2BIG)
        return
    dt = frame.datatype
    if dt & _SNAPPY:
        value = inflated(conn, frame, value)
        if value is None:
            return
        dt &= ~_SNAPPY
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    if dt or value[:1] in (b"{", b"["):
        dt = check_datatype(conn, frame, value, dt)
        if dt is None:
            return
    flags, expiry = _STORE_EXTRAS.unpack(extras)
    now = time.time()
    if expiry:
        expiry = decisions.absolute_expiry(expiry, int(now))
    if key[0] or conn.bucket.max_ttl:
        expiry = cap_expiry(conn.bucket, key, expiry, int(now))
    conn.wrote = True
    res = vb.store(key, value, flags, expiry, dt, cas=frame.cas, mode=_SET_MODE[frame.opcode],
                   now=now)
    # a SET with a CAS on a missing key gets KEY_ENOENT from the store
    answer_write(conn, frame, vb, res, frame.opcode in _QUIET)


@command(Opcode.DELETE, Opcode.DELETEQ, decode=False, privilege=Privilege.WRITE)
def delete(conn, frame) -> None:
    if frame.extras or frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    key = request_doc_key(conn, frame, frame.key)
    if key is None:
        return
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    conn.wrote = True
    res = vb.delete(key, cas=frame.cas)
    answer_write(conn, frame, vb, res, frame.opcode in _QUIET)


@command(Opcode.APPEND, Opcode.PREPEND, Opcode.APPENDQ, Opcode.PREPENDQ, decode=False,
         privilege=Privilege.WRITE)
def append_prepend(conn, frame) -> None:
    """APPEND/PREPEND: add the request's value after/before the stored body.

    memcached semantics, as kv_engine's AppendPrependCommandContext applies them: no
    extras; a missing key is NOT_STORED; a non-zero CAS must match; the new version
    keeps the document's flags and expiry, and its xattrs stay in front of the body; the
    JSON bit follows from the resulting body.
    """
    if frame.extras:
        conn.reply(frame, Status.EINVAL)
        return
    key = request_doc_key(conn, frame, frame.key)
    if key is None:
        return
    dt = frame.datatype
    if dt & ~_APPEND_DATATYPES or (dt & _JSON and not conn.json):
        conn.reply(frame, Status.EINVAL)
        return
    value = frame.value
    if len(value) > MAX_VALUE:
        conn.reply(frame, Status.E2BIG)
        return
    if dt & _SNAPPY:
        value = inflated(conn, frame, value)
        if value is None:
            return
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    now = time.time()
    old = vb.get(key, now)
    if old is None:
        conn.reply(frame, Status.NOT_STORED)
        return
    held = vb.lock_cas(key, now) if vb.locks else 0
    if held:
        if frame.cas != held:
            conn.error(frame, Status.LOCKED)
            return
    elif frame.cas and frame.cas != old.cas:
        conn.reply(frame, Status.KEY_EEXISTS)
        return
    if old.datatype & _XATTR:
        xattrs, body = split_xattrs(old.value)
    else:
        xattrs, body = b"", old.value
    body = body + value if frame.opcode in _APPENDS else value + body
    if len(xattrs) + len(body) > MAX_VALUE:
        conn.reply(frame, Status.E2BIG)
        return
    new_dt = (old.datatype & _XATTR) | (_JSON if _is_json(body) else 0)
    conn.wrote = True
    res = vb.store(key, xattrs + body, old.flags, old.expiry, new_dt, cas=held or old.cas,
                   mode=2, now=now)
    answer_write(conn, frame, vb, res, frame.opcode in _QUIET)


@command(Opcode.GET, Opcode.GETQ, Opcode.GETK, Opcode.GETKQ, decode=False,
         privilege=Privilege.READ)
def get(conn, frame) -> None:
    if frame.extras or frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    key = request_doc_key(conn, frame, frame.key)
    if key is None:
        return
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    op = frame.opcode
    with_key = op in (Opcode.GETK, Opcode.GETKQ)
    now = time.time()
    item = vb.get(key, now)
    if item is None:
        if op in _QUIET:
            return
        conn.reply(frame, Status.KEY_ENOENT, key=frame.key if with_key else b"")
        return
    cas = item.cas
    if vb.locks and vb.lock_cas(key, now):
        cas = LOCKED_CAS  # the lock's holder alone knows a CAS that writes
    value = item.value
    dt = item.datatype
    if dt & _XATTR:
        value = split_xattrs(value)[1]
        dt &= ~_XATTR
    if not conn.json:
        dt &= ~_JSON
    conn.reply(frame, extras=_FLAGS.pack(item.flags), key=frame.key if with_key else b"",
               value=value, cas=cas, datatype=dt)
