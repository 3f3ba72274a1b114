"""Position tracking for a reader of a DCP consumer that may stop mid-batch."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .events import (
    DELETION,
    EV_ADVANCED_SEQNO,
    EV_KIND,
    EV_ROLLBACK_INFO,
    EV_SEQNO,
    EV_SNAP_END,
    EV_SNAP_START,
    EV_SYSTEM_EVENT,
    EV_VBUCKET,
    EXPIRATION,
    MUTATION,
    ROLLBACK,
    SEQNO_ADVANCED,
    SNAPSHOT,
    SYSTEM_EVENT,
)
from .position import Position

if TYPE_CHECKING:
    from .consumer import DcpConsumer

_ITEMS = frozenset((MUTATION, DELETION, EXPIRATION))


class PositionTracker:
    """What a consumer has handed out per vbucket, so saved state never skips or repeats.

    The session parses whole reads; its reader (`dcptool tail`) may stop in the middle of
    one (--count, Ctrl-C), so it keeps its own (seqno, snapshot start, end, last complete
    end) from the events it has seen, and `positions()` gives where to resume from.
    """

    def __init__(self, positions: dict[int, Position]) -> None:
        self.t = {vb: [p.seqno, p.snap_start, p.snap_end, None] for vb, p in positions.items()}

    def see(self, ev) -> None:
        kind = ev[EV_KIND]
        t = self.t.get(ev[EV_VBUCKET])
        if t is None:
            return
        if kind in _ITEMS:
            t[0] = ev[EV_SEQNO]
        elif kind == SEQNO_ADVANCED:
            seqno = ev[EV_ADVANCED_SEQNO]
            if seqno > t[2]:  # past the snapshot: a snapshot of its own ending there
                if t[0] >= t[2]:
                    t[3] = t[2]
                t[1] = t[2] = seqno
            t[0] = seqno
        elif kind == SYSTEM_EVENT:
            t[0] = ev[EV_SYSTEM_EVENT].seqno
        elif kind == SNAPSHOT:
            t[3] = t[2]
            t[1], t[2] = ev[EV_SNAP_START], ev[EV_SNAP_END]
        elif kind == ROLLBACK:
            p = ev[EV_ROLLBACK_INFO].after
            t[:] = [p.seqno, p.snap_start, p.snap_end, None]

    def position(self, consumer: "DcpConsumer", vb: int) -> Position:
        p = consumer.position(vb, consistent=False)
        seq, ms, me, done = self.t[vb]
        if (p.seqno, p.snap_start, p.snap_end) == (seq, ms, me):
            return p
        if seq >= me:
            seq = ms = me
        elif seq < ms:
            seq = ms = me = done if done is not None else seq
        ends = tuple(e for e in p.snapshot_ends if e <= seq)
        if seq == me and seq and (not ends or ends[-1] != seq):
            ends += (seq,)
        return Position(p.uuid_at(seq) or p.uuid, seq, ms, me, p.failover_log, ends)

    def positions(self, consumer: "DcpConsumer") -> dict[int, Position]:
        return {vb: self.position(consumer, vb) for vb in self.t}
