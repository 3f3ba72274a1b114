"""Replica vbuckets: fed over DCP from their source node, the way seeds 001 and 004 describe.

`Replication` (one per bucket, `node.replications[NAME]`; `node.replication` is the first
bucket's) holds the bucket's cluster map (see `dcptool.node.clustermap`; kept in the
bucket's data directory) and one `ReplicaStream` per replica vbucket of the bucket. A ReplicaStream is
a thread running a `dcptool.client.DcpConsumer` against the source node (this module
is the node's replication consumer, the one part of `node/` that uses the client). It
asks for the vbucket from the replica's own position (newest failover entry, high seqno):

* the stream request's answer carries the source's failover log, which the replica
  takes and persists at once, so active and replica share one history (seed 004);
* a ROLLBACK answer rolls the replica back before it asks again (`rollback`): to the
  node's rollback seqno when every change above it created its key (nothing older was
  overwritten, so dropping those changes restores the state at that seqno exactly),
  otherwise to 0 (everything is streamed again);
* records are kept until their snapshot is complete and then applied together, with
  their seqnos, CAS, revision seqnos, flags, expiries and delete times unchanged
  (`apply_snapshot`). The replica therefore only ever holds complete snapshots of its
  active: in memory each received snapshot becomes one checkpoint, on disk it reaches
  the flusher in one piece, so a DCP client streaming from the replica gets no partial
  snapshot (seed 003, "Streaming from a replica vbucket");
* a hold (`REPLICATION_HOLD`, 0xe9) stops the stream before the first change above a
  seqno, so tests can keep a replica at an exact point (seed 004's node C at 900);
* collections: the stream negotiates collections (`SessionConfig(collections=True)`, so
  keys arrive as doc keys, stored as they are) and system events are applied like items,
  at the same seqno as on the active (`apply_snapshot`); the replica bucket's manifest
  follows them (`Bucket.follow_event`).

Everything that touches a vbucket runs on the node's event loop; the thread waits for it.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from dcptool.protocol.constants import SEQNO_MAX, StreamEndReason, VBucketState
from dcptool.protocol.snappy import SNAPPY, decompress

from . import hwtrepl
from .clustermap import ClusterMap, load_map, save_map
from .item import ITEM_DELETION, ITEM_EXPIRATION, ITEM_MUTATION, Item
from .storage import SEQNO_MASK, row_id
from .sysevent import system_item

if TYPE_CHECKING:
    from .vbucket import VBucket

log = logging.getLogger("dcptool.node.replication")

_REPLICA = int(VBucketState.REPLICA)
_OPS = {0x57: ITEM_MUTATION, 0x58: ITEM_DELETION, 0x59: ITEM_EXPIRATION}
#: the client's event kind of a DCP_SYSTEM_EVENT: (SYSTEM_EVENT, vbucket, SystemEvent)
SYSTEM_EVENT = 0x5F


def session_config(**kwargs):
    """The replication consumer's SessionConfig, collection-aware when the client is."""
    from dcptool.client.session import SessionConfig

    try:
        return SessionConfig(collections=True, **kwargs)
    except TypeError:  # a client without collections: keys come as the producer sends them
        return SessionConfig(**kwargs)


def record_seqno(ev) -> int:
    """The seqno of a record event (an item or a system event)."""
    if ev[0] == SYSTEM_EVENT:
        return ev[2].seqno
    return ev[2]
#: seconds between reconnection attempts to a source that cannot be reached
RETRY_DELAY = 0.2
#: the largest value a replica inflates (the front end's document limit plus xattrs)
MAX_INFLATED = 21 * 1024 * 1024


# ---------------------------------------------------------------------------
# applying on the loop


