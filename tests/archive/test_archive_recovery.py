"""Partial backups: recovery tells complete from incomplete vbuckets and where to restart;
a resumed writer keeps the valid prefix, and the result equals an uninterrupted backup."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from archiveutil import W, flip_position, mutations, write_events

from dcptool.archive import Archive, ArchiveError, ArchivePosition
from dcptool.archive.frames import TornFrame, decompress_frame, frame_records, scan_frames
from dcptool.archive.verify import verify_archive


def complete_frames_records(path):
    """Records of the complete frames of a (possibly torn) file, read independently."""
    out = []
    with open(path, "rb") as f:
        try:
            for off, fr in scan_frames(f, str(path)):
                out += frame_records(decompress_frame(fr, str(path), off), str(path), off)
        except TornFrame:
            pass
    return out


def value(seqno: int) -> bytes:
    return b'{"seq":%d,"pad":"%s"}' % (seqno, os.urandom(30).hex().encode())


def events(first, last, per=50):
    return [(e[0], e[1], e[2], value(e[1])) if e[0] == "mut" else e
            for e in mutations(first, last, per_snapshot=per)]


def test_torn_partial_backup_recovers_and_resumes(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    bw = a.begin_backup("full", block_size=3000)
    w0 = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w0, events(1, 500))
    done0 = w0.close(ArchivePosition.at(W, 500))
    w1 = bw.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w1, events(1, 500))
    w1.abort()
    path1 = bw.dir / "vb-0001-000.mpk.zst"
    size = path1.stat().st_size
    os.truncate(path1, size - 700)  # the last frame is torn
    bw.abort()

    kept = complete_frames_records(path1)
    expect = max(r[1] for r in kept if r[0] == 3 and r[1] % 50 == 0)
    assert 0 < expect < 500

    partial = a.partial_backup()
    assert partial.id == bw.id
    rec = partial.recover()
    assert sorted(rec) == [0, 1]
    assert rec[0].complete and rec[0].summary == done0 and rec[0].position == ArchivePosition.at(W, 500)
    assert not rec[1].complete
    assert rec[1].position == ArchivePosition.at(W, expect)
    assert rec[1].start == ArchivePosition.at(W, 0)
    assert "torn" in rec[1].problem
    assert rec[1].to_json()["position"] == {"uuid": W, "seqno": expect, "snap_start": expect,
                                            "snap_end": expect}
    # scan=False only checks done files
    quick = partial.recover(scan=False)
    assert quick[0].complete and not quick[1].complete and quick[1].position is None

    bw2 = a.resume_backup()
    assert bw2.id == bw.id and bw2.resumed
    w1 = bw2.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    assert w1.position == ArchivePosition.at(W, expect)
    write_events(w1, events(expect + 1, 500))
    s1 = w1.close(ArchivePosition.at(W, 500))
    names = [f["name"] for f in s1["files"]]
    assert names == ["vb-0001-000.mpk.zst", "vb-0001-001.mpk.zst"]
    assert path1.stat().st_size < size - 700  # the torn tail and the open snapshot are gone
    w2 = bw2.vbucket(2, ArchivePosition.at(W, 0), [(W, 0)], resume=True)  # never started: fresh
    assert w2.position == ArchivePosition.at(W, 0)
    write_events(w2, events(1, 500))
    s2 = w2.close(ArchivePosition.at(W, 500))
    m = bw2.commit([rec[0].summary, s1, s2])
    assert [e["counts"]["mutations"] for e in m["vbuckets"]] == [500, 500, 500]
    report = verify_archive(a.path)
    assert report.ok, [str(p) for p in report.problems]
    b = a.backup(bw.id)
    for vb in (0, 1, 2):
        seqnos = [r[1] for r in b.records(vb) if r[0] == 3]
        assert seqnos == list(range(1, 501)), vb  # no gap, no duplicate
        assert len(a.resolve_vbucket(vb)) == 500


def test_completed_vbucket_with_a_changed_file_is_not_complete(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=2)
    bw = a.begin_backup("full", block_size=2000)
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w, events(1, 200))
    w.close(ArchivePosition.at(W, 200))
    bw.abort()
    path = bw.dir / "vb-0000-000.mpk.zst"
    data = bytearray(path.read_bytes())
    data[flip_position(bytes(data), path, content_changes=True)] ^= 0x01
    path.write_bytes(bytes(data))
    rec = a.partial_backup().recover()[0]
    assert not rec.complete
    assert "SHA-256 does not match" in rec.problem
    assert rec.position is not None and rec.position.seqno < 200  # the prefix before the flip
    bw2 = a.resume_backup()
    w = bw2.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    assert w.position == rec.position
    write_events(w, events(rec.position.seqno + 1, 200))
    bw2.commit([w.close(ArchivePosition.at(W, 200))])
    assert verify_archive(a.path).ok
    assert [r[1] for r in a.backup(bw.id).records(0) if r[0] == 3] == list(range(1, 201))


def test_killed_after_end_record_restarts_at_the_end(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=1)
    bw = a.begin_backup("full")
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w, events(1, 120, per=40))
    w.close(ArchivePosition.at(W, 130))  # the node's last snapshot ended past the last item
    os.unlink(bw.dir / "vb-0000.done.json")  # killed before the done file was renamed in
    bw.abort()
    rec = a.partial_backup().recover()[0]
    assert not rec.complete and rec.position == ArchivePosition.at(W, 130)
    bw2 = a.resume_backup()
    w = bw2.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    s = w.close(ArchivePosition.at(W, 130))
    assert s["counts"]["mutations"] == 120
    bw2.commit([s])
    assert verify_archive(a.path).ok


def test_resume_refuses_a_complete_vbucket_and_handles_nothing_valid(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=2)
    bw = a.begin_backup("full")
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    write_events(w, events(1, 10))
    w.close(ArchivePosition.at(W, 10))
    (bw.dir / "vb-0001-000.mpk.zst").write_bytes(b"\x28\xb5\x2f\xfd\x00")  # a torn first frame
    bw.abort()
    rec = a.partial_backup().recover()
    assert rec[0].complete and not rec[1].complete and rec[1].position is None
    bw2 = a.resume_backup()
    with pytest.raises(ArchiveError, match="already complete"):
        bw2.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    w1 = bw2.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    assert w1.position == ArchivePosition.at(W, 0)
    write_events(w1, events(1, 10))
    bw2.commit([rec[0].summary, w1.close(ArchivePosition.at(W, 10))])
    assert verify_archive(a.path).ok


WRITER = textwrap.dedent("""
    import os, sys, time
    from dcptool.archive import Archive, ArchivePosition
    a = Archive.open(sys.argv[1])
    bw = a.begin_backup("full", block_size=4096)
    print(bw.id, flush=True)
    writers = [bw.vbucket(vb, ArchivePosition.at(7, 0), [(7, 0)]) for vb in range(4)]
    for vb in (0, 1):  # these finish
        w = writers[vb]
        w.marker(1, 1000)
        for s in range(1, 1001):
            w.mutation(s, 1, s, 0, 0, 1, b"key-%d" % s, b"v" * 100)
        w.close(ArchivePosition.at(7, 1000))
    print("two done", flush=True)
    s = 0
    while True:  # vbuckets 2 and 3 stream forever, 10 items per snapshot, until killed
        for vb in (2, 3):
            writers[vb].marker(s + 1, s + 10)
            for q in range(s + 1, s + 11):
                writers[vb].mutation(q, 1, q, 0, 0, 1, b"key-%d" % q, os.urandom(60))
        s += 10
        if s % 500 == 0:
            time.sleep(0.001)
