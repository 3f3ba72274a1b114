"""verify: a sound archive passes; every kind of damage is found and names the file."""
from __future__ import annotations

import json
import os
import random
import shutil

import pytest

from archiveutil import W, X, backup, flip_position, mutations

from dcptool.archive import Archive, CorruptFileError, ArchivePosition
from dcptool.archive.verify import verify_archive


def valued(evts):
    return [(e[0], e[1], e[2], b'{"n":%d,"r":"%s"}' % (e[1], os.urandom(12).hex().encode()))
            if e[0] == "mut" else e for e in evts]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine") / "arc"
    a = Archive.create(path, bucket="b", vbuckets=4)
    full = backup(a, "full", {vb: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 300),
                                   "events": valued(mutations(1, 300, per_snapshot=60))}
                              for vb in range(4)}, block_size=2000)
    inc = backup(a, "incremental", {vb: {"start": ArchivePosition.at(W, 300), "end": ArchivePosition.at(X, 320),
                                         "flog": [(X, 300), (W, 0)],
                                         "events": [("snap", 301, 320), ("del", 301, b"doc-1"),
                                                    ("exp", 302, b"doc-2")]
                                         + valued([("mut", s, b"doc-%d" % s)
                                                   for s in range(303, 321)])}
                                    for vb in (0, 1)})
    return path, full, inc


@pytest.fixture
def arc(pristine, tmp_path):
    path, full, inc = pristine
    copy = tmp_path / "arc"
    shutil.copytree(path, copy)
    return copy, full, inc


def data_file(path, backup_id, vb, seg=0):
    return path / "backups" / backup_id / f"vb-{vb:04d}-{seg:03d}.mpk.zst"


def problems(path):
    report = verify_archive(path)
    return report, [str(p) for p in report.problems]


def test_sound_archive_verifies(arc):
    path, full, inc = arc
    report, probs = problems(path)
    assert report.ok and probs == [] and report.notes == []
    assert report.backups_checked == 2 and report.files_checked == 6
    assert report.records_checked == full["totals"]["records"] + inc["totals"]["records"]


@pytest.mark.parametrize("content_changes", [True, False], ids=["content", "same-content"])
def test_flipped_byte_is_found_and_names_the_file(arc, content_changes):
    """A flipped bit is found by the file's SHA-256; where it changes what its frame decodes
    to, decoding says where. (About one byte in 500 is a match offset into a run of equal
    bytes, whose flip decodes to the same content: only the SHA-256 sees that one.)"""
    path, full, _inc = arc
    f = data_file(path, full["id"], 2)
    data = bytearray(f.read_bytes())
    data[flip_position(bytes(data), f, content_changes=content_changes)] ^= 0x01
    f.write_bytes(bytes(data))
    report, probs = problems(path)
    assert not report.ok
    assert probs and all(p.startswith(str(f) + ":") for p in probs), probs
    assert any("SHA-256 does not match" in p for p in probs)
    assert any(": at byte " in p for p in probs) == content_changes, probs


def test_truncated_file(arc):
    path, _full, inc = arc
    f = data_file(path, inc["id"], 1)
    os.truncate(f, f.stat().st_size - 5)
    report, probs = problems(path)
    assert not report.ok
    assert any(p.startswith(str(f)) and "truncated" in p for p in probs), probs


def test_swapped_files(arc):
    path, full, _inc = arc
    f0, f1 = data_file(path, full["id"], 0), data_file(path, full["id"], 1)
    tmp = f0.with_suffix(".tmp")
    os.rename(f0, tmp)
    os.rename(f1, f0)
    os.rename(tmp, f1)
    _report, probs = problems(path)
    for f, other in ((f0, 1), (f1, 0)):
        assert any(p.startswith(str(f)) and f"vbucket {other} of backup" in p and "swapped" in p
                   for p in probs), probs
    # and reading refuses them with a clear error instead of returning the wrong data
    # (the size check catches it first, unless both files compressed to the same size)
    with pytest.raises(CorruptFileError,
                       match="vb-0000-000.mpk.zst: (size is|holds segment 0 of vbucket 1 )"):
        list(Archive.open(path).backup(full["id"]).records(0))


def test_missing_manifest(arc):
    path, _full, inc = arc
    os.unlink(path / "backups" / inc["id"] / "manifest.json")
    report, probs = problems(path)
    assert report.ok and probs == []  # a partial backup is not damage ...
    assert report.partial_backups == 1 and report.backups_checked == 1
    assert any(n.startswith(str(path / "backups" / inc["id"])) and "partial backup" in n
               for n in report.notes)  # ... but it is reported


