"""Pipelined *_WITH_META writes: restore documents with their cas, rev seqno, flags and expiry.

Writes go out as quiet requests (SETQ_WITH_META / DELQ_WITH_META), which a node answers
only on failure, in windows closed by a NOOP: when the NOOP's answer arrives every write
before it has been applied. Conflicts the node's revision-seqno resolution decides against
us (newer data already there) are counted as skipped; TMPFAIL is retried with backoff.
"""
from __future__ import annotations

import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate, chain, islice, repeat
from operator import add, itemgetter
from typing import Iterable

from dcptool.client.connection import Connection
from dcptool.client.errors import NotMyVbucketError, ProtocolViolation
from dcptool.errors import DcptoolError
from dcptool.faults import fault_point
from dcptool.protocol import vbucket_of
from dcptool.protocol import wire
from dcptool.protocol.collections import split_doc_key
from dcptool.protocol.constants import (
    REQUEST_MAGICS,
    MetaOption,
    Opcode,
    Status,
    status_name,
)

#: the kinds of record the writer accepts (the first field of a record), also the keys of
#: `WriteCounts`' dicts
WRITE_MUTATION, WRITE_DELETION, WRITE_EXPIRATION = "mutation", "deletion", "expiration"
WRITE_KINDS = (WRITE_MUTATION, WRITE_DELETION, WRITE_EXPIRATION)
_RETRY = {Status.ETMPFAIL, Status.EBUSY, Status.ENOMEM}
#: a request header and its SET/DEL_WITH_META extras in one precompiled struct
_WITH_META_REQ = wire.WITH_META
_WITH_META_OPTS_REQ = wire.WITH_META_OPTIONS
_SETQ_WITH_META = wire.OP_SETQ_WITH_META
_DELQ_WITH_META = wire.OP_DELQ_WITH_META
_IS_EXPIRATION = wire.META_IS_EXPIRATION
_KEY = itemgetter(1)  # of a record
_KIND, _FLAGS, _EXPIRY, _REV, _CAS, _DATATYPE = (itemgetter(i) for i in (0, 3, 4, 5, 6, 7))
_MUTATIONS_ONLY = {WRITE_MUTATION}
_FIRST_BYTE = itemgetter(0)
_AFTER_FIRST_BYTE = itemgetter(slice(1, None))


def logical_keys(batch: list[tuple]) -> list[bytes]:
    """The keys of a batch of doc-key records without their collection prefixes (what a
    key's vbucket is computed from): one slice per key, a LEB128 decode only for ids from
    128 up."""
    keys = list(map(_KEY, batch))
    if keys and min(map(len, keys)) and max(map(_FIRST_BYTE, keys)) < 0x80:
        return list(map(_AFTER_FIRST_BYTE, keys))  # one-byte ids only: C-level passes
    return [k[1:] if k[0] < 0x80 else split_doc_key(k)[1] for k in keys]


def _vbucket_of_record(key: bytes, vbuckets: int, prefixed: bool) -> int:
    return vbucket_of(split_doc_key(key)[1] if prefixed else key, vbuckets)


def _zero_counts() -> dict[str, int]:
    return dict.fromkeys(WRITE_KINDS, 0)


@dataclass
class WriteCounts:
    restored: dict[str, int] = field(default_factory=_zero_counts)
    skipped: dict[str, int] = field(default_factory=_zero_counts)
    failed: dict[str, int] = field(default_factory=_zero_counts)
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


#: a window holds at most this many value bytes (or one record, if that is larger): with
#: large documents a window of `window` records would be gigabytes encoded at once
WINDOW_BYTES = 8 << 20
_VALUE = itemgetter(2)  # of a record: (kind, key, value, flags, expiry, rev_seqno, cas, datatype)


def _by_bytes(batch: list[tuple], limit: int) -> list[list[tuple]]:
    """`batch` cut into runs whose values hold at most `limit` bytes (a record larger than
    that alone), in order; one C-level pass over the values' lengths when it fits."""
    if sum(map(len, map(_VALUE, batch))) <= limit:
        return [batch]
    ends = list(accumulate(map(len, map(_VALUE, batch))))
    parts = []
    lo, base = 0, 0
    while lo < len(batch):
        hi = max(lo + 1, bisect_right(ends, base + limit, lo))
        parts.append(batch[lo:hi])
        base = ends[hi - 1]
        lo = hi
    return parts


