"""Format version 2: columnar blocks (block.py), their size, and reading version 1 archives."""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import msgpack
import pytest
import zstandard
from archiveutil import W

from dcptool.archive import Archive, ArchivePosition, VBucketWriter
from dcptool.archive.block import ITEM_COST, compress_sections, decode_block, encode_records
from dcptool.archive.errors import CorruptFileError
from dcptool.archive.format import FORMAT_VERSION, sync_filesystem
from dcptool.archive.frames import decompress_frame, frame_records, scan_frames
from dcptool.archive.verify import verify_archive
from dcptool.archive.writer import buffered_bytes
from dcptool.protocol.collections import EVENT_BEGIN_COLLECTION, SystemEvent

FIXTURE = Path(__file__).parent / "fixtures" / "archive-v1"  # written by the version 1 writer
MAX64 = (1 << 64) - 1


def _random_records(rnd: random.Random, n: int) -> list[tuple]:
    recs: list[tuple] = [(0, "dcptool-archive", 2, 3, "20261122T000000.000000Z", 0),
                         (1, W, 0, 0, 0, ((W, 0), (7, 0)))]
    seq = 0
    for i in range(n):
        r = rnd.random()
        seq += rnd.choice((1, 1, 1, 5, -3))  # not even monotonic: the codec must not care
        cas = rnd.choice((0, MAX64, rnd.getrandbits(64), 1 << 63))
        key = rnd.randbytes(rnd.randrange(1, 30))
        val = rnd.randbytes(rnd.choice((0, 3, 300)))
        if r < 0.1:
            recs.append((2, seq, seq + 10, rnd.randrange(16)))
        elif r < 0.6:
            x = rnd.choice((None, None, b"\x00\x00\x00\x05xattr"))
            recs.append((3, seq, rnd.randrange(1 << 40), cas, rnd.getrandbits(32),
                         rnd.getrandbits(32), rnd.randrange(8), key, val, x))
        elif r < 0.8:
            recs.append((4, seq, 2, cas, key, rnd.getrandbits(32), rnd.randrange(8), val))
        elif r < 0.9:
            recs.append((5, seq, 2, cas, key, 0, 0, b""))
        else:
            recs.append((6, seq, rnd.getrandbits(64)))
    recs.append((7, W, seq, seq, seq))
    return recs


def test_block_codec_round_trips_every_record_type_and_extreme_values():
    rnd = random.Random(11)
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    for n in (0, 1, 50, 2000):
        recs = _random_records(rnd, n)
        sections = encode_records(recs)
        frame = compress_sections(cctx, sections)
        content = decompress_frame(frame, "x", 0)
        assert content == b"".join(sections)
        assert zstandard.frame_content_size(frame) == len(content)
        assert frame_records(content, "x", 0, validate=False) == recs
    only_items = [(3, s, 1, MAX64 - s, 0, 0, 1, b"k%d" % s, b"v", None) for s in range(1, 300)]
    assert decode_block(b"".join(encode_records(only_items))) == only_items


def test_damaged_blocks_raise_corrupt_file_error_only():
    rnd = random.Random(5)
    content = b"".join(encode_records(_random_records(rnd, 200)))
    raised = 0
    for _ in range(400):
        bad = bytearray(content)
        for _ in range(rnd.randint(1, 4)):
            bad[rnd.randrange(min(len(bad), 400))] = rnd.randrange(256)
        if rnd.random() < 0.2:
            bad = bad[:rnd.randrange(len(bad))]
        try:
            frame_records(bytes(bad), "f", 0)
        except CorruptFileError as exc:
            assert "f" in str(exc)
            raised += 1
    assert raised > 100