def test_incremental_whose_parent_lost_its_manifest(arc):
    path, full, inc = arc
    os.unlink(path / "backups" / full["id"] / "manifest.json")
    report, probs = problems(path)
    mpath = str(path / "backups" / inc["id"] / "manifest.json")
    assert any(p == f"{mpath}: parent backup {full['id']} is partial" for p in probs), probs


def test_manifest_counts_that_lie(arc):
    path, full, _inc = arc
    mpath = path / "backups" / full["id"] / "manifest.json"
    m = json.loads(mpath.read_text())
    m["vbuckets"][3]["counts"]["mutations"] += 1
    m["totals"]["mutations"] += 1
    mpath.write_text(json.dumps(m))
    _report, probs = problems(path)
    assert any("vbucket 3: holds 300 mutations but the manifest says 301" in p
               for p in probs), probs
    mpath.write_text("{ not json")
    _report, probs = problems(path)
    assert any(p.startswith(str(mpath)) and "unreadable" in p for p in probs), probs


def test_manifest_that_is_not_well_formed(arc):
    path, full, _inc = arc
    mpath = path / "backups" / full["id"] / "manifest.json"
    m = json.loads(mpath.read_text())
    del m["vbuckets"][0]["files"][0]["sha256"]
    m["type"] = "weekly"
    mpath.write_text(json.dumps(m))
    _report, probs = problems(path)
    assert any("sha256 is not 64 hex digits" in p for p in probs), probs
    assert any("type 'weekly'" in p for p in probs), probs


def test_unlisted_data_file(arc):
    path, full, _inc = arc
    extra = path / "backups" / full["id"] / "vb-0001-001.mpk.zst"
    extra.write_bytes(b"")
    _report, probs = problems(path)
    assert probs == [f"{extra}: data file not listed in the manifest"]


def test_backup_that_does_not_start_where_its_parent_ended(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=2)
    backup(a, "full", {0: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 50),
                           "events": mutations(1, 50)}})
    inc = backup(a, "incremental", {0: {"start": ArchivePosition.at(W, 40), "end": ArchivePosition.at(W, 60),
                                        "events": mutations(41, 60)},
                                    1: {"start": ArchivePosition.at(W, 7), "end": ArchivePosition.at(W, 9),
                                        "events": mutations(8, 9)}})
    _report, probs = problems(a.path)
    mpath = a.path / "backups" / inc["id"] / "manifest.json"
    assert f"{mpath}: vbucket 0: starts at uuid {W} seqno 40 but the chain before it ended at " \
           f"uuid {W} seqno 50, with no rollback recorded" in probs
    assert f"{mpath}: vbucket 1: starts at seqno 7 but no earlier backup of the chain holds it" \
           in probs


def test_seqnos_out_of_order_or_outside_the_snapshot(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=2)
    m = backup(a, "full", {
        0: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 10),
            "events": [("snap", 1, 10), ("mut", 1, b"\x00a"), ("mut", 3, b"\x00b"),
                       ("mut", 2, b"\x00c")]},
        1: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 10),
            "events": [("snap", 1, 5), ("mut", 1, b"\x00a"), ("mut", 7, b"\x00b")]}})
    _report, probs = problems(a.path)
    f0 = data_file(a.path, m["id"], 0)
    f1 = data_file(a.path, m["id"], 1)
    assert f"{f0}: record 5: item seqno 2 does not increase (after 3)" in probs
    assert f"{f1}: record 4: item seqno 7 lies outside its snapshot 1..5" in probs


def test_random_damage_never_crashes_and_is_always_found(pristine, tmp_path):
    src, full, inc = pristine
    rng = random.Random(20261122)
    files = sorted(p for p in src.rglob("*.mpk.zst"))
    for i in range(int(os.environ.get("DCPTOOL_FUZZ_ROUNDS", "60"))):
        path = tmp_path / f"arc{i}"
        shutil.copytree(src, path)
        victim = path / files[rng.randrange(len(files))].relative_to(src)
        data = bytearray(victim.read_bytes())
        kind = rng.choice(["flip", "truncate", "zero", "append", "shuffle"])
        if kind == "flip":
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del data[rng.randrange(len(data)):]
        elif kind == "zero":
            at = rng.randrange(len(data))
            data[at:at + rng.randint(1, 64)] = bytes(min(64, len(data) - at))
        elif kind == "append":
            data += os.urandom(rng.randint(1, 100))
        else:
            cut = rng.randrange(1, len(data))
            data = data[cut:] + data[:cut]
        if bytes(data) == victim.read_bytes():
            continue
        victim.write_bytes(bytes(data))
        report = verify_archive(path)
        assert not report.ok, (kind, victim)
        assert any(p.path == str(victim) for p in report.problems), (kind, victim, report.problems)
        # reading the damaged vbucket fails with a clear error, never another exception
        a = Archive.open(path)
        bid = victim.parent.name
        vb = int(victim.name[3:7])
        with pytest.raises(CorruptFileError) as exc:
            for _ in a.backup(bid).records(vb, check_sha256=True):
                pass
        assert str(victim) in str(exc.value)
        shutil.rmtree(path)