def apply_snapshot(bucket, vb: "VBucket", records: list, end: int) -> int:
    """Apply one complete snapshot received from the source. Returns the new high seqno.

    The records keep the source's metadata; the snapshot becomes one checkpoint and goes
    to the flusher in one `deque.extend` (the flusher cannot split it). A value that came
    Snappy-compressed is stored decompressed, like every value the node holds; one that
    does not decompress fails the whole snapshot before anything of it is applied.
    """
    if any(rec[0] != SYSTEM_EVENT and rec[7] & SNAPPY for rec in records):
        records = [_decompressed(rec) for rec in records]
    ck = vb.checkpoints
    ck.close_open()
    limits = ck.max_items, ck.max_bytes
    ck.max_items = ck.max_bytes = 1 << 62
    entries = []
    install = vb.install
    heap = bucket.expiry_heap
    high = vb.high_seqno
    try:
        for rec in records:
            if rec[0] == SYSTEM_EVENT:
                ev = rec[2]
                if ev.seqno <= high:
                    continue
                old = vb.find(system_item(ev).key)
                item = system_item(ev, rev=old.rev + 1 if old is not None else 1,
                                   cas=vb.next_cas())
                item.seqno = ev.seqno
                install(item)
                ck.queue(item)
                entries.append((vb.id, item))
                high = ev.seqno
                bucket.follow_event(ev)
                continue
            kind, _vb, seq, rev, cas, flags, expiry, dt, key, value = rec
            if seq <= high:
                continue  # already held (a re-sent snapshot after a reconnect)
            op = _OPS[kind]
            if op == ITEM_MUTATION:
                item = Item(key, bytes(value), seq, rev, cas, flags, expiry, dt)
            else:
                item = Item(key, bytes(value), seq, rev, cas, 0, 0, dt, op,
                            expiry or int(time.time()))
            install(item)
            ck.queue(item)
            entries.append((vb.id, item))
            if cas > vb.max_cas:
                vb.max_cas = cas
            if expiry and op == ITEM_MUTATION:
                import heapq
                heapq.heappush(heap, (expiry, vb.id, key, seq))
            high = seq
    finally:
        ck.max_items, ck.max_bytes = limits
    if end > high:
        high = end
    vb.high_seqno = high
    ck.close_open()
    if entries:
        bucket.storage.dirty.extend(entries)
        bucket.storage.kick()
    if vb.waiters:
        waiters, vb.waiters = vb.waiters, []
        for w in waiters:
            w()
    return high


def _decompressed(rec):
    """A received record with its value decompressed and the SNAPPY bit cleared."""
    if rec[0] == SYSTEM_EVENT:
        return rec
    kind, vbid, seq, rev, cas, flags, expiry, dt, key, value = rec
    if not dt & SNAPPY:
        return rec
    value = decompress(value, MAX_INFLATED)
    return (kind, vbid, seq, rev, cas, flags, expiry, dt & ~SNAPPY, key, value)


def position_at_high_seqno(vb: "VBucket"):
    """The client position a stream of `vb` resumes from: its high seqno, on the newest
    failover entry at or below it (a replica catching up, a takeover starting)."""
    from dcptool.client.position import Position

    log_ = tuple((int(u), int(s)) for u, s in vb.failover_log)
    high = vb.high_seqno
    uuid = 0
    for u, s in log_:
        if s <= high:
            uuid = u
            break
    return Position(uuid, high, high, high, log_, (high,) if high else ())


def position_after_rollback(info, target: int):
    """Where a stream resumes once the rollback the source asked for (`info`, a client
    `RollbackInfo`) took the vbucket to `target`: the old position moved there, or the start."""
    from dcptool.client.position import Position

    return info.before.moved_to(target) if target else Position()


def close_consumer(consumer) -> None:
    """Close a replication consumer, if any; one whose connection broke is closed enough."""
    if consumer is not None:
        try:
            consumer.close()
        except OSError:
            pass


def rollback_target(vb: "VBucket", seqno: int) -> int:
    """Where a replica asked to roll back to at most `seqno` can go: `seqno` itself when
    every change above it created its key (dropping them restores the state at `seqno`
    exactly), else 0."""
    if seqno <= 0:
        return 0
    if vb.full:
        # everything is on disk by now (the rollback waited for the flusher)
        rows = vb.cache.query("SELECT 1 FROM items WHERE id > ? AND id <= ? AND rev != 1 LIMIT 1",
                              (row_id(vb.id, seqno), row_id(vb.id, SEQNO_MASK)))
        return 0 if rows else seqno
    for it in vb.items.values():
        if it.seqno > seqno and it.rev != 1:
            return 0
    return seqno


def _delete_above(db, vbid: int, seqno: int, failover: str) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("DELETE FROM items WHERE id > ? AND id <= ?",
                   (row_id(vbid, seqno), row_id(vbid, SEQNO_MASK)))
        db.execute("UPDATE vbucket_meta SET persisted_seqno = ?, failover = ? WHERE vb = ?",
                   (seqno, failover, vbid))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