def _order_values(rnd: random.Random, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        head = b'{"id":%d,"status":"%s","note":"' % (i, rnd.choice((b"new", b"paid")))
        out.append(head + bytes(rnd.choice(b"abcdefghijklmnopqrstuvwxyz ")
                                for _ in range(200)) + b'"}')
    return out


def test_version_2_is_smaller_than_version_1_and_near_zstd_of_the_values(tmp_path):
    """The same records in both layouts: values with random text (Huffman-coded literals)
    and near-random CAS suffer most from the interleaving of version 1."""
    rnd = random.Random(3)
    values = _order_values(rnd, 6000)
    sizes = {}
    for version in (1, FORMAT_VERSION):  # 3 keeps the columnar blocks of 2
        a = Archive.create(tmp_path / f"v{version}", bucket="b", vbuckets=1)
        bw = a.begin_backup("full", version=version)
        w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
        w.marker(1, len(values))
        cas = 1_795_315_799_434_788_864
        r = random.Random(9)
        for s, v in enumerate(values, 1):
            cas += r.randrange(1 << 24) << 16
            w.mutation(s, 1, cas, 0, 0, 1, b"order::%09d" % (s * 1024 + r.randrange(1024)), v)
        sizes[version] = w.close(ArchivePosition.at(W, len(values)))["bytes"]["files"]
        bw.abort()
    zstd3 = len(zstandard.ZstdCompressor(level=3).compress(b"".join(values)))
    assert sizes[FORMAT_VERSION] < 0.93 * sizes[1], sizes
    assert sizes[FORMAT_VERSION] < 1.08 * zstd3, (sizes, zstd3)


def _copy_fixture(tmp_path: Path) -> Path:
    dst = tmp_path / "archive-v1"
    shutil.copytree(FIXTURE, dst)
    return dst


def test_version_1_fixture_reads_verifies_and_resolves(tmp_path):
    path = _copy_fixture(tmp_path)
    a = Archive.open(path)
    assert a.meta["version"] == 1
    report = verify_archive(path)
    assert report.ok, report.problems
    full, inc = a.committed_ids()
    assert [a.manifest(b)["version"] for b in (full, inc)] == [1, 1]
    recs = list(a.backup(full).records(1))
    assert recs[0] == (0, "dcptool-archive", 1, 1, full, 0)
    # the keys come out as doc keys of the default collection (the 0x00 prefix is given
    # by the reader: a version 1 file stores them without)
    assert recs[2:] == [
        (2, 1, 6, 2),
        *[(3, s, 1, 1000 + s, 7, 0, 1, b"\x00key-1-%d" % s, b'{"n":%d}' % s, None)
          for s in range(1, 5)],
        (3, 5, 2, 1005, 0, 99, 5, b"\x00key-1-1", b"body", b"\x00\x00\x00\x04xatt"),
        (4, 6, 3, 1006, b"\x00key-1-2", 1700000000, 0, b""),
        (7, 0x1111, 6, 6, 6),
    ]
    # vbucket 0 rolled back to 4 in the incremental: 5 and 6 of the full backup are dead
    state = a.resolve_vbucket(0)
    assert state[b"\x00key-0-3"][8] == b'{"n":"x"}'
    assert state[b"\x00key-0-4"][0] == 5  # expired
    assert state[b"\x00key-0-1"][8] == b'{"n":1}'  # the version at seqno 5 is dead
    assert state[b"\x00key-0-2"][0] == 3  # so is the deletion at 6


def test_new_backup_on_a_version_1_archive_writes_version_3(tmp_path):
    path = _copy_fixture(tmp_path)
    a = Archive.open(path)
    end = a.end_positions()[1]
    bw = a.begin_backup("incremental")
    w = bw.vbucket(1, end, [(0x1111, 0)])
    w.marker(7, 8)
    w.mutation(7, 5, 3007, 0, 0, 1, b"\x00key-1-3", b'{"n":7}')
    w.mutation(8, 5, 3008, 0, 0, 1, b"\x00key-1-9", b'{"n":8}')
    m = bw.commit([w.close(ArchivePosition.at(0x1111, 8))])
    assert m["version"] == FORMAT_VERSION == 3
    assert m["collections"] is None  # a node without collections (the default)
    assert json.loads((path / "archive.json").read_text())["version"] == 1  # never rewritten
    first = next(iter(a.backup(m["id"]).records(1)))
    assert first[2] == 3
    assert verify_archive(path).ok
    # one key form across the chain: the version 1 parent's keys read as doc keys too
    state = a.resolve_vbucket(1)
    assert state[b"\x00key-1-3"][8] == b'{"n":7}' and state[b"\x00key-1-9"][8] == b'{"n":8}'
    assert state[b"\x00key-1-2"][0] == 4


def test_resuming_a_version_1_partial_backup_keeps_version_1(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=2)
    bw = a.begin_backup("full", version=1, block_size=300)
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    for snap in range(10):
        w.marker(snap * 10 + 1, snap * 10 + 10)
        for s in range(snap * 10 + 1, snap * 10 + 11):
            w.mutation(s, 1, s, 0, 0, 1, b"k%d" % s, b"value %d" % s)
    w.abort()  # killed: a partial backup whose frames hold version 1 records
    bw.abort()
    bw = a.resume_backup()
    w = VBucketWriter(a, bw.id, 0, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    assert w.version == 1 and 0 < w.position.seqno <= 100
    at = w.position.seqno
    w.marker(at + 1, at + 1)
    w.mutation(at + 1, 1, at + 1, 0, 0, 1, b"k-new", b"new")
    m = bw.commit([w.close(ArchivePosition.at(W, at + 1))])
    assert m["version"] == 1
    assert verify_archive(a.path).ok
    for name in (f["name"] for f in m["vbuckets"][0]["files"]):
        with open(a.backup(m["id"]).dir / name, "rb") as f:
            for off, fr in scan_frames(f, name):
                assert decompress_frame(fr, name, off)[:1] != b"\xc1"  # msgpack, not blocks
    keys = [r[7] for r in a.backup(m["id"]).records(0) if r[0] == 3]
    assert keys[-1] == b"\x00k-new" and len(keys) == at + 1  # read as doc keys


def test_deferred_sync_writer_leaves_the_same_files(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=2)
    bw = a.begin_backup("full", block_size=2000, segment_bytes=3000)
    sums = []
    for vb, sync in ((0, True), (1, False)):
        w = VBucketWriter(a, bw.id, vb, ArchivePosition.at(W, 0), [(W, 0)], sync=sync)
        w.marker(1, 400)
        for s in range(1, 401):
            w.mutation(s, 1, s, 0, 0, 1, b"k%d" % s, os.urandom(20).hex().encode())
        sums.append(w.close(ArchivePosition.at(W, 400)))
    sync_filesystem(bw.dir)
    assert len(sums[1]["files"]) > 1
    assert json.loads((bw.dir / "vb-0001.done.json").read_text()) == sums[1]
    m = bw.commit(sums)
    assert [e["counts"]["mutations"] for e in m["vbuckets"]] == [400, 400]
    assert verify_archive(a.path).ok


@pytest.mark.parametrize("version", [1, FORMAT_VERSION])
def test_add_packed_checks_the_counts_it_is_given(tmp_path, version):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=1)
    bw = a.begin_backup("full", version=version)
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    recs = [(2, 1, 2, 0), (3, 1, 1, 5, 0, 0, 1, b"\x00a", b"xy", None),
            (4, 2, 1, 6, b"\x00b", 0, 0, b"")]
    if version < 3:  # plain keys in the file; read back with the prefix
        recs, read = [legacy_plain(r) for r in recs], recs
    else:
        read = recs
    data = b"".join(msgpack.packb(r) for r in recs)
    with pytest.raises(ValueError, match="not the counts"):
        w.add_packed(data, mutations=2, deletions=1, snapshots=1, value_bytes=2)
    w2 = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    w2.add_packed(data, mutations=1, deletions=1, snapshots=1, value_bytes=2)
    s = w2.close(ArchivePosition.at(W, 2))
    assert s["counts"]["mutations"] == 1 and s["counts"]["deletions"] == 1
    m = bw.commit([s])
    assert [r for r in a.backup(m["id"]).records(0) if r[0] in (2, 3, 4)] == read


def legacy_plain(r: tuple) -> tuple:
    """An item record with its doc key of the default collection made plain (format 1/2)."""
    if r[0] == 3:
        return r[:7] + (r[7][1:],) + r[8:]
    if r[0] in (4, 5):
        return r[:4] + (r[4][1:],) + r[5:]
    return r


def test_open_writers_keep_to_the_block_budget_together(tmp_path):
    """Many vbucket writers open at once close smaller frames (memory stays bounded);
    a writer open alone keeps the full block size."""
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=8)
    bw = a.begin_backup("full")
    budget = 8 * (64 << 10)

    def frames_of(summary):
        out = []
        for f in summary["files"]:
            with open(bw.dir / f["name"], "rb") as fh:
                out += [decompress_frame(fr, "x", off) for off, fr in scan_frames(fh, "x")]
        return out

    events = [(3, 0, s, 1, s, 0, 0, 1, b"k%d" % s, os.urandom(1000)) for s in range(1, 301)]
    ws = [VBucketWriter(a, bw.id, vb, ArchivePosition.at(W, 0), [(W, 0)], block_budget=budget)
          for vb in range(8)]
    for w in ws:
        w.marker(1, 300)
    before = buffered_bytes()
    run = 50 * (1000 + ITEM_COST)
    peak = 0
    for lo in range(0, 300, 50):  # interleaved, as a task streams its vbuckets
        for w in ws:
            w.mutation_events(events, lo, lo + 50)
            peak = max(peak, buffered_bytes() - before)
    # together they never hold more than the budget and the run just appended
    assert budget < peak <= budget + run + 1024, (peak, budget)
    sums = [w.close(ArchivePosition.at(W, 300)) for w in ws]
    assert buffered_bytes() == before
    sizes = [len(c) for c in frames_of(sums[0])]
    # frames of a run or two (at least MIN_BLOCK_SIZE of content), not one of 300 KB
    assert len(sizes) >= 2 and max(sizes) < 160 << 10, sizes
    alone = VBucketWriter(a, bw.id, 0, ArchivePosition.at(W, 0), [(W, 0)], block_budget=budget)
    alone.marker(1, 300)
    alone.mutation_events(events)
    assert len(frames_of(alone.close(ArchivePosition.at(W, 300)))) == 1
    assert [r[8] for r in frames_of_records(bw.dir, sums[3])] == [e[9] for e in events]
    bw.abort()


