"""`dcptool info` and `dcptool verify` as a user runs them: real subprocesses, real archives."""
from __future__ import annotations

import json
import re
import os
import subprocess

import pytest
from cliutil import run_dcptool

from dcptool.archive import Archive, ArchivePosition

W = 0x1234_5678_9ABC_DEF0


def run(*args: str) -> subprocess.CompletedProcess:
    return run_dcptool({**os.environ, "NO_COLOR": "1"}, *args, timeout=120)


def write_backup(a: Archive, btype: str, first: int, last: int, *, vbuckets=(0, 1),
                 rollback: int | None = None, commit: bool = True) -> str:
    bw = a.begin_backup(btype)
    sums = []
    for vb in vbuckets:
        start = ArchivePosition.at(W, 0 if btype == "full" else first - 1)
        w = bw.vbucket(vb, start, [(W, 0)])
        if rollback is not None:
            w.rollback(rollback, W)
            w.stream(ArchivePosition.at(W, rollback), [(W, 0)])
        w.marker(first, last)
        for s in range(first, last + 1):
            if s % 10 == 0:
                w.deletion(s, 2, s, b"doc-%d" % (s - 5), 77)
            else:
                w.mutation(s, 1, s, 0, 0, 1, b"doc-%d" % s, b'{"n":%d}' % s)
        sums.append(w.close(ArchivePosition.at(W, last)))
    if not commit:
        bw.abort()
        return bw.id
    return bw.commit(sums)["id"]


@pytest.fixture
def archive(tmp_path) -> Archive:
    a = Archive.create(tmp_path / "arc", bucket="travel", vbuckets=2)
    write_backup(a, "full", 1, 100)
    write_backup(a, "incremental", 101, 120)
    return a


def test_info_json(archive):
    write_backup(archive, "incremental", 91, 130, rollback=90, vbuckets=(1,))
    res = run("info", str(archive.path), "--json")
    assert res.returncode == 0, res.stderr
    desc = json.loads(res.stdout)
    assert desc["archive"]["bucket"] == "travel" and desc["archive"]["vbuckets"] == 2
    assert desc["archive"]["uuid"] == archive.uuid and desc["archive"]["locked_by"] is None
    full, inc, inc2 = desc["backups"]
    assert full["type"] == "full" and full["parent"] is None and full["state"] == "complete"
    assert inc["parent"] == full["id"] and inc["type"] == "incremental"
    assert (full["vbuckets"], full["mutations"], full["deletions"]) == (2, 180, 20)
    assert (inc["mutations"], inc["deletions"], inc["rollbacks"]) == (36, 4, 0)
    assert inc2["rollbacks"] == 1 and inc2["rollback_records"] == [
        {"vbucket": 1, "seqno": 90, "vbucket_uuid": W}]
    bdir = archive.path / "backups" / full["id"]
    assert full["size_on_disk"] == sum(p.stat().st_size for p in bdir.iterdir())
    assert full["started"].endswith("Z") and full["finished"] >= full["started"]


def test_info_table_and_partial(archive):
    pid = write_backup(archive, "incremental", 121, 140, commit=False)
    res = run("info", str(archive.path))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "bucket travel" in out and "2 vbuckets" in out
    for line_id, state in ((pid, "partial"),):
        line = next(l for l in out.splitlines() if l.startswith("│ " + line_id))
        assert state in line
    assert f"{pid} is partial" in out
    desc = json.loads(run("info", str(archive.path), "--json").stdout)
    assert desc["backups"][-1]["state"] == "partial" and desc["backups"][-1]["vbuckets"] == 2


def test_info_errors_are_one_line(tmp_path):
    res = run("info", str(tmp_path / "nowhere"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"dcptool: error: no archive at {tmp_path / 'nowhere'}: no such directory"]
    res = run("info", str(tmp_path))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcptool: error: ")
    assert "not a dcptool archive" in lines[0]
    res = run("verify", str(tmp_path / "nowhere"))
    assert res.returncode == 2 and res.stderr.startswith("dcptool: error: no archive at")
    assert "Traceback" not in res.stderr


def test_verify_ok(archive):
    res = run("verify", str(archive.path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.match(r"OK: 2 backups \([\d.]+ (B|KiB|MiB)\), 4 files",
                    res.stdout.strip().splitlines()[-1]), res.stdout
    res = run("verify", str(archive.path), "--json")
    report = json.loads(res.stdout)
    assert res.returncode == 0 and report["ok"] and report["problems"] == []
    # the size is info's: the bytes of the backups' files
    info = json.loads(run("info", str(archive.path), "--json").stdout)
    assert report["size_on_disk"] == info["archive"]["size_on_disk"] > 0
    assert report["records_checked"] == 2 * (100 + 4) + 2 * (20 + 4)


def test_verify_names_the_flipped_file(archive):
    target = sorted((archive.path / "backups").glob("*/vb-0001-000.mpk.zst"))[0]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    res = run("verify", str(archive.path))
    assert res.returncode == 1
    lines = res.stdout.strip().splitlines()
    assert lines[-1].startswith("FAILED: ")
    assert any(l.startswith(f"{target}: SHA-256 does not match") for l in lines), lines
    assert all(l.startswith(str(target)) for l in lines[:-1]), lines
    report = json.loads(run("verify", str(archive.path), "--json").stdout)
    assert not report["ok"] and {p["path"] for p in report["problems"]} == {str(target)}
    assert report["problems"][0]["vbucket"] == 1
    quick = run("verify", str(archive.path), "--checksums-only")
    assert quick.returncode == 1 and str(target) in quick.stdout


def test_verify_truncated_and_missing_files(archive):
    files = sorted((archive.path / "backups").glob("*/vb-0000-000.mpk.zst"))
    os.truncate(files[0], 10)
    os.unlink(files[1])
    res = run("verify", str(archive.path), "--json")
    assert res.returncode == 1
    probs = {(p["path"], p["message"]) for p in json.loads(res.stdout)["problems"]}
    assert any(path == str(files[0]) and "truncated" in msg for path, msg in probs), probs
    assert (str(files[1]), "listed in the manifest but missing") in probs
    assert "Traceback" not in res.stderr


def test_verify_reports_partial_backup_as_a_note(archive):
    write_backup(archive, "incremental", 121, 140, commit=False)
    res = run("verify", str(archive.path))
    assert res.returncode == 0
    assert any(l.startswith("note: ") and "partial backup" in l
               for l in res.stdout.splitlines())


def test_commands_are_registered():
    res = run("--help")
    assert "info" in res.stdout and "verify" in res.stdout