class MetaWriter:
    """Writes documents with their metadata over one connection.

    Records go out in windows of `window` requests, each closed by a NOOP; up to `depth`
    windows are in flight, so the node applies one window while the next is encoded and
    sent. A window's records count as written once its NOOP is answered; `write` returns
    when every window it sent is confirmed. `force` skips the node's conflict resolution
    (our version always wins). `prefixed`: the keys are doc keys (the connection negotiated
    Collections), so a key's vbucket is computed from the key without its prefix.
    """

    def __init__(self, conn: Connection, vbuckets: int, *, force: bool = False, window: int = 2000,
                 max_retries: int = 8, backoff: float = 0.05, depth: int = 2,
                 prefixed: bool = False) -> None:
        if prefixed and not getattr(conn, "collections", False):
            # doc keys sent over a connection without Collections would be stored as
            # literal keys in the default collection
            conn.close()
            raise DcptoolError(f"{conn.address} did not accept HELLO Collections: the "
                               "collection-prefixed keys cannot be written to it")
        self.conn = conn
        self.prefixed = prefixed
        self.vbuckets = vbuckets
        self.options = int(MetaOption.SKIP_CONFLICT_RESOLUTION) if force else 0
        self.window = max(1, min(window, 0xFFFF))
        self.max_retries = max_retries
        self.backoff = backoff
        self.depth = max(1, depth)
        self.counts = WriteCounts()
        #: windows sent and not yet confirmed: (barrier opaque, records, attempt)
        self._inflight: deque[tuple[int, list[tuple], int]] = deque()
        #: records a confirmed window's node answered NOT_MY_VBUCKET (not counted)
        self._misrouted: list[tuple] = []
        self._next_window = 0

    def write(self, records: Iterable[tuple]) -> WriteCounts:
        """records: (kind, key, value, flags, expiry, rev_seqno, cas, datatype)."""
        it = iter(records)
        window = self.window
        try:
            while True:
                batch = list(islice(it, window))
                if not batch:
                    break
                for part in _by_bytes(batch, WINDOW_BYTES):
                    self._send(part, 0)
                    while len(self._inflight) >= self.depth:
                        self._confirm_oldest()
                    # DCPTOOL_FAULT: stall-restore-after-windows (once the node has them)
                    fault_point("restore-window", self._next_window, flush=self._confirm_all)
            self._confirm_all()
        except BaseException:
            self._inflight.clear()  # the connection is unusable for this writer now
            raise
        return self.counts

    def submit(self, batch: list[tuple]) -> None:
        """Send `batch` as one or more windows without waiting for them: only the oldest
        windows are confirmed, while more than `depth` are in flight. `finish` confirms the
        rest. After an error, `unconfirmed` gives the records to write elsewhere."""
        for part in _by_bytes(batch, WINDOW_BYTES):
            self._send(part, 0)
            while len(self._inflight) >= self.depth:
                self._confirm_oldest()

    def finish(self) -> WriteCounts:
        """Confirm every window in flight."""
        self._confirm_all()
        return self.counts

    def unconfirmed(self) -> list[tuple]:
        """The records not known written (after an error: the windows in flight, and the
        records a node answered NOT_MY_VBUCKET), taken out of the writer."""
        out = self._misrouted
        self._misrouted = []
        for _barrier, batch, _attempt in self._inflight:
            out.extend(batch)
        self._inflight.clear()
        return out

    def _confirm_all(self) -> None:
        while self._inflight:
            self._confirm_oldest()

    def _send(self, batch: list[tuple], attempt: int) -> None:
        """Encode and send one window (requests numbered base+i, then the NOOP barrier)."""
        base = (self._next_window & 0x7FFF) << 16
        self._next_window += 1
        n = self.vbuckets
        options = self.options
        pack = _WITH_META_REQ.pack
        pack_opts = _WITH_META_OPTS_REQ.pack
        parts: list[bytes] = []
        append = parts.append
        opaque = base
        req, extlen, opts_extlen = wire.REQ, wire.WITH_META_EXTLEN, wire.WITH_META_OPTIONS_EXTLEN
        # the records' vbuckets in one pass (a call per record would cost)
        vbs = wire.vbuckets_of(logical_keys(batch) if self.prefixed else map(_KEY, batch), n)
        if not options and set(map(_KIND, batch)) == _MUTATIONS_ONLY:
            # every record a mutation without options: the requests packed in C-level passes
            klens = list(map(len, map(_KEY, batch)))
            bodies = map(add, map(add, klens, map(len, map(_VALUE, batch))), repeat(extlen))
            heads = map(pack, repeat(req), repeat(_SETQ_WITH_META), klens, repeat(extlen),
                        map(_DATATYPE, batch), vbs, bodies, range(base, base + len(batch)),
                        repeat(0), map(_FLAGS, batch), map(_EXPIRY, batch), map(_REV, batch),
                        map(_CAS, batch))
            parts = list(chain.from_iterable(zip(heads, map(_KEY, batch), map(_VALUE, batch))))
            append = parts.append
            vbs = ()  # (taken)
        for (kind, key, value, flags, expiry, rev, cas, datatype), vb in zip(batch, vbs):
            klen = len(key)
            if kind == WRITE_MUTATION:
                if options:
                    append(pack_opts(req, _SETQ_WITH_META, klen, opts_extlen, datatype, vb,
                                     opts_extlen + klen + len(value), opaque, 0, flags, expiry,
                                     rev, cas, options))
                else:
                    append(pack(req, _SETQ_WITH_META, klen, extlen, datatype, vb,
                                extlen + klen + len(value), opaque, 0, flags, expiry, rev, cas))
            else:
                o = options | _IS_EXPIRATION if kind == WRITE_EXPIRATION else options
                if o:
                    append(pack_opts(req, _DELQ_WITH_META, klen, opts_extlen, datatype, vb,
                                     opts_extlen + klen + len(value), opaque, 0, flags, expiry,
                                     rev, cas, o))
                else:
                    append(pack(req, _DELQ_WITH_META, klen, extlen, datatype, vb,
                                extlen + klen + len(value), opaque, 0, flags, expiry, rev, cas))
            append(key)
            if value:
                append(value)
            opaque += 1
        barrier = base | 0xFFFF
        append(wire.HEADER.pack(req, wire.OP_NOOP, 0, 0, 0, 0, 0, barrier, 0))
        # in flight from here: a send that fails leaves the window unconfirmed
        self._inflight.append((barrier, batch, attempt))
        self.conn.send_bytes(b"".join(parts))

    def _confirm_oldest(self) -> None:
        """Read answers up to the oldest window's NOOP; count its records, resend retries."""
        barrier, batch, attempt = self._inflight[0]
        base = barrier & ~0xFFFF
        failed_idx: dict[int, int] = {}
        while True:
            frame = self.conn.recv_frame()
            if frame.magic in REQUEST_MAGICS:
                continue
            if frame.opcode == Opcode.NOOP and frame.opaque == barrier:
                break
            i = frame.opaque - base
            if not 0 <= i < len(batch):
                raise ProtocolViolation(f"{self.conn.address} answered an unknown request "
                                        f"(opaque {frame.opaque})", host=self.conn.address)
            failed_idx[i] = frame.status
        self._inflight.popleft()  # answered: what follows counts or resends its records
        restored = self.counts.restored
        if not failed_idx:
            kinds = [r[0] for r in batch]
            nm = kinds.count(WRITE_MUTATION)
            restored[WRITE_MUTATION] += nm
            if nm != len(kinds):
                restored[WRITE_DELETION] += kinds.count(WRITE_DELETION)
                restored[WRITE_EXPIRATION] += kinds.count(WRITE_EXPIRATION)
            return
        retry = []
        misrouted = []
        for i, rec in enumerate(batch):
            kind = rec[0]
            status = failed_idx.get(i)
            if status is None or status == Status.SUCCESS:
                restored[kind] += 1
            elif status == Status.KEY_EEXISTS or (status == Status.KEY_ENOENT
                                                  and kind != WRITE_MUTATION):
                # the node holds a version that wins conflict resolution (or nothing to delete)
                self.counts.skipped[kind] += 1
            elif status in _RETRY and attempt < self.max_retries:
                retry.append(rec)
            elif status == Status.EACCESS:
                # the user's roles changed during the run: every further write would be
                # refused too, so the run ends here with one error
                from dcptool.client.privileges import META_WRITE, privilege_error

                raise privilege_error(self.conn.username or "?", META_WRITE, "restore into",
                                      self.conn.address, self.conn.bucket, lost=True)
            elif status == Status.NOT_MY_VBUCKET:
                misrouted.append(rec)  # not written here: the caller may send it elsewhere
            else:
                self.counts.failed[kind] += 1
                if len(self.counts.errors) < 10:
                    self.counts.errors.append(f"{kind} {rec[1][:60].decode('utf-8', 'replace')}: "
                                              f"{status_name(status)}")
        if misrouted:
            self._misrouted.extend(misrouted)
            self._misrouted.extend(retry)
            vb = _vbucket_of_record(misrouted[0][1], self.vbuckets, self.prefixed)
            raise NotMyVbucketError(
                f"{self.conn.address} does not hold vbucket {vb} "
                f"(key {misrouted[0][1][:60]!r})", host=self.conn.address, vbucket=vb)
        if retry:
            attempt += 1
            self.counts.retries += len(retry)
            time.sleep(min(2.0, self.backoff * (2 ** (attempt - 1))))
            self._send(retry, attempt)


