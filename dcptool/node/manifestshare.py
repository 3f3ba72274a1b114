"""Cluster members share each bucket's collections manifest: the member that takes a REST change
sends its whole manifest to every other member (SET_COLLECTIONS_MANIFEST 0xb9 over the data
port, with the cluster map's credentials). Like the replication streams, this is the node
acting as a client of its peers, so it is one of the node modules that use `dcptool.client`.
"""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("dcptool.node.rest")


async def share_manifest(node, bucket=None) -> None:
    """Send `bucket`'s manifest (the node's first bucket's when None) to every other member
    of its cluster map (0xb9 over the data port with the map's credentials). A member that
    cannot be reached is logged; it gets the whole manifest with the next change, and its
    replicas follow their actives."""
    bucket = node.bucket if bucket is None else bucket
    repl = node.replication_of(bucket)
    cmap = repl.map if repl is not None else None
    if cmap is None or len(cmap.nodes) < 2:
        return
    doc = bucket.manifest.to_bytes(internal=True)
    members = [cmap.address(i) for i in range(len(cmap.nodes)) if i != cmap.this]
    loop = asyncio.get_running_loop()
    results = await asyncio.gather(*(
        loop.run_in_executor(None, _send_manifest, addr, cmap.auth, bucket.name, doc)
        for addr in members), return_exceptions=True)
    for addr, res in zip(members, results):
        if isinstance(res, BaseException):
            log.warning("collections manifest not sent to %s:%d: %s", addr[0], addr[1], res)


def _send_manifest(address, auth, bucket: str, doc: bytes) -> None:
    from dcptool.client.connection import Connection
    from dcptool.client.topology import cluster_call

    from .commands.collections import SET_COLLECTIONS_MANIFEST

    conn = Connection.open(address[0], address[1], username=auth.get("username", ""),
                           password=auth.get("password", ""), bucket=bucket, timeout=5.0,
                           agent="dcptool-node/manifest")
    try:
        cluster_call(conn, SET_COLLECTIONS_MANIFEST, value=doc, what="SET_COLLECTIONS_MANIFEST")
    finally:
        conn.close()
