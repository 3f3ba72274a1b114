"""Document commands beyond plain reads and writes, as kv_engine answers them:
INCREMENT/DECREMENT (and their quiet forms), TOUCH, GAT/GATQ, GET_LOCKED, UNLOCK_KEY,
GET_REPLICA and OBSERVE_SEQNO.

Every one that changes a document commits an ordinary new version through the vbucket
(a new seqno and CAS), so DCP streams, backups, tails and replicas see it like a SET.

* **Counters** (kv_engine's ArithmeticCommandContext): extras are the delta (u64), the
  initial value (u64) and an expiry (u32). A missing document is created with the initial
  value (flags 0, the expiry given), unless the expiry is 0xffffffff: then KEY_ENOENT. An
  existing body must be an unsigned decimal number of at most 20 digits (DELTA_BADVAL
  otherwise); an increment wraps at 2^64, a decrement stops at 0; the document keeps its
  flags, expiry and xattrs. The answer's value is the new count as a big-endian u64.
* **Touch** sets a new expiry (same convention as SET's); GAT also answers the value with
  its flags. A missing document is KEY_ENOENT (GATQ says nothing on a miss).
* **Locks** (GET_LOCKED): the document is locked for the extras' seconds; 0 or more than
  the maximum (30 s) means the default (15 s), kv_engine's getl_default_timeout and
  getl_max_timeout. The answer carries a new CAS, the lock's. While locked, GET answers
  CAS 0xffffffffffffffff, GET_LOCKED and UNLOCK_KEY with another CAS answer LOCKED with
  XERROR (TMPFAIL without), and writes without the lock's CAS answer LOCKED (KEY_EEXISTS
  without XERROR). A write with the lock's CAS, UNLOCK_KEY with it, or the lock's time
  ends the lock; UNLOCK_KEY of a document that is not locked is NOT_LOCKED (TMPFAIL
  without XERROR). Locks are held in memory only. SET/DEL_WITH_META (restores and
  replication) do not wait for a lock: their version ends it.
* **GET_REPLICA** reads a vbucket this node holds as a replica (NOT_MY_VBUCKET for any
  other state), as the SDKs' replica reads do.
* **OBSERVE_SEQNO**: the value is the vbucket uuid the client knows; the answer gives the
  vbucket's persisted and current seqnos, and, when that uuid is not the current one but
  in the failover log, the old uuid and the seqno its branch ended at (format 1).
"""
from __future__ import annotations

import struct
import time

from dcptool.protocol.constants import Datatype, Opcode, Status, VBucketState

from .. import decisions
from ..access import Privilege
from ..item import ITEM_MUTATION, split_xattrs
from .common import cap_expiry, command, not_my_vbucket, request_doc_key
from .kv import LOCKED_CAS, answer_write, key_and_vbucket, mutation_extras

