"""Benchmark archives as Spark data: scans through the `dcptool` data source, and merge.

Builds an archive of --records item records (default 1M) over 1024 vbuckets with the
archive writer: a full backup of half of them and --incrementals (default 10) incremental
backups sharing the other half (updates of random keys, 5 % deletions), values JSON
documents of --value-size bytes. Then, in the same run and on the same files:

- plain:         one Python process decodes every data file (zstd frames, msgpack records)
                 and counts the item records: the floor of a single-process read;
- plain+arrow:   the data source's own partition reader in this process (decode, then
                 Arrow batches of the schema's columns), no Spark;
- spark count:   `read_archive(spark, path).count()`;
- spark agg:     a groupBy(type) with count and sum(length(value)) over the same scan;
- resolved:      `read_archive(spark, path, resolved=True).count()` (rows/s counted over the
                 records read, and the resolved rows);
- merge:         `run_merge` of the 10 incremental backups into one, then a check that the
                 resolved state did not change.

Rates are rows (item records) per second, best of --repeat after one warm-up run.

    python benchmarks/archive_scan.py
    python benchmarks/archive_scan.py --records 200000 --json out.json
    python benchmarks/archive_scan.py --dir /tmp/scan --reuse     # keep and reuse the archive
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.archive_write import make_value  # noqa: E402
from dcptool.archive import Archive  # noqa: E402
from dcptool.archive.frames import iter_frame_batches  # noqa: E402

UUID = 0x5EED_0000_0000_0002
VBUCKETS = 1024


def build_archive(path: Path, records: int, incrementals: int, value_size: int,
                  seed: int = 7) -> dict:
    """The archive described in the module docstring; returns its shape."""
    from dcptool.protocol.vbucket import vbucket_of

    rng = random.Random(seed)
    full = records // 2
    per_incr = (records - full) // max(1, incrementals)
    archive = Archive.create(path, bucket="bench", vbuckets=VBUCKETS)
    keys = [b"order::%08d" % i for i in range(full)]
    vb_of = [vbucket_of(k, VBUCKETS) for k in keys]
    seq = [0] * VBUCKETS
    cas = [1_763_700_000_000_000_000]

    def backup(btype: str, changes: list[tuple[int, bool]]) -> None:
        bw = archive.begin_backup(btype, level=3)
        per: dict[int, list] = {}
        for k, deleted in changes:
            per.setdefault(vb_of[k], []).append((k, deleted))
        summaries = []
        for vb in range(VBUCKETS):
            s0 = seq[vb]
            w = bw.vbucket(vb, {"uuid": UUID, "seqno": s0, "snap_start": s0, "snap_end": s0},
                           [[UUID, 0]])
            items = per.get(vb, [])
            if items:
                recs: list[tuple] = [(2, s0 + 1, s0 + len(items), 2)]
                for i, (k, deleted) in enumerate(items, 1):
                    s = s0 + i
                    cas[0] += rng.randint(2_000, 12_000)
                    if deleted:
                        recs.append((4, s, s, cas[0], keys[k], 1_763_700_000, 0, b""))
                    else:
                        recs.append((3, s, s, cas[0], 0, 0, 1, keys[k],
                                     make_value(rng, k, value_size), None))
                w.write(recs)
                seq[vb] = s0 + len(items)
            e = seq[vb]
            summaries.append(w.close({"uuid": UUID, "seqno": e, "snap_start": e, "snap_end": e}))
        bw.commit(summaries)

    backup("full", [(k, False) for k in range(full)])
    for _ in range(incrementals):
        backup("incremental", [(k, rng.random() < 0.05) for k in rng.sample(range(full), per_incr)])
    ids = archive.committed_ids()
    items = sum(archive.manifest(b)["totals"][t] for b in ids
                for t in ("mutations", "deletions", "expirations"))
    size = sum(archive.manifest(b)["totals"]["file_bytes"] for b in ids)
    return {"backups": len(ids), "items": items, "file_bytes": size, "keys": full}


def plain_read(path: Path) -> int:
    """Decode every data file in this process; the number of item records."""
    archive = Archive.open(path)
    n = 0
    for bid in archive.committed_ids():
        for _vb, f in archive.backup(bid).files():
            for batch in iter_frame_batches(f, validate=False):
                for r in batch:
                    if 2 < r[0] < 6:
                        n += 1
    return n


def best(fn, repeat: int) -> tuple[float, object]:
    fn()  # warm-up (page cache, Python workers, JIT)
    times = []
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--incrementals", type=int, default=10)
    ap.add_argument("--value-size", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the archive a previous run left in --dir")
    args = ap.parse_args()

    from pyspark.sql import functions as F

    from dcptool.pipeline.datasource import read_all
    from dcptool.pipeline.merge import run_merge
    from dcptool.pipeline.runtime import get_spark
    from dcptool.spark import read_archive

    work = Path(args.dir or tempfile.mkdtemp(prefix="dcptool-scan-"))
    path = work / "archive"
    shape_file = work / "shape.json"
    if args.reuse and shape_file.exists() and path.exists():
        shape = json.loads(shape_file.read_text())
    else:
        if path.exists():
            shutil.rmtree(path)
        t = time.perf_counter()
        shape = build_archive(path, args.records, args.incrementals, args.value_size)
        shape["build_seconds"] = round(time.perf_counter() - t, 1)
        shape_file.write_text(json.dumps(shape))
    print(f"archive: {shape['items']:,} item records in {shape['backups']} backups, "
          f"{shape['file_bytes'] / 2**20:.1f} MiB of data files ({shape['build_seconds']} s to build)")
    n = shape["items"]
    results: dict[str, dict] = {}

    def report(name: str, seconds: float, rows: int, note: str = "") -> None:
        results[name] = {"seconds": round(seconds, 3), "rows": rows,
                         "rows_per_second": round(rows / seconds)}
        print(f"  {name:<22} {seconds:7.2f} s  {rows / seconds:>12,.0f} rows/s  {note}")

    secs, got = best(lambda: plain_read(path), args.repeat)
    assert got == n, (got, n)
    report("plain (1 process)", secs, n, "decode only")
    secs, got = best(lambda: sum(b.num_rows for b in read_all(path)), args.repeat)
    assert got == n
    report("plain+arrow (1 proc)", secs, n, "the data source's reader, no Spark")

    t = time.perf_counter()
    spark = get_spark(args.master)
    startup = time.perf_counter() - t
    print(f"  spark session          {startup:7.2f} s  ({args.master}, "
          f"{spark.sparkContext.defaultParallelism} cores)")
    kw = {"partitions": args.partitions} if args.partitions else {}
    secs, got = best(lambda: read_archive(spark, path, **kw).count(), args.repeat)
    assert got == n
    report("spark count", secs, n)
    secs, _ = best(lambda: read_archive(spark, path, **kw).groupBy("type").agg(
        F.count("*"), F.sum(F.length("value"))).collect(), args.repeat)
    report("spark agg(type)", secs, n, "count and sum(length(value)) per type")
    secs, resolved = best(lambda: read_archive(spark, path, resolved=True, **kw).count(),
                          args.repeat)
    report("spark resolved", secs, n, f"records read; {resolved:,} resolved rows "
                                      f"({resolved / secs:,.0f}/s)")
    results["spark resolved"]["resolved_rows"] = resolved
    secs, resolved_local = best(lambda: sum(b.num_rows for b in read_all(path, resolved=True)), 1)
    report("resolved (1 proc)", secs, n, "the same, no Spark")

    merged = work / "merged"  # the merge changes the archive: work on a copy
    if merged.exists():
        shutil.rmtree(merged)
    shutil.copytree(path, merged)
    ids = Archive.open(merged).committed_ids()
    t = time.perf_counter()
    m = run_merge(merged, first=ids[1], spark=spark, **kw)
    merge_secs = time.perf_counter() - t
    after = read_archive(spark, merged, resolved=True).count()
    assert after == resolved, (after, resolved)
    results["merge"] = {"seconds": round(merge_secs, 3), "backups": len(m.replaced),
                        "items_before": m.items_before, "items_after": m.items_after,
                        "bytes_before": m.bytes_before, "bytes_after": m.bytes_after}
    print(f"  merge of {len(m.replaced)} incrementals {merge_secs:6.2f} s  "
          f"{m.items_before:,} items -> {m.items_after:,}, "
          f"{m.bytes_before / 2**20:.1f} -> {m.bytes_after / 2**20:.1f} MiB; "
          "resolved state unchanged")
    ratio = results["spark count"]["rows_per_second"] / results["plain (1 process)"]["rows_per_second"]
    print(f"  spark count / plain single-process read: {ratio:.2f}x")
    out = {"shape": shape, "master": args.master,
           "cores": spark.sparkContext.defaultParallelism, "spark_startup_seconds": round(startup, 2),
           "results": results, "spark_vs_plain": round(ratio, 3)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
