"""What the driver asks a node before planning a job: vbucket count, seqnos, failover logs."""
from __future__ import annotations

import json

from dcptool.client.connection import Connection, raise_for_status
from dcptool.client.ops import get_failover_logs, get_vbucket_seqnos
from dcptool.protocol.messages import GetClusterConfig


def cluster_config(conn: Connection) -> dict:
    rsp = conn.request(GetClusterConfig())
    raise_for_status(rsp, "GET_CLUSTER_CONFIG", address=conn.address)
    try:
        return json.loads(bytes(rsp.value))
    except (ValueError, AttributeError):
        return {}


def vbucket_count(conn: Connection) -> int:
    """The bucket's number of vbuckets, from the cluster map (fallback: the seqno listing)."""
    cfg = cluster_config(conn)
    vbmap = cfg.get("vBucketServerMap", {}).get("vBucketMap")
    if vbmap:
        return len(vbmap)
    seqnos = get_vbucket_seqnos(conn)
    return (max(seqnos) + 1) if seqnos else 0


def node_state(conn: Connection, vbuckets: list[int] | None = None) -> tuple[int, dict[int, int], dict]:
    """(vbucket count, {vb: high seqno} of active vbuckets, {vb: failover log})."""
    count = vbucket_count(conn)
    seqnos = get_vbucket_seqnos(conn, state=1)
    vbs = sorted(seqnos) if vbuckets is None else [vb for vb in vbuckets if vb in seqnos]
    logs = get_failover_logs(conn, vbs) if vbs else {}
    return count, {vb: seqnos[vb] for vb in vbs}, logs
