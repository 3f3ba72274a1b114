"""Writing and reading archives with real files: layout, records, summaries, manifest, lock."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import msgpack
import pytest

from archiveutil import W, X, backup, mutations, write_events

from dcptool.archive import (
    Archive,
    ArchiveError,
    ArchiveLockedError,
    NotAnArchiveError,
    PartialBackupExistsError,
    ArchivePosition,
    SummaryMismatchError,
    VBucketWriter,
    iter_file_records,
)
from dcptool.archive.format import BACKUP_ID_RE, read_json
from dcptool.archive.verify import verify_archive

MAX64 = (1 << 64) - 1


def test_create_layout_and_modes(tmp_path):
    path = tmp_path / "arc"
    a = Archive.create(path, bucket="travel", vbuckets=8)
    meta = json.loads((path / "archive.json").read_text())
    assert meta["format"] == "dcptool-archive" and meta["version"] == 3
    assert meta["bucket"] == "travel" and meta["vbuckets"] == 8
    assert len(meta["uuid"]) == 32 and meta["created"].endswith("Z")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path / "backups").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path / "archive.json").st_mode) == 0o600
    backup(a, "full", {3: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 10),
                           "events": mutations(1, 10)}})
    bdir = path / "backups" / a.latest_id()
    assert stat.S_IMODE(os.stat(bdir).st_mode) == 0o700
    for name in os.listdir(bdir):
        assert stat.S_IMODE(os.stat(bdir / name).st_mode) == 0o600, name
    assert sorted(os.listdir(bdir)) == ["backup.json", "manifest.json", "vb-0003-000.mpk.zst",
                                        "vb-0003.done.json"]
    assert Archive.open(path).uuid == a.uuid


def test_open_errors(tmp_path):
    with pytest.raises(NotAnArchiveError, match="no such directory"):
        Archive.open(tmp_path / "missing")
    with pytest.raises(NotAnArchiveError, match="no archive.json"):
        Archive.open(tmp_path)
    (tmp_path / "archive.json").write_text('{"format": "dcptool-archive", "version": 99}')
    with pytest.raises(NotAnArchiveError, match="version 99 is not supported"):
        Archive.open(tmp_path)
    (tmp_path / "archive.json").write_text("{not json")
    with pytest.raises(NotAnArchiveError, match="unreadable"):
        Archive.open(tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    with pytest.raises(ArchiveError, match="not empty"):
        Archive.create(busy, bucket="b")


@pytest.mark.parametrize("version", [3, 1])
def test_records_round_trip_every_field(tmp_path, version):
    """Both layouts (3: columnar blocks with doc keys, 1: the older msgpack records with
    plain keys) read back the same: a version 1 file's keys come out with the default
    collection's prefix 0x00."""
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full", version=version)
    big = os.urandom(3 << 20)  # one record larger than a frame
    pre = b"\x00" if version >= 3 else b""  # what the writer is given: the format's form
    w = bw.vbucket(2, ArchivePosition.at(W, 0), [(W, 0)])
    w.marker(1, 6, 1)
    w.mutation(1, 7, MAX64, 0xFFFFFFFF, 0xFFFFFFFF, 7, pre + b"k\x00\xff", b"",
               b"\x00\x00\x00\x10xattr")
    w.mutation(2, 1, 5, 0, 0, 0, pre + b"big", big)
    w.deletion(3, 9, 6, pre + b"gone", 1_700_000_000, 4, b"\x00\x00\x00\x04sys")
    w.expiration(4, 9, 7, pre + b"old", 1_700_000_001)
    w.write([(2, 5, 6, 0), (3, 5, 1, 8, 0, 0, 1, pre + b"w", b"1", None),
             (4, 6, 2, 9, pre + b"w", 3, 0, b"")])
    summary = w.close(ArchivePosition.at(W, 6))
    m = bw.commit([summary])
    recs = list(a.backup(m["id"]).records(2))
    assert m["version"] == version
    assert recs[0] == (0, "dcptool-archive", version, 2, m["id"], 0)
    assert recs[1] == (1, W, 0, 0, 0, ((W, 0),))
    assert recs[2:] == [
        (2, 1, 6, 1),
        (3, 1, 7, MAX64, 0xFFFFFFFF, 0xFFFFFFFF, 7, b"\x00k\x00\xff", b"",
         b"\x00\x00\x00\x10xattr"),
        (3, 2, 1, 5, 0, 0, 0, b"\x00big", big, None),
        (4, 3, 9, 6, b"\x00gone", 1_700_000_000, 4, b"\x00\x00\x00\x04sys"),
        (5, 4, 9, 7, b"\x00old", 1_700_000_001, 0, b""),
        (2, 5, 6, 0),
        (3, 5, 1, 8, 0, 0, 1, b"\x00w", b"1", None),
        (4, 6, 2, 9, b"\x00w", 3, 0, b""),
        (7, W, 6, 6, 6),
    ]
    counts = {"mutations": 3, "deletions": 2, "expirations": 1, "snapshots": 2,
              "rollbacks": 0, "records": 11}
    if version >= 3:
        counts["system_events"] = 0
    assert summary["counts"] == counts
    assert summary["bytes"]["values"] == len(big) + 7 + 1  # values only, not xattrs
    assert verify_archive(a.path).ok


