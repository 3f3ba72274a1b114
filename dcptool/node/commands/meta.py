"""Metadata commands: GET_META, SET/ADD/DEL_WITH_META (the restore and XDCR path).

SET_WITH_META and DEL_WITH_META store a version with the revision seqno, CAS, flags and
expiry the client brings, if it wins revision-seqno conflict resolution against the
stored version (fact sheet 4.14; `decisions.with_meta_wins`). FORCE (0x01) and
SKIP_CONFLICT_RESOLUTION (0x08) store it regardless; REGENERATE_CAS (0x04, only with
0x08) gives it a fresh local CAS. A loss answers KEY_EEXISTS.

A Snappy-compressed value (SNAPPY bit, from a connection that negotiated Snappy) is
inflated before anything else looks at it and stored decompressed (docs/snappy.md).

Keys are doc keys (`common.request_doc_key`: legacy keys get the default collection's
prefix; a collections connection's prefix is checked). A collection's max TTL does not
apply here: a version written with its metadata keeps the expiry it brings.
"""
from __future__ import annotations

import struct
import time

from dcptool.protocol.constants import Datatype, MetaOption, Opcode, Status
from dcptool.protocol.messages import GetMeta, SetWithMeta

from ..access import Privilege
from ..item import ITEM_MUTATION
from .common import command, request_doc_key
from .kv import active_vbucket, answer_write, datatype_allowed, inflated

_GET_META = struct.Struct(">IIIQ")


@command(Opcode.GET_META, Opcode.GETQ_META, privilege=Privilege.READ)
def get_meta(conn, frame, msg) -> None:
    if isinstance(msg, GetMeta):
        key, version = msg.key, msg.version
    else:  # GETQ_META has no message type of its own: GET_META's layout (EINVAL if bad)
        fields = GetMeta.parse(frame)
        key, version = fields["key"], fields["version"]
    key = request_doc_key(conn, frame, key)
    if key is None:
        return
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    item = vb.get_meta(key, time.time())
    if item is None:
        if frame.opcode == Opcode.GETQ_META:
            return
        conn.reply(frame, Status.KEY_ENOENT)
        return
    deleted = item.op != ITEM_MUTATION
    extras = _GET_META.pack(1 if deleted else 0, item.flags,
                            item.delete_time if deleted else item.expiry, item.rev)
    if version == 2:
        extras += bytes([item.datatype])
    conn.reply(frame, extras=extras, cas=item.cas)


def _with_meta(conn, frame, msg, *, deletion: bool, add: bool = False) -> None:
    key = request_doc_key(conn, frame, msg.key)
    if key is None:
        return
    options = msg.options or 0
    if options & MetaOption.FORCE_ACCEPT_WITH_META_OPS:
        # only for last-write-wins buckets; this node resolves by revision seqno
        conn.reply(frame, Status.EINVAL)
        return
    if options & MetaOption.REGENERATE_CAS and not options & MetaOption.SKIP_CONFLICT_RESOLUTION:
        conn.reply(frame, Status.EINVAL)
        return
    if options & MetaOption.IS_EXPIRATION and not deletion:
        conn.reply(frame, Status.EINVAL)
        return
    value = msg.value
    if msg.nmeta:
        if msg.nmeta > len(value):
            conn.reply(frame, Status.EINVAL)
            return
        value = value[:len(value) - msg.nmeta]
    dt = frame.datatype
    if dt & Datatype.SNAPPY:
        # the extended-meta trailer (nmeta) is not part of the document: only the value
        # before it is compressed
        value = inflated(conn, frame, value)
        if value is None:
            return
        dt &= ~Datatype.SNAPPY
    if deletion and value and not dt & Datatype.XATTR:
        conn.reply(frame, Status.EINVAL)
        return
    if not datatype_allowed(conn, frame, value, dt):
        return
    if msg.meta_cas == 0 and not options & MetaOption.REGENERATE_CAS:
        conn.reply(frame, Status.EINVAL)
        return
    vb = active_vbucket(conn, frame)
    if vb is None:
        return
    now = time.time()
    if add:
        old = vb.get(key, now)
        if old is not None:
            conn.reply(frame, Status.KEY_EEXISTS)
            return
    conn.wrote = True
    res = vb.store_with_meta(
        key, value, flags=msg.flags, expiry=msg.expiry, rev=msg.rev_seqno,
        meta_cas=msg.meta_cas, datatype=dt, options=options, cas=frame.cas,
        deletion=deletion, now=now)
    answer_write(conn, frame, vb, res, msg.quiet or frame.opcode in (Opcode.ADDQ_WITH_META,))


@command(Opcode.SET_WITH_META, Opcode.SETQ_WITH_META, privilege=Privilege.META_WRITE)
def set_with_meta(conn, frame, msg) -> None:
    _with_meta(conn, frame, msg, deletion=False)


@command(Opcode.ADD_WITH_META, Opcode.ADDQ_WITH_META, decode=False,
         privilege=Privilege.META_WRITE)
def add_with_meta(conn, frame) -> None:
    msg = SetWithMeta.from_frame(frame)
    _with_meta(conn, frame, msg, deletion=False, add=True)


@command(Opcode.DEL_WITH_META, Opcode.DELQ_WITH_META, privilege=Privilege.META_WRITE)
def del_with_meta(conn, frame, msg) -> None:
    _with_meta(conn, frame, msg, deletion=True)
