"""The `dcptool` Spark data source over a real archive: a real node process, a real local
SparkSession (the shared fixture), real files."""
from __future__ import annotations

import pytest
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.datasource import SCHEMA_DDL, parse_options, plan_scan, read_all
from dcptool.pipeline.restore import run_restore
from dcptool.spark import read_archive

VBS = 16
N = 2000


@pytest.fixture(scope="module")
def archive(tmp_path_factory, spark):
    """A full backup of 2000 documents, then updates, deletions and new documents in an
    incremental; with the node's state after each backup."""
    base = tmp_path_factory.mktemp("ds")
    with NodeProcess(base / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"doc::{i:05d}": {"i": i, "v": 1, "pad": "p" * (i % 50)}
                        for i in range(N)}, VBS, flags=5)
        path = base / "archive"
        run_backup(opts, path, spark=spark)
        state1 = node_documents(opts)
        with opts.connect() as conn:
            load(conn, {f"doc::{i:05d}": {"i": i, "v": 2} for i in range(0, 300)}, VBS, flags=9)
            delete(conn, [f"doc::{i:05d}" for i in range(300, 400)], VBS)
            load(conn, {f"new::{i}": {"n": i} for i in range(50)}, VBS)
        run_backup(opts, path, spark=spark)
        state2 = node_documents(opts)
    return path, state1, state2


def _as_node_docs(rows) -> dict[bytes, tuple]:
    """Resolved rows in the shape of docutil.node_documents."""
    out = {}
    for r in rows:
        if r["deleted"]:
            out[r["key"].encode()] = ("deleted", b"", r["cas"], r["rev_seqno"], 0, 0)
        else:
            out[r["key"].encode()] = ("live", bytes(r["value"]), r["cas"], r["rev_seqno"],
                                      r["flags"], r["expiry"])
    return out


def test_counts_equal_the_manifests(archive, spark):
    path, _s1, _s2 = archive
    a = Archive.open(path)
    ids = a.committed_ids()
    df = read_archive(spark, path)
    assert df.schema.simpleString() == f"struct<{SCHEMA_DDL.replace(' ', ':').replace(',:', ',')}>"
    got = {(r["backup_id"], r["type"]): r["count"]
           for r in df.groupBy("backup_id", "type").count().collect()}
    for bid in ids:
        t = a.manifest(bid)["totals"]
        assert got.get((bid, "mutation"), 0) == t["mutations"]
        assert got.get((bid, "deletion"), 0) == t["deletions"]
        assert got.get((bid, "expiration"), 0) == t["expirations"]
    assert df.count() == sum(a.manifest(b)["totals"][k] for b in ids
                             for k in ("mutations", "deletions", "expirations"))
    # one backup, a few vbuckets: the manifest's entries for those vbuckets
    entries = [e for e in a.manifest(ids[1])["vbuckets"] if e["vbucket"] in (0, 1, 2, 7)]
    one = read_archive(spark, path, backup=ids[1], vbuckets=[0, 1, 2, 7])
    assert one.count() == sum(e["counts"]["mutations"] + e["counts"]["deletions"]
                              + e["counts"]["expirations"] for e in entries)
    assert {r["vbucket"] for r in one.select("vbucket").distinct().collect()} == {0, 1, 2, 7}
    assert one.filter("dead").count() == 0


def test_partitions_group_vbuckets(archive, spark):
    path, _s1, _s2 = archive
    df = read_archive(spark, path, partitions=4)
    assert df.rdd.getNumPartitions() == 4
    plan = plan_scan(path, partitions=4)
    seen = [vb for p in plan for vb in {u[1]["vbucket"] for u in p.units}]
    assert sorted(seen) == list(range(VBS))  # each vbucket in exactly one partition
    resolved = plan_scan(path, resolved=True, partitions=64)
    assert len(resolved) == VBS // 2  # never one partition per vbucket
    assert all(len(p.units) == 2 for p in resolved)


def test_resolved_equals_what_restore_writes(archive, spark, tmp_path):
    path, state1, state2 = archive
    rows = read_archive(spark, path, resolved=True).collect()
    assert len(rows) == len({r["key"] for r in rows}) == N + 50
    resolved = _as_node_docs(rows)
    assert resolved == state2  # what the source node held at the last backup
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(path), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == resolved
    # as of the first backup
    first = Archive.open(path).committed_ids()[0]
    rows1 = read_archive(spark, path, resolved=True, backup=first).collect()
    assert _as_node_docs(rows1) == state1
    assert {r["backup_id"] for r in rows1} == {first}
    # every resolved row names the backup that holds that version
    updated = {r["key"]: r["backup_id"] for r in rows if r["key"] in ("doc::00000", "doc::01999")}
    assert updated["doc::00000"] != first and updated["doc::01999"] == first


