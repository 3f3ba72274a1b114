"""Chain resolution: newest version of each key, dead branches cut by rollback records."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archiveutil import W, X, backup, doc, mutations, seed_004_archive, write_events

from dcptool.archive import (
    Archive,
    ArchiveError,
    ArchivePosition,
    ResolutionError,
    mark_dead,
    part_cuts,
    resolve,
    resolved_in_seqno_order,
)
from dcptool.archive.verify import verify_archive


def deletion(seqno: int, key: bytes) -> tuple:
    return (4, seqno, 2, seqno, key, 99, 0, b"")


def expiration(seqno: int, key: bytes) -> tuple:
    return (5, seqno, 2, seqno, key, 99, 0, b"")


def rollback(seqno: int, uuid: int = W) -> tuple:
    return (6, seqno, uuid)


# -- the seed 004 scenario, with real files --------------------------------------------------


def test_seed_004_dead_branch_is_not_restored(tmp_path):
    archive, full, inc = seed_004_archive(tmp_path / "arc")
    state = archive.resolve_vbucket(0)
    # the rollback to 900 was recorded in the second backup, not performed on the first
    assert inc["vbuckets"][0]["rollbacks"] == [{"seqno": 900, "vbucket_uuid": W}]
    assert full["totals"]["mutations"] == 1000
    # documents 901..950 existed only on the dead branch: gone
    assert not any(b"doc-%d" % s in state for s in range(901, 951))
    # seqnos 951..1000 updated doc-1..doc-50 on the dead branch: the versions before 900 win
    for k in range(1, 51):
        assert state[b"doc-%d" % k][1] == k
    # nothing resolved comes from above 900 of history W
    assert all(r[1] <= 900 or r[7].startswith(b"new-") for r in state.values())
    # the live branch's documents are there
    assert all(state[b"new-%d" % s][1] == s for s in range(901, 961))
    assert len(state) == 900 + 60
    # as of the first backup, the dead branch was still the truth
    first = archive.resolve_vbucket(0, backup=full["id"])
    assert len(first) == 950 and first[b"doc-1"][1] == 951 and first[b"doc-950"][1] == 950
    assert verify_archive(archive.path).ok


def test_seed_004_as_of_a_seqno(tmp_path):
    archive, _full, _inc = seed_004_archive(tmp_path / "arc")
    at_500 = archive.resolve_vbucket(0, upto_seqno=500)
    assert sorted(r[1] for r in at_500.values()) == list(range(1, 501))
    at_920 = archive.resolve_vbucket(0, upto_seqno=920)
    assert len(at_920) == 900 + 20 and b"new-920" in at_920 and b"new-921" not in at_920


def test_rollback_inside_one_backup_removes_its_own_newer_records(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=1)
    bw = a.begin_backup("full", block_size=2000)
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w, mutations(1, 1000, per_snapshot=100))
    w.rollback(900, W)
    w.stream(ArchivePosition.at(W, 900), [(X, 900), (W, 0)])
    write_events(w, mutations(901, 950, per_snapshot=25, prefix=b"new-"))
    s = w.close(ArchivePosition.at(X, 950))
    bw.commit([s])
    items = [r for r in a.backup(bw.id).records(0) if r[0] == 3]
    assert [r[1] for r in items] == list(range(1, 951))
    assert all(r[7] == b"doc-%d" % r[1] for r in items[:900])
    assert s["counts"]["mutations"] == 950 and s["counts"]["rollbacks"] == 1
    assert s["counts"]["snapshots"] == 9 + 2
    assert verify_archive(a.path).ok
    assert set(a.resolve_vbucket(0)) == {b"doc-%d" % i for i in range(1, 901)} | {
        b"new-%d" % i for i in range(901, 951)}


def test_rollback_to_a_seqno_inside_a_snapshot_is_refused(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=1)
    bw = a.begin_backup("full")
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w, mutations(1, 300, per_snapshot=100))
    with pytest.raises(ArchiveError, match="250 is not a snapshot boundary"):
        w.rollback(250, W)
    w.rollback(200, W)  # a snapshot end is fine
    s = w.close(ArchivePosition.at(W, 200))
    assert s["counts"]["mutations"] == 200


def test_rollback_below_this_backups_start(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=1)
    backup(a, "full", {0: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 300),
                           "events": mutations(1, 300)}})
    bw = a.begin_backup("incremental")
    w = bw.vbucket(0, ArchivePosition.at(W, 300), [(W, 0)])
    write_events(w, mutations(301, 320, prefix=b"later-"))  # streamed, then the connection fell
    w.rollback(100, W)  # and the node failed over to a replica at 100
    write_events(w, [("stream", ArchivePosition.at(W, 100), [(X, 100), (W, 0)])]
                 + mutations(101, 110, prefix=b"x-"))
    s = w.close(ArchivePosition.at(X, 110))
    bw.commit([s])
    state = a.resolve_vbucket(0)
    assert set(state) == {b"doc-%d" % i for i in range(1, 101)} | {b"x-%d" % i for i in
                                                                   range(101, 111)}
    assert verify_archive(a.path).ok


# -- the pure function ------------------------------------------------------------------------


def test_resolve_keeps_deletions_and_can_drop_them():
    parts = [[doc(1, b"a"), doc(2, b"b"), doc(3, b"c")],
             [deletion(4, b"a"), expiration(5, b"b"), doc(6, b"c", b"new")]]
    state = resolve(parts)
    assert state[b"a"][0] == 4 and state[b"b"][0] == 5 and state[b"c"][8] == b"new"
    assert set(resolve(parts, include_deletions=False)) == {b"c"}
    assert [r[1] for r in resolved_in_seqno_order(parts)] == [4, 5, 6]


def test_rollback_revives_older_versions_from_older_parts():
    parts = [[doc(1, b"k", b"v1"), doc(5, b"k", b"v5")],
             [doc(8, b"k", b"v8")],
             [rollback(3), doc(4, b"k", b"v4-new-branch")]]
    assert resolve(parts)[b"k"][8] == b"v4-new-branch"
    assert resolve(parts[:2])[b"k"][8] == b"v8"
    parts2 = [[doc(1, b"k", b"v1"), doc(5, b"k", b"v5")], [rollback(3)]]
    assert resolve(parts2)[b"k"][8] == b"v1"
    # the lowest rollback of any later part wins
    parts3 = [[doc(1, b"k", b"v1"), doc(2, b"j"), doc(5, b"k", b"v5")],
              [rollback(3), doc(4, b"j")], [rollback(1)]]
    assert resolve(parts3) == {b"k": doc(1, b"k", b"v1")}


def test_resolution_refuses_a_rollback_after_newer_records_of_its_own_part():
    with pytest.raises(ResolutionError, match="rollback record to seqno 3"):
        resolve([[doc(1, b"a"), doc(5, b"b"), rollback(3)]])
    with pytest.raises(ResolutionError, match="does not increase"):
        resolve([[doc(5, b"a"), doc(4, b"b")]])


def test_part_cuts_and_mark_dead():
    assert part_cuts([[], [900], [], [950, 700], []]) == [700, 700, 700, None, None]
    parts = [[doc(1, b"a"), doc(950, b"b")], [rollback(900), doc(901, b"c")]]
    marks = [(i, r[1], dead) for i, r, dead in mark_dead(parts, [[], [900]])]
    assert marks == [(0, 1, False), (0, 950, True), (1, 901, False)]


# -- property: resolution equals a simple model ------------------------------------------------


def model(parts, upto=None, include_deletions=True):
    """Flatten; a record is dead when any later rollback record is below its seqno; each
    key's state is its last live record at or below `upto`."""
    flat = [r for p in parts for r in p]
    out = {}
    for i, r in enumerate(flat):
        if r[0] not in (3, 4, 5):
            continue
        if any(x[0] == 6 and x[1] < r[1] for x in flat[i + 1:]):
            continue
        if upto is not None and r[1] > upto:
            continue
        out[r[7] if r[0] == 3 else r[4]] = r
    if not include_deletions:
        out = {k: v for k, v in out.items() if v[0] == 3}
    return out