_ARITH_EXTRAS = struct.Struct(">QQI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_OBSERVE = struct.Struct(">BHQQQ")
_OBSERVE_FAILOVER = struct.Struct(">QQ")
_XATTR = int(Datatype.XATTR)
_JSON = int(Datatype.JSON)
_REPLICA = int(VBucketState.REPLICA)
_NO_CREATE = 0xFFFFFFFF
_WRAP = 1 << 64
#: the longest decimal a u64 needs
_MAX_DIGITS = 20
#: GET_LOCKED's lock time when the request names none, and the longest it may name
#: (kv_engine's getl_default_timeout and getl_max_timeout)
LOCK_DEFAULT_SECONDS = 15
LOCK_MAX_SECONDS = 30

_INCREMENTS = frozenset({Opcode.INCREMENT, Opcode.INCREMENTQ})
_QUIET = frozenset({Opcode.INCREMENTQ, Opcode.DECREMENTQ, Opcode.GATQ})


def locked_tmpfail(conn, frame) -> None:
    """kv_engine's locked_tmpfail: LOCKED to a client with XERROR, TMPFAIL to others."""
    conn.reply(frame, Status.LOCKED if conn.xerror else Status.ETMPFAIL)


def _counter(body: bytes) -> int | None:
    """The count a counter document's body holds, or None when it is not a number."""
    if not body or len(body) > _MAX_DIGITS or not body.isdigit():
        return None
    n = int(body)
    return n if n < _WRAP else None


@command(Opcode.INCREMENT, Opcode.DECREMENT, Opcode.INCREMENTQ, Opcode.DECREMENTQ,
         decode=False, privilege=Privilege.WRITE)
def arithmetic(conn, frame) -> None:
    if len(frame.extras) != _ARITH_EXTRAS.size or frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    opened = key_and_vbucket(conn, frame)
    if opened is None:
        return
    key, vb = opened
    delta, initial, expiry = _ARITH_EXTRAS.unpack(frame.extras)
    now = time.time()
    old = vb.get(key, now)
    if old is None:
        if expiry == _NO_CREATE:
            conn.reply(frame, Status.KEY_ENOENT)
            return
        if frame.cas:
            conn.reply(frame, Status.KEY_ENOENT)
            return
        count = initial
        expiry = decisions.absolute_expiry(expiry, int(now))
        if key[0] or conn.bucket.max_ttl:
            expiry = cap_expiry(conn.bucket, key, expiry, int(now))
        xattrs, flags, dt, mode, cas = b"", 0, _JSON, 1, 0
    else:
        held = vb.lock_cas(key, now)
        if held and frame.cas != held:
            conn.error(frame, Status.LOCKED)
            return
        if not held and frame.cas and frame.cas != old.cas:
            conn.reply(frame, Status.KEY_EEXISTS)
            return
        if old.datatype & _XATTR:
            xattrs, body = split_xattrs(old.value)
        else:
            xattrs, body = b"", old.value
        count = _counter(body)
        if count is None:
            conn.reply(frame, Status.DELTA_BADVAL)
            return
        if frame.opcode in _INCREMENTS:
            count = (count + delta) % _WRAP
        else:
            count = max(count - delta, 0)
        expiry, flags = old.expiry, old.flags
        dt = (old.datatype & _XATTR) | _JSON
        mode, cas = 2, held or old.cas
    conn.wrote = True
    res = vb.store(key, xattrs + b"%d" % count, flags, expiry, dt, cas=cas, mode=mode, now=now)
    if res.status:
        answer_write(conn, frame, vb, res, False)
    elif frame.opcode not in _QUIET:
        conn.reply(frame, extras=mutation_extras(conn, vb, res.item), value=_U64.pack(count),
                   cas=res.item.cas)


@command(Opcode.TOUCH, Opcode.GAT, Opcode.GATQ, decode=False, privilege=Privilege.WRITE)
def touch(conn, frame) -> None:
    """TOUCH and GAT: a new expiry for a live document (a new version, as kv_engine's
    touch is a mutation); GAT answers the value as GET does."""
    if len(frame.extras) != 4 or frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    opened = key_and_vbucket(conn, frame)
    if opened is None:
        return
    key, vb = opened
    if frame.opcode != Opcode.TOUCH and not _may_read(conn, frame):
        return
    now = time.time()
    old = vb.get(key, now)
    if old is None:
        if frame.opcode != Opcode.GATQ:
            conn.reply(frame, Status.KEY_ENOENT)
        return
    held = vb.lock_cas(key, now)
    if held and frame.cas != held:
        locked_tmpfail(conn, frame)
        return
    if not held and frame.cas and frame.cas != old.cas:
        conn.reply(frame, Status.KEY_EEXISTS)
        return
    expiry = decisions.absolute_expiry(_U32.unpack(frame.extras)[0], int(now))
    if key[0] or conn.bucket.max_ttl:
        expiry = cap_expiry(conn.bucket, key, expiry, int(now))
    conn.wrote = True
    res = vb.store(key, old.value, old.flags, expiry, old.datatype, cas=held or old.cas,
                   mode=2, now=now)
    if res.status:
        answer_write(conn, frame, vb, res, False)
        return
    item = res.item
    if frame.opcode == Opcode.TOUCH:
        conn.reply(frame, cas=item.cas, extras=mutation_extras(conn, vb, item))
        return
    _reply_value(conn, frame, item, item.cas)


def _may_read(conn, frame) -> bool:
    from ..access import has_privilege

    if has_privilege(conn, Privilege.READ):
        return True
    conn.error(frame, Status.EACCESS)
    return False


def _reply_value(conn, frame, item, cas: int) -> None:
    """A GET-style answer: flags in the extras, the body without xattrs."""
    value, dt = item.value, item.datatype
    if dt & _XATTR:
        value = split_xattrs(value)[1]
        dt &= ~_XATTR
    if not conn.json:
        dt &= ~_JSON
    conn.reply(frame, extras=_U32.pack(item.flags), value=value, cas=cas, datatype=dt)


@command(Opcode.GET_LOCKED, decode=False, privilege=Privilege.WRITE)
def get_locked(conn, frame) -> None:
    extras = frame.extras
    if len(extras) not in (0, 4) or frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    opened = key_and_vbucket(conn, frame)
    if opened is None:
        return
    key, vb = opened
    if not _may_read(conn, frame):
        return
    now = time.time()
    item = vb.get(key, now)
    if item is None:
        conn.reply(frame, Status.KEY_ENOENT)
        return
    if vb.lock_cas(key, now):
        locked_tmpfail(conn, frame)
        return
    seconds = _U32.unpack(extras)[0] if extras else 0
    if seconds == 0 or seconds > LOCK_MAX_SECONDS:
        seconds = LOCK_DEFAULT_SECONDS
    _reply_value(conn, frame, item, vb.lock(key, seconds, now))


@command(Opcode.UNLOCK_KEY, decode=False, privilege=Privilege.WRITE)
def unlock_key(conn, frame) -> None:
    if frame.extras or frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    opened = key_and_vbucket(conn, frame)
    if opened is None:
        return
    key, vb = opened
    now = time.time()
    if vb.get(key, now) is None:
        conn.reply(frame, Status.KEY_ENOENT)
        return
    held = vb.lock_cas(key, now)
    if not held:
        conn.error(frame, Status.NOT_LOCKED)
        return
    if frame.cas != held:
        locked_tmpfail(conn, frame)
        return
    vb.unlock(key)
    conn.reply(frame)


@command(Opcode.GET_REPLICA, decode=False, privilege=Privilege.READ)
def get_replica(conn, frame) -> None:
    if frame.extras or frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    key = request_doc_key(conn, frame, frame.key)
    if key is None:
        return
    vb = conn.bucket.vbuckets.get(frame.specific)
    if vb is None or vb.state != _REPLICA:
        not_my_vbucket(conn, frame)
        return
    item = vb.find(key)
    if item is None or item.op != ITEM_MUTATION or decisions.is_expired(item.expiry, time.time()):
        conn.reply(frame, Status.KEY_ENOENT)
        return
    _reply_value(conn, frame, item, item.cas)


@command(Opcode.OBSERVE_SEQNO, decode=False, privilege=Privilege.READ)
def observe_seqno(conn, frame) -> None:
    if frame.extras or frame.key or len(frame.value) != 8:
        conn.reply(frame, Status.EINVAL)
        return
    vb = conn.bucket.vbuckets.get(frame.specific)
    if vb is None or vb.state not in (VBucketState.ACTIVE, _REPLICA):
        not_my_vbucket(conn, frame)
        return
    uuid = _U64.unpack(frame.value)[0]
    persisted, current = vb.persisted_seqno, vb.high_seqno
    log = vb.failover_log
    if uuid == log[0][0]:
        conn.reply(frame, value=_OBSERVE.pack(0, vb.id, uuid, persisted, current))
        return
    # the branch the client knew ended where the next newer entry began
    for i in range(1, len(log)):
        if log[i][0] == uuid:
            ended = log[i - 1][1]
            conn.reply(frame, value=_OBSERVE.pack(1, vb.id, log[0][0], persisted, current)
                       + _OBSERVE_FAILOVER.pack(uuid, ended))
            return
    conn.reply(frame, Status.KEY_ENOENT)
