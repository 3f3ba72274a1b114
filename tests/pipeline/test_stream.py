"""The `dcptool-stream` Structured Streaming source against a real node: availableNow runs
pick up exactly what changed between them, and a rollback shows up as a row."""
from __future__ import annotations

import json

import pytest
from docutil import delete, load, opts_for
from nodeprocutil import NodeProcess

from dcptool.protocol import vbucket_of
from dcptool.spark import read_changes

VBS = 16


def run_once(spark, node, sink, checkpoint, **kw) -> None:
    """One availableNow run of changes -> Parquet with a checkpoint."""
    df = read_changes(spark, f"couchbase://{node.host}:{node.port}", bucket=node.bucket,
                      username=node.username, password=node.password, **kw)
    q = (df.writeStream.format("parquet").option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start(str(sink)))
    q.awaitTermination(120)
    assert not q.isActive
    assert q.exception() is None


def sink_rows(spark, sink) -> list:
    if not any(sink.glob("*.parquet")):
        return []
    return spark.read.parquet(str(sink)).collect()


def test_available_now_picks_up_exactly_the_changes(spark, tmp_path):
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"k::{i:03d}": {"i": i} for i in range(400)}, VBS)
        sink, ckpt = tmp_path / "sink", tmp_path / "checkpoint"
        run_once(spark, node, sink, ckpt)
        first = sink_rows(spark, sink)
        assert len(first) == 400
        assert {r["type"] for r in first} == {"mutation"}
        assert {r["key"] for r in first} == {f"k::{i:03d}" for i in range(400)}
        assert json.loads(first[0]["value"])["i"] == int(first[0]["key"][3:])

        # offsets are full per-vbucket positions, with string keys, in the checkpoint
        offset_files = sorted((p for p in (ckpt / "offsets").iterdir() if p.name.isdigit()),
                              key=lambda p: int(p.name))
        last_offset = json.loads(offset_files[-1].read_text().splitlines()[-1])
        assert set(last_offset) == {str(vb) for vb in range(VBS)}
        assert set(last_offset["0"]) == {"uuid", "seq", "ss", "se"}

        with opts.connect() as conn:
            load(conn, {f"k::{i:03d}": {"i": i, "v": 2} for i in range(0, 40)}, VBS)
            delete(conn, [f"k::{i:03d}" for i in range(100, 110)], VBS)
            load(conn, {f"new::{i}": {"n": i} for i in range(20)}, VBS)
        run_once(spark, node, sink, ckpt)
        rows = sink_rows(spark, sink)
        assert len(rows) == 400 + 70
        seen = {(r["vbucket"], r["seqno"]) for r in rows}
        assert len(seen) == len(rows)  # nothing read twice
        new = [r for r in rows if (r["vbucket"], r["seqno"]) not in
               {(f["vbucket"], f["seqno"]) for f in first}]
        assert sorted(r["key"] for r in new if r["type"] == "mutation") == sorted(
            [f"k::{i:03d}" for i in range(40)] + [f"new::{i}" for i in range(20)])
        dels = [r for r in new if r["type"] == "deletion"]
        assert sorted(r["key"] for r in dels) == [f"k::{i:03d}" for i in range(100, 110)]
        assert all(r["deleted"] and r["value"] == b"" for r in dels)

        # nothing changed: no new rows
        run_once(spark, node, sink, ckpt)
        assert len(sink_rows(spark, sink)) == 470

        # a new query reads the current state (one version per key) in bounded batches
        sink2, ckpt2 = tmp_path / "sink2", tmp_path / "checkpoint2"
        run_once(spark, node, sink2, ckpt2, maxRecordsPerBatch=150)
        rows2 = sink_rows(spark, sink2)
        assert len(rows2) == 420 and len({r["key"] for r in rows2}) == 420
        assert len({(r["vbucket"], r["seqno"]) for r in rows2}) == 420
        batches = [p for p in (ckpt2 / "offsets").iterdir() if p.name.isdigit()]
        assert len(batches) >= 4  # 470 seqnos in steps of at most 150


