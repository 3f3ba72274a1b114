"""Archives on object storage, through the archive API, against a real S3 server process.

The same archive code as on a local disk (see dcptool/archive/storage.py): these tests
write and read archives at s3://BUCKET/PREFIX and check the object storage guarantees:
the manifest is the last object written, a writer killed mid-upload leaves no object (its
open multipart upload is aborted when the backup resumes), the lock is a conditional
write, and verify reads every object's size and SHA-256.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from archiveutil import backup, mutations, seed_004_archive, write_events

from dcptool.archive import Archive, ArchivePosition, storage
from dcptool.archive.errors import ArchiveLockedError, NotAnArchiveError
from dcptool.archive.stores import s3 as s3store
from dcptool.archive.verify import verify_archive

W = 0xA1A1_0000_0000_0001


def keys_of(client, bucket: str, prefix: str = "") -> list[str]:
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", ())]
    return sorted(out)


def test_location_parses_s3_urls():
    loc = storage.location("s3://bkt/some/prefix/")
    assert isinstance(loc, storage.S3Path)
    assert (loc.bucket, loc.key, str(loc)) == ("bkt", "some/prefix", "s3://bkt/some/prefix")
    assert str(loc / "backups" / "x") == "s3://bkt/some/prefix/backups/x"
    assert loc.name == "prefix" and str(loc.parent) == "s3://bkt/some"
    with pytest.raises(storage.StorageError):
        storage.location("s3:///nobucket")
    with pytest.raises(storage.StorageError):
        storage.location("s3://bkt/a/../b")
    assert not isinstance(storage.location("/tmp/x"), storage.S3Path)


def test_seed_004_archive_on_s3_resolves_like_on_disk(s3, tmp_path):
    server, bucket = s3
    remote, m1_remote, m2_remote = seed_004_archive(f"s3://{bucket}/travel")
    local, m1_local, m2_local = seed_004_archive(tmp_path / "travel")
    for a, b in ((m1_remote, m1_local), (m2_remote, m2_local)):
        # (the files' bytes differ a little: their headers name different backup ids)
        assert {k: v for k, v in a["totals"].items() if k != "file_bytes"} == \
            {k: v for k, v in b["totals"].items() if k != "file_bytes"}
        assert [e["counts"] for e in a["vbuckets"]] == [e["counts"] for e in b["vbuckets"]]
    assert remote.resolve_vbucket(0) == local.resolve_vbucket(0)
    assert remote.resolve_vbucket(0, backup=remote.chain()[0].id) == \
        local.resolve_vbucket(0, backup=local.chain()[0].id)
    assert [b.id for b in remote.chain()] and len(remote.chain()) == len(local.chain())
    # the layout of docs/archive-format.md, as objects
    keys = keys_of(server.client(), bucket, "travel/")
    assert "travel/archive.json" in keys
    bid = remote.latest_id()
    assert f"travel/backups/{bid}/manifest.json" in keys
    assert f"travel/backups/{bid}/vb-0000-000.mpk.zst" in keys
    assert not [k for k in keys if k.endswith("/lock")]  # released
    report = verify_archive(f"s3://{bucket}/travel")
    assert report.ok, report.problems
    assert report.files_checked >= 2


def test_flipped_byte_in_an_object_is_reported_by_verify(s3):
    server, bucket = s3
    archive = Archive.create(f"s3://{bucket}/a", bucket="default", vbuckets=2)
    backup(archive, "full", {0: {"start": ArchivePosition.at(W, 0),
                                 "end": ArchivePosition.at(W, 300),
                                 "events": mutations(1, 300)}})
    bid = archive.latest_id()
    key = f"a/backups/{bid}/vb-0000-000.mpk.zst"
    c = server.client()
    data = bytearray(c.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x01
    c.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    report = verify_archive(f"s3://{bucket}/a")
    assert not report.ok
    assert any("vb-0000-000.mpk.zst" in p.path and "SHA-256" in p.message
               for p in report.problems), report.problems


def test_writer_killed_mid_upload_leaves_no_object_and_resumes(s3, monkeypatch):
    """A segment larger than one part goes up as a multipart upload; a writer that dies
    before completing it leaves no object. The next run aborts the open upload and the
    vbucket restarts from the segments that are complete."""
    server, bucket = s3
    monkeypatch.setattr(s3store, "PART_BYTES", 5 << 20)
    archive = Archive.create(f"s3://{bucket}/k", bucket="default", vbuckets=2)
    bw = archive.begin_backup("full", segment_bytes=6 << 20)
    import os

    def events(first, last):  # snapshots of 100 items of 4 KiB that do not compress
        out = []
        for lo in range(first, last + 1, 100):
            hi = min(last, lo + 99)
            out.append(("snap", lo, hi))
            out += [("mut", s, b"k%d" % s, os.urandom(4096)) for s in range(lo, hi + 1)]
        return out

    big = events(1, 1600)
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)], block_size=256 << 10)
    write_events(w, big)
    w._flush()
    # segment 000 is complete (it rolled over at 6 MiB); segment 001 is being uploaded
    write_events(w, events(1601, 3000))
    w._flush()
    uploads = server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert uploads, "the open segment should be a multipart upload in progress"
    bw.lock.release()  # the process "dies": nothing completes the upload
    del w
    keys = keys_of(server.client(), bucket, "k/backups/")
    assert not [k for k in keys if k.endswith("manifest.json")]
    segs = [k for k in keys if k.endswith(".mpk.zst")]
    assert segs and all(k.endswith("-000.mpk.zst") for k in segs), segs
    resumed = archive.resume_backup()
    assert server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    plan = resumed.plan([0])
    assert plan.starts[0].resume
    w2 = resumed.vbucket(0, plan.starts[0].position, [(W, 0)], resume=True)
    assert 0 < w2.position.seqno <= 1600  # what the complete segment held
    rest = w2.position.seqno + 1
    write_events(w2, events(rest, 3000))
    summary = w2.close(ArchivePosition.at(W, 3000))
    resumed.commit([summary])
    got = archive.resolve_vbucket(0)
    assert len(got) == 3000
    assert verify_archive(f"s3://{bucket}/k").ok


def test_lock_is_a_conditional_write(s3):
    server, bucket = s3
    archive = Archive.create(f"s3://{bucket}/l", bucket="default", vbuckets=2)
    first = archive.lock("one").acquire()
    try:
        with pytest.raises(ArchiveLockedError) as exc:
            archive.lock("two").acquire()
        assert "locked by" in str(exc.value)
        body = json.loads(server.client().get_object(Bucket=bucket, Key="l/lock")["Body"].read())
        assert body["token"] == first.token and body["expires"] > 0
    finally:
        first.release()
    archive.lock("three").acquire().release()


def test_expired_lease_is_broken(s3, monkeypatch):
    server, bucket = s3
    archive = Archive.create(f"s3://{bucket}/e", bucket="default", vbuckets=2)
    server.client().put_object(Bucket=bucket, Key="e/lock", Body=json.dumps({
        "pid": 1, "host": "elsewhere", "time": "2026-01-01T00:00:00Z", "purpose": "backup",
        "token": "dead", "expires": 1.0}).encode())
    lock = archive.lock("after a crash").acquire()
    assert lock.held
    lock.release()


def test_missing_bucket_and_missing_archive_are_one_line_errors(s3):
    server, bucket = s3
    with pytest.raises(storage.StorageError) as exc:
        Archive.open("s3://no-such-bucket-here/x")
    assert "does not exist" in str(exc.value)
    with pytest.raises(NotAnArchiveError):
        Archive.open(f"s3://{bucket}/nothing-here")


def test_wrong_credentials_are_one_line(s3_server):
    env = s3_server.env(AWS_SECRET_ACCESS_KEY="not-the-secret")
    bucket = s3_server.new_bucket()
    r = subprocess.run([sys.executable, "-m", "dcptool", "info", f"s3://{bucket}/a"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "access denied" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and "not-the-secret" not in r.stderr


def test_object_writers_hold_bounded_memory_and_spill_to_temporary_files(s3, monkeypatch):
    """A task streams many vbuckets at once, each object a part in the making: together
    they hold at most UPLOAD_MEMORY_BYTES in memory plus SPILL_MIN_BYTES a writer, the
    rest waits in temporary files, and every object still comes out whole."""
    import os

    server, bucket = s3
    monkeypatch.setattr(s3store, "UPLOAD_MEMORY_BYTES", 1 << 20)
    monkeypatch.setattr(s3store, "SPILL_MIN_BYTES", 64 << 10)
    archive = Archive.create(f"s3://{bucket}/m", bucket="default", vbuckets=32)
    bw = archive.begin_backup("full")
    writers = {vb: bw.vbucket(vb, ArchivePosition.at(W, 0), [(W, 0)], block_size=32 << 10)
               for vb in range(32)}
    spilled = []
    real_spill = s3store._spill_path
    monkeypatch.setattr(s3store, "_spill_path", lambda: spilled.append(1) or real_spill())
    peak = 0
    values = {}
    for lo in range(1, 301, 20):  # interleaved: every vbucket grows a little each round
        for vb, w in writers.items():
            hi = lo + 19
            w.marker(lo, hi, 0)
            for s in range(lo, hi + 1):
                values[vb, s] = os.urandom(1024)
                w.mutation(s, 1, s, 0, 0, 0, b"k%d" % s, values[vb, s])
            w._flush()
            peak = max(peak, storage.held_in_memory())
    # the bound: the budget, plus what each writer holds below the spill size, plus a frame;
    # without it the writers would hold all 9.6 MB
    assert peak <= (1 << 20) + 32 * (64 << 10) + (64 << 10), peak
    assert spilled
    sums = [w.close(ArchivePosition.at(W, 300)) for w in writers.values()]
    assert storage.held_in_memory() == 0
    bw.commit(sums)
    assert verify_archive(f"s3://{bucket}/m").ok
    a = Archive.open(f"s3://{bucket}/m")
    got = a.resolve_vbucket(7)
    assert len(got) == 300 and got[b"k5"][8] == values[7, 5]
