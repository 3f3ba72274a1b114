"""The cluster as clients see it: the bucket config of GET_CLUSTER_CONFIG and the REST port.

A node alone describes itself; a member of a cluster describes every node of the bucket's
map (`dcptool.node.clustermap`: every bucket of a cluster has its own map, with the same
members), each with the service ports it advertises. The vbucket
commands, the NOT_MY_VBUCKET answer and `dcptool.node.rest` all build their answers here.

**Revisions.** Clients keep the newest map by (`revEpoch`, `rev`). A node alone counts
its own changes (`rev` = `Node.config_rev`, epoch 1); the members of a cluster all serve
the bucket's cluster map's rev (`dcptool cluster` raises it on every change) with epoch 2, so every
member gives the same revision for the same map and any cluster map is newer than what a
member served while it was alone. A node failed over leaves the bucket's `nodes`,
`nodesExt` and `serverList` (as ns_server's failover does): clients drop their sessions to
it at once.

**The global configuration** (GET_CLUSTER_CONFIG on a connection with no bucket selected,
Couchbase 6.5's GCCCP) has the first bucket's revision and the nodes and their services,
without the bucket's parts.
"""
from __future__ import annotations

import json

from dcptool.protocol.constants import VBucketState


def host_of(node, transport) -> str:
    """The address clients reach `node` at: --host, or for a wildcard --host the local
    address of the connection (`transport`) the question came on."""
    host = node.config.host
    if host in ("0.0.0.0", "::", ""):
        sock = transport.get_extra_info("sockname") if transport is not None else None
        if sock:
            host = sock[0]
    return host


def advertised_host(conn) -> str:
    return host_of(conn.node, conn.transport)


def host_port(host: str, port: int) -> str:
    """host:port, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def own_services(node) -> dict[str, int]:
    """This node's service ports by Couchbase's names: kv, kvSSL (TLS), mgmt (the REST
    port), mgmtSSL (HTTPS REST port, TLS); the ones it listens on."""
    out = {"kv": node.port}
    for name, port in (("kvSSL", node.tls_port), ("mgmt", getattr(node, "rest_port", None)),
                       ("mgmtSSL", getattr(node, "rest_tls_port", None))):
        if port is not None:
            out[name] = port
    return out


def map_of(node, bucket=None):
    """The cluster map of `bucket` (the node's first when None) on `node`; None when the
    bucket is not mapped (a node alone)."""
    if bucket is None or bucket is getattr(node, "bucket", None):
        return getattr(getattr(node, "replication", None), "map", None)
    repl = node.replication_of(bucket) if hasattr(node, "replication_of") else None
    return repl.map if repl is not None else None


def cluster_members(node, host: str, bucket=None) -> list[dict]:
    """The nodes of `bucket`'s cluster map (the first bucket's when None), in map order:
    {"host", "kv", "services", "this"}.

    Alone, this node only, at `host`. A member of a cluster (dcptool cluster create): every
    node of the map, at its map address, with the services the map gives it (its own as it
    listens). GET_CLUSTER_CONFIG and the REST port both describe the cluster from this.
    """
    cmap = map_of(node, bucket)
    if cmap is None:
        return [{"host": host, "kv": node.port, "services": own_services(node), "this": True}]
    out = []
    for i in range(len(cmap.nodes)):
        h, p = cmap.address(i)
        this = i == cmap.this
        services = own_services(node) if this else cmap.services_of(i)
        if this:
            services["kv"] = p
        out.append({"host": h, "kv": p, "services": services, "this": this})
    return out


def member_hostname(member: dict) -> str:
    """A node's `hostname` in `nodes[]`: host and REST port, as Couchbase Server writes it
    (the data port when the REST port is unknown)."""
    return host_port(member["host"], member["services"].get("mgmt") or member["kv"])


#: the revision epochs: a node alone, the members of a cluster
ALONE_EPOCH = 1
CLUSTER_EPOCH = 2


def revision(node, bucket=None) -> tuple[int, int]:
    """(revEpoch, rev) of what `node` serves now for `bucket` (the first bucket's, which
    the global configuration has, when None)."""
    cmap = map_of(node, bucket)
    if cmap is None:
        return ALONE_EPOCH, node.config_rev
    return CLUSTER_EPOCH, cmap.rev


def global_config(node, host: str) -> dict:
    """The cluster-wide configuration (no bucket): revision, nodes and their services."""
    epoch, rev = revision(node)
    members = cluster_members(node, host)
    return {
        "rev": rev,
        "revEpoch": epoch,
        "nodesExt": [{"services": m["services"], "thisNode": m["this"], "hostname": m["host"]}
                     for m in members],
        "clusterCapabilitiesVer": [1, 0],
        "clusterCapabilities": {},
    }


def bucket_config(node, host: str, bucket=None) -> dict:
    """The cluster map of `bucket` (the node's first when None), in the shape Couchbase
    clients parse (GET_CLUSTER_CONFIG, and the REST port's terse bucket config); `host` is
    this node's advertised address. Each bucket of a cluster answers its own map."""
    if bucket is None:
        bucket = node.bucket
    cmap = map_of(node, bucket)
    members = cluster_members(node, host, bucket)
    nodes = [{"hostname": member_hostname(m), "ports": {"direct": m["kv"]}} for m in members]
    nodes_ext = [{"services": m["services"], "thisNode": m["this"], "hostname": m["host"]}
                 for m in members]
    server_list = [host_port(m["host"], m["kv"]) for m in members]
    vbmap = [[0] if vb.state == VBucketState.ACTIVE else [-1]
             for _, vb in sorted(bucket.vbuckets.items())]
    replicas = 0
    map_rev = 0
    if cmap is not None:
        # a member of a cluster: the whole map (dcptool cluster create)
        server_list = list(cmap.nodes)
        vbmap = [list(chain) for chain in cmap.vbmap]
        replicas = cmap.replicas
        map_rev = cmap.rev
    epoch, rev = revision(node, bucket)
    return {
        "rev": rev,
        "revEpoch": epoch,
        "dcptoolMapRev": map_rev,  # the cluster map's rev (`rev` counts this node's changes)
        "name": bucket.name,
        "uuid": getattr(bucket, "uuid", "") or node.bucket_uuid,
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


def cluster_config(conn) -> dict:
    """The cluster map as GET_CLUSTER_CONFIG answers it on `conn`: the bucket's, or the
    global configuration when the connection has no bucket selected."""
    if conn.bucket is None:
        return global_config(conn.node, advertised_host(conn))
    return bucket_config(conn.node, advertised_host(conn), conn.bucket)


def cluster_config_json(conn) -> bytes:
    return json.dumps(cluster_config(conn), separators=(",", ":")).encode()
