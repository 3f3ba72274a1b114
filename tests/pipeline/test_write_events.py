"""The backup task's event loop (`write_events`) and `VBucketWriter.mutation_events` write
the same records as one writer call per event."""
from __future__ import annotations

import pytest

from dcptool.archive import FULL, Archive, VBucketWriter
from dcptool.archive.reader import iter_vbucket_batches, iter_vbucket_records
from dcptool.client.events import DELETION, EXPIRATION, MUTATION, SNAPSHOT, STREAM_END, STREAM_OPEN
from dcptool.client.position import ZERO, Position
from dcptool.pipeline.backup import write_events
from dcptool.pipeline.plans import VBucketPlan

START = {"uuid": 0, "seqno": 0, "snap_start": 0, "snap_end": 0}


def _events(vbs=(0, 1, 2), per_vb=1500, snap=100, value=b'{"v":"' + b"x" * 200 + b'"}'):
    """Interleaved snapshots of mutations, deletions and expirations, values as memoryviews
    for one vbucket (as a session with copy_values=False hands them out)."""
    out = [(STREAM_OPEN, vb, [(0xAB, 0)], Position(0xAB, 0, 0, 0, ((0xAB, 0),))) for vb in vbs]
    for base in range(0, per_vb, snap):
        for vb in vbs:
            out.append((SNAPSHOT, vb, base + 1, base + snap, 1))
            for s in range(base + 1, base + snap + 1):
                key = b"k-%d-%d" % (vb, s)
                if s % 37 == 0:
                    out.append((DELETION, vb, s, 2, 1000 + s, 0, 77, 0, key, b""))
                elif s % 41 == 0:
                    out.append((EXPIRATION, vb, s, 2, 1000 + s, 0, 78, 0, key, b""))
                else:
                    v = memoryview(value) if vb == 1 else value + b"%d" % s
                    out.append((MUTATION, vb, s, 1, 1000 + s, 5, 0, 1, key, v))
    return out


class FakeConsumer:
    def __init__(self, events, batch=997):
        self.events = events
        self.batch = batch
        self.ends = {}

    def batches(self, tick=1.0):
        evs = self.events
        for i in range(0, len(evs), self.batch):
            chunk = evs[i:i + self.batch]
            for e in chunk:
                if e[0] in (MUTATION, DELETION, EXPIRATION):
                    self.ends[e[1]] = e[2]
            yield chunk
        yield [(STREAM_END, vb, 0, False) for vb in sorted(self.ends)]

    def position(self, vb):
        s = self.ends[vb]
        return Position(0xAB, s, s, s)


def _setup(tmp_path, name, vbs, **kw):
    a = Archive.create(tmp_path / name, bucket="b", vbuckets=4)
    bw = a.begin_backup(FULL, **kw)
    writers = {vb: VBucketWriter(a, bw.id, vb, START, (), ) for vb in vbs}
    return a, bw, writers


def _records(a, bw, summaries):
    out = {}
    for s in summaries:
        recs = list(iter_vbucket_records(a.path / "backups" / bw.id, s))
        out[s["vbucket"]] = [r for r in recs[1:]]  # drop the header (holds the backup id)
    return out


def test_write_events_matches_per_event_calls(tmp_path):
    vbs = (0, 1, 2)
    events = _events(vbs)
    # reference: one writer call per event
    a1, bw1, w1 = _setup(tmp_path, "ref", vbs)
    last = {}
    for ev in events:
        k = ev[0]
        if k == MUTATION:
            w1[ev[1]].mutation(*ev[2:])
            last[ev[1]] = ev[2]
        elif k == SNAPSHOT:
            w1[ev[1]].marker(ev[2], ev[3], ev[4])
        elif k in (DELETION, EXPIRATION):
            f = w1[ev[1]].deletion if k == DELETION else w1[ev[1]].expiration
            f(ev[2], ev[3], ev[4], ev[8], ev[6], ev[7], ev[9])
            last[ev[1]] = ev[2]
        elif k == STREAM_OPEN:
            w1[ev[1]].stream({"uuid": 0xAB, "seqno": 0, "snap_start": 0, "snap_end": 0}, ev[2])
    ref = [w1[vb].close({"uuid": 0xAB, "seqno": last[vb], "snap_start": last[vb],
                         "snap_end": last[vb]}) for vb in vbs]

    a2, bw2, w2 = _setup(tmp_path, "loop", vbs)
    plan = {vb: VBucketPlan(vb, ZERO, 0) for vb in vbs}
    run = {vb: {"opens": 0, "retries": 0, "first_open": None} for vb in vbs}
    summaries = []
    pending = write_events(FakeConsumer(events), w2, plan, {vb: ZERO for vb in vbs}, run,
                           summaries, 0.0)
    assert pending == set()
    assert sorted(s.vbucket for s in summaries) == list(vbs)
    for s in summaries:
        assert s.run["opens"] == 1
    summaries = [s.entry for s in summaries]
    by_vb = {s["vbucket"]: s for s in summaries}
    for r in ref:
        s = by_vb[r["vbucket"]]
        assert s["counts"] == r["counts"]
        assert s["bytes"]["values"] == r["bytes"]["values"]
    assert _records(a1, bw1, ref) == _records(a2, bw2, summaries)


