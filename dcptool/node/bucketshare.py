"""A bucket exists on every member of a cluster: creating, editing and dropping one over
REST on any member does it on all of them, as Couchbase Server's cluster manager does.

The member that takes the request (`dcptool bucket create`, or a POST to
/pools/default/buckets) does it itself, then forwards the same request to every other
member its cluster map names, on their REST ports, with the caller's own credentials (so
each member checks the caller's privileges itself; the forwarded request carries the
`X-Dcptool-Forwarded` header and is not forwarded again). A new bucket is then mapped:
the member builds the bucket's map (`bucket_map`: the cluster's members, rev and
credentials, the bucket's own vbucket count, actives spread evenly, the cluster's replica
count unless the bucket's replicaNumber says fewer), applies it and sends it to every
other member with CLUSTER_SET_MAP over their data ports (the map's credentials, the bucket
selected), so every member ends with the same map for the bucket.

Why the node and not the command line: a bucket created with any REST client (an SDK's
bucket manager, curl) must exist on the whole cluster too, and the node is the one that
knows the members (its map). The forwarded requests use the caller's credentials rather
than the map's, so a member never creates or drops a bucket for a caller it would refuse.

Like the replication streams, this is the node acting as a client of its peers (REST over
aiohttp, CLUSTER_SET_MAP over `dcptool.client`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import BasicAuth, ClientError, ClientSession, ClientTimeout, hdrs

from .bucketconfig import host_port
from .clustermap import ClusterMap

log = logging.getLogger("dcptool.node.rest")

#: the header of a request one member forwards to the others (not forwarded again)
FORWARDED = "X-Dcptool-Forwarded"
#: seconds a member has to answer a forwarded request
FORWARD_TIMEOUT = 60.0


def clustered(node) -> bool:
    """Is `node` a member of a cluster (its first bucket has a map; the others may have
    been failed over, its buckets are still mapped)?"""
    return node.cluster_map() is not None


def forwarded(request) -> bool:
    return request.headers.get(FORWARDED) == "1"


def _others(cmap: ClusterMap) -> list[int]:
    return [i for i in range(len(cmap.nodes)) if i != cmap.this]


def other_members(node) -> list[str]:
    cmap = node.cluster_map()
    return [] if cmap is None else [cmap.nodes[i] for i in _others(cmap)]


async def forward(node, request, method: str, path: str,
                  form: dict[str, str] | bytes | None = None,
                  members: list[str] | None = None) -> dict[str, str]:
    """Send `method path` (with `form`: a form's fields, or the request's own body as
    bytes, sent with its Content-Type) to every other member's REST port (or those of
    `members`), with the caller's credentials. Returns {member: error} for the members
    that did not do it."""
    cmap = node.cluster_map()
    if cmap is None:
        return {}
    targets = [i for i in _others(cmap) if members is None or cmap.nodes[i] in members]
    headers = {FORWARDED: "1"}
    if isinstance(form, bytes) and request.content_type:
        headers[hdrs.CONTENT_TYPE] = request.content_type
    auth = request.headers.get(hdrs.AUTHORIZATION)
    if auth:
        headers[hdrs.AUTHORIZATION] = auth
    else:  # a caller known by its client certificate: the cluster's credentials
        headers[hdrs.AUTHORIZATION] = BasicAuth(cmap.auth.get("username", ""),
                                                cmap.auth.get("password", "")).encode()
    errors: dict[str, str] = {}

    async def one(session: ClientSession, i: int) -> None:
        member = cmap.nodes[i]
        port = cmap.services_of(i).get("mgmt")
        if port is None:
            errors[member] = "its REST port is unknown (run dcptool cluster create again)"
            return
        host = cmap.address(i)[0]
        url = f"http://{host_port(host, port)}{path}"
        try:
            async with session.request(method, url, data=form, headers=headers) as rsp:
                if rsp.status not in (200, 202):
                    text = (await rsp.text())[:300].strip()
                    errors[member] = f"HTTP {rsp.status}" + (f": {text}" if text else "")
        except (ClientError, OSError, asyncio.TimeoutError) as exc:
            errors[member] = str(exc) or type(exc).__name__

    async with ClientSession(timeout=ClientTimeout(total=FORWARD_TIMEOUT)) as session:
        await asyncio.gather(*(one(session, i) for i in targets))
    for member, text in errors.items():
        log.warning("%s %s not done on %s: %s", method, path, member, text)
    return errors


async def share(node, request, method: str, path: str,
                form: dict[str, str] | bytes | None = None) -> dict[str, str]:
    """A change `request` made on `node`, made on every other member too (`forward`),
    unless `node` is in no cluster or the request was itself forwarded: {member: error}
    for the members that did not do it ({} when all did, or when there was none to ask)."""
    if not clustered(node) or forwarded(request):
        return {}
    return await forward(node, request, method, path, form)


def bucket_replicas(cmap: ClusterMap, settings: dict[str, Any], first: bool) -> int:
    """The replica count of a bucket's map: the cluster's, unless the bucket's replicaNumber
    says fewer (the first bucket always has the cluster's); never more than the members
    allow."""
    reps = cmap.replicas if first else min(cmap.replicas, int(settings.get("replicaNumber", 0)))
    return max(0, min(reps, len(cmap.nodes) - 1))


def plan(n_nodes: int, n_vbuckets: int, replicas: int) -> list[list[int]]:
    """Actives round-robin, replica k of vbucket v on the node k places further on (the
    plan `dcptool cluster create` uses)."""
    return [[(vb + k) % n_nodes for k in range(replicas + 1)] for vb in range(n_vbuckets)]


def bucket_map(node, bucket) -> dict[str, Any]:
    """The map document of `bucket` for this member (its `this`), from the cluster map."""
    cmap = node.cluster_map()
    reps = bucket_replicas(cmap, bucket.settings, bucket is node.bucket)
    doc = cmap.to_doc()
    doc.update(replicas=reps, vbmap=plan(len(cmap.nodes), bucket.num_vbuckets, reps))
    return doc


async def map_bucket(node, bucket) -> dict[str, str]:
    """Give `bucket` its map on this member and every other one. Returns {member: error}."""
    doc = bucket_map(node, bucket)
    cmap = node.cluster_map()
    repl = node.replication_of(bucket)
    if repl is None:
        return {cmap.nodes[cmap.this]: "the bucket is gone"}
    await repl.apply(ClusterMap.from_doc(doc, bucket.num_vbuckets))
    loop = asyncio.get_running_loop()
    errors: dict[str, str] = {}
    others = _others(cmap)
    results = await asyncio.gather(*(
        loop.run_in_executor(None, _send_map, cmap.address(i), cmap.auth, bucket.name,
                             {**doc, "this": i})
        for i in others), return_exceptions=True)
    for i, res in zip(others, results):
        if isinstance(res, BaseException):
            errors[cmap.nodes[i]] = str(res) or type(res).__name__
            log.warning("the map of bucket %s was not sent to %s: %s", bucket.name,
                        cmap.nodes[i], errors[cmap.nodes[i]])
    return errors


def _send_map(address, auth, bucket: str, doc: dict[str, Any]) -> None:
    from dcptool.client.connection import Connection
    from dcptool.client.topology import set_map

    conn = Connection.open(address[0], address[1], username=auth.get("username", ""),
                           password=auth.get("password", ""), bucket=bucket, timeout=10.0,
                           agent="dcptool-node/bucket-map")
    try:
        set_map(conn, doc)
    finally:
        conn.close()


def failed_text(errors: dict[str, str]) -> str:
    return "; ".join(f"{m}: {t}" for m, t in errors.items())