@st.composite
def histories(draw):
    keys = [b"k%d" % i for i in range(draw(st.integers(1, 6)))]
    high = 0  # highest seqno of the live branch
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        part = [(1, W, high, high, high, ())]
        top = -1  # highest item seqno in this part
        for _step in range(draw(st.integers(0, 12))):
            action = draw(st.sampled_from(["item"] * 6 + ["snap", "rollback"]))
            if action == "snap":
                part.append((2, high + 1, high + 5, 0))
            elif action == "rollback":
                low = max(top, 0)
                s = draw(st.integers(low, high)) if low <= high else high
                part.append(rollback(s))
                high = s
            else:
                high += draw(st.integers(1, 3))
                top = high
                key = draw(st.sampled_from(keys))
                kind = draw(st.sampled_from([3, 3, 4, 5]))
                part.append(doc(high, key, b"%d" % high) if kind == 3 else
                            deletion(high, key) if kind == 4 else expiration(high, key))
        parts.append(part)
    upto = draw(st.one_of(st.none(), st.integers(0, high + 2)))
    return parts, upto


@settings(max_examples=400, deadline=None)
@given(histories(), st.booleans())
def test_resolution_equals_the_model(history, include_deletions):
    parts, upto = history
    got = resolve(parts, upto_seqno=upto, include_deletions=include_deletions)
    assert got == model(parts, upto, include_deletions)
    # the forward form a Spark reader can use: drop records above their part's cut, then
    # take the highest surviving seqno of each key
    cuts = part_cuts([[r[1] for r in p if r[0] == 6] for p in parts])
    best = {}
    for cut, part in zip(cuts, parts):
        for r in part:
            alive = cut is None or r[1] <= cut
            if r[0] in (3, 4, 5) and alive and (upto is None or r[1] <= upto):
                k = r[7] if r[0] == 3 else r[4]
                if k not in best or r[1] > best[k][1]:
                    best[k] = r
    if not include_deletions:
        best = {k: v for k, v in best.items() if v[0] == 3}
    assert best == got