async def rollback(bucket, vb: "VBucket", seqno: int) -> int:
    """Roll replica `vb` back to at most `seqno` (memory and disk). Returns where it went."""
    import json

    loop = asyncio.get_running_loop()
    storage = bucket.storage
    # nothing of this vbucket may still be on its way to the disk
    await loop.run_in_executor(None, storage.wait_flushed)
    target = rollback_target(vb, seqno)
    if vb.full:
        # the keys whose newest version is above the target go (resident or not)
        (gone, gone_live), = vb.cache.query(
            "SELECT count(*), coalesce(sum(op = 0), 0) FROM items WHERE id > ? AND id <= ?",
            (row_id(vb.id, target), row_id(vb.id, SEQNO_MASK)))
        vb.nkeys -= gone
        vb.live_items -= gone_live
        for key in [k for k, it in vb.items.items() if it.seqno > target]:
            vb.cache.bytes -= vb.items.pop(key).size
    else:
        for key in [k for k, it in vb.items.items() if it.seqno > target]:
            it = vb.items.pop(key)
            if it.op == ITEM_MUTATION:
                vb.live_items -= 1
    vb.failover_log = [(u, s) for u, s in vb.failover_log if s <= target] or vb.failover_log[-1:]
    vb.high_seqno = target
    vb.persisted_seqno = target
    if vb.purge_seqno > target:
        vb.purge_seqno = target
    vb.checkpoints.reset(target + 1)
    vb.checkpoints.persisted_seqno = target
    # clients streaming from this replica went past the new end: they ask again
    for s in list(vb.streams):
        s.end_stream(StreamEndReason.STATE_CHANGED)
    failover = json.dumps(vb.failover_log)

    def on_disk() -> None:
        db = storage._connect()
        try:
            _delete_above(db, vb.id, target, failover)
        finally:
            db.close()
    await loop.run_in_executor(None, on_disk)
    # the per-collection high seqnos may name changes that are gone: rebuilt from what is
    # left (value eviction: the hash table now; full eviction: the database, on first use)
    if vb.full:
        vb.default_high = vb.other_high = 0
        vb.coll_high = {}
        vb.coll_seqnos_built = False
    else:
        vb.rebuild_collection_seqnos()
    log.info("vbucket %d rolled back to %d (asked %d)", vb.id, target, seqno)
    return target


# ---------------------------------------------------------------------------
# one replica vbucket's stream


class _Stopped(Exception):
    pass


class SnapshotBuffer:
    """The records of the snapshot a replica (or a takeover destination) is receiving,
    handed to `deliver(records, end)` only once the snapshot is complete: when an item or a
    SEQNO_ADVANCED reaches its end, or the next marker arrives. Used by the consumer
    thread alone."""

    __slots__ = ("deliver", "pending", "end")

    def __init__(self, deliver) -> None:
        self.deliver = deliver
        self.pending: list = []
        self.end: int | None = None

    def item(self, ev, seqno: int) -> None:
        """Buffer a record event (`seqno` is its seqno)."""
        self.pending.append(ev)
        if self.end is not None and seqno >= self.end:
            self.complete()

    def marker(self, end: int) -> None:
        if self.end is not None:
            self.complete()
        self.end = end

    def advanced(self, seqno: int) -> None:
        if self.end is not None and seqno >= self.end:
            self.complete()

    def complete(self) -> None:
        records, self.pending = self.pending, []
        end = self.end or 0
        self.end = None
        self.deliver(records, end)

    def clear(self) -> None:
        self.pending = []
        self.end = None


