"""The write hot path: runs of plain SET/SETQ and SET/DEL(Q)_WITH_META requests handled
straight from a connection's read buffer.

A restore or a bulk load sends thousands of such requests per read. `take_writes` walks
them with one precompiled header unpack per frame and no `Frame` or message object, and
stores each version through the vbucket's `_commit` like any other change. A request
that needs anything out of the ordinary (flexible framing, a request CAS, xattrs, a
Snappy-compressed value, an expiry to convert, unusual meta options or extras, a value
that might be JSON without saying so, a vbucket this node does not hold active, a user
without the privilege, a key whose collection prefix is anything but the default
collection's or a live collection's one-byte id, a SET into a collection with a max TTL
or a bucket with a maxTTL, ...) ends the run: the generic dispatch (`Connection.dispatch`)
takes that frame with all its checks, so the answers are the same either way.

Keys become doc keys here too: a legacy connection's key gets the 0x00 prefix, a
collections connection's key is stored as sent.
"""
from __future__ import annotations

import logging
import time

from dcptool.protocol import wire as w
from dcptool.protocol.constants import Status, VBucketState

from dcptool.protocol.collections import FIRST_USER_ID

from .access import Privilege
from .item import ITEM_DELETION, ITEM_EXPIRATION, ITEM_MUTATION, Item

log = logging.getLogger("dcptool.node.connection")

_HEADER = w.HEADER.unpack_from
_RSP = w.HEADER.pack
_META = w.WITH_META_EXTRAS.unpack_from
_META_OPTIONS = w.WITH_META_OPTIONS_EXTRAS.unpack_from
_SET_EXTRAS = w.STORE_EXTRAS.unpack_from
_SEQNO_EXTRAS = w.MUTATION_SEQNO_EXTRAS.pack
_REQ = w.REQ
_RES = w.RES

_SET = w.OP_SET
_SETQ = w.OP_SETQ
_SET_WITH_META = w.OP_SET_WITH_META
_SETQ_WITH_META = w.OP_SETQ_WITH_META
_DEL_WITH_META = w.OP_DEL_WITH_META
_DELQ_WITH_META = w.OP_DELQ_WITH_META
#: opcodes `take_writes` may handle (the connection looks at the first frame's opcode)
FAST_OPCODES = frozenset({_SET, _SETQ, _SET_WITH_META, _SETQ_WITH_META, _DEL_WITH_META,
                          _DELQ_WITH_META})
_WITH_META = frozenset({_SET_WITH_META, _SETQ_WITH_META, _DEL_WITH_META, _DELQ_WITH_META})
_DELETIONS = frozenset({_DEL_WITH_META, _DELQ_WITH_META})
_META_SETS = frozenset({_SET_WITH_META, _SETQ_WITH_META})
_QUIET = frozenset({_SETQ, _SETQ_WITH_META, _DELQ_WITH_META})

_JSON = w.DT_JSON
_ACTIVE = int(VBucketState.ACTIVE)
_SKIP_CR = w.META_SKIP_CONFLICT_RESOLUTION
_IS_EXPIRATION = w.META_IS_EXPIRATION
_FAST_OPTIONS = _SKIP_CR | _IS_EXPIRATION
_KEY_EEXISTS = int(Status.KEY_EEXISTS)
_EINTERNAL = int(Status.EINTERNAL)
MAX_KEY = 250
#: the first copy of a run's bytes (or its first frame, if larger), and the largest: each
#: copy is 4x the one before
_FIRST_CHUNK = 4096
_MAX_CHUNK = 1 << 20
MAX_VALUE = 20 * 1024 * 1024


