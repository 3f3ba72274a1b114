"""Key requests sent to the member that holds each key's vbucket active.

* `newest_view(opts, members)`: the newest cluster map any member answers with (during a
  failover or a move the members get the new map one after the other). `restore`'s
  writer, the cluster DCP consumer and `Router` read the map again through it.
* `Router`: the routes of a bucket (its cluster map) and one connection per member. A
  request answered NOT_MY_VBUCKET takes the map the answer carries (Couchbase nodes send
  their cluster config in its body) or, without one, reads the map again from the
  members; a request whose member cannot be reached (it died: a failover is under way)
  reads the map again too. Either way it goes again to the vbucket's active as the map
  now says, with a short backoff while the map names the same member, until
  `reroute_seconds` pass without a write getting through: then one RoutingError.
* `Router.request(vb, msg)`: one request; `Router.write(items)`: pipelined writes, one
  window per member at a time, the members written in parallel (a thread each).

A node alone (its map names only itself) gets everything on the connection the router
started with, whatever its map calls it; NOT_MY_VBUCKET from it is the caller's answer.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import Callable, Iterable

from dcptool.protocol.constants import REQUEST_MAGICS, Status, status_name

from .connection import Connection
from .errors import ClientError, ClientTimeout, ConnectError, ConnectionClosed, ProtocolViolation
from .topology import ClusterView, cluster_map, member_opts, newest_view

#: failures of a member's connection (it died or restarts), not refusals
UNREACHABLE = (ConnectError, ConnectionClosed, ClientTimeout, OSError)
#: statuses worth the same request again after a pause, on the same member
TRANSIENT = frozenset({Status.ETMPFAIL, Status.EBUSY, Status.ENOMEM})
#: seconds a request keeps looking for its vbucket's active without any write getting
#: through before the router gives up
REROUTE_SECONDS = 30.0


class RoutingError(ClientError):
    """Requests found no member taking them within the router's time."""

    def __init__(self, message: str, *, host: str | None = None, vbucket: int | None = None,
                 items: list | None = None) -> None:
        super().__init__(message, host=host,
                         hint="dcptool cluster status shows which member holds each vbucket")
        self.vbucket = vbucket
        self.items = items or []


@dataclass
class WriteOutcome:
    """What `Router.write` did: `written` answered SUCCESS; `failed` (item index, status,
    member) answered an error that no other member or pause can change."""

    written: int = 0
    failed: list[tuple[int, int, str]] = field(default_factory=list)
    #: requests sent again (NOT_MY_VBUCKET, a lost connection, a temporary failure)
    resent: int = 0
    #: the members that took at least one write (a member failed over meanwhile included)
    nodes: set[str] = field(default_factory=set)


@dataclass
class _Window:
    node: str = ""
    ok: int = 0
    failed: list = field(default_factory=list)
    retry: list = field(default_factory=list)
    config: bytes = b""
    lost: str | None = None
    error: str = ""
    moved: bool = False
    transient: bool = False