def test_summary_shape_done_file_and_manifest(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full")
    w = VBucketWriter(a, bw.id, 1, {"uuid": W, "seqno": 0, "snap_start": 0, "snap_end": 0},
                      [[W, 0]])
    write_events(w, mutations(1, 50))
    s = w.close(ArchivePosition.at(W, 50))
    assert json.loads(json.dumps(s)) == s  # plain JSON-able dict
    assert set(s) == {"summary_version", "vbucket", "backup", "start", "end", "failover_log",
                      "counts", "bytes", "files", "rollbacks"}
    assert s["start"] == {"uuid": W, "seqno": 0, "snap_start": 0, "snap_end": 0}
    assert s["end"] == {"uuid": W, "seqno": 50, "snap_start": 50, "snap_end": 50}
    (f,) = s["files"]
    path = a.backup_dir(bw.id) / f["name"]
    assert f["name"] == "vb-0001-000.mpk.zst" and f["size"] == path.stat().st_size
    import hashlib
    assert f["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert f["records"] == 1 + 1 + 1 + 50 + 1  # header, stream, marker, items, end
    assert read_json(a.backup_dir(bw.id) / "vb-0001.done.json") == s
    m = bw.commit([s])
    assert m["format"] == "dcptool-manifest" and m["type"] == "full" and m["parent"] is None
    assert m["vbuckets"] == [s]
    assert m["totals"]["mutations"] == 50 and m["totals"]["file_bytes"] == f["size"]
    assert not (a.path / "lock").exists()
    assert a.manifest(bw.id) == m


def test_segments_and_frames(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=1)
    bw = a.begin_backup("full", block_size=4096, segment_bytes=20_000)
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    events = mutations(1, 3000, per_snapshot=500)
    write_events(w, [(e[0], e[1], e[2], os.urandom(40)) if e[0] == "mut" else e for e in events])
    s = w.close(ArchivePosition.at(W, 3000))
    names = [f["name"] for f in s["files"]]
    assert len(names) > 3 and names == [f"vb-0000-{i:03d}.mpk.zst" for i in range(len(names))]
    bw.commit([s])
    b = a.backup(bw.id)
    seqnos = [r[1] for r in b.records(0) if r[0] == 3]
    assert seqnos == list(range(1, 3001))
    for i, n in enumerate(names):  # every segment starts with its own header
        first = next(iter_file_records(b.dir / n))
        assert first == (0, "dcptool-archive", 3, 0, bw.id, i)
    assert sum(f["records"] for f in s["files"]) == s["counts"]["records"]


def test_bulk_apis_match_per_record_calls(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=3)
    recs = [(2, 1, 100, 0)] + [(3, q, 1, q, 0, 0, 1, b"k%d" % q, b"v" * (q % 50), None)
                               if q % 7 else (4, q, 2, q, b"k%d" % (q - 1), 5, 0, b"x")
                               for q in range(1, 101)]
    bw = a.begin_backup("full", block_size=600, segment_bytes=300)
    w0 = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    w0.marker(1, 100)
    for r in recs[1:]:
        if r[0] == 3:
            w0.mutation(*r[1:9])
        else:
            w0.deletion(*r[1:])
    w1 = bw.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)])
    w1.write(recs)
    w2 = bw.vbucket(2, ArchivePosition.at(W, 0), [(W, 0)])
    packer = msgpack.Packer()
    w2.add_packed(b"".join(packer.pack(r) for r in recs), mutations=86, deletions=14,
                  snapshots=1, value_bytes=sum(len(r[8] if r[0] == 3 else r[7])
                                               for r in recs[1:]))
    sums = [w.close(ArchivePosition.at(W, 100)) for w in (w0, w1, w2)]
    assert len(sums[1]["files"]) > 2  # several segments: per-file record counts must add up
    bw.commit(sums)
    assert verify_archive(a.path).ok
    b = a.backup(bw.id)
    got = [[r for r in b.records(vb) if r[0] in (2, 3, 4)] for vb in range(3)]
    assert got[0] == got[1] == got[2] == list(recs)
    counts = [{k: v for k, v in s["counts"].items() if k != "records"} for s in sums]
    assert counts[0] == counts[1] == counts[2]  # (one header per segment: records may differ)
    # per-record calls and write() flush at the same points: the same segments
    assert [f["records"] for f in sums[0]["files"]] == [f["records"] for f in sums[1]["files"]]
    assert sums[0]["bytes"]["values"] == sums[1]["bytes"]["values"] == sums[2]["bytes"]["values"]


