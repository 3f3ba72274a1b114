"""One DCP stream: the changes of one vbucket, in seqno order, as snapshots.

A stream owns a cursor in its vbucket's checkpoint manager from the moment it is
accepted. If memory still holds everything after the client's start seqno the stream
reads memory snapshots from that cursor; otherwise it first sends one disk snapshot
(a backfill read in a single SQLite read transaction: marker with the Disk flag from
its start to the persisted seqno, then the newest version of each key in seqno order),
then goes on from memory, skipping what the disk snapshot already covered. When the
memory budget drops its cursor, the stream finishes the snapshot it is sending, takes a
new cursor and backfills the gap from disk (seed 003, "slow clients").

States: BACKFILL_PENDING (waiting for a backfill slot), BACKFILLING, MEMORY, DEAD.

A takeover stream (stream flag TakeOver, a controlled vbucket move) runs the same way and
then, each time it has sent everything its vbucket holds, takes the next step of the
handshake `decisions.takeover_step` describes: SET_VBUCKET_STATE(pending), wait for the
answer, make the vbucket dead here, send what was written meanwhile,
SET_VBUCKET_STATE(active), wait for the answer, STREAM_END(OK).
`last_sent` is always the end of the last complete snapshot: the position a client
may resume from, and where a new backfill starts.

Collections (`dcptool.node.dcpfilter`, docs/collections-dcp.md): a stream of a connection
without collections sends default-collection documents only, keys without their 0x00
prefix (`_send_items_legacy`, `_send_rows_legacy`); a collections connection's stream
sends doc keys as stored and system events (`_send_items_doc`, `_send_rows_doc`), through
its filter when it has one. A memory snapshot is filtered only when it may hold something
to hide; its marker then ends at the last item sent (a snapshot with nothing to send is
skipped). A disk snapshot whose last seqnos were hidden ends with DCP_SEQNO_ADVANCED. Once
every filtered collection is dropped the stream ends with FilterEmpty.

The hot loops (`_send_items_*`, `_send_rows_*`) build frames with precompiled structs and
append the pieces to the producer's output list; flow control is enforced by `limit`,
the bytes this call may still add.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from dcptool.protocol import wire as w
from dcptool.protocol.constants import (
    SEQNO_MAX,
    SnapshotFlag,
    StreamEndReason,
    StreamFlag,
    VBucketState,
)

from . import decisions as d
from .dcpfilter import DcpFilter, ever_dropped
from .decisions import StreamPlan, first_marker_start
from .item import ITEM_DELETION, ITEM_EXPIRATION, ITEM_MUTATION, split_xattrs
from .storage import SEQNO_MASK, BackfillReader
from dcptool.logsafe import shown

if TYPE_CHECKING:
    from .backfill import BackfillManager
    from .storage import Storage
    from .vbucket import VBucket

log = logging.getLogger("dcptool.node.stream")

BACKFILL_PENDING = 0
BACKFILLING = 1
MEMORY = 2
DEAD = 3

_MEM = int(SnapshotFlag.MEMORY)
_DISK = int(SnapshotFlag.DISK)
_CHK = int(SnapshotFlag.CHECKPOINT)
_XATTR = w.DT_XATTR
_JSON = w.DT_JSON
_TWO64 = 1 << 64
ROWS_PER_FETCH = 2048

_MUT = w.MUTATION.pack
_MUT_BEFORE_NRU = w.MUTATION_BEFORE_NRU.pack
_REQ = w.REQ
_OP_MUTATION = w.OP_DCP_MUTATION
_MUT_EXTLEN = w.MUTATION_EXTLEN
_HLEN = w.HEADER_LEN
_FILTER_EMPTY = int(StreamEndReason.FILTER_EMPTY)
#: end reasons a connection without collections never sees (kv_engine's
#: DcpProducer::mapEndStreamStatus sends them as Ok)
_LEGACY_AS_OK = (int(StreamEndReason.FILTER_EMPTY), int(StreamEndReason.LOST_PRIVILEGES))
_NOTHING_DROPPED: frozenset = frozenset()
#: what `fill` does after one of its steps: go on, stop (nothing more now), or go on
#: unless it sends a single message (something was sent)
_GO, _STOP, _SENT = 0, 1, 2


class StreamOwner(Protocol):
    """What a stream needs of the DCP producer that runs it (`producer.Producer`): how its
    connection encodes and schedules, the bucket and storage it reads, the shared backfill
    slots, and the counters it adds to."""

    name: str
    collections: bool
    simple: bool
    strip_mask: int
    bucket: Any
    storage: "Storage"
    backfills: "BackfillManager"
    cursor_drops: int
    backfills_started: int

    def encode(self, *args: Any) -> list[bytes]: ...

    def ready_stream(self, s: "ProducerStream") -> None: ...

    def stream_finished(self, s: "ProducerStream") -> None: ...


class ProducerStream:
    def __init__(self, producer: StreamOwner, vb: "VBucket", opaque: int, sid: int | None,
                 plan: StreamPlan, filt: DcpFilter | None = None) -> None:
        self.producer = producer
        #: what this stream lets through (dcptool.node.dcpfilter); legacy streams strip the
        #: 0x00 prefix of keys and never see system events or seqno-advanced
        if filt is None:
            filt = DcpFilter(legacy=not producer.collections,
                             cids={0} if not producer.collections else None)
        self.filt = filt
        self.legacy = filt.legacy
        if filt.legacy and not vb.coll_seqnos_built:
            vb.ensure_collection_seqnos()  # `other_high` decides when snapshots need a filter
        self._send_items = self._send_items_legacy if filt.legacy else self._send_items_doc
        self._send_rows = self._send_rows_legacy if filt.legacy else self._send_rows_doc
        #: the snapshot range the client asked with (the first snapshot's seqno-advanced)
        self.req_snap_end = plan.snap_end
        self.vb = vb
        self.vbid = vb.id
        self.opaque = opaque
        self.sid = sid
        self.flags = plan.flags
        self.start = plan.start
        self.end = plan.end
        self.last_sent = plan.start
        self.items_sent = 0
        self.first_marker = True
        self.snap: list | None = None
        self.held: tuple | None = None
        self.snap_pos = 0
        self.snap_end = 0
        #: how far the current memory snapshot read the checkpoint (its marker may end
        #: before, at its last item the filter let through)
        self.snap_read_end = 0
        #: a DCP_SEQNO_ADVANCED to send after the current snapshot / before what follows
        self.snap_adv: int | None = None
        self.pending_adv: int | None = None
        #: the seqno of the last row of the current disk snapshot this stream sends
        self.disk_last = 0
        self.reader: BackfillReader | None = None
        self.rows: list | None = None
        self.row_pos = 0
        self.backfill_end = 0
        self.pending_end: int | None = None
        self.state = MEMORY
        self.queued = False
        self.waiting = False
        self.waiting_backfill = False
        self.holds_slot = False
        self.backfills = 0
        self.cursor = None
        #: the takeover phase (decisions.TAKEOVER_*), None for an ordinary stream
        self.takeover: str | None = d.TAKEOVER_SEND if plan.flags & StreamFlag.TAKEOVER else None
        self._register_cursor()
        if plan.flags & StreamFlag.DISK_ONLY:
            self.state = BACKFILL_PENDING
        if self.start >= self.end:
            self.pending_end = StreamEndReason.OK

    # -- lifecycle -------------------------------------------------------------------

    def _register_cursor(self) -> None:
        name = f"{self.producer.name}:{self.vbid}:{self.opaque}"
        self.cursor, need_backfill = self.vb.checkpoints.register_cursor(
            name, self.last_sent, on_drop=self._cursor_dropped)
        if need_backfill:
            self.state = BACKFILL_PENDING

    def _cursor_dropped(self, cursor) -> None:
        # the memory budget took our cursor: carry on from disk once the current snapshot is out
        self.producer.cursor_drops += 1
        if self.waiting:
            self.wake()

    def wake(self) -> None:
        """Called by the vbucket (new data) or the backfill manager (a slot is free)."""
        self.waiting = False
        self.waiting_backfill = False
        self.producer.ready_stream(self)

    @property
    def dead(self) -> bool:
        return self.state == DEAD

    def end_stream(self, reason: int) -> None:
        """End as soon as possible with STREAM_END `reason`, dropping what was not sent."""
        if self.state == DEAD or self.pending_end is not None and reason == StreamEndReason.OK:
            return
        self._release()
        self.snap = None
        self.held = None
        self.pending_end = reason
        self.producer.ready_stream(self)

    def _release(self) -> None:
        """Give back the cursor, the disk snapshot and the backfill slot."""
        if self.cursor is not None:
            self.vb.checkpoints.remove_cursor(self.cursor)
            self.cursor = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self.rows = None
        if self.holds_slot:
            self.holds_slot = False
            self.producer.backfills.release(self.producer)
        if self.waiting_backfill:
            self.producer.backfills.cancel(self.wake)
            self.waiting_backfill = False
        if self.waiting:
            try:
                self.vb.waiters.remove(self.wake)
            except ValueError:
                pass
            self.waiting = False

    def close(self) -> None:
        """Drop the stream at once (connection gone, or close without a STREAM_END)."""
        self._release()
        self.state = DEAD
        self.snap = None
        self.held = None

    # -- producing -------------------------------------------------------------------------

    def fill(self, out: list, limit: int, single: bool = False, loose: bool = False) -> int:
        """Append frames to `out`, at most `limit` bytes.

        `single`: send exactly one message, whatever its size (a message larger than the
        whole flow-control buffer). `loose`: the first message may exceed `limit` (no flow
        control: `limit` is only a fairness quantum). Returns the bytes appended. Leaves
        `self.waiting`/`self.waiting_backfill` set when it stopped for lack of data or of a
        backfill slot.
        """
        first_ok = single or loose
        used = 0
        sid_extra = w.SID_EXTRA if self.sid is not None else 0
        while used < limit or single:
            if self.snap is not None:
                n = self._send_items(out, limit - used, single, first_ok and not used)
                used += n
                if self.snap_pos < len(self.snap):
                    return used
                self._memory_snapshot_sent()
                if single and n:
                    return used
                continue
            if self.pending_adv is not None:
                size = w.SEQNO_ADVANCED_SIZE + sid_extra
                if used + size > limit and (used or not first_ok):
                    return used
                out.append(w.seqno_advanced(self.vbid, self.opaque, self.pending_adv, self.sid))
                self.pending_adv = None
                used += size
                if single:
                    return used
                continue
            if self.held is not None:
                size = w.MARKER_SIZE + sid_extra
                if used + size > limit and (used or not first_ok):
                    return used
                held = self.held
                self.held = None
                self._start_memory_snapshot(out, *held)
                used += size
                if single:
                    return used
                continue
            if self.rows is not None:
                n = self._send_rows(out, limit - used, single, first_ok and not used)
                used += n
                if self.row_pos < len(self.rows):
                    return used
                self.rows = None
                if self.filt.empty:
                    self.end_stream(_FILTER_EMPTY)
                if single and n:
                    return used
                continue
            if self.pending_end is not None:
                size = w.STREAM_END_SIZE + sid_extra
                if used + size > limit and (used or not first_ok):
                    return used
                self._send_stream_end(out)
                return used + size
            if self.takeover is not None and d.takeover_waits(self.takeover):
                self.waiting = True  # until the consumer answers (`vbucket_state_acked`)
                return used
            state = self.state
            if state == MEMORY:
                used, step = self._next_memory_snapshot(out, used, limit, first_ok)
            elif state == BACKFILL_PENDING:
                used, step = self._start_backfill(out, used, limit, first_ok)
            elif state == BACKFILLING:
                self._next_backfill_rows()
                step = _GO
            else:
                return used  # DEAD
            if step == _STOP or (step == _SENT and single):
                return used
        return used

    # the steps of `fill`: each says what the loop does next
    def _memory_snapshot_sent(self) -> None:
        """The current memory snapshot is all sent: move past it."""
        self.snap = None
        self.last_sent = self.snap_read_end
        if self.snap_adv is not None:
            self.pending_adv, self.snap_adv = self.snap_adv, None
        self._check_end(self.snap_read_end)
        if self.filt.empty and self.pending_end is None:
            self.pending_end = _FILTER_EMPTY

    def _send_stream_end(self, out: list) -> None:
        reason = self.pending_end
        if self.legacy and reason in _LEGACY_AS_OK:
            reason = 0
        out.append(w.stream_end(self.vbid, self.opaque, reason, self.sid))
        self.state = DEAD
        self._release()
        self.producer.stream_finished(self)

    def _next_memory_snapshot(self, out: list, used: int, limit: int, first_ok: bool
                              ) -> tuple[int, int]:
        """Read the next snapshot from the checkpoints and send its marker (the items go
        on the next turns of the loop). Returns the bytes used and the next step."""
        sid_extra = w.SID_EXTRA if self.sid is not None else 0
        if self.cursor is None or self.cursor.dropped:
            self.cursor = None
            self._register_cursor()
            if self.state != MEMORY:
                return used, _GO
        snap = self.vb.checkpoints.read(self.cursor)
        if snap is None:
            if self.cursor.dropped:
                return used, _GO
            if self.takeover is not None:
                size = w.SET_VBUCKET_STATE_SIZE + sid_extra
                if used + size > limit and (used or not first_ok):
                    return used, _STOP
                if self._takeover_event(d.CAUGHT_UP, out):
                    return used + size, _GO
            self.waiting = True
            self.vb.waiters.append(self.wake)
            return used, _STOP
        chosen = self._snapshot_to_send(snap)
        if chosen is None:
            return used, _GO
        sending, end, adv = chosen
        size = w.MARKER_SIZE + sid_extra
        if used + size > limit and (used or not first_ok):
            # keep the snapshot for the next call; its marker goes first
            self.held = (sending, end, snap.end, snap.checkpoint_start, adv)
            return used, _STOP
        self._start_memory_snapshot(out, sending, end, snap.end, snap.checkpoint_start, adv)
        return used + size, _SENT

    def _snapshot_to_send(self, snap) -> tuple[list, int, int | None] | None:
        """What this stream sends of a snapshot read from the checkpoints: the items this
        client sees above what it has, the marker's end and the seqno-advanced to send
        after them (None: nothing to send; the stream moved past the snapshot)."""
        items = snap.items
        floor = self.last_sent
        if items[0].seqno <= floor:
            items = [i for i in items if i.seqno > floor]
            if not items:
                return None
        read_end = snap.end
        sending = self._admitted(items)
        if sending is items:
            return sending, read_end, None
        if sending:
            return sending, sending[-1].seqno, None
        if (self.first_marker and not self.legacy
                and self.last_sent < self.req_snap_end <= read_end):
            # the client's first snapshot was filtered away entirely: a marker and a
            # seqno-advanced still move it past the snapshot it asked to complete
            # (kv_engine, MB-47009)
            return sending, read_end, read_end
        # nothing here for this client: no marker (kv_engine)
        self.last_sent = read_end
        self._check_end(read_end)
        if self.filt.empty and self.pending_end is None:
            self.pending_end = _FILTER_EMPTY
        return None

    def _start_backfill(self, out: list, used: int, limit: int, first_ok: bool
                        ) -> tuple[int, int]:
        """Take a backfill slot, open the disk snapshot and send its marker. Returns the
        bytes used and the next step."""
        if used + w.MARKER_SIZE + w.SID_EXTRA > limit and (used or not first_ok):
            return used, _STOP
        if not self.producer.backfills.acquire(self.wake, self.producer):
            self.waiting_backfill = True
            return used, _STOP
        self.holds_slot = True
        self.reader = BackfillReader(self.producer.storage, self.vbid, self.last_sent)
        if (0 < self.last_sent < self.reader.purge_seqno
                and not self.flags & StreamFlag.IGNORE_PURGED_TOMBSTONES):
            # compaction purged deletions this stream has not sent (kv_engine ends
            # the stream the same way); the client asks again and rolls back to 0
            self.end_stream(StreamEndReason.ROLLBACK)
            return used, _GO
        end = self.reader.end
        if end <= self.last_sent:
            self._finish_backfill()
            return used, _GO
        self.backfill_end = end
        self.disk_last = self.last_sent
        self.state = BACKFILLING
        start = self.start if self.first_marker else self.last_sent + 1
        self.first_marker = False
        self.backfills += 1
        self.producer.backfills_started += 1
        out.append(w.marker(self.vbid, self.opaque, start, end, _DISK | _CHK, self.sid))
        return used + w.MARKER_SIZE + (w.SID_EXTRA if self.sid is not None else 0), _SENT

    def _next_backfill_rows(self) -> None:
        """Fetch the next rows of the disk snapshot this client sees (the send loop takes
        them from `self.rows`), or finish the snapshot when everything is read."""
        rows = self.reader.fetch(ROWS_PER_FETCH) if self.reader is not None else []
        if self.reader is not None and self.reader.done:
            # everything is read: the transaction and the slot can go before the
            # last rows are sent
            self.reader = None
            self._release_slot()
        if rows:
            filt = self.filt
            dropped = self._dropped()
            if filt.legacy:
                # only if the vbucket ever held anything outside the default
                # collection (the legacy send loop trusts the rows are default)
                need = dropped or self.vb.other_high
            else:
                # a dropped collection's documents are on disk until purged
                need = dropped or filt.cids is not None
            if need:
                rows = filt.filter_rows(rows, self.producer.bucket.collections)
                if not rows:
                    if filt.empty:
                        self.end_stream(_FILTER_EMPTY)
                    return
            self.disk_last = rows[-1][0] & SEQNO_MASK
            self.rows = rows
            self.row_pos = 0
            return
        # the disk snapshot is complete; when its last seqnos were not for this
        # client, a seqno-advanced tells it the snapshot's end (collections
        # connections only, kv_engine)
        if not self.legacy and self.disk_last < self.backfill_end:
            self.pending_adv = self.backfill_end
        self.last_sent = self.backfill_end
        self._finish_backfill()
        self._check_end(self.backfill_end)

    # -- takeover ----------------------------------------------------------------------------

    def _takeover_event(self, event: str, out: list | None = None) -> bool:
        """One step of the takeover handshake; True when a SET_VBUCKET_STATE went to `out`."""
        self.takeover, actions = d.takeover_step(self.takeover, event)
        sent = False
        for action in actions:
            if action == d.SEND_PENDING:
                out.append(w.set_vbucket_state(self.vbid, self.opaque, VBucketState.PENDING,
                                               self.sid))
                sent = True
            elif action == d.SEND_ACTIVE:
                out.append(w.set_vbucket_state(self.vbid, self.opaque, VBucketState.ACTIVE,
                                               self.sid))
                sent = True
            elif action == d.SET_DEAD:
                # from now on writes answer NOT_MY_VBUCKET here; this stream carries the rest
                # (the other streams of the vbucket end with STATE_CHANGED)
                log.info("takeover of vbucket %d by %s: the vbucket is dead here at seqno %d",
                         self.vbid, shown(self.producer.name), self.vb.high_seqno)
                self.vb.set_state(VBucketState.DEAD)
            elif action == d.END_OK:
                self.pending_end = StreamEndReason.OK
        return sent

    def vbucket_state_acked(self, status: int) -> None:
        """The consumer answered our SET_VBUCKET_STATE."""
        if self.state == DEAD or self.takeover is None or not d.takeover_waits(self.takeover):
            return
        if status != 0:
            log.warning("takeover of vbucket %d: the consumer refused SET_VBUCKET_STATE "
                        "(status 0x%x)", self.vbid, status)
            self.end_stream(StreamEndReason.STATE_CHANGED)
            return
        self._takeover_event(d.ACKED)
        self.wake()

    def _release_slot(self) -> None:
        if self.holds_slot:
            self.holds_slot = False
            self.producer.backfills.release(self.producer)

    def _finish_backfill(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self._release_slot()
        self.state = MEMORY

    def _check_end(self, snapshot_end: int) -> None:
        if self.end != SEQNO_MAX and snapshot_end >= self.end and self.pending_end is None:
            self.pending_end = StreamEndReason.OK

    def _dropped(self):
        """The collections whose documents are dropped and not purged yet (usually none)."""
        return getattr(self.producer.bucket, "dropped", None) or _NOTHING_DROPPED

    def _admitted(self, items: list) -> list:
        """The items of a memory snapshot this stream sends: `items` itself (no copy, no
        per-item work) when nothing in it can be filtered out, else the filtered list."""
        filt = self.filt
        bucket = self.producer.bucket
        if filt.legacy or filt.cids is None:
            if items[0].seqno > self.vb.other_high:
                return items  # default-collection documents only
            if filt.cids is None and not ever_dropped(bucket.manifest):
                return items
        return filt.filter_items(items, bucket.collections)

    def _start_memory_snapshot(self, out, items, end, read_end, chk, adv=None) -> None:
        first = items[0].seqno if items else self.start + 1
        if self.first_marker:
            start = first_marker_start(self.start, first)
            self.first_marker = False
        else:
            start = first
        out.append(w.marker(self.vbid, self.opaque, start, end, _MEM | (_CHK if chk else 0),
                            self.sid))
        self.snap = items
        self.snap_pos = 0
        self.snap_end = end
        self.snap_read_end = read_end
        self.snap_adv = adv

    # -- the hot loops ---------------------------------------------------------------------

    def _send_items_doc(self, out: list, limit: int, single: bool, first_ok: bool) -> int:
        """Encode items of the current memory snapshot, keys as stored (collections
        connections). Returns bytes appended."""
        items = self.snap
        i = self.snap_pos
        n = len(items)
        prod = self.producer
        used = 0
        vb = self.vbid
        opq = self.opaque
        append = out.append
        strip = prod.strip_mask
        simple = prod.simple and self.sid is None
        pack = _MUT
        req, opcode, extlen, hlen = _REQ, _OP_MUTATION, _MUT_EXTLEN, _HLEN
        while i < n:
            it = items[i]
            if simple and it.op == 0 and not it.datatype & strip:
                key = it.key
                val = it.value
                kl = len(key)
                body = extlen + kl + len(val)
                size = hlen + body
                if used + size > limit and (used or not first_ok):
                    break
                append(pack(req, opcode, kl, extlen, it.datatype, vb, body, opq, it.cas, it.seqno,
                            it.rev, it.flags, it.expiry, 0, 0, 0))
                append(key)
                append(val)
            else:
                parts = prod.encode(vb, opq, self.sid, it.key, it.value, it.datatype, it.cas,
                                    it.seqno, it.rev, it.flags, it.expiry, it.op, it.delete_time)
                size = len(parts[0]) + len(parts[1]) + len(parts[2])
                if used + size > limit and (used or not first_ok):
                    break
                out.extend(parts)
            used += size
            i += 1
            if single:
                break
        self.items_sent += i - self.snap_pos
        self.snap_pos = i
        return used

    def _send_rows_doc(self, out: list, limit: int, single: bool, first_ok: bool) -> int:
        """Encode rows of the disk snapshot, keys as stored. Returns bytes appended."""
        rows = self.rows
        i = self.row_pos
        n = len(rows)
        prod = self.producer
        used = 0
        vb = self.vbid
        opq = self.opaque
        append = out.append
        strip = prod.strip_mask
        simple = prod.simple and self.sid is None
        pack = _MUT
        req, opcode, extlen, hlen = _REQ, _OP_MUTATION, _MUT_EXTLEN, _HLEN
        mask = SEQNO_MASK
        while i < n:
            rid, key, rev, cas, flags, expiry, dt, op, dtime, val = rows[i]
            if cas < 0:
                cas += _TWO64
            if rev < 0:
                rev += _TWO64
            if simple and op == 0 and not dt & strip:
                kl = len(key)
                body = extlen + kl + len(val)
                size = hlen + body
                if used + size > limit and (used or not first_ok):
                    break
                append(pack(req, opcode, kl, extlen, dt, vb, body, opq, cas, rid & mask, rev, flags,
                            expiry, 0, 0, 0))
                append(key)
                append(val)
            else:
                parts = prod.encode(vb, opq, self.sid, key, val, dt, cas, rid & mask, rev, flags,
                                    expiry, op, dtime)
                size = len(parts[0]) + len(parts[1]) + len(parts[2])
                if used + size > limit and (used or not first_ok):
                    break
                out.extend(parts)
            used += size
            i += 1
            if single:
                break
        self.items_sent += i - self.row_pos
        self.row_pos = i
        return used

    def _send_items_legacy(self, out: list, limit: int, single: bool, first_ok: bool) -> int:
        """`_send_items_doc` for a connection without collections: the snapshot holds
        default-collection documents only (`_admitted` saw to it); their keys go without
        the 0x00 prefix."""
        items = self.snap
        i = self.snap_pos
        n = len(items)
        prod = self.producer
        used = 0
        vb = self.vbid
        opq = self.opaque
        append = out.append
        strip = prod.strip_mask
        simple = prod.simple and self.sid is None
        pack = _MUT_BEFORE_NRU
        req, opcode, extlen, hlen = _REQ, _OP_MUTATION, _MUT_EXTLEN, _HLEN
        while i < n:
            it = items[i]
            key = it.key
            if simple and it.op == 0 and not it.datatype & strip:
                # the doc key goes as it is: its 0x00 prefix is the extras' last byte
                # (wire.MUTATION_BEFORE_NRU), the key length the key's without it
                val = it.value
                kl = len(key) - 1
                body = extlen + kl + len(val)
                size = hlen + body
                if used + size > limit and (used or not first_ok):
                    break
                append(pack(req, opcode, kl, extlen, it.datatype, vb, body, opq, it.cas, it.seqno,
                            it.rev, it.flags, it.expiry, 0, 0))
                append(key)
                append(val)
            else:
                parts = prod.encode(vb, opq, self.sid, key[1:], it.value, it.datatype, it.cas,
                                    it.seqno, it.rev, it.flags, it.expiry, it.op, it.delete_time)
                size = len(parts[0]) + len(parts[1]) + len(parts[2])
                if used + size > limit and (used or not first_ok):
                    break
                out.extend(parts)
            used += size
            i += 1
            if single:
                break
        self.items_sent += i - self.snap_pos
        self.snap_pos = i
        return used

    def _send_rows_legacy(self, out: list, limit: int, single: bool, first_ok: bool) -> int:
        """`_send_rows_doc` for a connection without collections: the rows are the default
        collection's only (filtered when the vbucket ever held anything else)."""
        rows = self.rows
        i = self.row_pos
        n = len(rows)
        prod = self.producer
        used = 0
        vb = self.vbid
        opq = self.opaque
        append = out.append
        strip = prod.strip_mask
        simple = prod.simple and self.sid is None
        pack = _MUT_BEFORE_NRU
        req, opcode, extlen, hlen = _REQ, _OP_MUTATION, _MUT_EXTLEN, _HLEN
        mask = SEQNO_MASK
        while i < n:
            rid, key, rev, cas, flags, expiry, dt, op, dtime, val = rows[i]
            if cas < 0:
                cas += _TWO64
            if rev < 0:
                rev += _TWO64
            if simple and op == 0 and not dt & strip:
                kl = len(key) - 1  # the 0x00 prefix is the extras' last byte (see above)
                body = extlen + kl + len(val)
                size = hlen + body
                if used + size > limit and (used or not first_ok):
                    break
                append(pack(req, opcode, kl, extlen, dt, vb, body, opq, cas, rid & mask, rev, flags,
                            expiry, 0, 0))
                append(key)
                append(val)
            else:
                parts = prod.encode(vb, opq, self.sid, key[1:], val, dt, cas, rid & mask, rev,
                                    flags, expiry, op, dtime)
                size = len(parts[0]) + len(parts[1]) + len(parts[2])
                if used + size > limit and (used or not first_ok):
                    break
                out.extend(parts)
            used += size
            i += 1
            if single:
                break
        self.items_sent += i - self.row_pos
        self.row_pos = i
        return used

    # -- stats -------------------------------------------------------------------------------

    def stats(self) -> dict:
        out = {"state": ("backfill_pending", "backfilling", "in-memory", "dead")[self.state],
                "opaque": self.opaque, "start_seqno": self.start, "end_seqno": self.end,
                "last_sent_seqno": self.last_sent, "items_sent": self.items_sent,
                "backfills": self.backfills}
        if self.takeover is not None:
            out["takeover"] = self.takeover
        return out


def payload(value: bytes, datatype: int, op: int, *, include_xattrs: bool, no_value: bool,
            keep_datatype: bool) -> tuple[bytes, int]:
    """The value and datatype a DCP client gets for a stored value (fact sheet 1.5, 4.8)."""
    if datatype & _XATTR:
        xattrs, body = split_xattrs(value)
    else:
        xattrs, body = b"", value
    if no_value or op != ITEM_MUTATION:
        body = b""
    if include_xattrs and xattrs:
        out = xattrs + body
        dt = datatype if body else datatype & ~_JSON
    else:
        out = body
        dt = datatype & ~_XATTR
        if not body and not keep_datatype:
            dt &= ~_JSON
    if keep_datatype:
        dt = datatype if include_xattrs else datatype & ~_XATTR
    return out, dt


__all__ = ["ProducerStream", "payload", "BACKFILL_PENDING", "BACKFILLING", "MEMORY", "DEAD",
           "ITEM_DELETION", "ITEM_EXPIRATION"]