def test_mutation_events_counts_across_frames(tmp_path):
    a, bw, w = _setup(tmp_path, "frames", (3,))
    wr = w[3]
    wr.stream(START, [])
    value = b"y" * 4000
    evs = [(MUTATION, 3, s, 1, s, 0, 0, 0, b"key%d" % s, value) for s in range(1, 1001)]
    wr.marker(1, 1000, 1)
    wr.mutation_events(evs, 0, 400)
    wr.mutation_events(evs, 400)
    summary = wr.close({"uuid": 0, "seqno": 1000, "snap_start": 1, "snap_end": 1000})
    assert summary["counts"]["mutations"] == 1000
    assert summary["bytes"]["values"] == 4000 * 1000
    recs = list(iter_vbucket_records(a.path / "backups" / bw.id, summary))
    muts = [r for r in recs if r[0] == 3]
    assert [r[1] for r in muts] == list(range(1, 1001))
    assert all(r[8] == value for r in muts)


def test_mutation_run_stops_at_the_first_event_of_another_vbucket_or_kind(tmp_path):
    a, bw, w = _setup(tmp_path, "runs", (3, 4))
    wr = w[3]
    wr.stream(START, [])
    wr.marker(1, 10, 1)
    value = b'{"v":1}'
    evs = ([(MUTATION, 3, s, 1, s, 0, 0, 1, b"k%d" % s, value) for s in range(1, 5)]
           + [(MUTATION, 4, 1, 1, 1, 0, 0, 1, b"other", value)]
           + [(MUTATION, 3, s, 1, s, 0, 0, 1, b"k%d" % s, memoryview(value)) for s in range(5, 8)]
           + [(SNAPSHOT, 3, 8, 10, 1)])
    assert wr.mutation_run(evs, 0) == 4       # stops at vbucket 4's mutation
    assert wr.mutation_run(evs, 5) == 8       # views copied; stops at the marker
    assert wr.mutation_run(evs, 5, 6) == 6    # and at hi
    summary = wr.close({"uuid": 0, "seqno": 7, "snap_start": 1, "snap_end": 10})
    recs = [r for r in iter_vbucket_records(a.path / "backups" / bw.id, summary) if r[0] == 3]
    assert [r[1] for r in recs] == [1, 2, 3, 4, 5, 6, 7, 5]
    assert all(r[8] == value and type(r[8]) is bytes for r in recs)
    w[4].stream(START, [])
    with pytest.raises(ValueError, match="one vbucket's mutations"):
        w[4].mutation_events(evs, 3, 6)  # vbucket 3's, then 4's


def test_mutation_runs_cut_blocks_where_single_calls_do(tmp_path):
    """Runs of mutations (whole runs that fit in the block, runs the block fills up inside)
    give the same frames, record for record, as one `mutation()` call per event."""
    vbs = (0, 1)
    # values of 1-3 KB: with 6 KB blocks a run fits whole, or fills the block once or more
    evs = [(MUTATION, vb, s, 1, 7 * s, 0, 0, 1, b"k-%d-%04d" % (vb, s), b"v" * (1000 + (s * 397) % 2000))
           for base in range(0, 300, 20) for vb in vbs for s in range(base + 1, base + 21)]
    a1, bw1, w1 = _setup(tmp_path, "ref", vbs, block_size=6000)
    a2, bw2, w2 = _setup(tmp_path, "runs", vbs, block_size=6000)
    for e in evs:
        w1[e[1]].mutation(*e[2:])
    i = 0
    for size in [1, 7, 3, 40, 2, 19] * 100:  # uneven pieces: runs end inside batches too
        piece = evs[i:i + size]
        j = 0
        while j < len(piece):
            j = w2[piece[j][1]].mutation_run(piece, j)
        i += size
        if i >= len(evs):
            break
    end = {"uuid": 0, "seqno": 300, "snap_start": 1, "snap_end": 300}
    for vb in vbs:
        ref = w1[vb].close(end)
        got = w2[vb].close(end)
        frames_ref = [b for b in iter_vbucket_batches(a1.path / "backups" / bw1.id, ref)]
        frames_got = [b for b in iter_vbucket_batches(a2.path / "backups" / bw2.id, got)]
        assert len(frames_ref) > 20
        # the first frame holds the header (with the backup id): compare what follows it
        assert frames_got[0][1:] == frames_ref[0][1:]
        assert frames_got[1:] == frames_ref[1:]
        assert got["counts"] == ref["counts"] and got["bytes"]["values"] == ref["bytes"]["values"]
