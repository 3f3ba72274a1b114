"""Cluster administration over the wire, dcptool's own opcodes (docs/protocol-extensions.md):

Each works on the bucket the connection selected (the node's first when none): every bucket
of a cluster has its own map and replica streams (`Node.replications`).

* CLUSTER_SET_MAP (0xe8): value = the bucket's cluster map (JSON, see
  `dcptool.node.clustermap`); the node keeps it, changes the bucket's vbucket states and
  (re)points its replica streams. Answered once applied, with a JSON summary.
* REPLICATION_HOLD (0xe9): vbucket in the header; extras = u64 seqno: this node's
  replication stream of that vbucket applies nothing above the seqno; no extras: release.
* CLUSTER_STATUS (0xea): JSON: the map's rev, this node's index, the node list, this
  node's service ports (`services`: kv, kvSSL, mgmt, mgmtSSL; what `dcptool cluster`
  puts in the maps it sends), per vbucket its state, high seqno, uuid and replication
  stream (source, received seqno); `buckets`: every bucket of the node, {NAME:
  {"vbuckets", "replicaNumber", "first", "rev"}} (`rev`: its map's, null when unmapped).
* VBUCKET_TAKEOVER (0xeb): vbucket in the header; value = JSON {"source": "host:port",
  "auth": {...}, "timeout": s}: this node takes the vbucket over from its active by a
  takeover stream (`dcptool.node.takeover`) and answers once it is active here (JSON
  summary), or EINVAL / NOT_MY_VBUCKET / KEY_EEXISTS / EINTERNAL with an error context.
"""
from __future__ import annotations

import json
import struct

from dcptool.protocol.constants import Datatype, Status, VBucketState

from ..access import Privilege
from ..bucketconfig import own_services
from ..clustermap import ClusterMap, MapError
from ..takeover import TakeoverError, take_over
from .common import answer_later, command

CLUSTER_SET_MAP = 0xE8
REPLICATION_HOLD = 0xE9
CLUSTER_STATUS = 0xEA
VBUCKET_TAKEOVER = 0xEB

_U64 = struct.Struct(">Q")


def _send(conn, frame, doc, status: int = Status.SUCCESS) -> None:
    conn.reply(frame, status, value=json.dumps(doc, separators=(",", ":")).encode(),
               datatype=Datatype.JSON if conn.json else 0)


def _allowed(conn, frame) -> bool:
    if not (conn.authenticated and conn.user is not None):
        conn.error(frame, Status.EACCESS)
        return False
    return True


def _bucket(conn):
    """The bucket the command works on: the connection's, or the node's first."""
    return conn.bucket if conn.bucket is not None else conn.node.bucket


def _replication(conn):
    bucket = _bucket(conn)
    return conn.node.replication_of(bucket) or conn.node.replication


def buckets_doc(node) -> dict:
    """Every bucket of `node`: {name: {vbuckets, replicaNumber, first, rev}}."""
    out = {}
    for name, b in list(node.buckets.items()):
        repl = node.replication_of(b)
        cmap = repl.map if repl is not None else None
        out[name] = {"vbuckets": b.num_vbuckets,
                     "replicaNumber": int(b.settings.get("replicaNumber", 0)),
                     "first": b is node.bucket, "rev": cmap.rev if cmap else None}
    return out


@command(CLUSTER_SET_MAP, decode=False, privilege=Privilege.NODE_MANAGEMENT)
def cluster_set_map(conn, frame) -> None:
    if not _allowed(conn, frame):
        return
    bucket = _bucket(conn)
    try:
        doc = json.loads(bytes(frame.value) or b"null")
        cmap = ClusterMap.from_doc(doc, bucket.num_vbuckets)
    except (ValueError, MapError) as exc:
        _send(conn, frame, {"error": {"context": str(exc)}}, Status.EINVAL)
        return
    repl = conn.node.replication_of(bucket)
    if repl is None:
        _send(conn, frame, {"error": {"context": f"bucket {bucket.name} is being dropped"}},
              Status.EINVAL)
        return
    if repl.map is not None and cmap.rev < repl.map.rev:
        _send(conn, frame, {"error": {"context": f"map rev {cmap.rev} is older than the "
                                                 f"node's ({repl.map.rev})"}}, Status.EINVAL)
        return
    cmap.inherit_services(repl.map)

    async def work() -> None:
        summary = await repl.apply(cmap)
        _send(conn, frame, {"rev": cmap.rev, **summary})

    answer_later(conn, frame, work)


@command(REPLICATION_HOLD, decode=False, privilege=Privilege.NODE_MANAGEMENT)
def replication_hold(conn, frame) -> None:
    if not _allowed(conn, frame):
        return
    vbid = frame.specific
    if vbid not in _bucket(conn).vbuckets:
        conn.reply(frame, Status.NOT_MY_VBUCKET)
        return
    ex = bytes(frame.extras)
    if ex and len(ex) != 8:
        conn.reply(frame, Status.EINVAL)
        return
    _replication(conn).hold(vbid, _U64.unpack(ex)[0] if ex else None)
    conn.reply(frame)


@command(CLUSTER_STATUS, decode=False, privilege=Privilege.NODE_MANAGEMENT)
def cluster_status(conn, frame) -> None:
    if not _allowed(conn, frame):
        return
    _send(conn, frame, {**_replication(conn).status(), "services": own_services(conn.node),
                        "buckets": buckets_doc(conn.node)})


@command(VBUCKET_TAKEOVER, decode=False, privilege=Privilege.NODE_MANAGEMENT)
def vbucket_takeover(conn, frame) -> None:
    if not _allowed(conn, frame):
        return
    vbid = frame.specific
    bucket = _bucket(conn)
    vb = bucket.vbuckets.get(vbid)
    if vb is None:
        _send(conn, frame, {"error": {"context": f"no vbucket {vbid}"}}, Status.NOT_MY_VBUCKET)
        return
    try:
        doc = json.loads(bytes(frame.value) or b"null")
        host, _, port = str(doc["source"]).rpartition(":")
        address = (host.strip("[]"), int(port))
        auth = doc.get("auth")
        if auth is None:
            repl = _replication(conn)
            cmap = repl.map if repl is not None else None
            auth = cmap.auth if cmap is not None else {}
        auth = {str(k): str(v) for k, v in dict(auth).items()}
        timeout = float(doc.get("timeout", 600.0))
    except (ValueError, KeyError, TypeError) as exc:
        _send(conn, frame, {"error": {"context": f"bad takeover request: {exc}"}},
              Status.EINVAL)
        return
    if vb.state == VBucketState.ACTIVE:
        _send(conn, frame, {"error": {"context": f"vbucket {vbid} is already active here"}},
              Status.KEY_EEXISTS)
        return

    async def work() -> None:
        try:
            summary = await take_over(conn.node, vbid, address, auth, timeout=timeout,
                                      bucket=bucket)
        except (TakeoverError, OSError, Exception) as exc:  # noqa: BLE001 - told to the caller
            text = str(exc) or type(exc).__name__
            _send(conn, frame, {"error": {"context": f"takeover of vbucket {vbid} from "
                                                     f"{address[0]}:{address[1]} failed: "
                                                     f"{text}"}}, Status.EINTERNAL)
            return
        _send(conn, frame, summary)

    answer_later(conn, frame, work)