def write_to_actives(opts, routes: dict[int, str], vbuckets: int,
                     per_vbucket: Iterable[tuple[int, Iterable[tuple]]], *,
                     force: bool = False, window: int = 2000,
                     reroute_timeout: float = 60.0, prefixed: bool = False,
                     depth: int = 2) -> WriteCounts:
    """Write each vbucket's records to its active node on a cluster.

    routes: {vbucket: HOST:PORT of its active node} (from the cluster map); per_vbucket:
    (vbucket, records) pairs. One connection per node, opened on first use. Records are
    gathered per node, across vbuckets, into windows of `window`; each node's writer keeps
    up to `depth` windows in flight (`MetaWriter.submit`) and waits for none while the
    others are written, so every node applies its windows at once.

    The map may change while the restore runs (a failover, a move). The records of a
    window answered NOT_MY_VBUCKET, or in flight to a node that cannot be reached, are sent
    again to their vbuckets' actives as the map read again from the members says (the
    newest rev that answers), until they are written or `reroute_timeout` seconds pass
    without a node taking them.
    """
    w = _ActiveWriters(opts, routes, vbuckets, force=force, window=window,
                       reroute_timeout=reroute_timeout, prefixed=prefixed, depth=depth)
    try:
        for vb, records in per_vbucket:
            w.gather(vb, records)
        w.drain()
    finally:
        w.close()
    return w.counts()


