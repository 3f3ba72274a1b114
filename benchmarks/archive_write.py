"""Benchmark the archive writer against a bare msgpack + zstd loop, in the same run.

Both write the same pre-built mutation records (256-byte JSON values by default) to files:

- bare:        Packer().pack(tuple) appended to a bytearray, zstd level 3 (with frame
               checksums, as the archive writes) once the buffer passes 1 MiB, os.write;
- writer:      VBucketWriter.mutation(...) per record, one vbucket, then close() (end
               record, fsync, done file);
- add_packed:  the caller packs records itself, as the bare loop does, and hands the bytes
               of each run of 64 records to VBucketWriter.add_packed with their counts;
- x16:         the same records spread over 16 streams (bare) or 16 vbucket writers in runs
               of 64, the way a backup task interleaves the streams of its vbuckets.

Only the writing is timed (not creating the archive). Reported: items/s and MB/s (of key +
value bytes) per variant, the ratio of each to the bare loop of the same shape (best of
--repeat), and the archive's data size against `zstd -3` of the concatenated raw values
(issue 11's size target).

    python benchmarks/archive_write.py                  # 1M records
    python benchmarks/archive_write.py --records 200000 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import msgpack  # noqa: E402
import zstandard  # noqa: E402

from dcptool.archive import Archive, ArchivePosition, VBucketWriter  # noqa: E402

BLOCK = 1 << 20
UUID = 0x5EED_0000_0000_0001

_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
          "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()
_CITIES = ("Oslo", "Lima", "Paris", "Osaka", "Quito", "Accra", "Perth", "Porto", "Dakar")
_STATUS = ("new", "paid", "packed", "shipped", "delivered", "returned")


def make_value(rng: random.Random, i: int, size: int) -> bytes:
    """A JSON document of about `size` bytes with the variety of real order documents."""
    items = ",".join(
        '{"sku":"SKU-%05d","qty":%d,"price":%d.%02d}' % (rng.randrange(100000), rng.randint(1, 9),
                                                          rng.randint(1, 500), rng.randrange(100))
        for _ in range(rng.randint(1, 3)))
    doc = ('{"id":%d,"type":"order","customer":"cust-%06d","city":"%s","status":"%s",'
           '"items":[%s],"created":"2026-11-%02dT%02d:%02d:%02dZ","note":"' % (
               i, rng.randrange(1_000_000), rng.choice(_CITIES), rng.choice(_STATUS), items,
               rng.randint(1, 28), rng.randrange(24), rng.randrange(60), rng.randrange(60)))
    note = []
    while len(doc) + len(" ".join(note)) + 2 < size:
        note.append(rng.choice(_WORDS))
    return (doc + " ".join(note)[:max(0, size - len(doc) - 2)] + '"}').encode()


def make_records(n: int, value_size: int, seed: int = 1) -> list[tuple]:
    """(seqno, rev_seqno, cas, flags, expiry, datatype, key, value) per mutation."""
    rng = random.Random(seed)
    cas_ns = 1_763_700_000_000_000_000
    out = []
    for i in range(n):
        cas_ns += rng.randint(2_000, 12_000)  # a document every few microseconds
        cas = (cas_ns & ~0xFFFF) | (i & 0xFFFF)  # hybrid logical clock: time + counter
        out.append((i + 1, 1, cas, 0, 0, 1, b"order::%08d" % i, make_value(rng, i, value_size)))
    return out


def bare_loop(records: list[tuple], scratch: Path, level: int, streams: int = 1,
              run: int = 64) -> tuple[float, int]:
    """The limit: pack each record tuple into a bytearray per stream, compress ~1 MiB frames
    with zstd (frame checksums on, as the archive writes them), os.write them, fsync.
    With streams > 1, runs of `run` records go to each stream in turn."""
    pack = msgpack.Packer().pack
    cctx = zstandard.ZstdCompressor(level=level, write_checksum=True)
    fds = [os.open(scratch / f"bare-{i}.mpk.zst", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
           for i in range(streams)]
    bufs = [bytearray() for _ in range(streams)]
    size = 0
    t0 = time.perf_counter()
    for start in range(0, len(records), run):
        i = (start // run) % streams
        buf = bufs[i]
        for seqno, rev, cas, flags, expiry, datatype, key, value in records[start:start + run]:
            buf += pack((3, seqno, rev, cas, flags, expiry, datatype, key, value, None))
            if len(buf) >= BLOCK:
                frame = cctx.compress(buf)
                os.write(fds[i], frame)
                size += len(frame)
                buf = bufs[i] = bytearray()
    for i, fd in enumerate(fds):
        frame = cctx.compress(bufs[i])
        os.write(fd, frame)
        size += len(frame)
        os.fsync(fd)
        os.close(fd)
    return time.perf_counter() - t0, size


def _writers(scratch: Path, level: int, n: int) -> list[VBucketWriter]:
    """Writers for vbuckets 0..n-1 of a fresh archive's backup (set-up, not timed)."""
    path = scratch / "archive"
    if path.exists():
        shutil.rmtree(path)
    a = Archive.create(path, bucket="bench", vbuckets=1024)
    bw = a.begin_backup("full", level=level)
    bw.lock.release()  # the benchmark commits nothing; leave no lock behind
    return [VBucketWriter(a, bw.id, vb, ArchivePosition.at(UUID, 0), [(UUID, 0)])
            for vb in range(n)]


