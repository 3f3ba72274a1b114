"""The destination side of a controlled vbucket move: a takeover stream from the active.

`take_over(node, vbid, address, auth)` (admin opcode VBUCKET_TAKEOVER, 0xeb, sent by
`dcptool cluster move`) makes this node's copy of a vbucket the active one without a
history branch (seeds 000 and 001, "controlled handover"):

1. the vbucket's replication stream on this node, if any, stops; the vbucket becomes a
   replica (a dead copy too: its own position is checked by the source like any
   replica's, and rolled back when its history differs);
2. a DCP connection to the current active asks for the vbucket with the TakeOver stream
   flag from this copy's position (newest failover entry, high seqno): a replica goes
   on from where it is;
3. the failover log of the answer replaces this copy's (one history for both);
   snapshots are applied complete, with seqnos, CAS, revision seqnos, flags, expiries
   and delete times unchanged (`replication.apply_snapshot`);
4. SET_VBUCKET_STATE(pending): the vbucket becomes pending here, then the answer goes
   back; the source makes its copy dead and sends what was written meanwhile;
5. SET_VBUCKET_STATE(active): the last snapshot is applied, the vbucket becomes active
   **without** a new failover entry (`VBucket.set_state(..., new_branch=False)`) at the
   source's last seqno, then the answer goes back; the source ends the stream with OK.

The stream runs in a thread (the blocking `DcpConsumer`); everything that touches the
vbucket runs on the node's event loop.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Protocol

from dcptool.protocol.constants import SEQNO_MAX, StreamEndReason, StreamFlag, VBucketState

from .hwtrepl import adopt
from .replication import (SYSTEM_EVENT, Replication, SnapshotBuffer, apply_snapshot, close_consumer,
                          position_after_rollback, position_at_high_seqno, record_seqno,
                          rollback, session_config)


log = logging.getLogger("dcptool.node.takeover")

_ACTIVE = int(VBucketState.ACTIVE)
_REPLICA = int(VBucketState.REPLICA)
_PENDING = int(VBucketState.PENDING)
#: records applied in snapshots: items and collections system events
_RECORDS = (0x57, 0x58, 0x59, SYSTEM_EVENT)


class TakeoverHost(Protocol):
    """What a takeover needs of its node (`server.Node`): the bucket, the replication that
    feeds the vbucket until then, and the address the node serves on."""

    bucket: Any
    replication: Replication
    host: str
    port: int


class TakeoverError(Exception):
    """A takeover that could not be done (the text goes back to the caller)."""


class _Takeover:
    """One takeover stream, run by a thread; `done` is set on the loop when it ends."""

    def __init__(self, node: TakeoverHost, vbid: int, address: tuple[str, int],
                 auth: dict[str, str], timeout: float, bucket: Any = None) -> None:
        self.node = node
        self.bucket = node.bucket if bucket is None else bucket
        self.vbid = vbid
        self.address = address
        self.auth = auth
        self.timeout = timeout
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future = self.loop.create_future()
        self.snap = SnapshotBuffer(self._deliver)
        self.received = 0
        self.items = 0
        self.rollbacks = 0
        self.became_active = False
        self.start_seqno = 0
        self.consumer = None

    # -- on the loop -------------------------------------------------------------------

    def _position(self):
        vb = self.bucket.vbuckets[self.vbid]
        self.start_seqno = vb.high_seqno
        return position_at_high_seqno(vb)

    def _take_failover_log(self, failover_log) -> None:
        vb = self.bucket.vbuckets[self.vbid]
        vb.failover_log = [(int(u), int(s)) for u, s in failover_log]
        if vb.on_meta_change is not None:
            vb.on_meta_change(vb)

    def _apply(self, records, end) -> int:
        vb = self.bucket.vbuckets[self.vbid]
        return apply_snapshot(self.bucket, vb, records, end)

    def _set_state(self, state: int) -> None:
        vb = self.bucket.vbuckets[self.vbid]
        vb.set_state(state, new_branch=False)

    def _finish(self, exc: BaseException | None) -> None:
        if self.done.done():
            return
        if exc is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(exc)

    # -- the thread ----------------------------------------------------------------------

    def on_loop(self, fn, *args):
        async def call():
            r = fn(*args)
            if asyncio.iscoroutine(r):
                r = await r
            return r
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(self.timeout)

    def run(self) -> None:
        exc: BaseException | None = None
        try:
            self._stream()
        except BaseException as e:  # handed to the waiting command
            if not self.became_active:
                exc = e
            else:
                # active here, the source dead: the move is done even if its STREAM_END
                # was lost with the connection
                log.warning("takeover of vbucket %d: %s after the vbucket became active",
                            self.vbid, e)
        finally:
            c, self.consumer = self.consumer, None
            close_consumer(c)
        self.loop.call_soon_threadsafe(self._finish, exc)

    def _deliver(self, records, end) -> None:
        if records or end:
            self.on_loop(self._apply, records, end)

    def _on_rollback(self, info):
        self.rollbacks += 1
        self.snap.clear()

        async def do():
            vb = self.bucket.vbuckets[self.vbid]
            return await rollback(self.bucket, vb, info.rollback_seqno)
        return position_after_rollback(info, self.on_loop(do))

    def _stream(self) -> None:
        from dcptool.client.consumer import DcpConsumer
        from dcptool.client.events import (
            EV_ADVANCED_SEQNO,
            EV_END_REASON,
            EV_END_RETRYING,
            EV_KIND,
            EV_OPEN_FAILOVER_LOG,
            EV_SNAP_END,
            EV_STATE,
            EV_STATE_OPAQUE,
            SEQNO_ADVANCED,
            SNAPSHOT,
            STREAM_END,
            STREAM_OPEN,
            VBUCKET_STATE,
        )
        pos = self.on_loop(self._position)
        me = f"{self.node.host}:{self.node.port}"
        cfg = session_config(name=f"takeover:{me}:{self.vbid}", include_xattrs=True,
                             delete_times=True, noop_interval=5.0, consistent=True,
                             max_rollbacks=4, ack_vbucket_state=False)
        host, port = self.address
        self.consumer = c = DcpConsumer.open(
            host, port, username=self.auth.get("username", ""),
            password=self.auth.get("password", ""), bucket=self.bucket.name, timeout=10.0,
            config=cfg, on_rollback=self._on_rollback)
        c.add_stream(self.vbid, pos, end_seqno=SEQNO_MAX, flags=int(StreamFlag.TAKEOVER))
        deadline = time.monotonic() + self.timeout
        snap = self.snap
        while True:
            if time.monotonic() > deadline:
                raise TakeoverError(f"the takeover of vbucket {self.vbid} did not finish in "
                                    f"{self.timeout:.0f}s")
            for ev in c.poll(0.5):
                kind = ev[EV_KIND]
                if kind in _RECORDS:
                    self.received = record_seqno(ev)
                    self.items += 1
                    snap.item(ev, self.received)
                elif kind == SNAPSHOT:
                    snap.marker(ev[EV_SNAP_END])
                elif kind == SEQNO_ADVANCED:
                    self.received = ev[EV_ADVANCED_SEQNO]
                    snap.advanced(ev[EV_ADVANCED_SEQNO])
                elif kind == STREAM_OPEN:
                    self.on_loop(self._take_failover_log, ev[EV_OPEN_FAILOVER_LOG])
                elif kind == VBUCKET_STATE:
                    # the producer sends it between complete snapshots
                    if snap.end is not None or snap.pending:
                        snap.complete()
                    state = int(ev[EV_STATE])
                    if state not in (_PENDING, _ACTIVE):
                        raise TakeoverError(f"the source sent SET_VBUCKET_STATE({state})")
                    self.on_loop(self._set_state, state)
                    self.became_active = state == _ACTIVE
                    c.session.ack_vbucket_state(ev[EV_STATE_OPAQUE])
                    c.flush()
                elif kind == STREAM_END:
                    if ev[EV_END_REASON] == StreamEndReason.OK and self.became_active:
                        return
                    if not ev[EV_END_RETRYING]:
                        raise TakeoverError(
                            f"the source ended the takeover stream of vbucket {self.vbid} "
                            f"(reason {ev[EV_END_REASON]})" + ("" if self.became_active
                                                   else " before the handshake"))


async def take_over(node: TakeoverHost, vbid: int, address: tuple[str, int], auth: dict[str, str],
                    *, timeout: float = 600.0, bucket: Any = None) -> dict[str, Any]:
    """Make this node's copy of `vbid` of `bucket` (the node's first when None) active by a
    takeover stream from `address`."""
    bucket = node.bucket if bucket is None else bucket
    vb = bucket.vbuckets.get(vbid)
    if vb is None:
        raise TakeoverError(f"no vbucket {vbid}")
    if vb.state == _ACTIVE:
        raise TakeoverError(f"vbucket {vbid} is already active on this node")
    repl = node.replication if bucket is node.bucket else node.replication_of(bucket)
    if repl is None:
        raise TakeoverError(f"bucket {bucket.name} is being dropped")
    started = time.monotonic()
    # this node's replication stream of the vbucket must not apply anything meanwhile
    lock = repl._lock
    if lock is not None:
        await lock.acquire()
    try:
        s = repl.streams.pop(vbid, None)
        if s is not None:
            await repl._stop([s])
        if vb.state != _REPLICA:
            vb.set_state(_REPLICA)
    finally:
        if lock is not None:
            lock.release()
    t = _Takeover(node, vbid, address, auth, timeout, bucket)
    before = vb.high_seqno
    thread = threading.Thread(target=t.run, name=f"dcptool-takeover-{vbid}", daemon=True)
    thread.start()
    try:
        await t.done
    except BaseException:
        vb = bucket.vbuckets[vbid]
        if vb.state == _PENDING:
            vb.set_state(_REPLICA)  # the source is still active (or dead: see the CLI)
        raise
    await adopt(node, vbid, address, auth, bucket=bucket)  # the old active's HWT rows (seed 002)
    vb = bucket.vbuckets[vbid]
    log.info("vbucket %d taken over from %s:%d at seqno %d (%d items, from %d)", vbid,
             address[0], address[1], vb.high_seqno, t.items, before)
    return {"vbucket": vbid, "high_seqno": vb.high_seqno, "start_seqno": t.start_seqno,
            "items": t.items, "rollbacks": t.rollbacks,
            "failover_log": [[u, s] for u, s in vb.failover_log],
            "seconds": round(time.monotonic() - started, 3)}


__all__ = ["take_over", "TakeoverError"]
