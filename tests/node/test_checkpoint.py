"""Checkpoints, deduplication, cursors and the memory budget (seed 003), without a network."""
from __future__ import annotations

from dcptool.node.checkpoint import CheckpointManager, CheckpointMemory
from dcptool.node.item import ITEM_OVERHEAD, Item


class Seq:
    def __init__(self) -> None:
        self.n = 0

    def item(self, key: bytes, value: bytes = b"v") -> Item:
        self.n += 1
        return Item(key, value, self.n, 1, self.n, 0, 0, 0)


def test_dedup_a_b_a_keeps_the_newest_version_once():
    mem = CheckpointMemory(1 << 30)
    m = CheckpointManager(0, mem)
    s = Seq()
    for k in (b"A", b"B", b"A"):
        m.queue(s.item(k))
    cur, backfill = m.register_cursor("c", 0)
    assert not backfill
    snap = m.read(cur)
    assert [(i.seqno, i.key) for i in snap.items] == [(2, b"B"), (3, b"A")]
    assert snap.end == 3
    assert m.read(cur) is None


def test_seed_003_point_in_time_snapshots_for_two_cursors():
    m = CheckpointManager(0, CheckpointMemory(1 << 30))
    s = Seq()
    for i in range(100):
        m.queue(s.item(b"k%d" % i))
    c1, _ = m.register_cursor("R1", 0)
    snap = m.read(c1)
    assert (snap.items[0].seqno, snap.end, len(snap.items)) == (1, 100, 100)
    for i in range(100, 120):
        m.queue(s.item(b"k%d" % i))
    c2, _ = m.register_cursor("R2", 0)
    snap2 = m.read(c2)
    assert (snap2.items[0].seqno, snap2.end) == (1, 120)
    for i in range(120, 150):
        m.queue(s.item(b"k%d" % i))
    a = m.read(c1)
    b = m.read(c2)
    assert (a.items[0].seqno, a.end) == (101, 150)
    assert (b.items[0].seqno, b.end) == (121, 150)


def test_snapshot_is_a_copy_that_later_dedup_cannot_tear():
    m = CheckpointManager(0, CheckpointMemory(1 << 30))
    s = Seq()
    m.queue(s.item(b"x"))
    m.queue(s.item(b"y"))
    cur, _ = m.register_cursor("c", 0)
    snap = m.read(cur)
    m.queue(s.item(b"x"))  # dedups x@1 in the open checkpoint
    assert [i.seqno for i in snap.items] == [1, 2]
    assert [i.seqno for i in m.read(cur).items] == [3]


def test_checkpoints_close_at_their_item_limit_and_cursors_cross_them():
    m = CheckpointManager(0, CheckpointMemory(1 << 30), max_items=10)
    s = Seq()
    for i in range(25):
        m.queue(s.item(b"k%d" % i))
    assert len(m.checkpoints) == 3
    cur, _ = m.register_cursor("c", 0)
    ends = []
    starts = []
    while (snap := m.read(cur)) is not None:
        starts.append((snap.items[0].seqno, snap.checkpoint_start))
        ends.append(snap.end)
    assert ends == [10, 20, 25]
    assert starts == [(1, True), (11, True), (21, True)]


def test_cursor_registered_mid_checkpoint_starts_after_the_seqno():
    m = CheckpointManager(0, CheckpointMemory(1 << 30))
    s = Seq()
    for i in range(10):
        m.queue(s.item(b"k%d" % i))
    m.queue(s.item(b"k3"))  # seqno 11 replaces k3@4
    cur, backfill = m.register_cursor("c", 5)
    assert not backfill
    snap = m.read(cur)
    assert [i.seqno for i in snap.items] == [6, 7, 8, 9, 10, 11]
    assert not snap.checkpoint_start


def test_persisted_unreferenced_closed_checkpoints_are_freed():
    mem = CheckpointMemory(1 << 30)
    m = CheckpointManager(0, mem, max_items=10)
    s = Seq()
    for i in range(30):
        m.queue(s.item(b"k%d" % i))
    assert len(m.checkpoints) == 4
    m.set_persisted(25)
    # 1..10 and 11..20 are on disk and nobody reads them
    assert m.low_seqno == 21
    cur, backfill = m.register_cursor("c", 0)
    assert backfill, "seqnos 1..20 are only on disk now"
    before = mem.used
    m.set_persisted(30)
    assert mem.used == before, "the cursor pins its checkpoint"
    m.remove_cursor(cur)
    assert m.low_seqno == 31 and len(m.checkpoints) == 1


def test_memory_budget_drops_the_slow_cursor():
    size = len(b"k0000") + 100 + ITEM_OVERHEAD
    mem = CheckpointMemory(budget=50 * size)
    m = CheckpointManager(0, mem, max_items=10)
    dropped = []
    s = Seq()
    slow, _ = m.register_cursor("slow", 0, on_drop=dropped.append)
    for i in range(200):
        m.queue(s.item(b"k%04d" % i, b"x" * 100))
        m.set_persisted(s.n)  # the flusher keeps up
        assert mem.used <= mem.budget + 10 * size
    assert dropped == [slow] and slow.dropped
    assert mem.cursors_dropped == 1
    assert m.read(slow) is None


def test_reset_forgets_cursors_and_memory():
    mem = CheckpointMemory(1 << 30)
    m = CheckpointManager(0, mem)
    s = Seq()
    for i in range(5):
        m.queue(s.item(b"k%d" % i))
    cur, _ = m.register_cursor("c", 0)
    m.reset(6)
    assert cur.dropped and mem.used == 0 and m.low_seqno == 6
