"""Checkpoints: the in-memory queue of a vbucket's recent changes, read by stream cursors.

Every change of a vbucket is queued into its *open* checkpoint. Within the open
checkpoint a key appears once: a newer version of a key replaces the older one
(deduplication, seed 003), leaving a hole (`None`) where the old one was. When the open
checkpoint grows past its item or byte limit it is closed and a new one opened; closed
checkpoints never change.

A *cursor* marks how far one stream has read. Reading from a cursor returns one memory
snapshot: the items from the cursor to the end of its checkpoint as they are now (a list
copy, so later deduplication cannot tear a snapshot that is being sent).

Closed checkpoints are freed once the flusher has persisted them and no cursor is in
them. All checkpoints of the node share one memory budget (`CheckpointMemory`); when it
is exceeded the cursor holding the oldest checkpoint is dropped, its stream falls back to
a disk backfill, and the checkpoints it held can be freed (seed 003, "slow clients").
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from .item import ITEM_OVERHEAD, Item


class Checkpoint:
    """A run of consecutive seqnos of one vbucket.

    `items` holds the queued items in seqno order, `None` where deduplication removed one;
    `index` maps a key to its position while the checkpoint is open. `start` is the first
    seqno the checkpoint covers and `end` the last one queued into it.
    """

    __slots__ = ("id", "start", "end", "items", "index", "nbytes", "open", "cursors")

    def __init__(self, cid: int, start: int) -> None:
        self.id = cid
        self.start = start
        self.end = start - 1
        self.items: list[Item | None] = []
        self.index: dict[bytes, int] = {}
        self.nbytes = 0
        self.open = True
        self.cursors = 0

    def __len__(self) -> int:
        return len(self.items)


class Cursor:
    """A reader's position: the checkpoint it is in and the index of the next item.

    `dropped` is set when the memory budget took the cursor away; its owner must then
    fetch what it missed from disk and register a new cursor.
    """

    __slots__ = ("name", "manager", "ckpt", "pos", "dropped", "on_drop")

    def __init__(self, name: str, manager: "CheckpointManager", ckpt: Checkpoint, pos: int,
                 on_drop: Callable[["Cursor"], None] | None = None) -> None:
        self.name = name
        self.manager = manager
        self.ckpt = ckpt
        self.pos = pos
        self.dropped = False
        self.on_drop = on_drop
        ckpt.cursors += 1

    def pending(self) -> bool:
        """Does this cursor have something to read?"""
        if self.dropped:
            return False
        ck = self.ckpt
        if self.pos < len(ck.items):
            return True
        return not ck.open

    def move(self, ckpt: Checkpoint, pos: int) -> None:
        if ckpt is not self.ckpt:
            self.ckpt.cursors -= 1
            ckpt.cursors += 1
            self.ckpt = ckpt
        self.pos = pos


class MemorySnapshot:
    """Items read from a cursor in one go, with the bounds of their checkpoint."""

    __slots__ = ("items", "checkpoint_start", "end")

    def __init__(self, items: list[Item], checkpoint_start: bool, end: int) -> None:
        self.items = items
        self.checkpoint_start = checkpoint_start
        self.end = end


class CheckpointMemory:
    """Memory accounting shared by all checkpoint managers of a node.

    `used` is the estimated bytes held by checkpoints; `budget` the limit above which
    cursors are dropped. `cursors_dropped` counts drops for the stats.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.cursors_dropped = 0
        self.managers: list[CheckpointManager] = []
        #: do not try again before usage passes this (nothing was droppable last time)
        self.retry_above = 0
        #: called when over budget (the node wakes the flusher: unpersisted items cannot be freed)
        self.on_pressure: Callable[[], None] | None = None

    def maybe_reduce(self) -> None:
        if self.used > self.budget and self.used > self.retry_above:
            self.reduce()

    def reduce(self) -> int:
        """Free checkpoint memory until under budget, dropping the slowest cursors. Returns drops."""
        drops = 0
        if self.on_pressure is not None:
            self.on_pressure()
        for m in self.managers:
            m.free_unreferenced()
        while self.used > self.budget:
            # the oldest closed checkpoint that a cursor holds, across all vbuckets
            victim = None
            victim_mgr = None
            for m in self.managers:
                ck = m.oldest_pinned_closed()
                if ck is not None and (victim is None or ck.nbytes > victim.nbytes):
                    victim, victim_mgr = ck, m
            if victim is None:
                break
            drops += victim_mgr.drop_cursors_in(victim)
            victim_mgr.free_unreferenced()
        self.cursors_dropped += drops
        self.retry_above = self.used + self.budget // 16 if self.used > self.budget else 0
        return drops