def test_writer_built_in_another_process_from_plain_values(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full")
    code = textwrap.dedent(f"""
        import json, sys
        from dcptool.archive import Archive, VBucketWriter
        out = []
        for vb in (1, 2):
            w = VBucketWriter(Archive.open({str(a.path)!r}), {bw.id!r}, vb,
                              {{"uuid": 7, "seqno": 0, "snap_start": 0, "snap_end": 0}}, [[7, 0]])
            w.marker(1, 3)
            for s in (1, 2, 3):
                w.mutation(s, 1, s, 0, 0, 0, b"key%d" % s, b"value")
            out.append(w.close([7, 3, 3, 3]))
        json.dump(out, sys.stdout)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()
    summaries = json.loads(res.stdout)
    m = bw.commit(summaries)
    assert [e["vbucket"] for e in m["vbuckets"]] == [1, 2]
    assert a.resolve_vbucket(2)[b"key3"][1] == 3


def test_retried_vbucket_overwrites_only_its_own_files(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full", segment_bytes=2000, block_size=1000)
    other = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(other, mutations(1, 20))
    s0 = other.close(ArchivePosition.at(W, 20))
    before = {p.name: p.read_bytes() for p in bw.dir.glob("vb-0000*")}
    first = bw.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(first, [(e[0], e[1], e[2], os.urandom(200)) if e[0] == "mut" else e
                         for e in mutations(1, 200)])
    first.abort()  # the task died
    assert len(list(bw.dir.glob("vb-0001-*.mpk.zst"))) > 2
    retry = bw.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(retry, mutations(1, 5))
    s1 = retry.close(ArchivePosition.at(W, 5))
    assert [f["name"] for f in s1["files"]] == ["vb-0001-000.mpk.zst"]
    assert sorted(p.name for p in bw.dir.glob("vb-0001*")) == ["vb-0001-000.mpk.zst",
                                                             "vb-0001.done.json"]
    assert {p.name: p.read_bytes() for p in bw.dir.glob("vb-0000*")} == before
    bw.commit([s0, s1])
    assert len(a.resolve_vbucket(1)) == 5


def test_commit_checks_summaries_against_files(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full")
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w, mutations(1, 10))
    s = w.close(ArchivePosition.at(W, 10))
    path = bw.dir / s["files"][0]["name"]
    data = bytearray(path.read_bytes())
    data[-10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(SummaryMismatchError, match="vb-0000-000.mpk.zst"):
        bw.commit([s])
    bad = json.loads(json.dumps(s))
    bad["counts"]["records"] += 1
    with pytest.raises(SummaryMismatchError, match="counts.records"):
        bw.commit([bad])
    with pytest.raises(SummaryMismatchError, match="two summaries"):
        bw.commit([s, s])
    assert not (bw.dir / "manifest.json").exists()
    bw.abort()


def test_commit_drops_leftovers_and_loads_done_files(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full")
    for vb in (0, 1):
        w = bw.vbucket(vb, ArchivePosition.at(W, 0), [(W, 0)])
        write_events(w, mutations(1, 3))
        w.close(ArchivePosition.at(W, 3))
    junk = bw.vbucket(2, ArchivePosition.at(W, 0), [(W, 0)])  # started, never finished
    write_events(junk, mutations(1, 3))
    junk.abort()
    (bw.dir / "vb-0001-001.mpk.zst").write_bytes(b"stale attempt")
    m = bw.commit()  # None: the done files in the directory
    assert [e["vbucket"] for e in m["vbuckets"]] == [0, 1]
    assert sorted(os.listdir(bw.dir)) == ["backup.json", "manifest.json", "vb-0000-000.mpk.zst",
                                          "vb-0000.done.json", "vb-0001-000.mpk.zst",
                                          "vb-0001.done.json"]


def test_lock_stops_a_second_writer_and_stale_locks_are_broken(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full")
    holder = json.loads((a.path / "lock").read_text())
    assert holder["pid"] == os.getpid() and holder["purpose"] == "full backup"
    with pytest.raises(ArchiveLockedError, match=f"pid {os.getpid()}"):
        a.begin_backup("full")
    with pytest.raises(ArchiveLockedError):
        a.purge_partial()
    bw.abort()
    assert not (a.path / "lock").exists()
    # a lock left by a process that no longer exists is stale
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True)
    dead = int(proc.stdout)
    import socket
    (a.path / "lock").write_text(json.dumps({"pid": dead, "host": socket.gethostname(),
                                             "time": "x", "purpose": "full backup",
                                             "token": "t"}))
    assert a.purge_partial() == [bw.id]
    # a lock held from another host is never broken automatically
    (a.path / "lock").write_text(json.dumps({"pid": dead, "host": "elsewhere.example",
                                             "time": "x", "purpose": "merge", "token": "t"}))
    with pytest.raises(ArchiveLockedError, match="elsewhere.example"):
        a.begin_backup("full")


def test_partial_backup_blocks_a_new_one_until_purged(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full")
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w, mutations(1, 5))
    w.abort()
    bw.abort()
    p = a.partial_backup()
    assert p is not None and p.id == bw.id and p.type == "full"
    with pytest.raises(PartialBackupExistsError, match=bw.id):
        a.begin_backup("full")
    assert a.purge_partial() == [bw.id]
    assert a.partial_backup() is None and not bw.dir.exists()
    a.begin_backup("full").abort()


def test_incremental_chain_end_positions_and_ids(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    with pytest.raises(ArchiveError, match="first backup must be full"):
        a.begin_backup("incremental")
    m1 = backup(a, "full", {v: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 10),
                                "events": mutations(1, 10)} for v in range(4)})
    m2 = backup(a, "incremental", {v: {"start": ArchivePosition.at(W, 10), "end": ArchivePosition.at(X, 20),
                                       "events": mutations(11, 20)} for v in (0, 1)})
    m3 = backup(a, "incremental", {1: {"start": ArchivePosition.at(X, 20), "end": ArchivePosition.at(X, 25),
                                       "events": mutations(21, 25)}})
    ids = [m1["id"], m2["id"], m3["id"]]
    assert ids == sorted(ids) and all(BACKUP_ID_RE.match(i) for i in ids)
    assert m2["parent"] == m1["id"] and m3["parent"] == m2["id"]
    assert [b.id for b in a.chain()] == ids
    assert [b.id for b in a.chain(m2["id"])] == ids[:2]
    ends = a.end_positions()
    assert ends == {0: ArchivePosition.at(X, 20), 1: ArchivePosition.at(X, 25), 2: ArchivePosition.at(W, 10),
                    3: ArchivePosition.at(W, 10)}
    assert a.end_positions(m1["id"])[1] == ArchivePosition.at(W, 10)
    assert len(a.resolve_vbucket(1)) == 25 and len(a.resolve_vbucket(1, backup=m1["id"])) == 10
    with pytest.raises(ArchiveError, match="no backup 2030"):
        a.chain("20300101T000000.000000Z")


def test_committed_backup_refuses_new_writers(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    m = backup(a, "full", {0: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 3),
                               "events": mutations(1, 3)}})
    with pytest.raises(ArchiveError, match="committed"):
        VBucketWriter(a, m["id"], 0, ArchivePosition.at(W, 0), [])
    with pytest.raises(ArchiveError, match="no backup"):
        VBucketWriter(a, "20300101T000000.000000Z", 0, ArchivePosition.at(W, 0), [])