def test_rollback_is_reread_and_visible(spark, tmp_path):
    node = NodeProcess(tmp_path / "src", vbuckets=VBS).start()
    try:
        with opts_for(node).connect() as conn:
            load(conn, {f"base::{i}": {"i": i} for i in range(200)}, VBS)
        node.extra_args = ("--flush-interval", "3600")  # what comes next stays in memory
        node.restart()
        sink, ckpt = tmp_path / "sink", tmp_path / "checkpoint"
        run_once(spark, node, sink, ckpt)
        with opts_for(node).connect() as conn:
            load(conn, {f"late::{i}": {"i": i} for i in range(60)}, VBS)
        run_once(spark, node, sink, ckpt)
        assert len(sink_rows(spark, sink)) == 260
        node.kill()  # the late writes are lost: the node starts a new history branch
        node.extra_args = ()
        node.start()
        with opts_for(node).connect() as conn:
            load(conn, {f"after::{i}": {"i": i} for i in range(30)}, VBS)
        run_once(spark, node, sink, ckpt)
        rows = sink_rows(spark, sink)
    finally:
        node.stop()
    rollbacks = {r["vbucket"]: r["seqno"] for r in rows if r["type"] == "rollback"}
    late_vbs = {vbucket_of(f"late::{i}".encode(), VBS) for i in range(60)}
    assert set(rollbacks) == late_vbs
    for r in rows:
        if r["key"] and r["key"].startswith("late::"):
            assert r["seqno"] > rollbacks[r["vbucket"]]  # the rollback row retracts it
        if r["key"] and r["key"].startswith("base::") and r["vbucket"] in rollbacks:
            assert r["seqno"] <= rollbacks[r["vbucket"]]
    after = [r for r in rows if r["key"] and r["key"].startswith("after::")]
    assert sorted(r["key"] for r in after) == sorted(f"after::{i}" for i in range(30))
    for r in after:
        if r["vbucket"] in rollbacks:
            assert r["seqno"] > rollbacks[r["vbucket"]]  # re-read from the rollback point


def test_positions_mode_batches_are_offset_ranges_from_the_start_offset(spark, tmp_path):
    """`positions`: a micro-batch is its offset range, one row per vbucket (no items); the
    query starts at `startOffset` without asking the node; a node that cannot be asked
    makes latestOffset answer the start offset (no batch) instead of failing; the password
    is not in the `connection` option nor in the plan Spark shows."""
    from dcptool.pipeline.dataframes import register
    from dcptool.pipeline.streamsource import DcpStreamReader, connection_options

    register(spark)

    def positions(node, start: dict, n: int) -> list:
        df = (spark.readStream.format("dcptool-stream").option("positions", "true")
              .options(**connection_options(opts_for(node)))
              .option("startOffset", json.dumps(start)).load())
        # the password rides in an option of its own, which Spark redacts in what it shows
        assert "password" not in json.loads(connection_options(opts_for(node))["connection"])
        assert "password=*********(redacted)" in df._jdf.queryExecution().toString()
        sink, ckpt = tmp_path / f"p{n}", tmp_path / f"c{n}"
        q = (df.writeStream.format("parquet").option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start(str(sink)))
        q.awaitTermination(120)
        assert q.exception() is None
        return sorted(sink_rows(spark, sink), key=lambda r: r["vbucket"])

    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"p::{i}": {"i": i} for i in range(100)}, VBS)
        rows = positions(node, {}, 1)
        assert [r["vbucket"] for r in rows] == list(range(VBS))
        assert set(rows[0].asDict()) == {"vbucket", "uuid", "start_seqno", "end_seqno", "moved"}
        assert all(r["start_seqno"] == 0 and r["moved"] == (r["end_seqno"] > 0) for r in rows)
        assert sum(r["end_seqno"] for r in rows) == 100
        # from a start offset (an archive's end positions): only what moved since
        start = {str(r["vbucket"]): {"uuid": r["uuid"], "seq": r["end_seqno"],
                                     "ss": r["end_seqno"], "se": r["end_seqno"]} for r in rows}
        key = "p::new"
        vb = vbucket_of(key.encode(), VBS)
        with opts.connect() as conn:
            load(conn, {key: {"n": 1}}, VBS)
        rows2 = positions(node, start, 2)
        moved = [r for r in rows2 if r["moved"]]
        assert [r["vbucket"] for r in moved] == [vb]
        assert moved[0]["start_seqno"] == rows[vb]["end_seqno"]
        assert moved[0]["end_seqno"] == rows[vb]["end_seqno"] + 1
        assert all(r["start_seqno"] == r["end_seqno"] for r in rows2 if not r["moved"])
        reader = DcpStreamReader({**connection_options(opts), "positions": "true",
                                  "startOffset": json.dumps(start)})
        assert reader.initialOffset() == start
    # the node is gone: no batch, no error
    assert reader.latestOffset(start) == start
