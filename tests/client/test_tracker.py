"""Position tracking of a reader that stops mid-batch (dcptool.client.tracker)."""
from __future__ import annotations

from dcptool.client import MUTATION, SNAPSHOT, Position
from dcptool.client.tracker import PositionTracker


class _FakeConsumer:
    def __init__(self, pos):
        self.pos = pos

    def position(self, vb, consistent=None):
        return self.pos


def test_tracker_stops_mid_batch_without_skipping():
    # the session parsed up to seqno 5, but the tail stopped after printing seqno 3
    session_pos = Position(7, 5, 1, 6, ((7, 0),), ())
    t = PositionTracker({0: Position()})
    t.see((SNAPSHOT, 0, 1, 6, 1))
    for s in (1, 2, 3):
        t.see((MUTATION, 0, s, 1, 1, 0, 0, 0, b"k", b"v"))
    p = t.position(_FakeConsumer(session_pos), 0)
    assert (p.uuid, p.seqno, p.snap_start, p.snap_end) == (7, 3, 1, 6)
    # stopped right after a marker with nothing of it printed: the previous snapshot end
    t.see((MUTATION, 0, 6, 1, 1, 0, 0, 0, b"k", b"v"))
    t.see((SNAPSHOT, 0, 7, 9, 1))
    p = t.position(_FakeConsumer(Position(7, 8, 7, 9, ((7, 0),), (6,))), 0)
    assert (p.seqno, p.snap_start, p.snap_end) == (6, 6, 6)
