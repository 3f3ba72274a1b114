"""Key-value commands: GET, SET, ADD, REPLACE, DELETE and their quiet forms.

These are the ingest hot path, so they read the `Frame` directly instead of building a
typed message. Expiry follows the memcached convention (relative up to 30 days);
a non-zero request CAS must match the stored one. With MutationSeqno negotiated a
successful mutation answers with the vbucket uuid and the seqno it got.
"""
from __future__ import annotations

import json
import struct
import time

from dcptool.protocol.constants import DATATYPE_MASK, Datatype, Opcode, Status, VBucketState

from .. import decisions
from ..access import Privilege
from ..item import split_xattrs, valid_xattr_blob
from . import command

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

_SET_MODE = {
    Opcode.SET: 0, Opcode.SETQ: 0,
    Opcode.ADD: 1, Opcode.ADDQ: 1,
    Opcode.REPLACE: 2, Opcode.REPLACEQ: 2,
}
_QUIET = frozenset({Opcode.SETQ, Opcode.ADDQ, Opcode.REPLACEQ, Opcode.DELETEQ,
                    Opcode.GETQ, Opcode.GETKQ})


def not_my_vbucket(conn, frame) -> None:
    """NOT_MY_VBUCKET with the cluster map, so a smart client can refresh its view."""
    from .cluster import cluster_config_json

    conn.error(frame, Status.NOT_MY_VBUCKET, value=cluster_config_json(conn),
               datatype=Datatype.JSON if conn.json else 0)


def active_vbucket(conn, frame):
    """The active vbucket a key request addresses, or None after answering NOT_MY_VBUCKET."""
    vb = conn.bucket.vbuckets.get(frame.specific)
    if vb is None or vb.state != _ACTIVE:
        not_my_vbucket(conn, frame)
        return None
    return vb


def check_datatype(conn, frame, value: bytes) -> int | None:
    """The datatype to store for a client's value, or None after answering an error."""
    dt = frame.datatype
    if dt & _BAD_DATATYPE:
        conn.reply(frame, Status.EINVAL)
        return None
    if dt & _XATTR:
        if not conn.xattr:
            conn.reply(frame, Status.EINVAL)
            return None
        if not valid_xattr_blob(value):
            conn.reply(frame, Status.XATTR_EINVAL)
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


@command(Opcode.SET, Opcode.ADD, Opcode.REPLACE, Opcode.SETQ, Opcode.ADDQ, Opcode.REPLACEQ,
         decode=False, privilege=Privilege.WRITE)
def store(conn, frame) -> None:
    extras = frame.extras
    key = frame.key
    if len(extras) != 8 or not key or len(key) > MAX_KEY:
        conn.reply(frame, Status.EINVAL)
        return
    value = frame.value
    if len(value) > MAX_VALUE:
        conn.reply(frame, Status.E2BIG)
        return
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    dt = frame.datatype
    if dt or value[:1] in (b"{", b"["):
        dt = check_datatype(conn, frame, value)
        if dt is None:
            return
    flags, expiry = _STORE_EXTRAS.unpack(extras)
    now = time.time()
    if expiry:
        expiry = decisions.absolute_expiry(expiry, int(now))
    conn.wrote = True
    res = vb.store(key, value, flags, expiry, dt, cas=frame.cas, mode=_SET_MODE[frame.opcode],
                   now=now)
    if res.status:
        if res.status == Status.KEY_ENOENT and frame.opcode in (Opcode.SET, Opcode.SETQ):
            # SET with a CAS on a missing key
            conn.reply(frame, Status.KEY_ENOENT)
        else:
            conn.reply(frame, res.status)
        return
    if frame.opcode in _QUIET:
        return
    item = res.item
    conn.reply(frame, cas=item.cas, extras=mutation_extras(conn, vb, item))


@command(Opcode.DELETE, Opcode.DELETEQ, decode=False, privilege=Privilege.WRITE)
def delete(conn, frame) -> None:
    if frame.extras or frame.value or not frame.key or len(frame.key) > MAX_KEY:
        conn.reply(frame, Status.EINVAL)
        return
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    conn.wrote = True
    res = vb.delete(frame.key, cas=frame.cas)
    if res.status:
        conn.reply(frame, res.status)
        return
    if frame.opcode in _QUIET:
        return
    conn.reply(frame, cas=res.item.cas, extras=mutation_extras(conn, vb, res.item))


@command(Opcode.GET, Opcode.GETQ, Opcode.GETK, Opcode.GETKQ, decode=False,
         privilege=Privilege.READ)
def get(conn, frame) -> None:
    if frame.extras or frame.value or not frame.key or len(frame.key) > MAX_KEY:
        conn.reply(frame, Status.EINVAL)
        return
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    op = frame.opcode
    with_key = op in (Opcode.GETK, Opcode.GETKQ)
    item = vb.get(frame.key, time.time())
    if item is None:
        if op in _QUIET:
            return
        conn.reply(frame, Status.KEY_ENOENT, key=frame.key if with_key else b"")
        return
    value = item.value
    dt = item.datatype
    if dt & _XATTR:
        value = split_xattrs(value)[1]
        dt &= ~_XATTR
    if not conn.json:
        dt &= ~_JSON
    conn.reply(frame, extras=_FLAGS.pack(item.flags), key=frame.key if with_key else b"",
               value=value, cas=item.cas, datatype=dt)
