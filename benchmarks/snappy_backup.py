"""Backup items/s with and without Snappy, against one node in one run.

    python benchmarks/snappy_backup.py [-n 200000] [--vbuckets 64] [--rounds 3] [--json out.json]
    python -m benchmarks run --only snappy

One reference node is loaded with N JSON documents built like the travel sample's
(`benchmarks/docs.py`: routes with schedules, hotels with reviews in text of natural word
frequencies, airlines; ~0.9 KB on average, Snappy takes each to ~0.68 of its size and
`zstd -3` all of them to ~0.24).
Then the same full backup is taken again and again, the two modes alternating in each
round (A B, then B A, ...):

- `off`: Snappy not negotiated (the default): the node sends every value as it is;
- `snappy`: HELLO Snappy and DCP_CONTROL force_value_compression=true (`--snappy`): the
  node compresses every value, the backup task decompresses it before the archive.

Each mode is measured two ways:

- `task`: the backup task's loop (`dcptool.pipeline.backup.write_events` into archive
  writers) in this process over a live DCP connection, no Spark: the client's and the
  node's work only, with the node's CPU seconds and the bytes that crossed the wire;
- `e2e`: `run_backup` through local Spark, as `dcptool backup` runs (Spark started before).

Reported per mode and way: items/s of each round, the best and the median, and the ratio
of the best to the best of `off` measured in the same run (the baseline); plus the
archive sizes (the same in both modes: the archive holds values decompressed).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402
from benchmarks.backup_restore import set_documents  # noqa: E402
from benchmarks.docs import values  # noqa: E402

MODES = ("off", "snappy")

# ------------------------------------------------------------------ documents

#: documents like the travel sample's (`benchmarks/docs.py`), ~0.9 KB on average
DOC_SIZE = 900


def load(opts: ConnOptions, n: int, vbuckets: int, window: int = 5000) -> dict:
    """SETQ `n` documents (JSON datatype); their sizes and a sampled Snappy ratio."""
    import cramjam

    raw = snappy = 0

    def docs():
        nonlocal raw, snappy
        for i, val in enumerate(values(n, DOC_SIZE)):
            raw += len(val)
            if i % 16 == 0:  # a sample is enough for the ratio
                snappy += 16 * len(cramjam.snappy.compress_raw(val))
            yield f"doc::{i:09d}".encode(), val

    set_documents(opts, docs(), vbuckets, window)
    return {"raw_value_bytes": raw, "mean_value_bytes": round(raw / n, 1),
            "snappy_ratio_sampled": round(snappy / raw, 3)}


def node_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ one backup each way

def task_backup(opts: ConnOptions, scratch: Path, node_pid: int, *,
                collections: bool = True, name: str = "bench-snappy") -> dict:
    """The backup task's loop in this process, every vbucket from 0 to its high seqno
    (`collections`: the session negotiates Collections, as `dcptool backup` does)."""
    from dcptool.archive import FULL, Archive, VBucketWriter
    from dcptool.archive.format import sync_filesystem
    from dcptool.client.ops import get_vbucket_seqnos
    from dcptool.client.position import ZERO
    from dcptool.pipeline.backup import backup_consumer_config, write_events
    from dcptool.pipeline.plans import VBucketPlan

    shutil.rmtree(scratch, ignore_errors=True)
    with opts.connect(collections=True) as conn:  # every collection's high seqno
        seqnos = {vb: s for vb, s in get_vbucket_seqnos(conn, state=1).items() if s}
    archive = Archive.create(scratch, bucket=opts.bucket, vbuckets=max(seqnos) + 1)
    bw = archive.begin_backup(FULL)
    zero = {"uuid": 0, "seqno": 0, "snap_start": 0, "snap_end": 0}
    writers = {vb: VBucketWriter(archive, bw.id, vb, zero, (), sync=False) for vb in seqnos}
    run = {vb: {"opens": 0, "retries": 0, "first_open": None} for vb in seqnos}
    summaries: list = []
    cpu0 = node_cpu_seconds(node_pid)
    t0 = time.perf_counter()
    consumer = opts.consumer(backup_consumer_config(name, collections=collections))
    try:
        consumer.add_streams({vb: (ZERO, s) for vb, s in seqnos.items()})
        pending = write_events(consumer, writers, {vb: VBucketPlan(vb, ZERO, s) for vb, s in seqnos.items()},
                               {vb: ZERO for vb in seqnos}, run, summaries, time.monotonic())
        sync_filesystem(scratch)
        secs = time.perf_counter() - t0
        s = consumer.session
        wire = {"values_decompressed": s.values_decompressed,
                "compressed_bytes": s.compressed_bytes,
                "decompressed_bytes": s.decompressed_bytes, "bytes_received": s.bytes_received,
                "refused_controls": sorted(s.control_failures)}
    finally:
        consumer.close()
    node_cpu = node_cpu_seconds(node_pid) - cpu0
    if pending:
        raise RuntimeError(f"vbuckets {sorted(pending)[:8]} did not end")
    items = sum(x.entry["counts"]["mutations"] for x in summaries)
    events = sum(x.entry["counts"].get("system_events", 0) for x in summaries)
    size = sum(x.entry["bytes"]["files"] for x in summaries)
    bw.abort()
    shutil.rmtree(scratch, ignore_errors=True)
    return {"items": items, "system_events": events, "seconds": secs,
            "items_per_s": items / secs, "node_cpu_s": round(node_cpu, 2),
            "archive_bytes": size, **wire}


def e2e_backup(opts: ConnOptions, scratch: Path, spark, partitions: int | None) -> dict:
    """`run_backup` through Spark into a fresh archive (no watermark registration)."""
    from dcptool.pipeline.backup import run_backup

    shutil.rmtree(scratch, ignore_errors=True)
    t0 = time.perf_counter()
    b = run_backup(opts, scratch, spark=spark, partitions=partitions, watermark=False)
    secs = time.perf_counter() - t0
    shutil.rmtree(scratch, ignore_errors=True)
    return {"items": b.items, "seconds": secs, "items_per_s": b.items / secs,
            "archive_bytes": b.bytes}


def _summary(rounds: list[dict]) -> dict:
    rates = [r["items_per_s"] for r in rounds]
    out = {"items_per_s_rounds": [round(x) for x in rates], "best_items_per_s": round(max(rates)),
           "median_items_per_s": round(statistics.median(rates)),
           "archive_bytes": rounds[-1]["archive_bytes"]}
    for k in ("node_cpu_s", "values_decompressed", "compressed_bytes", "decompressed_bytes",
              "bytes_received", "refused_controls"):
        if k in rounds[-1]:
            out[k] = rounds[-1][k]
    if "node_cpu_s" in out:
        out["node_cpu_s"] = round(statistics.median(r["node_cpu_s"] for r in rounds), 2)
    return out


def run(n: int = 200_000, vbuckets: int = 64, rounds: int = 3, *, ways=("task", "e2e"),
        master: str = "local[*]", partitions: int | None = None,
        work_dir: str | None = None) -> dict:
    """Load one node, then alternate the modes (see the module's doc); the figures."""
    work = Path(work_dir or tempfile.mkdtemp(prefix="dcptool-bench-snappy-"))
    password = secrets.token_urlsafe(10)
    res: dict = {"n": n, "vbuckets": vbuckets, "rounds": rounds,
                 "loadavg_start": os.getloadavg()[0]}
    try:
        with LocalNode(work / "node", password=password, vbuckets=vbuckets) as node:
            base = ConnOptions(node.host, node.port, "Administrator", password, timeout=60)
            t = time.perf_counter()
            res.update(load(base, n, vbuckets))
            res["load_seconds"] = round(time.perf_counter() - t, 2)
            opts = {m: dataclasses.replace(base, snappy=(m == "snappy")) for m in MODES}
            spark = None
            if "e2e" in ways:
                from dcptool.pipeline.runtime import get_spark

                spark = get_spark(master)
                spark.sparkContext.parallelize([0], 1).count()
            got: dict[str, dict[str, list]] = {w: {m: [] for m in MODES} for w in ways}
            # one warm-up of each way (first stream from disk, Spark's Python workers)
            for w in ways:
                if w == "task":
                    task_backup(opts["off"], work / "warm", node.proc.pid)
                else:
                    e2e_backup(opts["off"], work / "warm", spark, partitions)
            for i in range(rounds):
                order = MODES if i % 2 == 0 else tuple(reversed(MODES))
                for w in ways:
                    for m in order:
                        if w == "task":
                            r = task_backup(opts[m], work / "archive", node.proc.pid)
                        else:
                            r = e2e_backup(opts[m], work / "archive", spark, partitions)
                        got[w][m].append(r)
                        print(f"round {i + 1} {w:<4} {m:<6} {r['items_per_s']:>10,.0f} items/s",
                              file=sys.stderr, flush=True)
            for w in ways:
                out = {m: _summary(got[w][m]) for m in MODES}
                ref = out["off"]["best_items_per_s"]
                for m in MODES:
                    out[m]["ratio_to_off"] = round(out[m]["best_items_per_s"] / ref, 3)
                    out[m]["median_ratio_to_off"] = round(
                        out[m]["median_items_per_s"] / out["off"]["median_items_per_s"], 3)
                res[w] = out
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
    res["loadavg_end"] = os.getloadavg()[0]
    return res


def table(res: dict) -> str:
    lines = [f"{'way / mode':<16} {'best items/s':>13} {'median':>10} {'ratio':>7}  note"]
    for w in ("task", "e2e"):
        for m in MODES:
            r = res.get(w, {}).get(m)
            if not r:
                continue
            note = f"rounds {r['items_per_s_rounds']}"
            if w == "task":
                note += f", node CPU {r['node_cpu_s']} s"
                if r.get("decompressed_bytes"):
                    note += (f", wire values {r['compressed_bytes'] / r['decompressed_bytes']:.3f}"
                             f" of their size")
            lines.append(f"{w + ' ' + m:<16} {r['best_items_per_s']:>13,} "
                         f"{r['median_items_per_s']:>10,} {r['ratio_to_off']:>7}  {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--vbuckets", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ways", default="task,e2e", help="comma-separated: task, e2e")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--dir", default=None, help="work here and keep it (default: a temp dir)")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run(a.n, a.vbuckets, a.rounds, ways=tuple(a.ways.split(",")), master=a.master,
              partitions=a.partitions, work_dir=a.dir)
    res["command"] = "python benchmarks/snappy_backup.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(table(res))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