def take_writes(conn, buf: bytearray, max_body: int) -> int:
    """Handle the run of plain write requests at the start of `buf`; returns the bytes used.

    0 means the first frame is not one for this path (or is incomplete).
    """
    bucket = conn.bucket
    if bucket is None or not conn.authenticated or conn.closing:
        return 0
    privileges = getattr(conn, "privileges", ())
    meta_ok = Privilege.META_WRITE in privileges
    set_ok = Privilege.WRITE in privileges
    vbuckets = bucket.vbuckets
    replied = 0
    seqno_extras = conn.mutation_seqno
    collections = conn.collections
    live = bucket.collections
    first_user = FIRST_USER_ID
    n = len(buf)
    off = 0
    count = 0
    now = time.time()
    req = _REQ
    rsp = _RES
    # keys and values are sliced from a bytes copy of the buffer (one memcpy a chunk; a
    # bytes slice costs about half a memoryview's slice copied): `data` holds buf[lo:hi],
    # copied as the run reaches it, in chunks that grow while the run goes on (a run of
    # one frame before other commands copies little)
    data = b""
    lo = hi = 0
    chunk = _FIRST_CHUNK
    with memoryview(buf) as mv:
        while n - off >= 24:
            magic, op, klen, elen, dt, vbid, blen, opaque, cas = _HEADER(buf, off)
            if magic != req or blen > max_body:
                break
            end = off + 24 + blen
            if end > n or cas or not klen:
                break
            p = off + 24
            ks = p + elen
            kend = ks + klen
            if kend > end:
                break
            if end > hi:
                lo = off
                hi = min(n, max(end, off + chunk))
                data = bytes(mv[lo:hi])
                if chunk < _MAX_CHUNK:
                    chunk <<= 2
            if collections:
                b = buf[ks]
                if b:
                    # a one-byte collection id of a live collection; anything else
                    # (reserved, longer prefixes, unknown) is the generic path's
                    if b < first_user or b >= 0x80 or klen < 2 or klen > 247:
                        break
                    ttl = live.get(b)
                    if ttl is None:
                        break
                elif klen < 2 or klen > 251:
                    break
                else:
                    ttl = 0
                key = data[ks - lo:kend - lo]
            else:
                if klen > MAX_KEY:
                    break
                ttl = 0
                key = b"\x00" + data[ks - lo:kend - lo]
            if op in _WITH_META:
                if not meta_ok:
                    break
                vb = vbuckets.get(vbid)
                if elen == 24 and op in _META_SETS and not dt & ~_JSON and vb is not None \
                        and vb.state == _ACTIVE:
                    # the restore's common case, inline: a SET(Q)_WITH_META without options
                    # (what `_with_meta` does with it, without the call)
                    flags, expiry, rev, meta_cas = _META(buf, p)
                    if not meta_cas:
                        break
                    value = data[kend - lo:end - lo]
                    try:
                        if vb.find(key) is None:
                            if meta_cas > vb.max_cas:
                                vb.max_cas = meta_cas
                            got = vb._commit(Item(key, value, 0, rev, meta_cas, flags, expiry,
                                                  dt))
                        else:  # a stored version: full conflict resolution
                            res = vb.store_with_meta(
                                key, value, flags=flags, expiry=expiry, rev=rev,
                                meta_cas=meta_cas, datatype=dt, options=0, deletion=False,
                                now=now)
                            got = res.status or res.item
                    except Exception:
                        log.exception("%s: command 0x%02x failed", conn.peer, op)
                        got = _EINTERNAL
                else:
                    got = _with_meta(conn, vb, buf, data, lo, p, kend, end, op, elen, dt, key,
                                     now)
            elif op == _SET or op == _SETQ:
                if not set_ok or ttl:
                    break
                vb = vbuckets.get(vbid)
                got = _set(conn, vb, buf, data, lo, p, kend, end, op, elen, dt, key)
            else:
                break
            if got is None:
                break  # not for this path: the generic dispatch takes the frame
            off = end
            count += 1
            if isinstance(got, int):
                conn.out.append(_RSP(rsp, op, 0, 0, 0, got, 0, opaque, 0))
                replied += 24
                continue
            item = got
            if op not in _QUIET:
                if seqno_extras:
                    conn.out.append(_RSP(rsp, op, 0, 16, 0, 0, 16, opaque, item.cas))
                    conn.out.append(_SEQNO_EXTRAS(vb.uuid, item.seqno))
                    replied += 40
                else:
                    conn.out.append(_RSP(rsp, op, 0, 0, 0, 0, 0, opaque, item.cas))
                    replied += 24
    if count:
        conn.frames_in += count
        conn.wrote = True
    if replied:
        conn.out_bytes += replied
    return off


def _with_meta(conn, vb, buf, data: bytes, lo: int, p: int, kend: int, end: int, op: int,
               elen: int, dt: int, key: bytes, now: float):
    """Store one SET/DEL(Q)_WITH_META whose header and key `take_writes` checked: the new
    Item, a status to answer, or None when the request is not for the fast path. `data`
    holds `buf` from offset `lo` on (the key's and value's bytes at least)."""
    if dt & ~_JSON:
        return None
    if elen == 24:
        flags, expiry, rev, meta_cas = _META(buf, p)
        options = 0
    elif elen == 28:
        flags, expiry, rev, meta_cas, options = _META_OPTIONS(buf, p)
        if options & ~_FAST_OPTIONS:
            return None
    else:
        return None
    deletion = op in _DELETIONS
    if not meta_cas or (deletion and kend != end) or (
            options & _IS_EXPIRATION and not deletion):
        return None
    if vb is None or vb.state != _ACTIVE:
        return None
    value = data[kend - lo:end - lo]
    try:
        old = vb.find(key)
        if old is not None and not options & _SKIP_CR:
            # a stored version: full conflict resolution
            res = vb.store_with_meta(
                key, value, flags=flags, expiry=expiry, rev=rev, meta_cas=meta_cas,
                datatype=dt, options=options, deletion=deletion, now=now)
            return res.status or res.item
        if meta_cas > vb.max_cas:
            vb.max_cas = meta_cas
        if deletion:
            return vb._commit(Item(
                key, value, 0, rev, meta_cas, flags, 0, dt,
                ITEM_EXPIRATION if options & _IS_EXPIRATION else ITEM_DELETION,
                expiry or int(now)))
        return vb._commit(Item(key, value, 0, rev, meta_cas, flags, expiry, dt))
    except Exception:
        log.exception("%s: command 0x%02x failed", conn.peer, op)
        return _EINTERNAL


def _set(conn, vb, buf, data: bytes, lo: int, p: int, kend: int, end: int, op: int,
         elen: int, dt: int, key: bytes):
    """Store one plain SET/SETQ whose header and key `take_writes` checked: the new Item,
    a status to answer, or None when the request is not for the fast path."""
    if elen != 8 or end - kend > MAX_VALUE:
        return None
    if dt:
        if dt != _JSON or not conn.json:
            return None
    elif end > kend and buf[kend] in b"{[":
        return None  # might be JSON: the generic path looks
    flags, expiry = _SET_EXTRAS(buf, p)
    if expiry or conn.bucket.max_ttl:
        return None
    if vb is None or vb.state != _ACTIVE:
        return None
    if vb.locks and key in vb.locks:
        return None  # locked (GET_LOCKED): the generic path answers
    old = vb.find(key)
    if old is not None and old.op == ITEM_MUTATION and old.expiry:
        return None  # may have expired: the generic path turns it into a tombstone
    value = data[kend - lo:end - lo]
    try:
        return vb._commit(Item(key, value, 0, old.rev + 1 if old is not None else 1,
                               vb.next_cas(), flags, 0, dt))
    except Exception:
        log.exception("%s: command 0x%02x failed", conn.peer, op)
        return _EINTERNAL