class ReplicaStream(threading.Thread):
    def __init__(self, repl: "Replication", vbid: int, source: int, address: tuple[str, int],
                 auth: dict[str, str], name: str) -> None:
        super().__init__(name=f"dcptool-replica-{vbid}", daemon=True)
        self.repl = repl
        self.vbid = vbid
        self.source = source
        self.address = address
        self.auth = auth
        self.conn_name = name
        self.stopping = False
        self.consumer = None
        self.connected = False
        self.received = 0          # last seqno received from the source
        self.snapshot_end = 0      # end of the snapshot being received
        self.rollbacks = 0
        self.last_error: str | None = None
        self._snap = SnapshotBuffer(self._deliver)

    # -- control (any thread) -------------------------------------------------------

    def stop(self) -> None:
        self.stopping = True
        c = self.consumer
        if c is not None:
            try:
                c.conn.sock.shutdown(2)
            except OSError:
                pass
        with self.repl.cond:
            self.repl.cond.notify_all()

    def status(self) -> dict[str, Any]:
        return {"source": self.source, "address": f"{self.address[0]}:{self.address[1]}",
                "connected": self.connected, "received": self.received,
                "snapshot_end": self.snapshot_end, "buffered": len(self._snap.pending),
                "rollbacks": self.rollbacks, "error": self.last_error}

    # -- the thread ------------------------------------------------------------------

    def _on_loop(self, fn, *args):
        """Run `fn(*args)` (a coroutine function or a plain one) on the node's loop."""
        if self.stopping:
            raise _Stopped()

        async def call():
            if self.stopping:
                raise _Stopped()
            r = fn(*args)
            if asyncio.iscoroutine(r):
                r = await r
            return r
        fut = asyncio.run_coroutine_threadsafe(call(), self.repl.loop)
        while True:
            try:
                return fut.result(0.5)
            except TimeoutError:
                if self.stopping and not self.repl.loop.is_running():
                    raise _Stopped() from None

    def run(self) -> None:
        while not self.stopping:
            try:
                self._run_once()
            except _Stopped:
                break
            except Exception as exc:  # connection refused or broken, source restarting...
                if self.stopping:
                    break
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.debug("replica %d from %s: %s", self.vbid, self.address, self.last_error)
            finally:
                self.connected = False
                c, self.consumer = self.consumer, None
                close_consumer(c)
            with self.repl.cond:
                if not self.stopping:
                    self.repl.cond.wait(RETRY_DELAY)

    def _position(self):
        vb = self.repl.bucket.vbuckets[self.vbid]
        if vb.state != _REPLICA:
            raise _Stopped()
        return position_at_high_seqno(vb)

    def _run_once(self) -> None:
        from dcptool.client.consumer import DcpConsumer
        from dcptool.client.events import (
            EV_ADVANCED_SEQNO,
            EV_END_REASON,
            EV_END_RETRYING,
            EV_KIND,
            EV_OPEN_FAILOVER_LOG,
            EV_SNAP_END,
            ROLLBACK,
            SEQNO_ADVANCED,
            SNAPSHOT,
            STREAM_END,
            STREAM_OPEN,
        )
        pos = self._on_loop(self._position)
        cfg = session_config(name=self.conn_name, include_xattrs=True, delete_times=True,
                             noop_interval=5.0, consistent=True, max_rollbacks=4)
        host, port = self.address
        self.consumer = DcpConsumer.open(
            host, port, username=self.auth.get("username", ""),
            password=self.auth.get("password", ""), bucket=self.repl.bucket.name, timeout=5.0,
            config=cfg, on_rollback=self._on_rollback)
        if self.stopping:
            raise _Stopped()
        self._snap.clear()
        self.consumer.add_stream(self.vbid, pos, end_seqno=SEQNO_MAX)
        snap = self._snap
        while not self.stopping:
            events = self.consumer.poll(0.5)
            for ev in events:
                kind = ev[EV_KIND]
                if kind in _OPS or kind == SYSTEM_EVENT:
                    seqno = record_seqno(ev)
                    self._wait_hold(seqno)
                    self.received = seqno
                    snap.item(ev, seqno)
                elif kind == SNAPSHOT:
                    snap.marker(ev[EV_SNAP_END])
                    self.snapshot_end = ev[EV_SNAP_END]
                elif kind == SEQNO_ADVANCED:
                    self.received = ev[EV_ADVANCED_SEQNO]
                    snap.advanced(ev[EV_ADVANCED_SEQNO])
                elif kind == STREAM_OPEN:
                    self.connected = True
                    self.last_error = None
                    self._on_loop(self._take_failover_log, ev[EV_OPEN_FAILOVER_LOG])
                elif kind == ROLLBACK:
                    pass  # done in _on_rollback, before the session asked again
                elif kind == STREAM_END:
                    if snap.end is not None and ev[EV_END_REASON] == StreamEndReason.OK:
                        snap.complete()
                    snap.clear()
                    if not ev[EV_END_RETRYING]:
                        return  # the source ended it (e.g. its vbucket changed state)

    def _wait_hold(self, seqno: int) -> None:
        repl = self.repl
        with repl.cond:
            while not self.stopping:
                hold = repl.holds.get(self.vbid)
                if hold is None or seqno <= hold:
                    return
                repl.cond.wait(0.5)
        raise _Stopped()

    def _deliver(self, records, end) -> None:
        self._on_loop(self._apply, records, end)

    def _apply(self, records, end):
        vb = self.repl.bucket.vbuckets[self.vbid]
        if vb.state != _REPLICA or self.stopping:
            raise _Stopped()
        high = apply_snapshot(self.repl.bucket, vb, records, end)
        hwtrepl.kick(self.repl)  # a pending HWT row may be installable soon
        return high

    def _take_failover_log(self, failover_log) -> None:
        vb = self.repl.bucket.vbuckets[self.vbid]
        if vb.state != _REPLICA:
            raise _Stopped()
        new = [(int(u), int(s)) for u, s in failover_log]
        changed = new != vb.failover_log
        vb.failover_log = new
        if vb.on_meta_change is not None:
            vb.on_meta_change(vb)
        if changed:
            # streams served from this replica (the next hop of a chain, clients) were
            # given the old history: they ask again and take the new one
            for s in list(vb.streams):
                s.end_stream(StreamEndReason.STATE_CHANGED)

    def _on_rollback(self, info):
        self.rollbacks += 1
        self._snap.clear()

        async def do():
            vb = self.repl.bucket.vbuckets[self.vbid]
            if vb.state != _REPLICA:
                raise _Stopped()
            return await rollback(self.repl.bucket, vb, info.rollback_seqno)
        return position_after_rollback(info, self._on_loop(do))


