"""`dcptool merge`: a chain with updates, deletions and a recorded rollback folds into one
backup with the same restore. Real node processes, the shared SparkSession, real files."""
from __future__ import annotations

import json

import pytest
from cliutil import cli
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.archive.verify import verify_archive
from dcptool.pipeline.backup import run_backup
from dcptool.archive.merging import STAGING
from dcptool.pipeline.merge import run_merge
from dcptool.pipeline.restore import resolved_records, run_restore
from dcptool.protocol import vbucket_of

VBS = 16


def restore_state(path, backup=None) -> dict:
    """{vb: [what restore writes, in order]} straight from restore's own resolution."""
    return {vb: list(resolved_records(str(path), vb, backup)) for vb in range(VBS)}


@pytest.fixture(scope="module")
def chain(tmp_path_factory, spark):
    """Five backups: B1 full; B2 updates and deletions; B3 documents the node never
    persisted; B4 after an unclean restart (rollbacks recorded) with new documents;
    B5 more updates and deletions. The node's final state and the restore before any merge."""
    base = tmp_path_factory.mktemp("merge")
    path = base / "archive"
    node = NodeProcess(base / "src", vbuckets=VBS).start()
    try:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"doc::{i:04d}": {"i": i, "v": 1} for i in range(1500)}, VBS)
        run_backup(opts, path, spark=spark)
        with opts.connect() as conn:
            load(conn, {f"doc::{i:04d}": {"i": i, "v": 2} for i in range(0, 200)}, VBS, flags=3)
            delete(conn, [f"doc::{i:04d}" for i in range(200, 300)], VBS)
        run_backup(opts, path, spark=spark)
        node.extra_args = ("--flush-interval", "3600")
        node.restart()
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"late::{i}": {"i": i} for i in range(100)}, VBS)
            load(conn, {f"doc::{i:04d}": {"i": i, "v": "late"} for i in range(1000, 1010)}, VBS)
        run_backup(opts, path, spark=spark)
        node.kill()  # the late writes were never persisted: a new history branch
        node.extra_args = ()
        node.start()
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"after::{i}": {"i": i} for i in range(80)}, VBS)
        b4 = run_backup(opts, path, spark=spark)
        assert b4.rollbacks > 0
        with opts.connect() as conn:
            load(conn, {f"doc::{i:04d}": {"i": i, "v": 5} for i in range(0, 50)}, VBS)
            delete(conn, [f"doc::{i:04d}" for i in range(1400, 1450)] +
                   [f"after::{i}" for i in range(10)], VBS)
        run_backup(opts, path, spark=spark)
        final = node_documents(opts)
    finally:
        node.stop()
    ids = Archive.open(path).committed_ids()
    assert len(ids) == 5
    before = restore_state(path)
    with NodeProcess(base / "dst-before", vbuckets=VBS) as dst:
        run_restore(str(path), opts_for(dst), spark=spark)
        restored_before = node_documents(opts_for(dst))
    assert restored_before == final
    assert not any(k.startswith(b"late::") for k in final)
    return path, ids, before, restored_before


def test_dead_branch_in_the_data_source_and_examine(chain, spark):
    """Before any merge: the late writes are on the branch the rollback cut off."""
    from dcptool.pipeline.examine import examine_key
    from dcptool.spark import read_archive

    path, ids, before, _restored = chain
    df = read_archive(spark, path)
    dead = {r["key"] for r in df.filter("dead").select("key").collect()}
    assert {f"late::{i}" for i in range(100)} <= dead
    assert {f"doc::{i:04d}" for i in range(1000, 1010)} <= dead
    resolved = {r["key"] for r in read_archive(spark, path, resolved=True).collect()}
    assert not any(k.startswith("late::") for k in resolved)
    versions = examine_key(path, "doc::1003")["versions"]
    assert [v["backup"] for v in versions] == [ids[0], ids[2]]
    assert [v["dead"] for v in versions] == [False, True]
    assert [v["restored"] for v in versions] == [True, False]


