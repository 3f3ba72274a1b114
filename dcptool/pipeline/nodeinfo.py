"""What the driver asks a node before planning a job: vbucket count, seqnos, failover logs."""
from __future__ import annotations

from dcptool.client.topology import cluster_config
from dcptool.client.connection import Connection
from dcptool.client.ops import get_failover_logs, get_vbucket_seqnos


def vbucket_count(conn: Connection) -> int:
    """The bucket's number of vbuckets, from the cluster map (fallback: the seqno listing)."""
    cfg = cluster_config(conn)
    vbmap = cfg.get("vBucketServerMap", {}).get("vBucketMap")
    if vbmap:
        return len(vbmap)
    seqnos = get_vbucket_seqnos(conn)
    return (max(seqnos) + 1) if seqnos else 0


def bucket_uuid(opts) -> str | None:
    """The uuid of the bucket `opts` names, as the node's cluster map gives it (Couchbase
    Server's bucket uuid; a new one when a bucket is deleted and created again); None when
    the map has none."""
    with opts.connect() as conn:
        uuid = cluster_config(conn).get("uuid")
    return str(uuid) if uuid else None


def node_state(conn: Connection, vbuckets: list[int] | None = None) -> tuple[int, dict[int, int], dict]:
    """(vbucket count, {vb: high seqno} of active vbuckets, {vb: failover log})."""
    count = vbucket_count(conn)
    seqnos = get_vbucket_seqnos(conn, state=1)
    vbs = sorted(seqnos) if vbuckets is None else [vb for vb in vbuckets if vb in seqnos]
    logs = get_failover_logs(conn, vbs) if vbs else {}
    return count, {vb: seqnos[vb] for vb in vbs}, logs


def active_nodes(opts, conn: Connection, vbuckets: list[int] | None = None):
    """(cluster view, {node address: [vbuckets active there]}) when `conn`'s node is a member
    of a cluster of several nodes, else None. `vbuckets` defaults to all of the map's;
    vbuckets without a live active in the map are left out."""
    from dcptool.client.topology import ClusterView

    view = ClusterView.from_config(cluster_config(conn), conn.address)
    if not view.clustered:
        return None
    wanted = range(len(view.vbmap)) if vbuckets is None else vbuckets
    groups: dict[str, list[int]] = {}
    for vb in wanted:
        if 0 <= vb < len(view.vbmap):
            node = view.active_node(vb)
            if node is not None:
                groups.setdefault(node, []).append(vb)
    return view, groups


def node_opts(opts, address: str):
    """`opts` pointed at another member (HOST:PORT as the cluster map names it)."""
    from dcptool.client.topology import member_opts

    return member_opts(opts, address)


def cluster_state(opts, vbuckets: list[int] | None = None):
    """node_state for the node `opts` or, when it is a member of a cluster, for the whole
    cluster: seqnos and failover logs come from each vbucket's active node (as the map
    says). Returns (vbucket count, {vb: high seqno}, {vb: failover log}, groups) where
    groups is {node address: [vbuckets]} on a cluster and None for a node alone.

    The connections negotiate Collections: GET_ALL_VB_SEQNOS then reports each vbucket's
    high seqno (a connection without it gets the default collection's)."""
    with opts.connect(collections=True) as conn:
        found = active_nodes(opts, conn, vbuckets)
        if found is None:
            return (*node_state(conn, vbuckets), None)
    view, groups = found
    seqnos: dict[int, int] = {}
    logs: dict = {}
    placed: dict[str, list[int]] = {}
    for address, vbs in groups.items():
        with node_opts(opts, address).connect(collections=True) as conn:
            actives = get_vbucket_seqnos(conn, state=1)
            mine = [vb for vb in vbs if vb in actives]
            if mine:
                logs.update(get_failover_logs(conn, mine))
        for vb in mine:
            seqnos[vb] = actives[vb]
        if mine:
            placed[address] = mine
    return len(view.vbmap), seqnos, logs, placed
