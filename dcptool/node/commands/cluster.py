"""Cluster-level commands: the cluster map, vbucket seqnos, failover logs, vbucket states."""
from __future__ import annotations

import json
import struct

from dcptool.protocol.constants import Datatype, Opcode, Status, VBucketState

from ..access import Privilege
from . import command
from .kv import not_my_vbucket

_VB_SEQNO = struct.Struct(">HQ")
_FAILOVER = struct.Struct(">QQ")
_U32 = struct.Struct(">I")


def advertised_host(conn) -> str:
    host = conn.node.config.host
    if host in ("0.0.0.0", "::", ""):
        t = conn.transport
        sock = t.get_extra_info("sockname") if t is not None else None
        if sock:
            host = sock[0]
    return host


def cluster_config(conn) -> dict:
    """A single-node cluster map for the bucket, in the shape Couchbase clients parse."""
    node = conn.node
    bucket = node.bucket
    host = advertised_host(conn)
    port = node.port
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    vbmap = [[0] if vb.state == VBucketState.ACTIVE else [-1]
             for _, vb in sorted(bucket.vbuckets.items())]
    nodes = [{"hostname": hostport, "ports": {"direct": port}}]
    nodes_ext = [{"services": {"kv": port}, "thisNode": True, "hostname": host}]
    server_list = [hostport]
    replicas = 0
    map_rev = 0
    cmap = getattr(getattr(node, "replication", None), "map", None)
    if cmap is not None:
        # a member of a cluster: the whole map (dcptool cluster create)
        server_list = list(cmap.nodes)
        nodes, nodes_ext = [], []
        for i, hp in enumerate(cmap.nodes):
            h, p = cmap.address(i)
            nodes.append({"hostname": hp, "ports": {"direct": p}})
            nodes_ext.append({"services": {"kv": p}, "thisNode": i == cmap.this, "hostname": h})
        vbmap = [list(chain) for chain in cmap.vbmap]
        replicas = cmap.replicas
        map_rev = cmap.rev
    return {
        "rev": node.config_rev,
        "revEpoch": 1,
        "dcptoolMapRev": map_rev,  # the cluster map's rev (`rev` counts this node's changes)
        "name": bucket.name,
        "uuid": node.bucket_uuid,
        "nodeLocator": "vbucket",
        "bucketCapabilitiesVer": "",
        "bucketCapabilities": ["xattr", "dcp", "cbhello", "touch", "cccp", "nodesExt",
                               "xdcrCheckpointing"],
        "nodes": nodes,
        "nodesExt": nodes_ext,
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": replicas,
            "serverList": server_list,
            "vBucketMap": vbmap,
        },
        "clusterCapabilitiesVer": [1, 0],
        "clusterCapabilities": {},
    }


def cluster_config_json(conn) -> bytes:
    return json.dumps(cluster_config(conn), separators=(",", ":")).encode()


@command(Opcode.GET_CLUSTER_CONFIG, privilege=Privilege.META_READ)
def get_cluster_config(conn, frame, msg) -> None:
    conn.reply(frame, value=cluster_config_json(conn),
               datatype=Datatype.JSON if conn.json else 0)


@command(Opcode.GET_ALL_VB_SEQNOS, privilege=Privilege.META_READ)
def get_all_vb_seqnos(conn, frame, msg) -> None:
    if msg.collection is not None:
        conn.reply(frame, Status.EINVAL)  # collection filters need HELLO Collections
        return
    want = msg.state or 0
    if want > VBucketState.DEAD:
        conn.reply(frame, Status.EINVAL)
        return
    alive = (VBucketState.ACTIVE, VBucketState.REPLICA, VBucketState.PENDING)
    out = []
    for vbid, vb in sorted(conn.bucket.vbuckets.items()):
        if (want == 0 and vb.state in alive) or vb.state == want:
            out.append(_VB_SEQNO.pack(vbid, vb.high_seqno))
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