class _ActiveWriters:
    """`write_to_actives`' state: a MetaWriter per node, the records waiting for each node
    (None: a vbucket with no active node yet), and since when writes have failed."""

    def __init__(self, opts, routes: dict[int, str], vbuckets: int, *, force: bool,
                 window: int, reroute_timeout: float, prefixed: bool, depth: int):
        self.opts = opts
        self.routes = dict(routes)
        self.vbuckets = vbuckets
        self.force, self.window, self.prefixed, self.depth = force, window, prefixed, depth
        self.reroute_timeout = reroute_timeout
        self.writers: dict[str, MetaWriter] = {}
        self.retired: list[MetaWriter] = []
        self.pending: dict[str | None, list[tuple]] = {}
        #: since when writes have failed without one succeeding (None: the last one worked)
        self.failing: float | None = None
        self.delay = 0.05

    def vb_of(self, rec: tuple) -> int:
        return _vbucket_of_record(rec[1], self.vbuckets, self.prefixed)

    def gather(self, vb: int, records: Iterable[tuple]) -> None:
        """Queue a vbucket's records for its node, in windows as they come (a generator's
        too), writing each window that fills."""
        node = self.routes.get(vb)
        it = iter(records)
        while True:
            batch = self.pending.setdefault(node, [])
            chunk = list(islice(it, self.window - len(batch)))
            if not chunk:
                break
            batch.extend(chunk)
            if len(batch) >= self.window:
                self.flush(node)

    def drain(self) -> None:
        """The rest, and whatever a failure sent elsewhere, until every node confirmed
        all."""
        while self.pending or self.writers:
            while self.pending:
                self.flush(next(iter(self.pending)))
            for node in list(self.writers):
                self.finish(node)
                if not self.pending and node in self.writers:
                    self.drop(node)

    def close(self) -> None:
        for node in list(self.writers):
            self.drop(node)

    def counts(self) -> WriteCounts:
        total = WriteCounts()
        for w in self.retired:
            total.add(w.counts)
        return total

    def drop(self, node: str) -> None:
        w = self.writers.pop(node, None)
        if w is not None:
            self.retired.append(w)
            try:
                w.conn.close()
            except OSError:
                pass

    def _succeeded(self) -> None:
        self.failing = None
        self.delay = 0.05

    def reroute(self, node: str | None, exc: Exception, records: list[tuple]) -> None:
        """Send `records` again to their vbuckets' actives as the map read again says;
        `exc` is raised when it is not a routing failure or failures lasted too long."""
        if not isinstance(exc, (NotMyVbucketError, OSError)) and \
                not _unreachable(exc) and node is not None:
            raise exc
        if node is not None:
            self.drop(node)
        now = time.monotonic()
        if self.failing is None:
            self.failing = now
        elif now - self.failing > self.reroute_timeout:
            raise exc
        self.routes.update(_refresh_routes(self.opts, self.routes, node))
        vbs = [self.vb_of(r) for r in records]
        if any(self.routes.get(vb) == node for vb in vbs):
            time.sleep(self.delay)  # the map has not changed (yet): a failover under way
            self.delay = min(1.0, self.delay * 2)
        for rec, vb in zip(records, vbs):
            self.pending.setdefault(self.routes.get(vb), []).append(rec)

    def _writer(self, node: str) -> MetaWriter:
        from .nodeinfo import node_opts

        w = self.writers.get(node)
        if w is None:
            w = self.writers[node] = MetaWriter(
                node_opts(self.opts, node).connect(), self.vbuckets, force=self.force,
                window=self.window, prefixed=self.prefixed, depth=self.depth)
        return w

    def flush(self, node: str | None) -> None:
        from dcptool.client.errors import ClientError

        batch = self.pending.pop(node, None)
        if not batch:
            return
        w = None
        done = 0
        try:
            if node is None:
                raise DcptoolError(f"vbucket {self.vb_of(batch[0])} has no active node in "
                                   "the cluster map")
            w = self._writer(node)
            while done < len(batch):
                w.submit(batch[done:done + self.window])
                done += self.window
            self._succeeded()
        except (NotMyVbucketError, ClientError, OSError, DcptoolError) as exc:
            lost = batch[done:] if w is None else w.unconfirmed() + batch[done + self.window:]
            self.reroute(node, exc, lost)

    def finish(self, node: str) -> None:
        from dcptool.client.errors import ClientError

        w = self.writers.get(node)
        if w is None:
            return
        try:
            w.finish()
            self.failing = None
        except (NotMyVbucketError, ClientError, OSError, DcptoolError) as exc:
            self.reroute(node, exc, w.unconfirmed())


def _unreachable(exc: Exception) -> bool:
    """A connection that failed or closed (the node died or restarts), not a refusal."""
    from dcptool.client.errors import ClientTimeout, ConnectError, ConnectionClosed

    return isinstance(exc, (ConnectError, ConnectionClosed, ClientTimeout))


def _refresh_routes(opts, routes: dict[int, str], failed: str | None) -> dict[int, str]:
    """{vbucket: active node} from the newest cluster map any member answers with (the
    members named in `routes` and `opts`' node; `failed` is asked last)."""
    from dcptool.client.topology import newest_view

    best = newest_view(opts, [*sorted(set(routes.values())), opts.address], last=failed)
    if best is None:
        return {}
    return {vb: node for vb in range(len(best.vbmap))
            if (node := best.active_node(vb)) is not None}