def writer_calls(records: list[tuple], scratch: Path, level: int, streams: int = 1,
                 run: int = 64) -> tuple[float, int]:
    """VBucketWriter.mutation per record (runs of `run` records per vbucket in turn), then
    close() of every writer (end record, fsync, done file) - all timed."""
    ws = _writers(scratch, level, streams)
    n = len(records)
    t0 = time.perf_counter()
    for w in ws:
        w.marker(1, n, 1)
    muts = [w.mutation for w in ws]
    for start in range(0, n, run):
        mutation = muts[(start // run) % streams]
        for seqno, rev, cas, flags, expiry, datatype, key, value in records[start:start + run]:
            mutation(seqno, rev, cas, flags, expiry, datatype, key, value)
    size = sum(w.close(ArchivePosition.at(UUID, n))["bytes"]["files"] for w in ws)
    return time.perf_counter() - t0, size


def writer_packed(records: list[tuple], scratch: Path, level: int,
                  run: int = 64) -> tuple[float, int]:
    """The caller packs records into its own buffer (as the bare loop does) and hands each
    run of `run` records to VBucketWriter.add_packed with their counts."""
    (w,) = _writers(scratch, level, 1)
    n = len(records)
    pack = msgpack.Packer().pack
    t0 = time.perf_counter()
    w.marker(1, n, 1)
    add = w.add_packed
    for start in range(0, n, run):
        buf = bytearray()
        vbytes = 0
        for seqno, rev, cas, flags, expiry, datatype, key, value in records[start:start + run]:
            buf += pack((3, seqno, rev, cas, flags, expiry, datatype, key, value, None))
            vbytes += len(value)
        add(buf, mutations=min(run, n - start), value_bytes=vbytes)
    size = w.close(ArchivePosition.at(UUID, n))["bytes"]["files"]
    return time.perf_counter() - t0, size


def zstd_cli_size(values_path: Path) -> int | None:
    exe = shutil.which("zstd")
    if not exe:
        return None
    out = values_path.with_suffix(".zst")
    subprocess.run([exe, "-3", "-q", "-f", str(values_path), "-o", str(out)], check=True)
    return out.stat().st_size


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=256)
    ap.add_argument("--level", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", help="scratch directory (default: a temporary one)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args(argv)

    print(f"building {args.records:,} records with ~{args.value_size}-byte values ...",
          file=sys.stderr)
    records = make_records(args.records, args.value_size)
    raw = sum(len(r[6]) + len(r[7]) for r in records)
    raw_values = sum(len(r[7]) for r in records)
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="dcptool-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        L = args.level
        variants = {
            "bare pack+zstd loop": lambda: bare_loop(records, scratch, L),
            "VBucketWriter.mutation": lambda: writer_calls(records, scratch, L),
            "VBucketWriter.add_packed": lambda: writer_packed(records, scratch, L),
            "bare loop, 16 streams": lambda: bare_loop(records, scratch, L, streams=16),
            "VBucketWriter x16 interleaved": lambda: writer_calls(records, scratch, L, streams=16),
        }
        best: dict[str, float] = {}
        sizes: dict[str, int] = {}
        for rnd in range(args.repeat):
            for name, fn in variants.items():  # interleave variants so drift hits all alike
                dt, sizes[name] = fn()
                best[name] = min(best.get(name, dt), dt)
                print(f"  round {rnd + 1}: {name}: {dt:.3f} s", file=sys.stderr)
        values_path = scratch / "values.raw"
        with open(values_path, "wb") as f:
            for r in records:
                f.write(r[7])
        zstd_lib = len(zstandard.ZstdCompressor(level=3).compress(values_path.read_bytes()))
        zstd_cli = zstd_cli_size(values_path)
    finally:
        if not args.dir:
            shutil.rmtree(scratch, ignore_errors=True)

    rows = []
    for name in variants:
        dt = best[name]
        base = best["bare loop, 16 streams" if "16" in name else "bare pack+zstd loop"]
        rows.append({"variant": name, "seconds": round(dt, 4),
                     "items_per_s": round(args.records / dt), "mb_per_s": round(raw / dt / 1e6, 1),
                     "ratio_to_bare": round(base / dt, 3), "file_bytes": sizes[name]})
    ref = zstd_cli or zstd_lib
    result = {
        "records": args.records, "value_size": args.value_size, "level": args.level,
        "raw_key_value_bytes": raw, "raw_value_bytes": raw_values,
        "zstd_3_of_values": {"cli": zstd_cli, "library_one_shot": zstd_lib},
        "archive_size_vs_zstd3_values": round(sizes["VBucketWriter.mutation"] / ref, 3),
        "rows": rows,
        "python": sys.version.split()[0], "cpus": os.cpu_count(),
    }
    print(f"\n{args.records:,} mutations, ~{args.value_size} B values, zstd level {args.level}, "
          f"best of {args.repeat}")
    print(f"{'variant':32} {'items/s':>10} {'MB/s':>7} {'vs bare':>8} {'file bytes':>12}"
          "   (x16 rows compare with the 16-stream bare loop)")
    for r in rows:
        print(f"{r['variant']:32} {r['items_per_s']:>10,} {r['mb_per_s']:>7} "
              f"{r['ratio_to_bare']:>8.3f} {r['file_bytes']:>12,}")
    print(f"raw values {raw_values:,} B; zstd -3 of them {ref:,} B; archive data "
          f"{sizes['VBucketWriter.mutation']:,} B = {result['archive_size_vs_zstd3_values']}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