def test_same_rows_in_spark_and_in_process(archive, spark):
    path, _s1, _s2 = archive
    cols = ["backup_id", "vbucket", "seqno", "key", "cas", "deleted"]
    in_spark = sorted(tuple(r) for r in read_archive(spark, path).select(*cols).collect())
    local = []
    for rb in read_all(path):
        d = rb.to_pydict()
        local.extend(zip(*(d[c] for c in cols)))
    assert in_spark == sorted(local)


def test_bad_options_are_usage_errors(archive):
    from dcptool.errors import UsageError

    path = str(archive[0])
    with pytest.raises(UsageError, match="resolved"):
        parse_options({"path": path, "resolved": "maybe"})
    with pytest.raises(UsageError, match="vbuckets"):
        parse_options({"path": path, "vbuckets": "3-1"})
    with pytest.raises(UsageError, match="archive path"):
        parse_options({})


def test_empty_and_missing_archives(spark, tmp_path):
    from dcptool.archive.errors import ArchiveError, NotAnArchiveError

    Archive.create(tmp_path / "empty", bucket="default", vbuckets=VBS)
    assert read_archive(spark, tmp_path / "empty").count() == 0
    assert read_archive(spark, tmp_path / "empty", resolved=True).count() == 0
    with pytest.raises(NotAnArchiveError):
        read_archive(spark, tmp_path / "nothing")
    with pytest.raises(ArchiveError, match="no backup"):
        read_archive(spark, tmp_path / "empty", backup="20200101T000000.000000Z")


def test_rows_keep_edge_values(tmp_path):
    """uint64 CAS from 2^63 (kept bit for bit, as signed), a key that is not UTF-8, xattrs
    stored apart, tombstones and expirations: through the data source's own reader."""
    a = Archive.create(tmp_path / "a", bucket="default", vbuckets=4)
    bw = a.begin_backup("full")
    w = bw.vbucket(2, {"uuid": 7, "seqno": 0, "snap_start": 0, "snap_end": 0}, [[7, 0]])
    big = (1 << 64) - 5
    # keys are doc keys (format 3): 0x00 the default collection, 0x08 collection 8 (named
    # by no manifest: its hex id, no scope)
    w.write([(2, 1, 4, 2),
              (3, 1, 1, big, 0xFFFFFFFF, 1_900_000_000, 5, b"\x00k\xff", b"{}",
               b"\x00\x00\x00\x04xa"),
              (3, 2, 9, 12345, 0, 0, 1, b"\x08plain", b"{\"a\":1}", None),
              (4, 3, 3, 999, b"\x00gone", 1_700_000_000, 0, b""),
              (5, 4, 4, 1000, b"\x00old", 1_700_000_001, 0, b"")])
    bw.commit([w.close({"uuid": 7, "seqno": 4, "snap_start": 4, "snap_end": 4})])
    rows = {}
    for rb in read_all(tmp_path / "a"):
        for r in rb.to_pylist():
            rows[r["seqno"]] = r
    assert rows[1]["cas"] == big - (1 << 64) and rows[1]["cas"] & ((1 << 64) - 1) == big
    assert rows[1]["key"] == "k\ufffd" and rows[1]["flags"] == 0xFFFFFFFF
    assert rows[1]["xattrs"] == b"\x00\x00\x00\x04xa" and rows[1]["expiry"] == 1_900_000_000
    assert rows[2]["xattrs"] is None and rows[2]["rev_seqno"] == 9 and not rows[2]["deleted"]
    assert (rows[1]["scope"], rows[1]["collection"], rows[1]["collection_id"]) == (
        "_default", "_default", 0)
    assert (rows[2]["key"], rows[2]["scope"], rows[2]["collection"], rows[2]["collection_id"]) == (
        "plain", None, "8", 8)
    assert (rows[3]["type"], rows[3]["deleted"], rows[3]["delete_time"], rows[3]["flags"],
            rows[3]["expiry"]) == ("deletion", True, 1_700_000_000, None, None)
    assert rows[4]["type"] == "expiration" and rows[4]["delete_time"] == 1_700_000_001
    assert {r["vbucket"] for r in rows.values()} == {2} and not any(r["dead"] for r in rows.values())