""")


def test_sigkill_mid_backup_then_resume(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=4)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(a.path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        assert proc.stdout.readline().strip() == "two done"
        deadline = time.time() + 30
        bdir = a.backup_dir(a.partial_ids()[0])
        while time.time() < deadline:  # let vbuckets 2 and 3 write a few frames
            if (bdir / "vb-0003-000.mpk.zst").exists() and \
                    (bdir / "vb-0003-000.mpk.zst").stat().st_size > 40_000:
                break
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert (a.path / "lock").exists()  # the dead writer's lock ...
    rec = a.partial_backup().recover()
    assert rec[0].complete and rec[1].complete
    assert not rec[2].complete and not rec[3].complete
    positions = {vb: rec[vb].position.seqno for vb in (2, 3)}
    assert all(p > 0 and p % 10 == 0 for p in positions.values())
    bw = a.resume_backup()  # ... is stale (its pid is gone) and broken
    sums = [rec[0].summary, rec[1].summary]
    for vb in (2, 3):
        w = bw.vbucket(vb, ArchivePosition.at(7, 0), [(7, 0)], resume=True)
        p = w.position.seqno
        assert p == positions[vb]
        for s in range(p, 2000, 10):
            w.marker(s + 1, s + 10)
            for q in range(s + 1, s + 11):
                w.mutation(q, 1, q, 0, 0, 1, b"key-%d" % q, b"after")
        sums.append(w.close(ArchivePosition.at(7, 2000)))
    m = bw.commit(sums)
    assert m["totals"]["mutations"] == 2000 + 4000
    report = verify_archive(a.path)
    assert report.ok, [str(p) for p in report.problems]
    b = a.backup(m["id"])
    for vb in (2, 3):
        assert [r[1] for r in b.records(vb) if r[0] == 3] == list(range(1, 2001))
