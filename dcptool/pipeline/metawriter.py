"""Pipelined *_WITH_META writes: restore documents with their cas, rev seqno, flags and expiry.

Writes go out as quiet requests (SETQ_WITH_META / DELQ_WITH_META), which a node answers
only on failure, in windows closed by a NOOP: when the NOOP's answer arrives every write
before it has been applied. Conflicts the node's revision-seqno resolution decides against
us (newer data already there) are counted as skipped; TMPFAIL is retried with backoff.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Iterable

from dcptool.client.connection import Connection
from dcptool.client.errors import NotMyVbucketError, ProtocolViolation
from dcptool.protocol import HEADER, vbucket_of
from dcptool.protocol.constants import (
    REQUEST_MAGICS,
    Magic,
    MetaOption,
    Opcode,
    Status,
    status_name,
)

WITH_META = struct.Struct(">IIQQ")
WITH_META_OPTS = struct.Struct(">IIQQI")
#: record kinds the writer accepts
MUTATION, DELETION, EXPIRATION = "mutation", "deletion", "expiration"
_RETRY = {Status.ETMPFAIL, Status.EBUSY, Status.ENOMEM}
_BARRIER_OPAQUE = 0xFFFFFFFF


@dataclass
class WriteCounts:
    restored: dict[str, int] = field(default_factory=lambda: {MUTATION: 0, DELETION: 0, EXPIRATION: 0})
    skipped: dict[str, int] = field(default_factory=lambda: {MUTATION: 0, DELETION: 0, EXPIRATION: 0})
    failed: dict[str, int] = field(default_factory=lambda: {MUTATION: 0, DELETION: 0, EXPIRATION: 0})
    retries: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"restored": dict(self.restored), "skipped": dict(self.skipped),
                "failed": dict(self.failed), "retries": self.retries, "errors": self.errors[:10]}

    def add(self, other: "WriteCounts") -> None:
        for mine, theirs in ((self.restored, other.restored), (self.skipped, other.skipped),
                             (self.failed, other.failed)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.retries += other.retries
        self.errors.extend(other.errors[: max(0, 10 - len(self.errors))])


def encode_with_meta(kind: str, vbucket: int, opaque: int, key: bytes, value: bytes, flags: int,
                     expiry: int, rev_seqno: int, cas: int, datatype: int, options: int) -> bytes:
    """One SETQ_WITH_META or DELQ_WITH_META request, built with precompiled structs."""
    if kind == MUTATION:
        op = Opcode.SETQ_WITH_META
    else:
        op = Opcode.DELQ_WITH_META
        if kind == EXPIRATION:
            options |= MetaOption.IS_EXPIRATION
    if options:
        extras = WITH_META_OPTS.pack(flags, expiry, rev_seqno, cas, options)
    else:
        extras = WITH_META.pack(flags, expiry, rev_seqno, cas)
    body = len(extras) + len(key) + len(value)
    return b"".join((HEADER.pack(Magic.REQUEST, op, len(key), len(extras), datatype, vbucket, body,
                                 opaque, 0), extras, key, value))


class MetaWriter:
    """Writes documents with their metadata over one connection, `window` requests in flight.

    `force` skips the node's conflict resolution (our version always wins).
    """

    def __init__(self, conn: Connection, vbuckets: int, *, force: bool = False, window: int = 2000,
                 max_retries: int = 8, backoff: float = 0.05) -> None:
        self.conn = conn
        self.vbuckets = vbuckets
        self.options = int(MetaOption.SKIP_CONFLICT_RESOLUTION) if force else 0
        self.window = window
        self.max_retries = max_retries
        self.backoff = backoff
        self.counts = WriteCounts()

    def write(self, records: Iterable[tuple]) -> WriteCounts:
        """records: (kind, key, value, flags, expiry, rev_seqno, cas, datatype)."""
        batch: list[tuple] = []
        for rec in records:
            batch.append(rec)
            if len(batch) >= self.window:
                self._send_window(batch)
                batch = []
        if batch:
            self._send_window(batch)
        return self.counts

    def _send_window(self, batch: list[tuple]) -> None:
        attempt = 0
        while batch:
            parts = []
            for i, (kind, key, value, flags, expiry, rev, cas, datatype) in enumerate(batch):
                vb = vbucket_of(key, self.vbuckets)
                parts.append(encode_with_meta(kind, vb, i, key, value, flags, expiry, rev, cas,
                                              datatype, self.options))
            parts.append(HEADER.pack(Magic.REQUEST, Opcode.NOOP, 0, 0, 0, 0, 0, _BARRIER_OPAQUE, 0))
            self.conn.send_bytes(b"".join(parts))
            failed_idx: dict[int, int] = {}
            while True:
                frame = self.conn.recv_frame()
                if frame.magic in REQUEST_MAGICS:
                    continue
                if frame.opcode == Opcode.NOOP and frame.opaque == _BARRIER_OPAQUE:
                    break
                if frame.opaque >= len(batch):
                    raise ProtocolViolation(f"{self.conn.address} answered an unknown request "
                                            f"(opaque {frame.opaque})", host=self.conn.address)
                failed_idx[frame.opaque] = frame.status
            retry = []
            for i, rec in enumerate(batch):
                kind = rec[0]
                status = failed_idx.get(i)
                if status is None or status == Status.SUCCESS:
                    self.counts.restored[kind] += 1
                elif status == Status.KEY_EEXISTS or (status == Status.KEY_ENOENT and kind != MUTATION):
                    # the node holds a version that wins conflict resolution (or nothing to delete)
                    self.counts.skipped[kind] += 1
                elif status in _RETRY and attempt < self.max_retries:
                    retry.append(rec)
                elif status == Status.NOT_MY_VBUCKET:
                    raise NotMyVbucketError(
                        f"{self.conn.address} does not hold vbucket {vbucket_of(rec[1], self.vbuckets)} "
                        f"(key {rec[1][:60]!r})", host=self.conn.address,
                        vbucket=vbucket_of(rec[1], self.vbuckets))
                else:
                    self.counts.failed[kind] += 1
                    if len(self.counts.errors) < 10:
                        self.counts.errors.append(f"{kind} {rec[1][:60].decode('utf-8', 'replace')}: "
                                                  f"{status_name(status)}")
            if retry:
                attempt += 1
                self.counts.retries += len(retry)
                time.sleep(min(2.0, self.backoff * (2 ** (attempt - 1))))
            batch = retry


def write_to_actives(opts, routes: dict[int, str], vbuckets: int,
                     per_vbucket: Iterable[tuple[int, Iterable[tuple]]], *,
                     force: bool = False, window: int = 2000,
                     reroute_timeout: float = 60.0) -> WriteCounts:
    """Write each vbucket's records to its active node on a cluster.

    routes: {vbucket: HOST:PORT of its active node} (from the cluster map); per_vbucket:
    (vbucket, records) pairs. One connection per node, opened on first use.

    The map may change while the restore runs (a failover, a move). A window answered
    NOT_MY_VBUCKET, or whose node cannot be reached, is sent again to the vbucket's
    active as the map read again from the members says (the newest rev that answers),
    until it is written or `reroute_timeout` seconds pass without a node taking it.
    """
    from dcptool.client.errors import ClientError
    from dcptool.errors import DcptoolError

    from .nodeinfo import node_opts

    routes = dict(routes)
    writers: dict[str, MetaWriter] = {}
    retired: list[MetaWriter] = []

    def drop(node: str) -> None:
        w = writers.pop(node, None)
        if w is not None:
            retired.append(w)
            try:
                w.conn.close()
            except OSError:
                pass

    def send(vb: int, batch: list[tuple]) -> None:
        deadline = time.monotonic() + reroute_timeout
        delay = 0.05
        while True:
            node = routes.get(vb)
            try:
                if node is None:
                    raise DcptoolError(f"vbucket {vb} has no active node in the cluster map")
                w = writers.get(node)
                if w is None:
                    w = writers[node] = MetaWriter(node_opts(opts, node).connect(), vbuckets,
                                                   force=force, window=max(window, len(batch)))
                w.write(batch)
                return
            except (NotMyVbucketError, ClientError, OSError, DcptoolError) as exc:
                if not isinstance(exc, (NotMyVbucketError, OSError)) and \
                        not _unreachable(exc) and node is not None:
                    raise
                if node is not None:
                    drop(node)
                if time.monotonic() > deadline:
                    raise
                routes.update(_refresh_routes(opts, routes, node))
                if routes.get(vb) == node:
                    time.sleep(delay)  # the map has not changed (yet): a failover under way
                    delay = min(1.0, delay * 2)

    try:
        for vb, records in per_vbucket:
            batch: list[tuple] = []
            for rec in records:
                batch.append(rec)
                if len(batch) >= window:
                    send(vb, batch)
                    batch = []
            if batch:
                send(vb, batch)
    finally:
        for node in list(writers):
            drop(node)
    total = WriteCounts()
    for w in retired:
        total.add(w.counts)
    return total


def _unreachable(exc: Exception) -> bool:
    """A connection that failed or closed (the node died or restarts), not a refusal."""
    from dcptool.client.errors import ClientTimeout, ConnectError, ConnectionClosed

    return isinstance(exc, (ConnectError, ConnectionClosed, ClientTimeout))


def _refresh_routes(opts, routes: dict[int, str], failed: str | None) -> dict[int, str]:
    """{vbucket: active node} from the newest cluster map any member answers with (the
    members named in `routes` and `opts`' node; `failed` is asked last)."""
    from dcptool.client.cluster import cluster_map
    from dcptool.client.errors import ClientError

    from .nodeinfo import node_opts

    members = list(dict.fromkeys([*sorted(set(routes.values())), opts.address]))
    if failed in members:
        members.remove(failed)
        members.append(failed)
    best = None
    for address in members:
        try:
            with node_opts(opts, address).connect() as conn:
                view = cluster_map(conn)
        except (ClientError, OSError, ValueError):
            continue
        if view.clustered and (best is None or view.rev > best.rev):
            best = view
            members.extend(n for n in view.nodes if n not in members)
    if best is None:
        return {}
    return {vb: node for vb in range(len(best.vbmap))
            if (node := best.active_node(vb)) is not None}