class _Budget:
    """Time to find an active, restarted whenever a write gets through."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.delay = 0.05
        self.progress()

    def progress(self) -> None:
        self.deadline = time.monotonic() + self.seconds
        self.delay = 0.05

    @property
    def spent(self) -> bool:
        return time.monotonic() > self.deadline

    def pause(self) -> None:
        time.sleep(min(self.delay, max(0.0, self.deadline - time.monotonic())))
        self.delay = min(1.0, self.delay * 2)


class Router:
    """Routes of one bucket and a connection per member (see the module's docstring).

    `conn` is the connection to the member named by `opts` (kept and used for it);
    `collections`: every connection negotiates HELLO Collections (keys carry their
    collection id)."""

    #: `write` hands each member up to DEPTH windows at a time (two in flight)
    DEPTH = 4
    _window = 1000

    def __init__(self, opts, conn: Connection, *, collections: bool = False,
                 reroute_seconds: float = REROUTE_SECONDS, view: ClusterView | None = None) -> None:
        self.opts = opts
        self.first = conn
        self.collections = collections
        self.reroute_seconds = reroute_seconds
        self.view = view if view is not None else cluster_map(conn)
        self.conns: dict[str, Connection] = {}
        if self.view.clustered and opts.address in self.view.nodes:
            self.conns[opts.address] = conn
        #: maps taken from NOT_MY_VBUCKET answers / read again from the members
        self.maps_answered = 0
        self.maps_read = 0

    # -- routes ---------------------------------------------------------------------

    @property
    def clustered(self) -> bool:
        return self.view.clustered

    @property
    def vbuckets(self) -> int:
        """The bucket's vbucket count as the map says (0: the map has no vbucket map)."""
        return len(self.view.vbmap)

    @property
    def members(self) -> tuple[str, ...]:
        return self.view.nodes if self.clustered else (self.opts.address,)

    def node_of(self, vb: int) -> str | None:
        """The member to send vbucket `vb`'s keys to (None: the map names no active)."""
        if not self.clustered:
            return self.opts.address
        return self.view.active_node(vb) if 0 <= vb < len(self.view.vbmap) else None

    def take(self, view: ClusterView | None) -> bool:
        """Use `view` when it is a cluster's map at least as new as ours and differs from
        it; True if the routes changed."""
        if view is None or not view.clustered or not view.newer_than(self.view):
            return False
        changed = (view.nodes, view.vbmap) != (self.view.nodes, self.view.vbmap)
        self.view = view
        return changed

    def take_config(self, body: bytes, sender: str) -> bool:
        """The cluster config a NOT_MY_VBUCKET answer carried (empty or not JSON: False)."""
        if not body:
            return False
        try:
            view = ClusterView.from_config(json.loads(bytes(body)), sender)
        except (ValueError, TypeError, AttributeError):
            return False
        changed = self.take(view)
        self.maps_answered += changed
        return changed

    def refresh(self, failed: str | None = None) -> bool:
        """Read the map again from the members (`failed` asked last); True if it changed."""
        changed = self.take(newest_view(self.opts, [*self.members, self.opts.address],
                                        last=failed))
        self.maps_read += 1
        return changed

    # -- connections -------------------------------------------------------------------

    def connection(self, node: str) -> Connection:
        conn = self.conns.get(node)
        if conn is None or conn.closed:
            if not self.clustered:
                conn = self.first
                if conn.closed:
                    raise ConnectionClosed(f"connection to {node} is closed", host=node)
            else:
                conn = member_opts(self.opts, node).connect(collections=self.collections)
                if self.collections and not conn.collections and self.first.collections:
                    conn.close()
                    raise ProtocolViolation(f"{node} refused HELLO Collections, which "
                                            f"{self.opts.address} accepted", host=node)
            self.conns[node] = conn
        return conn

    def drop(self, node: str | None) -> None:
        conn = self.conns.pop(node, None) if node is not None else None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in list(self.conns.values()) + [self.first]:
            conn.close()
        self.conns.clear()

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one request ---------------------------------------------------------------------

    def request(self, vb: int, msg, *, what: str = "request"):
        """(response, member address): `msg` (a key request for vbucket `vb`) answered by
        the vbucket's active. NOT_MY_VBUCKET and lost connections are rerouted (on a
        cluster); any other status is the caller's. A request sent again after a lost
        connection may have been applied the first time."""
        budget = _Budget(self.reroute_seconds)
        while True:
            node = self.node_of(vb)
            reason = "the cluster map names no active node"
            if node is not None:
                try:
                    rsp = self.connection(node).request(msg)
                except UNREACHABLE as exc:
                    if not self.clustered:
                        raise
                    self.drop(node)
                    reason = str(exc)
                    moved = self.refresh(failed=node)
                else:
                    if rsp.status != Status.NOT_MY_VBUCKET or not self.clustered:
                        return rsp, node
                    reason = "NOT_MY_VBUCKET"
                    moved = (self.take_config(bytes(getattr(rsp, "value", b"") or b""), node)
                             and self.node_of(vb) != node) or self.refresh()
            else:
                moved = self.refresh()
            if budget.spent:
                raise RoutingError(f"{what} for vbucket {vb} found no member taking it within "
                                   f"{self.reroute_seconds:g} s (last: {node or 'no active'}: "
                                   f"{reason})", host=node, vbucket=vb)
            if not moved or self.node_of(vb) == node:
                budget.pause()

    # -- pipelined writes ----------------------------------------------------------------

    def write(self, items: Iterable[tuple[int, int, bytes]], *, window: int = 1000,
              name: Callable[[int], str] = str, stop_on_failure: bool = True) -> WriteOutcome:
        """Send `items` (index, vbucket, encoded request whose opaque is index mod 2**32):
        each to its vbucket's active, in windows of `window` requests, two in flight per
        member, the members in parallel. A request answered NOT_MY_VBUCKET or TMPFAIL, or
        unanswered when its member's connection broke, is sent again (so requests must be
        idempotent, as SET is); one answered SUCCESS counts as written and is never sent
        again.
        `stop_on_failure`: return after the first window with a failure. `name(index)`
        names an item in a RoutingError."""
        out = WriteOutcome()
        self._window = max(1, window)
        it = iter(items)
        pool = (ThreadPoolExecutor(max_workers=len(self.members),
                                   thread_name_prefix="dcptool-write")
                if self.clustered else None)
        try:
            while True:
                chunk = list(islice(it, window * self.DEPTH * max(1, len(self.members))))
                if not chunk:
                    break
                self._write_chunk(chunk, out, name, pool)
                if out.failed and stop_on_failure:
                    break
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
        return out

    def _write_chunk(self, pending: list, out: WriteOutcome, name, pool) -> None:
        budget = _Budget(self.reroute_seconds)
        while pending:
            groups: dict[str | None, list] = {}
            for item in pending:
                groups.setdefault(self.node_of(item[1]), []).append(item)
            stranded = groups.pop(None, [])
            if len(groups) > 1 and pool is not None:
                results = list(pool.map(lambda kv: self._send_window(*kv), groups.items()))
            else:
                results = [self._send_window(node, batch) for node, batch in groups.items()]
            retry = list(stranded)
            moved = False
            lost: list[str] = []
            errors: list[str] = []
            transient_only = not stranded
            for res in results:
                out.written += res.ok
                out.failed.extend(res.failed)
                retry.extend(res.retry)
                if res.ok:
                    budget.progress()
                    out.nodes.add(res.node)
                if res.config:
                    moved |= self.take_config(res.config, "")
                if res.lost is not None:
                    lost.append(res.lost)
                    errors.append(res.error)
                if res.moved or res.lost is not None:
                    transient_only = False
            if not retry:
                return
            if not self.clustered and not transient_only:
                # a node alone: nowhere else to send them
                raise RoutingError(f"{len(retry)} writes to {self.opts.address} were not "
                                   f"answered, first {name(retry[0][0])}: {errors[0]}",
                                   host=self.opts.address, items=retry)
            out.resent += len(retry)
            if not transient_only and not moved:
                for node in lost or [None]:
                    moved |= self.refresh(failed=node)
            if budget.spent:
                first = retry[0]
                node = self.node_of(first[1])
                raise RoutingError(f"{len(retry)} writes found no member taking them within "
                                   f"{self.reroute_seconds:g} s, first {name(first[0])} "
                                   f"(vbucket {first[1]}, "
                                   f"{'active on ' + node if node else 'no active node'})",
                                   host=node, vbucket=first[1], items=retry)
            if not moved:
                budget.pause()
            pending = retry

    def _send_window(self, node: str, batch: list) -> _Window:
        """Send `batch` to `node` and read every answer (runs in a worker thread)."""
        res = _Window(node=node)
        waiting = {item[0] & 0xFFFFFFFF: item for item in batch}
        step = self._window
        try:
            conn = self.connection(node)
            # up to two windows in flight: the node applies one while the next arrives
            sent = min(len(batch), 2 * step)
            conn.send_bytes(b"".join(item[2] for item in batch[:sent]))
            answered = 0
            while waiting:
                if sent < len(batch) and answered >= sent - step:
                    nxt = min(len(batch), sent + step)
                    conn.send_bytes(b"".join(item[2] for item in batch[sent:nxt]))
                    sent = nxt
                frame = conn.recv_frame()
                if frame.magic in REQUEST_MAGICS:
                    continue  # a server-initiated request (a config push): not an answer
                item = waiting.pop(frame.opaque, None)
                if item is None:
                    raise ProtocolViolation(f"{node} answered an unknown request (opaque "
                                            f"{frame.opaque})", host=node)
                answered += 1
                st = frame.status
                if st == Status.SUCCESS:
                    res.ok += 1
                elif st == Status.NOT_MY_VBUCKET and self.clustered:
                    res.retry.append(item)
                    res.moved = True
                    if frame.value and not res.config:
                        res.config = bytes(frame.value)
                elif st in TRANSIENT:
                    res.retry.append(item)
                    res.transient = True
                else:
                    res.failed.append((item[0], st, node))
        except (*UNREACHABLE, ProtocolViolation) as exc:
            self.drop(node)
            res.error = str(exc)
            res.retry.extend(waiting.values())
            res.lost = node
        return res


def failure_text(failed: list[tuple[int, int, str]], name: Callable[[int], str]) -> str:
    """One line for `WriteOutcome.failed`."""
    i, st, node = failed[0]
    nodes = sorted({f[2] for f in failed})
    where = nodes[0] if len(nodes) == 1 else f"{len(nodes)} members"
    return f"{len(failed)} writes failed on {where}, first {name(i)}: {status_name(st)}"


__all__ = ["Router", "RoutingError", "WriteOutcome", "newest_view", "failure_text",
           "REROUTE_SECONDS", "UNREACHABLE"]
