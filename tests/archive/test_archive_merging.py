"""The archive's merge lifecycle without Spark: plan, stage, commit, publish, finish an
interrupted merge. Invariant: a merge never rewrites the files of a committed backup that
survives it; the chain is re-pointed by the merged manifest alone."""
from __future__ import annotations

import hashlib
import shutil

import pytest

from dcptool.archive import Archive
from dcptool.archive.chain import descendant_cuts, effective_parents
from dcptool.archive.merging import (
    STAGING,
    StagedMerge,
    finish_interrupted_merges,
    merge_vbucket,
    plan_merge,
)
from dcptool.archive.verify import verify_archive
from dcptool.errors import UsageError

VBS = 4
UUID = 0x5151
T0 = 1_700_000_000_000_000_000


def _mut(s: int, key: bytes, v: int) -> tuple:
    return (3, s, s, T0 + s, 0, 0, 1, key, b'{"v":%d}' % v, None)


def _chain(path, rounds: int = 4, passphrase: str | None = None) -> list[str]:
    """`rounds` backups: a full one with 20 documents per vbucket, then incrementals that
    update 5 of them, delete one and add 3 (an encrypted archive with `passphrase`)."""
    a = Archive.create(path, bucket="default", vbuckets=VBS, passphrase=passphrase)
    seq = [0] * VBS
    ids = []
    for n in range(rounds):
        bw = a.begin_backup("full" if n == 0 else "incremental")
        sums = []
        for vb in range(VBS):
            s0 = seq[vb]
            w = bw.vbucket(vb, {"uuid": UUID, "seqno": s0, "snap_start": s0, "snap_end": s0},
                           [[UUID, 0]])
            if n == 0:
                recs = [_mut(s0 + i + 1, b"k%d-%d" % (vb, i), 0) for i in range(20)]
            else:
                recs = [_mut(s0 + i + 1, b"k%d-%d" % (vb, i), n) for i in range(5)]
                recs.append((4, s0 + 6, s0 + 6, T0 + s0 + 6, b"k%d-%d" % (vb, 10 + n), 0, 0, b""))
                recs += [_mut(s0 + 7 + i, b"n%d-%d-%d" % (vb, n, i), n) for i in range(3)]
            w.write([(2, s0 + 1, s0 + len(recs), 2)] + recs)
            seq[vb] = e = s0 + len(recs)
            sums.append(w.close({"uuid": UUID, "seqno": e, "snap_start": e, "snap_end": e}))
        ids.append(bw.commit(sums)["id"])
    return ids


def _state(archive: Archive) -> dict:
    return {vb: archive.resolve_vbucket(vb) for vb in range(VBS)}


def _digests(archive: Archive) -> dict[str, str]:
    """sha256 of every file of every committed backup, by relative path."""
    out = {}
    for bid in archive.committed_ids():
        for f in sorted(archive.backup_dir(bid).iterdir()):
            out[f"{bid}/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _merge(archive: Archive, first=None, last=None, *, publish: bool = True):
    """The whole lifecycle in this process (the pipeline runs merge_vbucket in tasks)."""
    with archive.lock("merge"):
        finish_interrupted_merges(archive)
        plan = plan_merge(archive, first, last)
        staged = StagedMerge.begin(archive, plan)
        summaries = [merge_vbucket(staged.target, p) for p in plan.vbuckets.values()]
        staged.commit(summaries)
        if publish:
            staged.publish()
    return plan


def test_merge_never_rewrites_a_surviving_backup(tmp_path):
    path = tmp_path / "a"
    b1, b2, b3, b4 = _chain(path)
    a = Archive.open(path)
    before = _digests(a)
    state = _state(a)

    plan = _merge(a, last=b2)
    a = Archive.open(path)
    assert plan.replaced == [b1, b2] and plan.children == [b3]
    assert a.committed_ids() == [plan.merged_id, b3, b4]
    after = _digests(a)
    survivors = {k: v for k, v in before.items() if k.split("/")[0] in (b3, b4)}
    assert survivors and all(after[k] == v for k, v in survivors.items())
    # b3 still names b2; the chain runs through the merged backup
    assert a.manifest(b3)["parent"] == b2
    assert a.parent_of(b3) == plan.merged_id
    assert [b.id for b in a.chain()] == [plan.merged_id, b3, b4]
    assert a.chain_ids() == [plan.merged_id, b3, b4]
    assert effective_parents(a.manifests())[b3] == plan.merged_id
    assert _state(a) == state
    report = verify_archive(path)
    assert report.ok, report.problems
    assert not (path / STAGING).exists()


def test_merging_a_merged_backup_again_resolves_transitively(tmp_path):
    path = tmp_path / "a"
    b1, b2, b3, b4 = _chain(path)
    a = Archive.open(path)
    state = _state(a)
    m1 = _merge(a, last=b2)
    m2 = _merge(Archive.open(path), last=b3)  # m1 + b3: b4 names b3, b3 named b2
    a = Archive.open(path)
    assert m2.replaced == [m1.merged_id, b3] and m2.children == [b4]
    assert a.committed_ids() == [m2.merged_id, b4]
    assert a.manifest(b4)["parent"] == b3 and a.parent_of(b4) == m2.merged_id
    assert _state(a) == state
    assert verify_archive(path).ok
    assert descendant_cuts(a.manifests()) == {m2.merged_id: {}, b4: {}}


def test_an_interrupted_merge_is_finished_without_touching_the_survivors(tmp_path):
    path = tmp_path / "a"
    b1, b2, b3, b4 = _chain(path)
    a = Archive.open(path)
    state = _state(a)
    keep = tmp_path / "kept"
    for b in (b1, b2):
        shutil.copytree(a.backup_dir(b), keep / b)
    plan = _merge(a, last=b2)
    for b in (b1, b2):  # as if killed right after the rename
        shutil.copytree(keep / b, a.backup_dir(b))
    a = Archive.open(path)
    before = _digests(a)
    # the originals are committed again: links lead to them, restores are the same
    assert a.parent_of(b3) == b2
    assert _state(a) == state
    with a.lock("merge"):
        assert finish_interrupted_merges(a) == [b1, b2]
    a = Archive.open(path)
    assert a.committed_ids() == [plan.merged_id, b3, b4]
    after = _digests(a)
    assert all(after[k] == before[k] for k in after)
    assert a.parent_of(b3) == plan.merged_id and _state(a) == state


def test_a_merge_that_fails_before_publishing_leaves_the_archive_unchanged(tmp_path):
    path = tmp_path / "a"
    _chain(path, rounds=3)
    a = Archive.open(path)
    before = _digests(a)
    _merge(a, publish=False)  # committed in staging, never published
    with a.lock("merge"):
        assert finish_interrupted_merges(a) == []
    assert not (path / STAGING).exists()
    assert _digests(Archive.open(path)) == before


def test_the_plan_of_a_range_inside_the_chain(tmp_path):
    path = tmp_path / "a"
    b1, b2, b3, b4 = _chain(path)
    a = Archive.open(path)
    with a.lock("merge"):
        with pytest.raises(UsageError, match="nothing to merge"):
            plan_merge(a, b4, b4)
        plan = plan_merge(a, b2, b3)
        assert plan.parent == b1 and plan.type == "incremental" and plan.children == [b4]
        assert sorted(plan.vbuckets) == list(range(VBS))
        assert [p[1]["vbucket"] for p in plan.vbuckets[2].parts] == [2, 2]