# ---------------------------------------------------------------------------
# the node's replication


class ReplicationHost(Protocol):
    """What replication needs of its node (`server.Node`): its first bucket (the one
    replicated into when no bucket is given), and the cluster config revision it raises
    when a map changes."""

    bucket: Any
    config_rev: int

    def config_changed(self) -> None: ...


class Replication:
    """The cluster map of one bucket of this node and the streams that feed its replica
    vbuckets."""

    def __init__(self, node: ReplicationHost, bucket: Any = None) -> None:
        self.node = node
        self.bucket = node.bucket if bucket is None else bucket
        self.map: ClusterMap | None = None
        self.streams: dict[int, ReplicaStream] = {}
        self.holds: dict[int, int] = {}
        self.cond = threading.Condition()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()
        cmap = load_map(self.bucket.data_dir, self.bucket.num_vbuckets)
        if cmap is not None:
            await self.apply(cmap, save=False)

    async def apply(self, cmap: ClusterMap, *, save: bool = True) -> dict[str, int]:
        """Make this node's vbuckets what `cmap` says; returns counts of changes."""
        assert self._lock is not None
        async with self._lock:
            if save:
                save_map(self.bucket.data_dir, cmap)
            self.map = cmap
            vbs = self.bucket.vbuckets
            stop = []
            for vb in range(len(cmap.vbmap)):
                cur = self.streams.get(vb)
                if cur is None:
                    continue
                src = cmap.source(vb) if cmap.role(vb) == _REPLICA else None
                if src is None or cmap.address(src) != cur.address:
                    stop.append(self.streams.pop(vb))
            await self._stop(stop)
            changed = started = 0
            for vb in range(len(cmap.vbmap)):
                role = int(cmap.role(vb))
                vbo = vbs[vb]
                if vbo.state != role:
                    vbo.set_state(role)
                    changed += 1
                if role == _REPLICA and vb not in self.streams:
                    src = cmap.source(vb)
                    if src is not None:
                        me = cmap.nodes[cmap.this]
                        if self.bucket is not self.node.bucket:
                            me = f"{me}:{self.bucket.name}"
                        s = ReplicaStream(self, vb, src, cmap.address(src), cmap.auth,
                                          f"replication:{me}:{vb}")
                        self.streams[vb] = s
                        s.start()
                        started += 1
            self.node.config_rev = max(self.node.config_rev + 1, cmap.rev)
            self.node.config_changed()
            hwtrepl.on_map(self)  # HWT rows and purge caps follow the sources (seed 002)
            return {"state_changes": changed, "streams_started": started,
                    "streams_stopped": len(stop)}

    async def _stop(self, streams: list[ReplicaStream]) -> None:
        for s in streams:
            s.stop()
        loop = asyncio.get_running_loop()
        for s in streams:
            await loop.run_in_executor(None, s.join, 10.0)

    async def stop_all(self) -> None:
        streams = list(self.streams.values())
        self.streams.clear()
        await self._stop(streams)
        await hwtrepl.stop(self)

    def hold(self, vbid: int, seqno: int | None) -> None:
        with self.cond:
            if seqno is None:
                self.holds.pop(vbid, None)
            else:
                self.holds[vbid] = seqno
            self.cond.notify_all()

    def status(self) -> dict[str, Any]:
        cmap = self.map
        out: dict[str, Any] = {"bucket": self.bucket.name,
                               "rev": cmap.rev if cmap else None,
                               "this": cmap.this if cmap else None,
                               "nodes": cmap.nodes if cmap else [],
                               "topology": cmap.topology if cmap else None,
                               "failed": cmap.failed if cmap else [], "vbuckets": {}}
        for vbid, vb in sorted(self.bucket.vbuckets.items()):
            d: dict[str, Any] = {"state": int(vb.state), "high_seqno": vb.high_seqno,
                                 "uuid": vb.uuid}
            s = self.streams.get(vbid)
            if s is not None:
                d["replication"] = s.status()
            if vbid in self.holds:
                d["hold"] = self.holds[vbid]
            out["vbuckets"][str(vbid)] = d
        return out
