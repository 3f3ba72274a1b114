"""Property: for any history of writes, deletes, registrations, reads and compactions, no
consumer misses a deletion, and a consumer whose registration is live is never even sent
back to seqno 0.

The model drives the node's own pieces: the purge bound (`decisions.purge_bound`), the
rollback decision (`decisions.rollback_point`) and the storage-level compaction functions
(`storage.purgeable_tombstones` / `storage.purge_tombstones`) on a real SQLite database
with the node's schema. A consumer reads like a disk backfill: the newest version of each
key above its position. Time is a counter; tombstones carry the time they were deleted.
"""
from __future__ import annotations

import sqlite3

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcptool.node import storage as S
from dcptool.node.decisions import Watermark, purge_bound, rollback_point

VBS = (0, 1)
KEYS = [b"a", b"b", b"c"]
PURGE_AGE = 2
UUID = 0xABC

ops = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(VBS), st.sampled_from(KEYS)),
    st.tuples(st.just("del"), st.sampled_from(VBS), st.sampled_from(KEYS)),
    st.tuples(st.just("setdel"), st.sampled_from(VBS), st.sampled_from(KEYS)),
    st.tuples(st.just("read"), st.integers(0, 2)),
    st.tuples(st.just("register"), st.integers(0, 2), st.integers(1, 6)),
    st.tuples(st.just("unregister"), st.integers(0, 2)),
    st.tuples(st.just("tick"), st.integers(1, 3)),
    st.tuples(st.just("compact"), st.booleans()),
)


class Node:
    """One bucket's disk (the node's schema in SQLite) and its seqno counters."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", isolation_level=None)
        self.db.executescript(S._SCHEMA)
        for vb in VBS:
            self.db.execute("INSERT INTO vbucket_meta (vb, state, failover) VALUES (?, 1, '[]')",
                            (vb,))
        self.high = {vb: 0 for vb in VBS}
        self.truth: dict[int, dict[bytes, bool]] = {vb: {} for vb in VBS}  # key -> live

    def write(self, vb: int, key: bytes, live: bool, now: int) -> None:
        cur = self.truth[vb].get(key)
        if not live and not cur:
            return  # DELETE of a missing document: KEY_ENOENT, nothing written
        self.high[vb] += 1
        s = self.high[vb]
        # the flusher's upsert: the newest version of a key replaces its row
        self.db.execute(S._UPSERT_ITEM, (S.row_id(vb, s), vb, key, 1, s, 0, 0, 0,
                                         0 if live else 1, 0 if live else now, b""))
        self.db.execute("UPDATE vbucket_meta SET persisted_seqno = ? WHERE vb = ?", (s, vb))
        self.truth[vb][key] = live

    def purge_seqno(self, vb: int) -> int:
        return self.db.execute("SELECT purge_seqno FROM vbucket_meta WHERE vb = ?",
                               (vb,)).fetchone()[0]

    def backfill(self, vb: int, start: int) -> list[tuple[bytes, bool]]:
        rows = self.db.execute(
            "SELECT key, op FROM items WHERE id > ? AND id <= ? ORDER BY id",
            (S.row_id(vb, start), S.row_id(vb, self.high[vb]))).fetchall()
        return [(bytes(k), op == 0) for k, op in rows]

    def compact(self, watermarks: list[Watermark], now: int, drop_deletes: bool) -> None:
        for vb in VBS:
            bound = purge_bound(vb, watermarks, now=now, purge_age=PURGE_AGE,
                                before=float("inf") if drop_deletes else None)
            limit = self.high[vb] if bound.seqno is None else min(bound.seqno, self.high[vb])
            cands = S.purgeable_tombstones(self.db, vb, 0, limit, bound.before)
            if cands:
                purged = [s for s, _k in cands]
                S.purge_tombstones(self.db, vb, purged, max(purged))


class Consumer:
    def __init__(self) -> None:
        self.pos = {vb: 0 for vb in VBS}
        self.view: dict[int, dict[bytes, bool]] = {vb: {} for vb in VBS}
        self.rollbacks = 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=20, max_size=80))
def test_no_registered_live_consumer_misses_a_deletion(history):
    node = Node()
    consumers = [Consumer() for _ in range(3)]
    rows: dict[int, Watermark] = {}        # consumer -> its registration
    purge_then: dict[int, dict[int, int]] = {}  # consumer -> purge seqnos when it registered
    now = 100

    def live_rows() -> list[Watermark]:
        return [w for w in rows.values() if w.live(now)]

    for op in history:
        kind = op[0]
        if kind in ("set", "del"):
            node.write(op[1], op[2], kind == "set", now)
        elif kind == "setdel":  # a document written and deleted again: a tombstone
            node.write(op[1], op[2], True, now)
            node.write(op[1], op[2], False, now)
        elif kind == "tick":
            now += op[1]
        elif kind == "register":
            c = consumers[op[1]]
            rows[op[1]] = Watermark(f"c{op[1]}", dict(c.pos), now + op[2])
            purge_then[op[1]] = {vb: node.purge_seqno(vb) for vb in VBS}
        elif kind == "unregister":
            rows.pop(op[1], None)
        elif kind == "compact":
            # the purger drops expired rows first, then bounds itself by the live ones
            for i in [i for i, w in rows.items() if not w.live(now)]:
                del rows[i]
            node.compact(live_rows(), now, op[1])
            for i, w in rows.items():
                for vb, s in w.seqnos.items():
                    # a live row stops the purger (one registered behind it came too late)
                    assert node.purge_seqno(vb) <= max(s, purge_then[i][vb]), \
                        "the purger passed a live watermark"
        elif kind == "read":
            i = op[1]
            c = consumers[i]
            w = rows.get(i)
            for vb in VBS:
                purge = node.purge_seqno(vb)
                rb = rollback_point([(UUID, 0)], c.pos[vb], UUID, c.pos[vb], c.pos[vb],
                                    node.high[vb], purge)
                if rb is not None:
                    assert rb == 0
                    # only a consumer whose registration is gone (or never was) or that
                    # registered after falling behind may be sent back to 0
                    assert w is None or not w.live(now) or w.seqnos[vb] < purge_then[i][vb]
                    c.rollbacks += 1
                    c.pos[vb] = 0
                    c.view[vb] = {}
                for key, live in node.backfill(vb, c.pos[vb]):
                    c.view[vb][key] = live
                c.pos[vb] = node.high[vb]
                # what it holds now is the node's state: no deletion was missed
                mine = {k for k, live in c.view[vb].items() if live}
                truth = {k for k, live in node.truth[vb].items() if live}
                assert mine == truth, (vb, mine, truth)


def test_the_model_catches_a_purger_that_ignores_the_table():
    """The property is not vacuous: purging past a live watermark makes a consumer
    that asks from its registered position roll back, which the test forbids."""
    node = Node()
    c = Consumer()
    node.write(0, b"a", True, 100)
    c.pos[0] = node.high[0]
    row = Watermark("c0", {0: c.pos[0]}, 10_000)
    node.write(0, b"a", False, 100)
    node.compact([], 200, False)          # the table ignored
    assert node.purge_seqno(0) == 2 > row.seqnos[0]
    assert rollback_point([(UUID, 0)], c.pos[0], UUID, c.pos[0], c.pos[0], node.high[0],
                          node.purge_seqno(0)) == 0
    node2 = Node()
    node2.write(0, b"a", True, 100)
    node2.write(0, b"a", False, 100)
    node2.compact([row], 200, False)      # the table respected
    assert node2.purge_seqno(0) == 0