def test_rollback_point_is_the_latest_live_snapshot_end(tmp_path):
    archive, _full, _inc = seed_004_archive(tmp_path / "arc")
    # the chain holds snapshot ends every 100 up to 900 on W, then 920, 940, 960 on X
    assert archive.rollback_point(0, 950) == ArchivePosition.at(X, 940)
    assert archive.rollback_point(0, 930) == ArchivePosition.at(X, 920)
    assert archive.rollback_point(0, 919) == ArchivePosition.at(X, 900)  # X began at 900
    assert archive.rollback_point(0, 899) == ArchivePosition.at(W, 800)
    assert archive.rollback_point(0, 5) == ArchivePosition.at(W, 0)
    # as of the first backup, 1000 was a boundary of W; after the rollback it is dead
    first = archive.chain()[0].id
    assert archive.rollback_point(0, 2000, upto=first) == ArchivePosition.at(W, 1000)
    assert archive.rollback_point(0, 2000) == ArchivePosition.at(X, 960)
    assert archive.rollback_point(3, 100) == ArchivePosition(0, 0, 0, 0)  # never backed up


def test_snapshot_boundaries():
    from dcptool.archive import snapshot_boundaries
    recs = [(0, "dcptool-archive", 1, 0, "id", 0), (1, W, 10, 10, 10, ()),
            (2, 11, 20, 0), doc(11, b"a"), doc(20, b"b"),       # complete: item at its end
            (2, 21, 30, 0), doc(22, b"c"),                      # complete: next marker follows
            (2, 31, 40, 0), doc(33, b"d"),                      # open when the rollback comes
            rollback(40), (2, 41, 50, 0), doc(45, b"e"), (7, X, 50, 50, 50)]
    assert snapshot_boundaries(recs) == [10, 20, 30, 40, 50]
    # a rollback below the stream's start removes the boundaries above it
    recs = [(1, W, 1000, 1000, 1000, ()), rollback(900), (1, W, 900, 900, 900, ()),
            (2, 901, 920, 0), doc(920, b"x"), (7, X, 920, 920, 920)]
    assert snapshot_boundaries(recs) == [900, 920]


# -- long runs of mutations (resolved a run at a time) ----------------------------------------


def _one_by_one(parts, upto=None):
    """resolve() over parts given as generators, so that every record is seen alone."""
    return resolve([(r for r in p) for p in parts], upto_seqno=upto)


def test_long_runs_resolve_as_record_by_record():
    """Runs of mutations long enough to be taken at once, with keys written again, cut by
    a later rollback, by a seqno inside a run and by deletions in between: the same state
    as when the parts yield their records one at a time, and in plain lists."""
    older = [doc(s, b"k%d" % (s % 30)) for s in range(1, 101)]
    older[50] = deletion(51, b"k21")  # two runs of 50 and 49 around it
    newer = [rollback(70)] + [doc(s, b"k%d" % (s % 45)) for s in range(71, 131)] \
        + [deletion(131, b"k3")] + [doc(s, b"n%d" % s) for s in range(132, 170)]
    for upto in (None, 85, 140, 60):
        want = _one_by_one([older, newer], upto)
        # plain lists are resolved in chunks, with their runs at once
        assert resolve([older, newer], upto_seqno=upto) == want
    state = resolve([older, newer])
    assert state[b"k3"][0] == 4 and state[b"k21"][1] == 111
    assert state[b"k29"][1] == 119 and resolve([older, newer], upto_seqno=60)[b"k0"][1] == 60


def test_a_seqno_that_does_not_increase_inside_a_long_run_is_named():
    recs = [doc(s, b"k%d" % s) for s in range(1, 41)]
    recs[25] = doc(20, b"k25")
    with pytest.raises(ResolutionError, match=r"item seqno 20 does not increase \(after 25\)"):
        resolve([recs])
