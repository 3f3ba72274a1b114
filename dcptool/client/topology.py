"""Clusters of nodes: the cluster map, the admin opcodes, and following vbuckets across nodes.

* `cluster_map(conn)`: the node's GET_CLUSTER_CONFIG, reduced to `ClusterView`
  (node addresses and, per vbucket, the chain active-first).
* `set_map`, `hold_replication`, `node_status`, `take_over`: dcptool's admin opcodes
  0xe8-0xeb (docs/protocol-extensions.md).
* `plan_map(n_nodes, n_vbuckets, replicas)`: actives spread evenly, replicas on other
  nodes (the map `dcptool cluster create` sends).
* `failover_map`, `move_map`: the maps after a failover or a move.
* `newest_view(opts, members)`: the newest map any member answers with; `member_opts`:
  connection options pointed at a member.
* `ClusterConsumer`: each vbucket streamed from its active node; on NOT_MY_VBUCKET, a
  stream ended by a state change (a failover, a move) or a closed connection, the map is
  read again (the newest one any member holds) and the vbucket resumes from its stored
  position on its active; `-c` may name any member.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Iterable

from dcptool.protocol.constants import Status, status_name
from dcptool.protocol.messages import GenericRequest, GetClusterConfig

from .connection import Connection, error_context, raise_for_status
from .errors import ClientError, RequestFailed
from .session import VALUE_COUNTERS

CLUSTER_SET_MAP = 0xE8
REPLICATION_HOLD = 0xE9
CLUSTER_STATUS = 0xEA
VBUCKET_TAKEOVER = 0xEB

_U64 = struct.Struct(">Q")


@dataclass(frozen=True)
class ClusterView:
    """What a client needs of a cluster map."""

    rev: int
    nodes: tuple[str, ...]
    vbmap: tuple[tuple[int, ...], ...]
    this: int | None = None
    #: the cluster map's own rev (0 for a node that is alone); `rev` is the node's config rev
    map_rev: int = 0

    def active_node(self, vb: int) -> str | None:
        chain = self.vbmap[vb]
        return self.nodes[chain[0]] if chain and chain[0] >= 0 else None

    @property
    def clustered(self) -> bool:
        """A cluster's map: several nodes, or a dcptool cluster map (one member may be left
        once the others failed over: its vbuckets are still routed by the map)."""
        return len(self.nodes) > 1 or self.map_rev > 0

    @classmethod
    def from_config(cls, cfg: dict[str, Any], fallback: str) -> "ClusterView":
        sm = cfg.get("vBucketServerMap") or {}
        nodes = tuple(str(n) for n in (sm.get("serverList") or [fallback]))
        vbmap = tuple(tuple(int(i) for i in chain) for chain in sm.get("vBucketMap") or ())
        this = None
        for i, n in enumerate(cfg.get("nodesExt") or ()):
            if n.get("thisNode"):
                this = i
        return cls(int(cfg.get("rev", 0)), nodes, vbmap, this,
                   int(cfg.get("dcptoolMapRev", 0) or 0))

    def newer_than(self, other: "ClusterView") -> bool:
        """Is this view at least as new as `other` (map rev first, then config rev)?"""
        return (self.map_rev, self.rev) >= (other.map_rev, other.rev)


def cluster_error(rsp, what: str, address: str) -> RequestFailed:
    """How the cluster commands (dcptool's own opcodes) read a failure: RequestFailed with
    the node's error context, whatever the status."""
    text = error_context(rsp) or ""
    if rsp.status == Status.UNKNOWN_COMMAND:
        text = "the node does not support clusters (an older dcptool node?)"
    return RequestFailed(f"{what} on {address} failed: "
                         f"{status_name(rsp.status)}" + (f": {text}" if text else ""),
                         host=address, status=rsp.status, opcode=rsp.opcode)


def cluster_call(conn: Connection, opcode: int, *, vbucket: int = 0, extras: bytes = b"",
                 value: bytes = b"", what: str = "") -> bytes:
    """Send one of the cluster commands; its value, or the error `cluster_error` reads."""
    rsp = conn.call(GenericRequest(op=opcode, vbucket=vbucket, extras=extras, value=value),
                    what or hex(opcode), errors=cluster_error)
    return bytes(getattr(rsp, "value", b"") or b"")


def cluster_config(conn: Connection) -> dict:
    rsp = conn.request(GetClusterConfig())
    raise_for_status(rsp, "GET_CLUSTER_CONFIG", address=conn.address)
    try:
        return json.loads(bytes(rsp.value))
    except (ValueError, AttributeError):
        return {}


def cluster_map(conn: Connection) -> ClusterView:
    return ClusterView.from_config(cluster_config(conn), conn.address)


def set_map(conn: Connection, doc: dict[str, Any]) -> dict[str, Any]:
    """CLUSTER_SET_MAP: give the node the whole map (its own index in doc['this'])."""
    return json.loads(cluster_call(conn, CLUSTER_SET_MAP, value=json.dumps(doc).encode(),
                                   what="CLUSTER_SET_MAP") or b"{}")


def hold_replication(conn: Connection, vbucket: int, seqno: int | None) -> None:
    """REPLICATION_HOLD: the node's replica of `vbucket` applies nothing above `seqno`
    (None releases the hold)."""
    cluster_call(conn, REPLICATION_HOLD, vbucket=vbucket,
                 extras=b"" if seqno is None else _U64.pack(seqno), what="REPLICATION_HOLD")


def take_over(conn: Connection, vbucket: int, source: str, *, auth: dict[str, str] | None = None,
              timeout: float = 600.0) -> dict[str, Any]:
    """VBUCKET_TAKEOVER: the node on `conn` takes `vbucket` over from its active `source`
    (host:port) by a takeover stream; returns once it is active there (a JSON summary).
    `conn` should wait at least `timeout` for the answer."""
    doc: dict[str, Any] = {"source": source, "timeout": timeout}
    if auth is not None:
        doc["auth"] = auth
    answer = cluster_call(conn, VBUCKET_TAKEOVER, vbucket=vbucket,
                          value=json.dumps(doc).encode(), what="VBUCKET_TAKEOVER")
    return json.loads(answer or b"{}")


def node_status(conn: Connection) -> dict[str, Any]:
    """CLUSTER_STATUS: the node's map rev, index, node list and per-vbucket replication."""
    return json.loads(cluster_call(conn, CLUSTER_STATUS, what="CLUSTER_STATUS") or b"{}")


# ---------------------------------------------------------------------------
# maps


def plan_map(n_nodes: int, n_vbuckets: int, replicas: int) -> list[list[int]]:
    """Chains for `n_vbuckets`: actives round-robin, replica k of vbucket v on the node k
    places further on (so every node holds as many actives and replicas as possible)."""
    if not 0 <= replicas < n_nodes:
        raise ValueError(f"{replicas} replicas need at least {replicas + 1} nodes")
    return [[(vb + k) % n_nodes for k in range(replicas + 1)] for vb in range(n_vbuckets)]


def failover_map(vbmap: list[list[int]], failed: int,
                 seqnos: dict[int, dict[int, int]]) -> tuple[list[list[int]], dict[int, int]]:
    """The chains once node `failed` is gone, and {vbucket: promoted node}.

    For a vbucket active on `failed`, the replica with the highest seqno (`seqnos[node][vb]`,
    ties to the earlier one in the chain) becomes active; the others stay its replicas.
    The failed node leaves every chain (-1 keeps the chain length).
    """
    out: list[list[int]] = []
    promoted: dict[int, int] = {}
    for vb, chain in enumerate(vbmap):
        rest = [n for n in chain if n >= 0 and n != failed]
        if chain and chain[0] == failed and rest:
            best = max(rest, key=lambda n: (seqnos.get(n, {}).get(vb, -1), -rest.index(n)))
            rest.remove(best)
            rest.insert(0, best)
            promoted[vb] = best
        elif chain and chain[0] == failed:
            rest = [-1]
        new = rest + [-1] * (len(chain) - len(rest))
        out.append(new)
    return out, promoted


def move_map(vbmap: list[list[int]], vbuckets: Iterable[int], to: int) -> list[list[int]]:
    """Chains after moving the actives of `vbuckets` to node `to` (the old active takes the
    new one's place in the chain, or leaves it when `to` held no copy)."""
    out = [list(c) for c in vbmap]
    for vb in vbuckets:
        chain = out[vb]
        old = chain[0]
        if old == to:
            continue
        if to in chain:
            chain[chain.index(to)] = old
        chain[0] = to
    return out


__all__ = ["ClusterView", "cluster_config", "cluster_map", "set_map", "hold_replication",
           "node_status", "take_over", "plan_map", "failover_map", "move_map", "ClientError",
           "member_opts", "newest_view", "cluster_call", "cluster_error"]


# ---------------------------------------------------------------------------
# following vbuckets across nodes


class _Counters:
    def __init__(self, owner: "ClusterConsumer") -> None:
        self._owner = owner

    @property
    def noops_answered(self) -> int:
        return self._owner.noops_answered + sum(
            c.session.noops_answered for c in self._owner.consumers.values())

    def __getattr__(self, name: str) -> int:
        # the compressed-value counters (VALUE_COUNTERS) of every connection, closed ones too
        if name not in VALUE_COUNTERS:
            raise AttributeError(name)
        return self._owner.closed_counts.get(name, 0) + sum(
            getattr(c.session, name) for c in self._owner.consumers.values())


class ClusterConsumer:
    """DcpConsumer's interface over a cluster: each vbucket streams from its active node.

    When a node's connection closes (or dies) or a stream is answered NOT_MY_VBUCKET, the
    vbuckets of that connection keep their positions; the map is read again from any
    member that answers and they are asked again from those positions on their (new)
    active node, where the usual rollback handshake applies.
    """

    #: seconds between map refreshes while a vbucket has no live active
    REFRESH_DELAY = 0.2

    def __init__(self, opts, config, view: ClusterView, *, on_rollback=None) -> None:
        self.opts = opts
        self.config = config
        self.view = view
        self.on_rollback = on_rollback
        self.consumers: dict[str, Any] = {}
        self.owner: dict[int, str] = {}
        self.saved: dict[int, Any] = {}
        self.ends: dict[int, int] = {}
        self.orphans: set[int] = set()
        self.finished: set[int] = set()
        self.noops_answered = 0
        #: counters of the connections closed so far (see _Counters)
        self.closed_counts: dict[str, int] = {}
        self.session = _Counters(self)
        self._next_refresh = 0.0
        self.moves = 0

    # -- the DcpConsumer interface used by tail ------------------------------------------

    def start(self) -> None:
        pass

    def add_streams(self, plan) -> None:
        from dcptool.protocol.constants import SEQNO_MAX

        for vb, item in plan.items():
            pos, end = item if isinstance(item, tuple) else (item, SEQNO_MAX)
            self.saved[vb] = pos
            self.ends[vb] = end
            self.orphans.add(vb)
        self._place()

    def position(self, vb: int, consistent: bool | None = None):
        node = self.owner.get(vb)
        c = self.consumers.get(node) if node else None
        if c is not None and vb in c.session.streams:
            return c.position(vb, consistent)
        return self.saved[vb]

    def positions(self, consistent: bool | None = None):
        return {vb: self.position(vb, consistent) for vb in self.saved}

    @property
    def done(self) -> bool:
        return not self.orphans and all(c.done for c in self.consumers.values())

    def batches(self, tick: float | None = 1.0):
        while not self.done:
            yield self.poll(tick)

    def poll(self, timeout: float | None = 1.0) -> list:
        import time

        from .errors import ClientTimeout, ConnectionClosed, NotMyVbucketError, ProtocolViolation

        if self.orphans and time.monotonic() >= self._next_refresh:
            self._place()
        out: list = []
        live = list(self.consumers.items())
        if not live:
            time.sleep(min(timeout or self.REFRESH_DELAY, self.REFRESH_DELAY))
            return out
        each = None if timeout is None else max(0.01, timeout / len(live))
        for node, c in live:
            try:
                out.extend(c.poll(each))
            except NotMyVbucketError as exc:
                self._orphan(node, [exc.vbucket] if exc.vbucket is not None else None)
            except (ConnectionClosed, ClientTimeout, ProtocolViolation, OSError):
                self._orphan(node, None)
        return out

    def close(self) -> None:
        for c in self.consumers.values():
            try:
                c.close()
            except OSError:
                pass
        self.consumers.clear()

    # -- routing ---------------------------------------------------------------------

    def _orphan(self, node: str, vbs) -> None:
        import time

        c = self.consumers.get(node)
        mine = [vb for vb, n in self.owner.items() if n == node]
        if vbs is not None:
            mine = [vb for vb in mine if vb in vbs]
        for vb in mine:
            if c is not None and vb in c.session.streams:
                # the session's own choice: a backup (consistent) resumes at the last complete
                # snapshot end, the only place its writer can continue from; tail inside one
                self.saved[vb] = c.position(vb)
                if c.session.streams[vb].finished and vbs is None and \
                        c.session.streams[vb].state == "ended":
                    self.finished.add(vb)
                    continue
            self.owner.pop(vb, None)
            self.orphans.add(vb)
        if vbs is None or (c is not None and not any(n == node for n in self.owner.values())):
            if c is not None:
                self.noops_answered += c.session.noops_answered
                for name in VALUE_COUNTERS:
                    self.closed_counts[name] = (self.closed_counts.get(name, 0)
                                                + getattr(c.session, name))
                try:
                    c.close()
                except OSError:
                    pass
            self.consumers.pop(node, None)
        self.moves += 1
        # at once the first time; while the map still names a node that refuses the
        # vbucket (a move between its handshake and the new map) every REFRESH_DELAY
        self._next_refresh = max(time.monotonic(), self._next_refresh)

    def _refresh(self) -> None:
        """Read the map from every member that answers and keep the newest: during a move
        or a failover the members get the new map one after the other."""
        best = newest_view(self.opts, [*self.view.nodes, self.opts.address])
        if best is not None and (not self.view.vbmap or best.newer_than(self.view)):
            self.view = best

    def _place(self) -> None:
        import time

        from .errors import ClientError

        self._refresh()
        for vb in sorted(self.orphans):
            node = self.view.active_node(vb) if vb < len(self.view.vbmap) else None
            if node is None:
                continue
            try:
                c = self._consumer(node)
                c.session.streams.pop(vb, None)
                c.add_stream(vb, self.saved[vb], end_seqno=self.ends[vb])
            except (ClientError, OSError):
                self.consumers.pop(node, None)
                continue
            self.owner[vb] = node
            self.orphans.discard(vb)
        self._next_refresh = time.monotonic() + self.REFRESH_DELAY

    def _consumer(self, node: str):
        from .consumer import DcpConsumer

        c = self.consumers.get(node)
        if c is None:
            o = member_opts(self.opts, node)
            c = DcpConsumer.open(o.host, o.port, username=o.username, password=o.login_password,
                                 bucket=o.bucket, tls=o.ssl_context(), timeout=o.timeout,
                                 config=self.config, on_rollback=self.on_rollback,
                                 features=o.features)
            self.consumers[node] = c
        return c


def replace_address(opts, host: str, port: int):
    from dataclasses import replace

    return replace(opts, host=host, port=port)


def member_opts(opts, address: str):
    """`opts` pointed at another member (HOST:PORT as the cluster map names it)."""
    host, _, port = address.rpartition(":")
    return replace_address(opts, host.strip("[]"), int(port))


def newest_view(opts, members: Iterable[str], *, last: str | None = None) -> ClusterView | None:
    """The newest map (ClusterView.newer_than) of a cluster of several nodes that any of
    `members` (HOST:PORT) answers with; members the maps name are asked too. `last` (a
    member that just failed) is asked only when no other answers. None: no member
    answered with a cluster's map."""
    queue = [m for m in dict.fromkeys(members) if m != last]
    asked: set[str] = set()
    best: ClusterView | None = None
    i = 0
    while True:
        if i == len(queue):
            if best is not None or last is None or last in asked:
                return best
            queue.append(last)
        address = queue[i]
        i += 1
        if address in asked:
            continue
        asked.add(address)
        try:
            with member_opts(opts, address).connect() as conn:
                view = cluster_map(conn)
        except (ClientError, OSError, ValueError):
            continue
        if not view.clustered:
            continue
        if best is None or view.newer_than(best):
            best = view
        queue.extend(n for n in view.nodes if n not in asked and n not in queue and n != last)


def cluster_consumer(opts, conn: Connection, config, *, on_rollback=None):
    """A DcpConsumer on `conn` when the node is alone, else a ClusterConsumer (which opens
    its own connections; `conn` is closed)."""
    from .consumer import DcpConsumer

    view = cluster_map(conn)
    if not view.clustered:
        return DcpConsumer(conn, config, on_rollback=on_rollback)
    conn.close()
    return ClusterConsumer(opts, config, view, on_rollback=on_rollback)


def all_vbuckets(conn: Connection) -> list[int] | None:
    """Every vbucket of a cluster (None for a node that is alone)."""
    view = cluster_map(conn)
    return list(range(len(view.vbmap))) if view.clustered else None
