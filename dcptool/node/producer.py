"""The DCP producer of one connection: its streams, flow control, noop and fair scheduling.

Shared state, and why it exists:

* `streams`: (vbucket, stream id) -> ProducerStream, the live streams (one per vbucket,
  or per vbucket and stream id once `enable_stream_id` is on).
* `ready`: streams that have something to send right now, served round robin, each
  for at most `QUANTUM` bytes per turn, so one busy vbucket cannot starve the others.
* `outstanding`: bytes sent and not yet acknowledged with BUFFER_ACK. With
  `connection_buffer_size` set, nothing is sent that would take it above the buffer
  size (a single message larger than the whole buffer may go when nothing is outstanding).
  Every producer-to-consumer request counts at its full wire size except DCP_NOOP.
* noop: with `enable_noop`, a DCP_NOOP goes out every `set_noop_interval` seconds
  when the previous one was answered; a connection whose noop stays unanswered and
  that sends nothing for two intervals is closed.
* `force_compression`: `force_value_compression=true` on a connection that negotiated
  Snappy. Every non-empty value then goes out Snappy-compressed with the SNAPPY bit
  (unless compressing would make it larger); flow control counts the compressed size.
  The streams' fast path is off meanwhile, so the uncompressed path is unchanged.

The producer writes in batches: `pump` runs from the event loop (never inside a
request handler), fills one output list from the ready streams and writes it with one
`transport.write`. It stops when the transport asks to pause, when the flow-control
window is full, or after `PUMP_BYTES`, and reschedules itself.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from dcptool.protocol import wire as w
from dcptool.protocol.constants import DcpOpenFlag, Opcode, Status, StreamEndReason
from dcptool.protocol.snappy import SNAPPY, compress_if_smaller

from .decisions import TAKEOVER_DONE, TAKEOVER_SEND_DEAD, TAKEOVER_WAIT_ACTIVE
from .item import ITEM_EXPIRATION, ITEM_MUTATION, ITEM_SYSTEM, Item
from .stream import DEAD, ProducerStream, payload
from .sysevent import event_of
from dcptool.logsafe import shown

if TYPE_CHECKING:
    from .backfill import BackfillManager

log = logging.getLogger("dcptool.node.producer")

PUMP_BYTES = 256 * 1024
QUANTUM = 64 * 1024
DEFAULT_NOOP_INTERVAL = 120.0
MIN_NOOP_INTERVAL = 0.05
_U32_MAX = 0xFFFFFFFF


class ProducerLink(Protocol):
    """What a producer needs of the connection it writes to (`connection.Connection`)."""

    closing: bool
    write_paused: bool
    snappy: bool
    collections: bool

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class Producer:
    """The DCP producer of the connection `conn`, streaming `bucket` (the node's backfill
    slots `backfills` are shared by every producer)."""

    def __init__(self, conn: ProducerLink, name: str, flags: int, *, bucket: Any,
                 backfills: "BackfillManager") -> None:
        self.conn = conn
        self.name = name
        self.open_flags = flags
        self.bucket = bucket
        self.storage = bucket.storage
        self.backfills = backfills
        self.include_xattrs = bool(flags & DcpOpenFlag.INCLUDE_XATTRS)
        self.no_value = bool(flags & DcpOpenFlag.NO_VALUE)
        self.keep_datatype = bool(flags & DcpOpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE)
        self.delete_times = bool(flags & DcpOpenFlag.INCLUDE_DELETE_TIMES)
        self.streams: dict[tuple[int, int | None], ProducerStream] = {}
        self.ready: deque[ProducerStream] = deque()
        self.scheduled = False
        self.closed = False
        self.loop = asyncio.get_event_loop()
        # flow control
        self.buffer_size = 0
        self.outstanding = 0
        self.max_outstanding = 0
        # noop
        self.noop_enabled = False
        self.noop_interval = DEFAULT_NOOP_INTERVAL
        self.noop_pending: int | None = None
        self.noop_sent_at = 0.0
        self.noop_counter = 0
        self._noop_timer: asyncio.TimerHandle | None = None
        self.last_recv = time.monotonic()
        # controls
        self.expiry_opcode = False
        self.stream_end_on_close = False
        self.priority = "medium"
        self.cursor_dropping = False
        self.stream_ids = False
        self.hifi_mfu = False
        self.v7_status = False
        self.backfill_order = "round-robin"
        self.force_compression = False
        # counters
        self.bytes_sent = 0
        self.frames_batches = 0
        self.noops_sent = 0
        self.cursor_drops = 0
        self.backfills_started = 0
        self.streams_opened = 0
        self._update_mode()

    @property
    def collections(self) -> bool:
        """Did the connection negotiate collections (its streams see doc keys)?"""
        return self.conn.collections

    def _update_mode(self) -> None:
        # the streams' fast path handles plain mutations; anything else goes through encode()
        self.simple = not (self.no_value or self.keep_datatype or self.force_compression)
        self.strip_mask = 0 if self.include_xattrs else 0x04

    # -- streams -------------------------------------------------------------------------

    def add_stream(self, s: ProducerStream) -> None:
        self.streams[(s.vbid, s.sid)] = s
        s.vb.streams.add(s)
        self.streams_opened += 1
        self.ready_stream(s)

    def has_stream(self, vbid: int, sid: int | None) -> bool:
        s = self.streams.get((vbid, sid))
        return s is not None and s.state != DEAD

    def stream_finished(self, s: ProducerStream) -> None:
        key = (s.vbid, s.sid)
        if self.streams.get(key) is s:
            del self.streams[key]
        s.vb.streams.discard(s)

    def close_stream(self, vbid: int, sid: int | None) -> bool:
        s = self.streams.get((vbid, sid))
        if s is None or s.state == DEAD:
            return False
        if self.stream_end_on_close:
            s.end_stream(StreamEndReason.CLOSED)
        else:
            s.close()
            self.stream_finished(s)
        return True

    def ready_stream(self, s: ProducerStream) -> None:
        if not s.queued and s.state != DEAD and not self.closed:
            s.queued = True
            self.ready.append(s)
            self.schedule()

    def schedule(self) -> None:
        if not self.scheduled and not self.closed:
            self.scheduled = True
            self.loop.call_soon(self.pump)

    # -- sending ----------------------------------------------------------------------------

    def pump(self) -> None:
        self.scheduled = False
        conn = self.conn
        if self.closed or conn.closing or conn.write_paused:
            return
        out: list[bytes] = []
        total = 0
        ready = self.ready
        bufsize = self.buffer_size
        idle_turns = 0
        while ready and total < PUMP_BYTES:
            if bufsize:
                window = bufsize - self.outstanding - total
                if window <= 0:
                    break
            else:
                window = PUMP_BYTES
            s = ready.popleft()
            s.queued = False
            # the quantum is for fairness only, and flow control lets a message go while the
            # window is open (outstanding < buffer size), as kv_engine's BufferLog does, even
            # one larger than what is left of it: the first message of a turn may exceed the
            # limit. (Holding a message until it fits would wait forever for a consumer that
            # acknowledges only past a threshold it has not reached: a 100 KiB document
            # behind a marker stalled a stream.)
            n = s.fill(out, min(window, QUANTUM), loose=True)
            total += n
            if not (s.waiting or s.waiting_backfill or s.state == DEAD):
                s.queued = True
                ready.append(s)
            idle_turns = 0 if n else idle_turns + 1
            if idle_turns > len(ready):
                break  # nobody could add anything within the window
        if not out and ready and bufsize and self.outstanding == 0:
            # a message larger than the whole buffer: let exactly one through
            s = ready[0]
            total += s.fill(out, 0, single=True)
            if s.waiting or s.waiting_backfill or s.state == DEAD:
                ready.popleft()
                s.queued = False
        if out:
            if bufsize:
                self.outstanding += total
                if self.outstanding > self.max_outstanding:
                    self.max_outstanding = self.outstanding
            self.bytes_sent += total
            self.frames_batches += 1
            conn.write(b"".join(out))
        if ready and not conn.write_paused:
            if not bufsize or self.outstanding < bufsize:
                self.schedule()

    def encode(self, vb: int, opq: int, sid: int | None, key: bytes, value: bytes, dt: int,
               cas: int, seqno: int, rev: int, flags: int, expiry: int, op: int,
               delete_time: int) -> list[bytes]:
        """Any item the streams' fast path does not handle (deletions, xattrs, NoValue, sids,
        system events)."""
        if op == ITEM_SYSTEM:
            ev = event_of(Item(key, value, seqno, rev, cas, flags, expiry, dt, op))
            k, v, version = ev.encode()
            return w.system_event(vb, opq, seqno, ev.event, version, k, v, sid)
        val, dt2 = payload(value, dt, op, include_xattrs=self.include_xattrs,
                           no_value=self.no_value or self.keep_datatype,
                           keep_datatype=self.keep_datatype)
        if self.force_compression and val and self.conn.snappy:
            # kv_engine's ActiveStream::makeResponseFromItem compresses what is left after
            # stripping (body and/or xattrs) when it is not empty; a value whose compressed
            # form would be larger goes as it is (Item::compressValue)
            packed = compress_if_smaller(val)
            if packed is not None:
                val = packed
                dt2 |= SNAPPY
        if op == ITEM_MUTATION:
            return w.mutation(vb, opq, key, val, dt2, cas, seqno, rev, flags, expiry, sid)
        if op == ITEM_EXPIRATION and self.expiry_opcode and self.delete_times:
            return w.expiration(vb, opq, key, val, dt2, cas, seqno, rev, delete_time, sid)
        return w.deletion(vb, opq, key, val, dt2, cas, seqno, rev,
                          delete_time if self.delete_times else None, sid)

    def ack(self, nbytes: int) -> None:
        self.outstanding = max(0, self.outstanding - nbytes)
        if self.ready:
            self.schedule()

    # -- noop ---------------------------------------------------------------------------------

    def _arm_noop(self) -> None:
        if self._noop_timer is not None:
            self._noop_timer.cancel()
            self._noop_timer = None
        if self.noop_enabled and not self.closed:
            self._noop_timer = self.loop.call_later(self.noop_interval / 2, self._noop_tick)

    def _noop_tick(self) -> None:
        self._noop_timer = None
        if self.closed or not self.noop_enabled:
            return
        now = time.monotonic()
        iv = self.noop_interval
        if self.noop_pending is not None:
            if now - self.noop_sent_at >= 2 * iv and now - self.last_recv >= 2 * iv:
                log.info("DCP connection %s did not answer NOOP for %.1fs; closing",
                         shown(self.name), now - self.noop_sent_at)
                self.conn.close()
                return
        elif now - self.noop_sent_at >= iv:
            self.noop_counter = (self.noop_counter + 1) & _U32_MAX
            self.noop_pending = self.noop_counter
            self.noop_sent_at = now
            self.noops_sent += 1
            self.conn.write(w.noop(self.noop_counter))  # never counted in flow control
        self._arm_noop()

    def handle_response(self, frame) -> None:
        """A response from the client: DCP_NOOP replies; anything else is tolerated."""
        if frame.opcode == Opcode.DCP_NOOP:
            if self.noop_pending is not None and frame.opaque == self.noop_pending:
                self.noop_pending = None
        elif frame.opcode == Opcode.DCP_SET_VBUCKET_STATE:
            # a takeover stream's handshake goes on (a response carries no vbucket: the
            # stream's opaque names it)
            for s in list(self.streams.values()):
                if s.opaque == frame.opaque and s.takeover is not None:
                    s.vbucket_state_acked(frame.status)

    # -- controls -------------------------------------------------------------------------------

    def control(self, key: str, value: str) -> int:
        """Apply one DCP_CONTROL; returns the status to answer (EINVAL for unknown keys)."""
        v = value.strip()
        if key == "connection_buffer_size":
            if not v.isdigit() or int(v) > _U32_MAX:
                return Status.EINVAL
            self.buffer_size = int(v)
            self.schedule()
            return Status.SUCCESS
        if key == "enable_noop":
            self.noop_enabled = v == "true"
            if self.noop_enabled:
                self.noop_sent_at = time.monotonic()
            self._arm_noop()
            return Status.SUCCESS
        if key == "set_noop_interval":
            try:
                iv = float(v)
            except ValueError:
                return Status.EINVAL
            if not MIN_NOOP_INTERVAL <= iv <= 24 * 3600:
                return Status.EINVAL
            self.noop_interval = iv
            self._arm_noop()
            return Status.SUCCESS
        if key == "set_priority":
            if v not in ("high", "medium", "low"):
                return Status.EINVAL
            self.priority = v
            return Status.SUCCESS
        if key == "enable_expiry_opcode":
            if v not in ("true", "false"):
                return Status.EINVAL
            # takes effect only with IncludeDeleteTimes; still a success otherwise
            self.expiry_opcode = v == "true"
            return Status.SUCCESS
        if key == "send_stream_end_on_client_close_stream":
            if v != "true":
                return Status.EINVAL
            self.stream_end_on_close = True
            return Status.SUCCESS
        if key in ("supports_cursor_dropping", "supports_cursor_dropping_vulcan"):
            if v not in ("true", "false"):
                return Status.EINVAL
            self.cursor_dropping = v == "true"
            return Status.SUCCESS
        if key == "supports_hifi_MFU":
            if v not in ("true", "false"):
                return Status.EINVAL
            self.hifi_mfu = v == "true"
            return Status.SUCCESS
        if key == "enable_stream_id":
            if v != "true":
                return Status.EINVAL
            if any(s.state != DEAD for s in self.streams.values()):
                return Status.EINVAL
            self.stream_ids = True
            return Status.SUCCESS
        if key == "v7_dcp_status_codes":
            if v != "true":
                return Status.EINVAL
            self.v7_status = True
            return Status.SUCCESS
        if key == "consumer_name":
            return Status.SUCCESS if v else Status.EINVAL
        if key == "backfill_order":
            if v not in ("round-robin", "sequential"):
                return Status.EINVAL
            self.backfill_order = v
            return Status.SUCCESS
        if key == "include_deleted_user_xattrs":
            ok = v == "true" and self.open_flags & DcpOpenFlag.INCLUDE_DELETED_USER_XATTRS
            return Status.SUCCESS if ok else Status.EINVAL
        if key in ("enable_sync_writes", "change_streams", "stream_buffer_size", "cache_transfer",
                   "max_marker_version"):
            return Status.NOT_SUPPORTED
        if key == "force_value_compression":
            # kv_engine (DcpProducer::control): EINVAL unless the connection negotiated
            # Snappy; then "true" turns it on and any other value off
            if not self.conn.snappy:
                return Status.EINVAL
            self.force_compression = v == "true"
            self._update_mode()
            return Status.SUCCESS
        # enable_out_of_order_snapshots and flatbuffers_system_events need collections,
        # which this node does not negotiate. Unknown keys too.
        return Status.EINVAL

    # -- teardown and stats ---------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._noop_timer is not None:
            self._noop_timer.cancel()
            self._noop_timer = None
        for s in list(self.streams.values()):
            s.close()
            s.vb.streams.discard(s)
        self.streams.clear()
        self.ready.clear()
        if self.bucket.producers.get(self.name) is self:
            del self.bucket.producers[self.name]

    def stats(self) -> dict:
        live = [s for s in self.streams.values() if s.state != DEAD]
        out = {
            "type": "producer",
            "flags": hex(self.open_flags),
            "num_streams": len(live),
            "ready_streams": len(self.ready),
            "max_buffer_bytes": self.buffer_size,
            "unacked_bytes": self.outstanding,
            "max_unacked_bytes_seen": self.max_outstanding,
            "total_bytes_sent": self.bytes_sent,
            "noop_enabled": self.noop_enabled,
            "noop_interval": self.noop_interval,
            "noops_sent": self.noops_sent,
            "priority": self.priority,
            "cursors_dropped": self.cursor_drops,
            "backfills_started": self.backfills_started,
            "streams_opened": self.streams_opened,
            "items_sent": sum(s.items_sent for s in self.streams.values()),
        }
        for s in live:
            for k, v in s.stats().items():
                out[f"stream_{s.vbid}{'' if s.sid is None else f'_{s.sid}'}_{k}"] = v
        return out


def end_streams_on_state_change(vb, old_state: int) -> None:
    """Vbucket listener: a state change ends every stream of the vbucket (StateChanged),
    except a takeover stream that made the vbucket dead itself and carries the rest."""
    for s in list(vb.streams):
        if s.takeover in (TAKEOVER_SEND_DEAD, TAKEOVER_WAIT_ACTIVE, TAKEOVER_DONE):
            continue
        s.end_stream(StreamEndReason.STATE_CHANGED)


__all__ = ["Producer", "end_streams_on_state_change"]