def test_damaged_records_inside_valid_frames_never_crash(pristine, tmp_path):
    """Damage below the checksums: change the msgpack bytes inside a frame, recompress it
    and re-sign the manifest, so only the record checks stand between it and a restore."""
    import hashlib

    import zstandard

    from dcptool.archive import ResolutionError
    from dcptool.archive.frames import decompress_frame, scan_frames

    src, _full, _inc = pristine
    rng = random.Random(7)
    files = sorted(src.rglob("*.mpk.zst"))
    found = 0
    for i in range(int(os.environ.get("DCPTOOL_FUZZ_ROUNDS", "60"))):
        path = tmp_path / f"arc{i}"
        shutil.copytree(src, path)
        victim = path / files[rng.randrange(len(files))].relative_to(src)
        with open(victim, "rb") as f:
            frames = [decompress_frame(fr, "x", off) for off, fr in scan_frames(f, "x")]
        k = rng.randrange(len(frames))
        content = bytearray(frames[k])
        for _ in range(rng.randint(1, 3)):
            content[rng.randrange(len(content))] = rng.randrange(256)
        frames[k] = bytes(content)
        cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
        data = b"".join(cctx.compress(c) for c in frames)
        victim.write_bytes(data)
        mpath = victim.parent / "manifest.json"
        m = json.loads(mpath.read_text())
        for e in m["vbuckets"]:
            for fe in e["files"]:
                if fe["name"] == victim.name:
                    e["bytes"]["files"] += len(data) - fe["size"]
                    m["totals"]["file_bytes"] += len(data) - fe["size"]
                    fe["size"], fe["sha256"] = len(data), hashlib.sha256(data).hexdigest()
                    # the done file says what the manifest says (verify compares them)
                    (victim.parent / f"vb-{e['vbucket']:04d}.done.json").write_text(
                        json.dumps(e))
        mpath.write_text(json.dumps(m))
        report = verify_archive(path)
        assert all(p.path == str(victim) for p in report.problems), report.problems
        found += not report.ok
        a = Archive.open(path)
        vb = int(victim.name[3:7])
        try:
            a.resolve_vbucket(vb)
        except (CorruptFileError, ResolutionError) as exc:
            assert victim.name in str(exc) or isinstance(exc, ResolutionError)
        shutil.rmtree(path)
    assert found > 0


def test_long_runs_of_mutations_name_the_record_at_fault(tmp_path):
    """Runs of mutations are checked column by column (verify.py `_runs`); one bad record
    in a long run is still named by its number and its fault, and sound runs are counted."""
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=3)
    bad_order = mutations(1, 40, per_snapshot=40, prefix=b"\x00a")
    bad_order[30] = ("mut", 5, b"\x00late")        # seqno 5 after 29, inside the run
    outside = mutations(1, 40, per_snapshot=40, prefix=b"\x00b")
    outside[0] = ("snap", 1, 20)                   # items 21..40 lie past their snapshot
    m = backup(a, "full", {
        0: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 40),
            "events": bad_order},
        1: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 40),
            "events": outside},
        2: {"start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 300),
            "events": mutations(1, 300, per_snapshot=100, prefix=b"\x00c")}})
    report, probs = problems(a.path)
    # records: header 0, stream 1, snapshot 2, then the items from 3
    assert f"{data_file(a.path, m['id'], 0)}: record 32: item seqno 5 does not increase " \
           "(after 29)" in probs
    assert f"{data_file(a.path, m['id'], 1)}: record 23: item seqno 21 lies outside its " \
           "snapshot 1..20" in probs
    assert not any(p.startswith(str(data_file(a.path, m["id"], 2))) for p in probs)
