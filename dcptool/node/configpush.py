"""Cluster map change notifications: the node pushes a changed map to the connections that
asked for it, as kv_engine does, so clients need not poll GET_CLUSTER_CONFIG.

A connection subscribes with HELLO: DUPLEX (the node may send it requests) and
CLUSTERMAP_CHANGE_NOTIFICATION (the whole map) or CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF
(only its revision). When the revision the node serves for the connection's bucket changes
(a vbucket changes state on a node alone, a new cluster map of the bucket arrives), every subscribed connection gets one server
request (magic 0x82, opcode 0x01): extras the revision epoch and the revision (two u64),
key the bucket's name (empty for the global configuration of a connection without a
bucket), value the configuration as GET_CLUSTER_CONFIG would answer it on that connection
(empty in the brief form). A connection gets each revision once, in order; many changes
in one turn of the loop make one notification. The client's answer (magic 0x83) is read
and dropped.
"""
from __future__ import annotations

import itertools
import json
import struct

from dcptool.protocol import encode_frame
from dcptool.protocol.constants import Datatype, Feature, Magic

from .bucketconfig import cluster_config, revision

CLUSTERMAP_CHANGE_NOTIFICATION = 0x01
_REV = struct.Struct(">QQ")
_opaques = itertools.count(1)


def subscribed(conn) -> bool:
    features = conn.features
    return Feature.DUPLEX in features and (
        Feature.CLUSTERMAP_CHANGE_NOTIFICATION in features
        or Feature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF in features)


def notification(conn, epoch: int, rev: int) -> bytes:
    """The server request that tells `conn` of revision (`epoch`, `rev`)."""
    brief = Feature.CLUSTERMAP_CHANGE_NOTIFICATION not in conn.features
    value = b"" if brief else json.dumps(cluster_config(conn), separators=(",", ":")).encode()
    key = conn.bucket.name.encode() if conn.bucket is not None else b""
    dt = Datatype.JSON if (value and conn.json) else 0
    return encode_frame(Magic.SERVER_REQUEST, CLUSTERMAP_CHANGE_NOTIFICATION, 0,
                        next(_opaques), 0, dt, b"", _REV.pack(epoch, rev), key, value)


def push(node) -> None:
    """Send the current revision (of the connection's bucket: each bucket of a cluster has
    its own map) to every subscribed connection that has not had it."""
    for conn in list(node.connections):
        if conn.closing or not conn.authenticated or not subscribed(conn):
            continue
        current = revision(node, conn.bucket)
        if getattr(conn, "pushed_rev", None) == current:
            continue
        conn.pushed_rev = current
        conn.write(notification(conn, *current))


def schedule(node, loop) -> None:
    """Push once, at the end of this turn of the loop (changes made together, one
    notification)."""
    if getattr(node, "_push_pending", False) or loop is None:
        return
    node._push_pending = True

    def run() -> None:
        node._push_pending = False
        push(node)

    loop.call_soon(run)
