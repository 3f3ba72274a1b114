"""The node's place in a cluster: the cluster map, and what it means for each vbucket.

A node starts alone: every vbucket active, GET_CLUSTER_CONFIG describes this node only.
`dcptool cluster create/failover/move` send every member the whole map of each bucket with
CLUSTER_SET_MAP (0xe8, docs/protocol-extensions.md; the connection's bucket is the one
mapped); the node keeps each bucket's map in the bucket's data directory, `cluster.json`
(mode 0600: it holds the credentials replication connects with; the first bucket's is
`DIR/cluster.json`, where a one-bucket node always kept it) and applies it to that
bucket's vbuckets:

* a vbucket whose chain starts with this node is active (a replica that becomes active
  starts a new history: `VBucket.set_state` adds the failover entry);
* a vbucket this node holds a replica of is a replica, fed over DCP by
  `replication.ReplicaStream` from its source (the active, or the previous replica when
  the map's topology is "chain");
* any other vbucket is dead (NOT_MY_VBUCKET for reads, writes and streams).

The map document (JSON):

    {"rev": 7, "nodes": ["127.0.0.1:11210", ...], "this": 0, "replicas": 1,
     "topology": "star", "vbmap": [[0, 1], [1, 0], ...],
     "auth": {"username": "...", "password": "..."},
     "services": [{"kv": 11210, "mgmt": 8091}, ...]}

`vbmap[vb]` is the chain of node indexes, active first, -1 for a missing copy.
`services` (optional) gives, per node, the ports of its services by Couchbase's names
(`kv`, `kvSSL`, `mgmt`, `mgmtSSL`): what GET_CLUSTER_CONFIG and the REST port
(`dcptool.node.rest`) advertise for the other members. A node always advertises its own
ports as it listens on them, whatever the map says; a member the map gives no services
keeps the ones the previous map gave the same address (a node that is down when a new map
goes out cannot tell its ports).

`failed` (optional) lists the nodes failed over out of the cluster, `[{"node": "h:p",
"services": {...}}]`: they are in no chain and not in `nodes` (so clients drop them from
the bucket's map), and the REST port's `/pools/default` still shows them as
`inactiveFailed`, as Couchbase Server does until they are removed.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcptool.protocol.constants import VBucketState

log = logging.getLogger("dcptool.node.cluster")

CLUSTER_FILE = "cluster.json"
TOPOLOGIES = ("star", "chain")


class MapError(ValueError):
    """A cluster map that cannot be applied (answered EINVAL with this text)."""


@dataclass
class ClusterMap:
    rev: int
    nodes: list[str]
    this: int
    vbmap: list[list[int]]
    replicas: int = 0
    topology: str = "star"
    auth: dict[str, str] = field(default_factory=dict)
    #: per node, {service name: port} ({} where unknown); as long as `nodes`
    services: list[dict[str, int]] = field(default_factory=list)
    #: the nodes failed over: [{"node": "host:port", "services": {name: port}}]
    failed: list[dict[str, Any]] = field(default_factory=list)

    # -- parsing ---------------------------------------------------------------------

    @classmethod
    def from_doc(cls, doc: Any, num_vbuckets: int) -> "ClusterMap":
        if not isinstance(doc, dict):
            raise MapError("the cluster map must be a JSON object")
        try:
            rev = int(doc["rev"])
            nodes = [str(n) for n in doc["nodes"]]
            this = int(doc["this"])
            vbmap = [[int(i) for i in chain] for chain in doc["vbmap"]]
            replicas = int(doc.get("replicas", 0))
            topology = str(doc.get("topology", "star"))
            auth = {str(k): str(v) for k, v in dict(doc.get("auth") or {}).items()}
            services = [{str(k): int(v) for k, v in dict(s or {}).items()}
                        for s in doc.get("services") or [{}] * len(nodes)]
            failed = [{"node": str(f["node"]),
                       "services": {str(k): int(v)
                                    for k, v in dict(f.get("services") or {}).items()}}
                      for f in doc.get("failed") or []]
        except (KeyError, TypeError, ValueError) as exc:
            raise MapError(f"bad cluster map: {exc}") from None
        if len(services) != len(nodes):
            raise MapError(f"the map has {len(services)} service lists for {len(nodes)} nodes")
        if any(not 0 < p <= 65535 for s in services for p in s.values()):
            raise MapError("a service port is not a TCP port (1..65535)")
        if not nodes or not 0 <= this < len(nodes):
            raise MapError("'this' must index 'nodes'")
        if len(vbmap) != num_vbuckets:
            raise MapError(f"the map has {len(vbmap)} vbuckets, the node {num_vbuckets}")
        if topology not in TOPOLOGIES:
            raise MapError(f"topology must be one of {', '.join(TOPOLOGIES)}")
        for vb, chain in enumerate(vbmap):
            if not chain:
                raise MapError(f"vbucket {vb} has an empty chain")
            real = [i for i in chain if i >= 0]
            if any(i >= len(nodes) or i < -1 for i in chain) or len(set(real)) != len(real):
                raise MapError(f"vbucket {vb}: bad chain {chain}")
        return cls(rev, nodes, this, vbmap, replicas, topology, auth, services, failed)

    def to_doc(self) -> dict[str, Any]:
        return {"rev": self.rev, "nodes": self.nodes, "this": self.this,
                "replicas": self.replicas, "topology": self.topology, "vbmap": self.vbmap,
                "auth": self.auth, "services": self.services, "failed": self.failed}

    def inherit_services(self, old: "ClusterMap | None") -> None:
        """Give each node without services the ones `old` gave the same address."""
        if old is None:
            return
        known = {n: s for n, s in zip(old.nodes, old.services) if s}
        known.update({f["node"]: f["services"] for f in old.failed if f["services"]})
        self.services = [dict(s) if s else dict(known.get(n, {}))
                         for n, s in zip(self.nodes, self.services)]
        for f in self.failed:
            if not f["services"]:
                f["services"] = dict(known.get(f["node"], {}))

    def services_of(self, node: int) -> dict[str, int]:
        """The ports of `node`'s services; `kv` is always its address's port."""
        out = dict(self.services[node]) if node < len(self.services) else {}
        out["kv"] = self.address(node)[1]
        return out

    # -- roles -----------------------------------------------------------------------

    def role(self, vb: int, node: int | None = None) -> int:
        """The state vbucket `vb` has on `node` (default: this node)."""
        me = self.this if node is None else node
        chain = self.vbmap[vb]
        if chain and chain[0] == me:
            return VBucketState.ACTIVE
        if me in chain[1:]:
            return VBucketState.REPLICA
        return VBucketState.DEAD

    def source(self, vb: int, node: int | None = None) -> int | None:
        """The node a replica of `vb` on `node` replicates from (None: no live source)."""
        me = self.this if node is None else node
        chain = self.vbmap[vb]
        if me not in chain[1:] or chain[0] < 0:
            return None
        if self.topology == "chain":
            i = chain.index(me)
            prev = [n for n in chain[:i] if n >= 0]
            return prev[-1] if prev else None
        return chain[0]

    def address(self, node: int) -> tuple[str, int]:
        host, _, port = self.nodes[node].rpartition(":")
        return host.strip("[]"), int(port)


def load_map(data_dir: Path, num_vbuckets: int) -> ClusterMap | None:
    path = Path(data_dir) / CLUSTER_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("%s: unreadable cluster map (%s); running alone", path, exc)
        return None
    try:
        return ClusterMap.from_doc(doc, num_vbuckets)
    except MapError as exc:
        log.error("%s: %s; running alone", path, exc)
        return None


def save_map(data_dir: Path, cmap: ClusterMap) -> None:
    path = Path(data_dir) / CLUSTER_FILE
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(cmap.to_doc(), indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
