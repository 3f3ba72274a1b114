"""Vbucket commands: the cluster config, vbucket seqnos, failover logs, vbucket states."""
from __future__ import annotations

import struct

from dcptool.protocol.constants import Datatype, Opcode, Status, VBucketState

from ..access import Privilege
from ..bucketconfig import cluster_config_json
from .common import command, not_my_vbucket, unknown_collection

_VB_SEQNO = struct.Struct(">HQ")
_FAILOVER = struct.Struct(">QQ")
_U32 = struct.Struct(">I")


@command(Opcode.GET_CLUSTER_CONFIG, bucket=False, privilege=Privilege.META_READ)
def get_cluster_config(conn, frame, msg) -> None:
    """The selected bucket's map, or without a bucket the global configuration."""
    conn.reply(frame, value=cluster_config_json(conn),
               datatype=Datatype.JSON if conn.json else 0)


@command(Opcode.GET_ALL_VB_SEQNOS, privilege=Privilege.META_READ)
def get_all_vb_seqnos(conn, frame, msg) -> None:
    """Each vbucket's high seqno (fact sheet 4.13): with a collection id (collections
    connections only) that collection's; for a connection without collections the default
    collection's (kv_engine); else the vbucket's."""
    cid = msg.collection
    if cid is not None:
        if not conn.collections:
            conn.reply(frame, Status.EINVAL)  # collection filters need HELLO Collections
            return
        manifest = getattr(conn.bucket, "manifest", None)
        known = (cid == 0) if manifest is None else manifest.collection_by_id(cid) is not None
        if not known:
            unknown_collection(conn, frame)
            return
    want = msg.state or 0
    if want > VBucketState.DEAD:
        conn.reply(frame, Status.EINVAL)
        return
    alive = (VBucketState.ACTIVE, VBucketState.REPLICA, VBucketState.PENDING)
    out = []
    legacy = not conn.collections
    for vbid, vb in sorted(conn.bucket.vbuckets.items()):
        if (want == 0 and vb.state in alive) or vb.state == want:
            if cid is not None:
                seqno = vb.collection_high(cid) or 0
            elif legacy:
                seqno = vb.legacy_high()
            else:
                seqno = vb.high_seqno
            out.append(_VB_SEQNO.pack(vbid, seqno))
    conn.reply(frame, value=b"".join(out))


def failover_log_bytes(vb) -> bytes:
    return b"".join(_FAILOVER.pack(u, s) for u, s in vb.failover_log)


@command(Opcode.GET_FAILOVER_LOG, privilege=Privilege.META_READ)
def get_failover_log(conn, frame, msg) -> None:
    vb = conn.bucket.vbuckets.get(frame.specific)
    if vb is None:
        not_my_vbucket(conn, frame)
        return
    conn.reply(frame, value=failover_log_bytes(vb))


@command(Opcode.SET_VBUCKET, privilege=Privilege.NODE_MANAGEMENT)
def set_vbucket(conn, frame, msg) -> None:
    if msg.state not in (1, 2, 3, 4):
        conn.reply(frame, Status.EINVAL)
        return
    vb = conn.bucket.vbuckets.get(frame.specific)
    if vb is None:
        not_my_vbucket(conn, frame)
        return
    if vb.state != msg.state:
        vb.set_state(msg.state)
        conn.node.config_rev += 1
    conn.reply(frame)


@command(Opcode.GET_VBUCKET, decode=False, privilege=Privilege.META_READ)
def get_vbucket(conn, frame) -> None:
    vb = conn.bucket.vbuckets.get(frame.specific)
    if vb is None:
        not_my_vbucket(conn, frame)
        return
    conn.reply(frame, value=_U32.pack(vb.state))
