"""A backup's progress: per item from the tasks' progress files, in phases, for the bar."""
from __future__ import annotations

from docutil import load, opts_for

from dcptool.archive import FULL, Archive, VBucketWriter
from dcptool.client.position import ZERO
from dcptool.pipeline.backup import TaskProgress, poll_task_progress, run_backup
from dcptool.pipeline.plans import VBucketPlan

VBS = 4


def test_task_progress_advances_with_each_item_before_its_vbucket_ends(tmp_path):
    archive = Archive.create(tmp_path / "a", bucket="default", vbuckets=VBS)
    writer = archive.begin_backup(FULL)
    try:
        plan = {vb: VBucketPlan(vb, ZERO, 100, (), False) for vb in (0, 1)}
        writers = {vb: VBucketWriter(archive, writer.id, vb, ZERO.to_archive(), (),
                                     sync=False) for vb in plan}
        report = TaskProgress(writer.dir, "0", writers, plan, {vb: ZERO for vb in plan},
                              {vb: 0 for vb in plan})
        writers[0].marker(1, 100, 0)
        for seqno in range(1, 31):
            writers[0].mutation(seqno, 1, seqno, 0, 0, 0, b"\0k%d" % seqno, b"v")
        report.write()
        # 30 items of vbucket 0, none of its vbuckets complete: 30 of 200 seqnos
        assert poll_task_progress(writer.dir) == {"items": 30, "work": 30, "work_total": 200,
                                                  "vbuckets_closed": 0}
        writers[0].mutation(31, 1, 31, 0, 0, 0, b"\0k31", b"v")
        report.write()
        assert poll_task_progress(writer.dir)["items"] == 31
        # a vbucket that ends counts all its seqnos (deduplication leaves fewer items)
        writers[0].close(ZERO.moved_to(100).to_archive())
        report.write()
        assert poll_task_progress(writer.dir) == {"items": 31, "work": 100, "work_total": 200,
                                                  "vbuckets_closed": 1}
        for w in writers.values():
            if not w.closed:
                w.abort()
    finally:
        writer.abort()


def test_backup_reports_phases_then_items_and_leaves_no_progress_file(node_factory, spark,
                                                                       tmp_path):
    node = node_factory(vbuckets=VBS)
    opts = opts_for(node)
    with opts.connect() as conn:
        load(conn, {f"p::{i}": {"i": i} for i in range(400)}, VBS)
    seen: list[dict] = []
    res = run_backup(opts, tmp_path / "archive", spark=spark, progress=seen.append,
                     watermark=False)
    phases = [p["phase"] for p in seen]
    assert phases[0] == "starting Spark" and phases[1] == "streaming"
    assert phases[-2:] == ["committing", "done"]
    assert seen[-1]["items"] == res.items_streamed == 400
    assert seen[-1]["work"] == seen[-1]["work_total"] > 0
    assert all(p["work"] <= p["work_total"] for p in seen)
    bdir = Archive.open(tmp_path / "archive").backup_dir(res.backup_id)
    assert not [n.name for n in bdir.iterdir() if n.name.startswith(".progress-")]
