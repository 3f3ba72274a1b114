"""`restore --to-time` of a cluster archive: every bucket to the time, by its own archive.

A node with two buckets; a cluster archive (`backup` without -b) backs both up, the test
notes the time, changes both (updates and a delete) and backs up again. Restoring to the
noted time into a second node gives each bucket the documents the test wrote before it
(from the test's own record of what it wrote); a time before the archive is refused in
one line. Real node processes, the session's Spark, commands in this process.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
from cliutil import cli
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive.pointintime import iso

VBS = 8
BUCKETS = ("default", "second")


def _docs(bucket: str, rnd: int, n: int = 20) -> dict[str, dict]:
    return {f"{bucket}::{i:02d}": {"bucket": bucket, "round": rnd, "i": i} for i in range(n)}



@contextmanager
def _source_and_target(base):
    """A source and a target node, and the source's login in the commands' environment
    (no DCPTOOL_BUCKET: a new archive is a cluster archive): (src, dst, src's address)."""
    mp = pytest.MonkeyPatch()
    src = NodeProcess(base / "src", vbuckets=VBS).start()
    dst = NodeProcess(base / "dst", vbuckets=VBS).start()
    try:
        mp.setenv("DCPTOOL_USERNAME", src.username)
        mp.setenv("DCPTOOL_PASSWORD", src.password)
        mp.delenv("DCPTOOL_BUCKET", raising=False)
        yield src, dst, f"{src.host}:{src.port}"
    finally:
        src.stop()
        dst.stop()
        mp.undo()


@pytest.fixture(scope="module")
def cluster_archive(tmp_path_factory, spark):
    """(archive, target node, the time between the two backups, what each bucket held
    then, as written)."""
    base = tmp_path_factory.mktemp("pitcluster")
    archive = base / "cluster"
    with _source_and_target(base) as (src, dst, addr):
        for node in (src, dst):
            rc = _run(["bucket", "create", "second", "-c", f"{node.host}:{node.port}", "-q"])
            assert rc == 0
        then = {}
        for b in BUCKETS:
            with opts_for(src, b).connect() as conn:
                load(conn, _docs(b, 1), VBS)
            then[b] = {k.encode(): json.dumps(v).encode() for k, v in _docs(b, 1).items()}
        assert _run(["backup", str(archive), "-c", addr, "--no-watermark", "-q"]) == 0
        at = time.time_ns()
        time.sleep(0.05)
        for b in BUCKETS:
            with opts_for(src, b).connect() as conn:
                load(conn, dict(list(_docs(b, 2).items())[:10]), VBS)
                delete(conn, [f"{b}::19"], VBS)
        assert _run(["backup", str(archive), "-c", addr, "--no-watermark", "-q"]) == 0
        yield archive, dst, at, then


def _run(args) -> int:
    from dcptool.cli.app import main

    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return exc.code or 0
    return 0


def test_cluster_restore_to_a_time_restores_each_bucket_as_it_was(cluster_archive, capsys):
    archive, dst, at, then = cluster_archive
    rc, out, err = cli(capsys, "restore", archive, "-c", f"{dst.host}:{dst.port}",
                       "--to-time", iso(at), "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert sorted(d["buckets"]) == list(BUCKETS)
    for b in BUCKETS:
        pit = d["buckets"][b]["restore"]["point_in_time"]
        assert pit["to_time"] == iso(at) and len(pit["vbuckets"]) == VBS
        assert all(c["time_ns"] is None or c["time_ns"] <= at for c in pit["vbuckets"])
        held = node_documents(opts_for(dst, b))
        assert {k: v[1] for k, v in held.items() if v[0] == "live"} == then[b], b


def test_cluster_restore_to_a_time_before_the_archive_is_refused(cluster_archive, capsys):
    archive, dst, _at, _then = cluster_archive
    rc, out, err = cli(capsys, "restore", archive, "-c", f"{dst.host}:{dst.port}",
                       "--to-time", "2020-01-01T00:00:00Z")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "before the archive's window" in err
    rc, out, err = cli(capsys, "restore", archive, "-c", f"{dst.host}:{dst.port}",
                       "--to-time", "-1h", "--run", "x")
    assert rc == 2 and "exclude each other" in err


def test_cluster_info_draws_each_buckets_window(cluster_archive, capsys, monkeypatch):
    archive, _dst, at, _then = cluster_archive
    rc, out, err = cli(capsys, "info", archive, "--json")
    assert rc == 0, err
    d = json.loads(out)
    for b in BUCKETS:
        w = d["buckets"][b]["point_in_time"]
        assert w["window"]["earliest"] <= iso(at) <= w["window"]["latest"] and w["gaps"] == []
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, err = cli(capsys, "info", archive)
    assert rc == 0, err
    bars = [line for line in out.splitlines() if "█" in line and not line.startswith("█")]
    assert [line.split()[0] for line in bars] == list(BUCKETS)
    assert all(len(line) <= 80 for line in bars)


def test_spark_source_as_of_reads_every_bucket_as_it_was(cluster_archive, spark):
    from dcptool.pipeline.dataframes import register

    archive, _dst, at, then = cluster_archive
    register(spark)
    rows = (spark.read.format("dcptool").option("asOf", iso(at)).load(str(archive))
            .where("NOT deleted").select("bucket", "key", "value").collect())
    got = {(r["bucket"], r["key"].encode()): bytes(r["value"]) for r in rows}
    assert got == {(b, k): v for b in BUCKETS for k, v in then[b].items()}


def test_cluster_export_resolved_at_writes_every_bucket_as_it_was(cluster_archive, capsys,
                                                                   tmp_path):
    import base64

    archive, _dst, at, then = cluster_archive
    rc, out, err = cli(capsys, "export", archive, tmp_path / "out", "--resolved", "--at",
                       iso(at), "--format", "jsonl", "--json", "--no-progress")
    assert rc == 0, err
    assert json.loads(out)["at"] == iso(at)
    rows = [json.loads(line) for f in sorted((tmp_path / "out").glob("part-*.jsonl"))
            for line in f.read_text().splitlines()]
    got = {(r["bucket"], r["key"].encode()): base64.b64decode(r["value"])
           for r in rows if not r["deleted"]}
    assert got == {(b, k): v for b in BUCKETS for k, v in then[b].items()}


@pytest.fixture(scope="module")
def merged_archive(tmp_path_factory, spark):
    """A bucket archive of four backups (a full one, three incrementals, documents changed
    before each), the middle two then removed (merged into the last); (archive, target
    node, a time between the second and third backups, what the test wrote by the end of
    the first backup)."""
    base = tmp_path_factory.mktemp("pitmerged")
    archive = base / "archive"
    with _source_and_target(base) as (src, dst, addr):
        written = {}
        at = None
        for rnd in range(4):
            docs = _docs("default", rnd, 12)
            with opts_for(src).connect() as conn:
                load(conn, docs, VBS)
            if rnd == 0:
                written = {k.encode(): json.dumps(v).encode() for k, v in docs.items()}
            assert _run(["backup", str(archive), "-b", "default", "-c", addr,
                         "--no-watermark", "-q"]) == 0
            if rnd == 1:
                at = time.time_ns()
                time.sleep(0.05)
        from dcptool.archive import Archive

        ids = Archive.open(archive).committed_ids()
        assert _run(["remove", str(archive), "--backup", ids[1], "--backup", ids[2], "-q",
                     "--no-progress"]) == 0
        yield archive, dst, at, written


def test_a_merged_backup_restores_only_its_ends(merged_archive, capsys, monkeypatch):
    archive, dst, at, written = merged_archive
    # the backups ran a few seconds apart: a tolerance below that shows the gap
    monkeypatch.setenv("DCPTOOL_GAP_TOLERANCE", "0.1")
    rc, out, err = cli(capsys, "info", archive, "--json")
    d = json.loads(out)
    assert [b["merged_from"] is not None for b in d["backups"]] == [False, True]
    (gap,) = d["point_in_time"]["gaps"]
    assert gap["from"] < iso(at) < gap["to"]
    # the state inside the merged range is gone: the time is in a gap
    rc, out, err = cli(capsys, "restore", archive, "-c", f"{dst.host}:{dst.port}",
                       "--to-time", iso(at), "--json")
    assert rc == 2 and "gap" in err
    # --nearest: the boundary before the merged range, the end of the full backup
    rc, out, err = cli(capsys, "restore", archive, "-c", f"{dst.host}:{dst.port}",
                       "--to-time", iso(at), "--nearest", "--json")
    assert rc == 0, err
    pit = json.loads(out)["point_in_time"]
    first = d["backups"][0]["id"]
    assert {c["backup"] for c in pit["vbuckets"] if c["time"] is not None} == {first}
    held = node_documents(opts_for(dst))
    assert {k: v[1] for k, v in held.items() if v[0] == "live"} == written
