"""The archive plans a backup (where each vbucket starts, what a killed attempt left) and
reports its progress; the pipeline only adds where the node's streams end."""
from __future__ import annotations

from archiveutil import W, mutations, write_events

from dcptool.archive import Archive, ArchivePosition
from dcptool.archive.archive import ZERO_START, VBucketStart


def _backup(archive: Archive, btype: str, per_vb: dict[int, int], start: dict[int, int]):
    bw = archive.begin_backup(btype)
    sums = []
    for vb, n in per_vb.items():
        s0 = start.get(vb, 0)
        w = bw.vbucket(vb, ArchivePosition.at(W, s0), [(W, 0)])
        write_events(w, mutations(s0 + 1, s0 + n))
        sums.append(w.close(ArchivePosition.at(W, s0 + n)))
    return bw.commit(sums)["id"]


def test_full_and_incremental_starts(tmp_path):
    a = Archive.create(tmp_path / "a", bucket="default", vbuckets=4)
    bw = a.begin_backup("full")
    plan = bw.plan([2, 0, 1])
    assert plan.kept == {}
    assert list(plan.starts) == [0, 1, 2]
    assert all(s == VBucketStart(ZERO_START, (), False) for s in plan.starts.values())
    bw.abort()
    a.purge_partial()

    _backup(a, "full", {0: 10, 1: 20}, {})
    bw = a.begin_backup("incremental")
    plan = bw.plan(range(3))
    assert plan.starts[0] == VBucketStart(ArchivePosition.at(W, 10), ((W, 0),), False)
    assert plan.starts[1].position == ArchivePosition.at(W, 20)
    assert plan.starts[2] == VBucketStart(ZERO_START, (), False)  # new in this backup
    bw.abort()


def test_a_resumed_backup_keeps_what_completed_and_resumes_what_began(tmp_path):
    a = Archive.create(tmp_path / "a", bucket="default", vbuckets=4)
    bw = a.begin_backup("full")
    done = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(done, mutations(1, 30))
    summary = done.close(ArchivePosition.at(W, 30))
    begun = bw.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(begun, mutations(1, 300, per_snapshot=100))
    begun.abort()
    bw.abort()  # killed

    resumed = a.resume_backup()
    progress = resumed.progress()
    assert progress.poll() == (1, 30, summary["bytes"]["files"])
    plan = resumed.plan(range(3))
    assert list(plan.kept) == [0] and plan.kept[0]["counts"] == summary["counts"]
    assert sorted(plan.starts) == [1, 2]
    assert plan.starts[1].resume and not plan.starts[2].resume
    resumed.abort()