class CheckpointManager:
    """The checkpoints of one vbucket and the cursors reading them.

    `persisted_seqno` is kept up to date by the vbucket so closed checkpoints that are
    on disk can be freed.
    """

    def __init__(self, vbid: int, memory: CheckpointMemory, *, start_seqno: int = 1,
                 max_items: int = 10000, max_bytes: int = 8 * 1024 * 1024) -> None:
        self.vbid = vbid
        self.memory = memory
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.persisted_seqno = start_seqno - 1
        self._next_id = 1
        self.checkpoints: deque[Checkpoint] = deque()
        self.cursors: set[Cursor] = set()
        self._open = self._new_checkpoint(start_seqno)
        memory.managers.append(self)

    # -- queueing ---------------------------------------------------------

    def _new_checkpoint(self, start: int) -> Checkpoint:
        ck = Checkpoint(self._next_id, start)
        self._next_id += 1
        self.checkpoints.append(ck)
        self._open = ck
        return ck

    def queue(self, item: Item) -> None:
        """Append a new version to the open checkpoint, replacing an older one of the same key."""
        ck = self._open
        size = len(item.key) + len(item.value) + ITEM_OVERHEAD
        index = ck.index
        items = ck.items
        old = index.get(item.key)
        if old is not None:
            prev = items[old]
            items[old] = None
            freed = len(prev.key) + len(prev.value) + ITEM_OVERHEAD
            ck.nbytes -= freed
            self.memory.used -= freed
        index[item.key] = len(items)
        items.append(item)
        ck.end = item.seqno
        ck.nbytes += size
        mem = self.memory
        mem.used += size
        if len(items) >= self.max_items or ck.nbytes >= self.max_bytes:
            self.close_open()
        if mem.used > mem.budget and mem.used > mem.retry_above:
            mem.reduce()

    def close_open(self) -> None:
        """Close the open checkpoint (if it has items) and open the next one."""
        ck = self._open
        if not ck.items:
            return
        ck.open = False
        ck.index = {}
        nxt = self._new_checkpoint(ck.end + 1)
        # cursors at the end of the closed checkpoint move on at once
        for c in self.cursors:
            if c.ckpt is ck and c.pos >= len(ck.items):
                c.move(nxt, 0)

    # -- cursors -----------------------------------------------------------

    @property
    def low_seqno(self) -> int:
        """The lowest seqno memory can still serve: the start of the oldest checkpoint."""
        return self.checkpoints[0].start

    def register_cursor(self, name: str, after_seqno: int,
                        on_drop: Callable[[Cursor], None] | None = None) -> tuple[Cursor, bool]:
        """A cursor positioned at the first item with seqno > `after_seqno`.

        Returns (cursor, needs_backfill). When memory no longer holds the seqnos right
        after `after_seqno`, the cursor starts at the oldest checkpoint and the caller must
        read the gap from disk first.
        """
        first = self.checkpoints[0]
        if after_seqno + 1 < first.start:
            cur = Cursor(name, self, first, 0, on_drop)
            self.cursors.add(cur)
            return cur, True
        for ck in self.checkpoints:
            if ck.end > after_seqno or ck.open:
                pos = self._position_after(ck, after_seqno)
                cur = Cursor(name, self, ck, pos, on_drop)
                self.cursors.add(cur)
                return cur, False
        raise AssertionError("the open checkpoint is always the last")  # pragma: no cover

    @staticmethod
    def _position_after(ck: Checkpoint, seqno: int) -> int:
        items = ck.items
        lo, hi = 0, len(items)
        # binary search over a list with holes: compare the nearest non-hole item
        while lo < hi:
            mid = (lo + hi) // 2
            j = mid
            while j < hi and items[j] is None:
                j += 1
            if j == hi:
                hi = mid
                continue
            if items[j].seqno <= seqno:
                lo = j + 1
            else:
                hi = mid
        return lo

    def remove_cursor(self, cursor: Cursor) -> None:
        if cursor in self.cursors:
            self.cursors.discard(cursor)
            cursor.ckpt.cursors -= 1
            cursor.dropped = True
            self.free_unreferenced()

    def read(self, cursor: Cursor) -> MemorySnapshot | None:
        """The next memory snapshot for `cursor`, or None when it has read everything."""
        if cursor.dropped:
            return None
        while True:
            ck = cursor.ckpt
            items = ck.items
            n = len(items)
            if cursor.pos < n:
                at_start = cursor.pos == 0
                snap = items[cursor.pos:n]
                if None in snap:
                    snap = [i for i in snap if i is not None]
                cursor.pos = n
                end = ck.end
                if not ck.open:
                    self._advance(cursor)
                if snap:
                    return MemorySnapshot(snap, at_start, end)
                continue
            if ck.open:
                return None
            self._advance(cursor)

    def _advance(self, cursor: Cursor) -> None:
        ck = cursor.ckpt
        idx = self.checkpoints.index(ck)
        nxt = self.checkpoints[idx + 1]
        cursor.move(nxt, 0)
        if idx == 0:
            self.free_unreferenced()

    # -- freeing -----------------------------------------------------------

    def set_persisted(self, seqno: int) -> None:
        self.persisted_seqno = seqno
        self.free_unreferenced()
        self.memory.retry_above = 0

    def free_unreferenced(self) -> None:
        """Free closed checkpoints at the front that are on disk and hold no cursor."""
        cks = self.checkpoints
        while len(cks) > 1:
            ck = cks[0]
            if ck.open or ck.cursors or ck.end > self.persisted_seqno:
                break
            cks.popleft()
            self.memory.used -= ck.nbytes
            ck.nbytes = 0
            ck.items = []

    def oldest_pinned_closed(self) -> Checkpoint | None:
        """The oldest closed checkpoint that stays only because a cursor is in it.

        A checkpoint the flusher has not persisted yet is not a candidate: dropping its
        cursors would free nothing.
        """
        ck = self.checkpoints[0]
        if ck.open or not ck.cursors or ck.end > self.persisted_seqno:
            return None
        return ck

    def drop_cursors_in(self, ck: Checkpoint) -> int:
        n = 0
        for c in list(self.cursors):
            if c.ckpt is ck:
                self.cursors.discard(c)
                ck.cursors -= 1
                c.dropped = True
                n += 1
                if c.on_drop is not None:
                    c.on_drop(c)
        return n

    def reset(self, start_seqno: int) -> None:
        """Forget every checkpoint (a rollback or a state change) and start again at `start_seqno`."""
        for c in list(self.cursors):
            self.cursors.discard(c)
            c.dropped = True
        for ck in self.checkpoints:
            self.memory.used -= ck.nbytes
        self.checkpoints.clear()
        self._new_checkpoint(start_seqno)

    def close(self) -> None:
        self.reset(self._open.end + 1)
        if self in self.memory.managers:
            self.memory.managers.remove(self)

    # -- stats ---------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return sum(ck.nbytes for ck in self.checkpoints)

    def stats(self) -> dict[str, int]:
        return {
            "num_checkpoints": len(self.checkpoints),
            "num_cursors": len(self.cursors),
            "mem_usage": self.nbytes,
            "open_checkpoint_id": self._open.id,
            "low_seqno": self.low_seqno,
        }

    def iter_items(self) -> Iterable[Item]:
        for ck in self.checkpoints:
            for it in ck.items:
                if it is not None:
                    yield it