def frames_of_records(bdir, summary):
    from dcptool.archive.frames import iter_file_records

    return [r for f in summary["files"] for r in iter_file_records(bdir / f["name"])
            if r[0] == 3]


def test_the_documented_reader_reads_both_versions(tmp_path):
    """docs/archive-format.md's reader (no dcptool imports) yields dcptool's records."""
    import re

    from dcptool.archive.frames import iter_file_records

    doc = (Path(__file__).parents[2] / "docs" / "archive-format.md").read_text()
    section = doc[doc.index("## Reading an archive without dcptool"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    v1 = _copy_fixture(tmp_path)
    a = Archive.create(tmp_path / "v2", bucket="b", vbuckets=1)
    bw = a.begin_backup("full")
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    recs = _random_records(random.Random(2), 300)[2:-1]
    # version 3 keys are doc keys (collection 0 and 9 here), with a system event
    recs = [r[:7] + (b"\x09" + r[7],) + r[8:] if r[0] == 3 else
            r[:4] + (b"\x00" + r[4],) + r[5:] if r[0] in (4, 5) else r for r in recs]
    w.write([r for r in recs if r[0] in (2, 3, 4, 5)])
    w.marker(20_000, 20_001)
    w.system_event(SystemEvent(20_001, EVENT_BEGIN_COLLECTION, 4, 8, 9, "c9", 60))
    bw.commit([w.close(ArchivePosition.at(W, 20_001))])
    for arc in (v1, a.path):
        ns: dict = {}
        exec(code.replace('"/backups/travel"', repr(str(arc))), ns)
        files = sorted(arc.glob("backups/*/vb-*.mpk.zst"))
        assert files
        for f in files:
            # the records as stored (a version 1 file's keys without the prefix)
            assert list(ns["records"](f.read_bytes())) == \
                list(iter_file_records(f, doc_keys=False))
    # a packed backup (what a backup task writes on object storage): members by range
    from dcptool.archive.format import entry_location
    from dcptool.archive.packing import Packer

    p = Archive.create(tmp_path / "packed", bucket="b", vbuckets=4)
    bw = p.begin_backup("full")
    packer = Packer(bw.dir)
    sums = []
    for vb in range(4):
        w = bw.vbucket(vb, ArchivePosition.at(W, 0), [(W, 0)], packer=packer)
        w.write([r for r in recs if r[0] in (2, 3, 4, 5)])
        sums.append(w.close(ArchivePosition.at(W, 20_000)))
    packer.flush()
    m = bw.commit(sums)
    ns = {}
    exec(code.replace('"/backups/travel"', repr(str(p.path))), ns)
    for e in m["vbuckets"]:
        (f,) = e["files"]
        assert "pack" in f
        assert list(ns["records"](ns["file_bytes"](bw.dir, f))) == \
            list(iter_file_records(entry_location(bw.dir, f), doc_keys=False))