def test_merge_chain_with_rollback_keeps_the_restore(chain, spark, tmp_path, capsys):
    path, ids, before, restored_before = chain
    b1, b2, b3, b4, b5 = ids

    # 1. the first two backups: the third is re-linked to the merged one
    m1 = run_merge(path, last=b2, spark=spark)
    a = Archive.open(path)
    assert m1.replaced == [b1, b2] and m1.relinked == [b3] and m1.type == "full"
    assert a.committed_ids() == [m1.merged_id, b3, b4, b5]
    # the chain through b3 now runs through the merged backup; b3's manifest is untouched
    assert a.parent_of(b3) == m1.merged_id and a.manifest(b3)["parent"] == b2
    assert m1.items_after < m1.items_before  # updated keys kept once
    assert m1.deletions == 100  # tombstones kept
    assert restore_state(path) == before

    # 2. the last two, which start with the rollback: the rollback record is kept, since
    #    it kills the late documents of B3, outside the range
    m2 = run_merge(path, first=b4, spark=spark)
    a = Archive.open(path)
    assert a.committed_ids() == [m1.merged_id, b3, m2.merged_id]
    mf = a.manifest(m2.merged_id)
    assert mf["parent"] == b3 and mf["type"] == "incremental"
    late_vbs = {vbucket_of(f"late::{i}".encode(), VBS) for i in range(100)}
    assert {e["vbucket"] for e in mf["vbuckets"] if e["rollbacks"]} == late_vbs
    assert restore_state(path) == before
    assert verify_archive(path).ok

    # 3. everything into one full backup, through the CLI; info shows it
    rc, out, err = cli(capsys, "merge", path, "--json")
    assert rc == 0, err
    m3 = json.loads(out)
    assert m3["replaced"] == [m1.merged_id, b3, m2.merged_id] and m3["type"] == "full"
    a = Archive.open(path)
    assert a.committed_ids() == [m3["merged_id"]]
    assert a.manifest(m3["merged_id"])["totals"]["rollbacks"] == 0  # nothing left to cut
    assert restore_state(path) == before
    report = verify_archive(path)
    assert report.ok, report.problems
    assert not (path / STAGING).exists()
    rc, out, _ = cli(capsys, "info", path, "--json")
    info = json.loads(out)
    (only,) = info["backups"]
    assert only["id"] == m3["merged_id"] and only["merged_from"] == m3["replaced"]
    rc, out, _ = cli(capsys, "info", path)
    assert f"merged from 3 backups" in out

    # the restore after the merge is the restore before it
    with NodeProcess(tmp_path / "dst-after", vbuckets=VBS) as dst:
        run_restore(str(path), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == restored_before


def test_merge_user_errors(chain, capsys, tmp_path):
    path = chain[0]
    rc, _out, err = cli(capsys, "merge", path, "--from", "20200101T000000.000000Z")
    assert rc != 0 and err.startswith("dcptool: error: ") and "Traceback" not in err
    rc, _out, err = cli(capsys, "merge", tmp_path / "nothing")
    assert rc != 0 and "no archive" in err
    a = Archive.open(path)
    if len(a.committed_ids()) == 1:
        rc, _out, err = cli(capsys, "merge", path)
        assert rc == 2 and "nothing to merge" in err


def _synthetic_chain(path, vbuckets: int = 4) -> list[str]:
    """Three backups written with the archive writer: every vbucket gets 30 documents,
    then 10 updates and 5 deletions, then 10 new documents."""
    a = Archive.create(path, bucket="default", vbuckets=vbuckets)
    seq = [0] * vbuckets
    uuid = 0x5151

    def one(btype, per_vb):
        bw = a.begin_backup(btype)
        sums = []
        for vb in range(vbuckets):
            s0 = seq[vb]
            w = bw.vbucket(vb, {"uuid": uuid, "seqno": s0, "snap_start": s0, "snap_end": s0},
                           [[uuid, 0]])
            recs = per_vb(vb, s0)
            w.write([(2, s0 + 1, s0 + len(recs), 2)] + recs)
            seq[vb] = s0 + len(recs)
            e = seq[vb]
            sums.append(w.close({"uuid": uuid, "seqno": e, "snap_start": e, "snap_end": e}))
        return bw.commit(sums)["id"]

    def mut(s, key, v):
        return (3, s, s, 1_700_000_000_000_000_000 + s, 0, 0, 1, key, b'{"v":%d}' % v, None)

    ids = [one("full", lambda vb, s0: [mut(s0 + i + 1, b"k%d-%d" % (vb, i), 1) for i in range(30)])]
    ids.append(one("incremental", lambda vb, s0: [mut(s0 + i + 1, b"k%d-%d" % (vb, i), 2)
                                                  for i in range(10)] +
                   [(4, s0 + 11 + i, s0 + 11 + i, 1_700_000_000_000_000_000 + s0 + 11 + i,
                     b"k%d-%d" % (vb, 20 + i), 0, 0, b"") for i in range(5)]))
    ids.append(one("incremental", lambda vb, s0: [mut(s0 + i + 1, b"n%d-%d" % (vb, i), 3)
                                                  for i in range(10)]))
    return ids


def test_an_interrupted_merge_is_finished_by_the_next(spark, tmp_path):
    import shutil

    from dcptool.archive.format import MANIFEST_JSON, read_json

    path = tmp_path / "archive"
    b1, b2, b3 = _synthetic_chain(path)
    state = {vb: list(resolved_records(str(path), vb, None)) for vb in range(4)}
    keep = tmp_path / "kept"
    for b in (b1, b2):
        shutil.copytree(path / "backups" / b, keep / b)
    m = run_merge(path, last=b2, spark=spark)
    # as if the merge had been killed right after publishing the merged backup
    for b in (b1, b2):
        shutil.copytree(keep / b, path / "backups" / b)
    # b3 still names b2 (a merge never edits a committed manifest)
    assert read_json(path / "backups" / b3 / MANIFEST_JSON)["parent"] == b2
    assert Archive.open(path).committed_ids() == sorted([b1, b2, m.merged_id, b3])
    assert {vb: list(resolved_records(str(path), vb, None)) for vb in range(4)} == state
    assert verify_archive(path).ok

    again = run_merge(path, spark=spark)
    assert again.finished_earlier == [b1, b2]
    assert again.replaced == [m.merged_id, b3]
    assert Archive.open(path).committed_ids() == [again.merged_id]
    assert {vb: list(resolved_records(str(path), vb, None)) for vb in range(4)} == state
    assert verify_archive(path).ok
