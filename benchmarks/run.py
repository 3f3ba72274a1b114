"""Issue 11's measurements in one run on one machine: a table on stdout and a JSON file.

    python -m benchmarks run [--quick] [--json FILE] [--only limit,task,node,ingest,e2e,cluster,rss,snappy,collections]

1. limit: a DCP stream recorded from a reference node (N mutations, JSON documents of ~256
   bytes like the travel sample's, `benchmarks/docs.py`, 16 vbuckets) replayed from a
   socket into (a) receive only, (b) header parsing only, (c) parse + msgpack + zstd-3 to
   a file, in plain Python ("limit 1c");
2. task: dcptool's backup task loop (`dcptool.pipeline.backup.write_events`) on the same
   replayed stream: items/s, MB/s and the ratio to limit 1c; and how the documents
   compress: the task's archive bytes / the stream's bytes;
3. node: the node's DCP producer draining N documents from disk (backfill) and from memory,
   and ingest over 1 and 4 connections;
4-5. e2e: a cold `python -m dcptool backup` command of a local node (its wall time and the
   Spark start-up its --json reports), then `run_backup` end to end from the same node with
   local Spark started in this process, then `run_restore` into a second node (items/s,
   and as a ratio to the node's ingest over 4 connections of item 3);
6. rss: peak RSS of the backup task (a fresh process replaying a synthetic stream of 1024
   vbuckets, all in one task) and of the node (disk drain, after a restart) for N and 4N
   documents (4N skipped with --quick);
7. snappy: backup items/s with Snappy negotiated and every value compressed against the
   same backup without it, in alternating rounds on one node (`benchmarks/snappy_backup.py`:
   the task loop alone and `run_backup` through Spark; 200,000 documents of ~0.9 KB JSON
   like the travel sample's, 100,000 with --quick), as a ratio to the one without.
8. collections: the backup task loop on a default-collection-only bucket with Collections
   negotiated, and on a bucket whose documents are spread over 100 collections, each as a
   ratio to the same default-only bucket streamed without Collections (the old way), in
   alternating rounds (`benchmarks/collections_backup.py`; the documents of item 7).
9. cluster: restore against ingest on a 3-member `dcptool cluster` (no replicas), in
   alternating rounds (`benchmarks/restore_ingest.py`): `run_restore` of an archive of N
   documents against N SETs over 4 connections per member, each member's connections
   writing the keys of its own vbuckets, all members at once; the ratio of the medians.

N is 1,000,000 (200,000 with --quick). The existing benchmark modules do the work; this
module only runs them and collects their figures.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from benchmarks import (  # noqa: E402
    backup_restore,
    docs,
    client_replay as cr,
    collections_backup,
    node_drain,
    node_ingest,
    restore_ingest,
    snappy_backup,
)

VALUE_SIZE = 256
SECTIONS = ("limit", "task", "node", "ingest", "e2e", "cluster", "rss", "snappy", "collections")


def _best(fn, repeat: int) -> tuple:
    """The fastest of `repeat` runs of `fn` (by its seconds, r[1]), and the least CPU
    seconds this process spent in one of them (the replay's sender is a process of its
    own: this is the loop's own work, which the machine's other load inflates less)."""
    best = None
    cpu = None
    for _ in range(repeat):
        c = time.process_time()
        r = fn()
        c = time.process_time() - c
        cpu = c if cpu is None else min(cpu, c)
        if best is None or r[1] < best[1]:
            best = r
    return best, cpu


def measure_replay(n: int, tmp: Path, repeat: int, sections: set[str]) -> dict:
    """Items 1 and 2: record from a node, replay into the plain loops and the backup task."""
    node, port = cr.start_node_and_load(tmp, n, VALUE_SIZE, 16)
    try:
        rec = tmp / "stream.dcp"
        meta = cr.record_from_node("127.0.0.1", port, rec, bucket="default", user=cr.USER,
                                   password=cr.PASSWORD)
    finally:
        node.terminate()
        node.wait(60)
    out: dict = {"mutations": meta["mutations"], "stream_bytes": meta["bytes"]}
    sender = cr.Sender(rec)
    total = meta["bytes"]
    rows = {}
    try:
        modes = []
        if "limit" in sections:
            modes += [("1a receive only", lambda: cr.run_receive(sender, total)),
                      ("1b header parse only", lambda: cr.run_headers(sender, total)),
                      ("1 plain parse loop (tuples)", lambda: cr.run_baseline(sender, total)),
                      ("1c parse+msgpack+zstd-3 to file",
                       lambda: cr.run_pack_zstd(sender, total, tmp / "limit.zst"))]
        if "task" in sections or "limit" in sections:
            # (the task's seconds include its one filesystem sync at the end, as
            # backup_task's do: sync_s, of the fastest run)
            modes += [("2 backup task (write_events)",
                       lambda: cr.run_backup_task(sender, meta, tmp / "task-archive")
                       + (cr.last_sync_seconds,)),
                      ("2 backup task, memoryview values",
                       lambda: cr.run_backup_task(sender, meta, tmp / "task-archive",
                                                  copy_values=False)
                       + (cr.last_sync_seconds,))]
        for name, fn in modes:
            r, cpu = _best(fn, repeat)
            secs = r[1]
            rows[name] = {"seconds": round(secs, 3),
                          "items_per_s": round(meta["mutations"] / secs),
                          "MB_per_s": round(total / secs / 1e6, 1),
                          "cpu_s": round(cpu, 3)}
            if len(r) > 2:
                rows[name]["archive_bytes"] = r[2]
            if len(r) > 3:
                rows[name]["sync_s"] = round(r[3], 3)
            print(f"  {name}: {rows[name]}", file=sys.stderr, flush=True)
    finally:
        sender.close()
    lim = rows.get("1c parse+msgpack+zstd-3 to file")
    if lim:
        for name, r in rows.items():
            r["ratio_to_1c"] = round(r["items_per_s"] / lim["items_per_s"], 3)
            r["cpu_ratio_to_1c"] = round(lim["cpu_s"] / r["cpu_s"], 3)
    out["modes"] = rows
    # how the documents compress: archive bytes / stream bytes (the task's archive, and
    # limit 1c's file: msgpack records in zstd-3 blocks of 1 MiB)
    task = rows.get("2 backup task (write_events)")
    if task and task.get("archive_bytes"):
        out["archive_vs_stream"] = round(task["archive_bytes"] / total, 3)
    if lim and lim.get("archive_bytes"):
        out["limit_1c_file_vs_stream"] = round(lim["archive_bytes"] / total, 3)
    return out


def measure_node(n: int, sections: set[str]) -> dict:
    """Item 3: DCP producer backfill and memory streaming; ingest over 1 and 4 connections."""
    out: dict = {}
    if "node" in sections:
        a = SimpleNamespace(n=n, s=VALUE_SIZE, vbuckets=1024, checkpoint_memory="4GiB",
                            buffer_size=20 * 1024 * 1024, profile=None)
        for mode in ("disk", "memory"):
            r = node_drain.run_mode(mode, a)
            out[f"drain_{mode}"] = r
            print(f"  drain {mode}: {r['items_per_s']} items/s", file=sys.stderr, flush=True)
        # the disk producer of a node in full eviction (documents not resident, 64 MiB quota)
        af = SimpleNamespace(**{**vars(a), "eviction": "full", "memory_quota": "64MiB"})
        r = node_drain.run_mode("disk", af)
        out["drain_disk_full"] = r
        print(f"  drain disk (full eviction): {r['items_per_s']} items/s", file=sys.stderr,
              flush=True)
    if "ingest" in sections:
        from nodeprocutil import NodeProcess

        for i, conns in enumerate((1, 4)):
            with tempfile.TemporaryDirectory(prefix="dcptool-ingest-") as d:
                node = NodeProcess(Path(d) / "node", vbuckets=1024, password="password")
                node.start()
                try:
                    r = node_ingest.run(node.host, node.port, "password", n, VALUE_SIZE, 1024,
                                        conns, 512, b"ingest-%d-" % i)
                    r["node_peak_rss_MB"] = node_drain.peak_rss_mb(node.pid)
                finally:
                    node.stop(timeout=600)
            out[f"ingest_{conns}"] = r
            print(f"  ingest {conns}: {r['sets_per_s']} sets/s", file=sys.stderr, flush=True)
    return out


TASK_RSS = r"""
import resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from benchmarks import client_replay as cr
meta = cr.json.loads(Path(sys.argv[2] + ".json").read_text())
sender = cr.Sender(Path(sys.argv[2]))
try:
    items, secs, size = cr.run_backup_task(sender, meta, Path(sys.argv[3]))
finally:
    sender.close()
# VmHWM, not ru_maxrss: ru_maxrss survives execve, so it would report the benchmark
# process this one was started from whenever that one was larger
hwm = [l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:")]
print(items, secs, int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


#: vbuckets of the synthetic stream of the task's peak-RSS run: a whole 1024-vbucket bucket
#: in one task, interleaved in snapshots of 512 (the worst case for its buffers: every
#: vbucket's writer is open at once)
RSS_VBUCKETS = 1024


def task_peak_rss(n: int, tmp: Path, repo: Path = REPO, keep: bool = False) -> dict:
    """Peak RSS (ru_maxrss = VmHWM) of a fresh process running the backup task on a
    replayed synthetic stream of n documents; `repo` picks the dcptool tree to run."""
    rec = tmp / f"synthetic-{n}.dcp"
    if not rec.exists():
        meta = cr.record_synthetic(rec, n, VALUE_SIZE, RSS_VBUCKETS)
        Path(str(rec) + ".json").write_text(json.dumps(meta))
    p = subprocess.run([sys.executable, "-c", TASK_RSS, str(repo), str(rec), str(tmp / "rss-arch")],
                       capture_output=True, text=True, check=True)
    items, secs, kb = p.stdout.split()
    if not keep:
        rec.unlink()
    return {"docs": int(items), "vbuckets": RSS_VBUCKETS,
            "items_per_s": round(int(items) / float(secs)), "peak_rss_MB": round(int(kb) / 1024, 1)}


def measure_rss(n: int, quick: bool, tmp: Path, node_1n: dict | None) -> dict:
    """Item 6: peak RSS of the backup task and of the node for N and 4N documents."""
    out: dict = {}
    sizes = [n] if quick else [n, 4 * n]
    for k in sizes:
        out[f"task_{k}"] = task_peak_rss(k, tmp)
        print(f"  task rss {k}: {out[f'task_{k}']}", file=sys.stderr, flush=True)
    # the node: value eviction (every document resident; `node_1n` is its disk drain at N
    # when the node section ran) and full eviction (64 MiB quota)
    given = {"value": node_1n}
    for eviction, who in (("value", "node"), ("full", "node_full")):
        a = SimpleNamespace(n=n, s=VALUE_SIZE, vbuckets=1024, checkpoint_memory="4GiB",
                            buffer_size=20 * 1024 * 1024, profile=None, eviction=eviction,
                            memory_quota="64MiB")
        for k in sizes:
            if k == n and given.get(eviction) is not None:
                r = given[eviction]
            else:
                a.n = k
                r = node_drain.run_mode("disk", a)
            out[f"{who}_{k}"] = {"docs": k, "peak_rss_MB": r.get("node_peak_rss_MB")}
            print(f"  {who} rss {k}: {out[f'{who}_{k}']}", file=sys.stderr, flush=True)
    if not quick:
        for who in ("task", "node", "node_full"):
            lo, hi = out[f"{who}_{n}"]["peak_rss_MB"], out[f"{who}_{4 * n}"]["peak_rss_MB"]
            out[f"{who}_growth_1n_to_4n"] = round(hi / lo, 3) if lo and hi else None
    return out


def table(res: dict) -> str:
    lines = [f"{'measurement':<46} {'figure':>14}  {'unit / note'}"]

    def row(name, val, note=""):
        lines.append(f"{name:<46} {val!s:>14}  {note}")

    rp = res.get("replay")
    if rp:
        for name, r in rp["modes"].items():
            row(name, r["items_per_s"], f"items/s, {r['MB_per_s']} MB/s, "
                                        f"{r.get('ratio_to_1c', '-')} of 1c")
        task = rp["modes"].get("2 backup task (write_events)", {})
        if "ratio_to_1c" in task:
            row("2 backup task / limit 1c", task["ratio_to_1c"],
                f"x (items/s; its file sync {task.get('sync_s', '-')} s of "
                f"{task['seconds']} s)")
            row("2 backup task / limit 1c, CPU seconds", task["cpu_ratio_to_1c"],
                f"x ({task['cpu_s']} s against {rp['modes']['1c parse+msgpack+zstd-3 to file']['cpu_s']} s)")
        if "archive_vs_stream" in rp:
            row("1-2 archive / stream (compression)", rp["archive_vs_stream"],
                f"x; {rp['stream_bytes']:,} B of stream, {rp['mutations']:,} documents")
        if "limit_1c_file_vs_stream" in rp:
            row("1c file / stream", rp["limit_1c_file_vs_stream"], "x")
    nd = res.get("node", {})
    for mode, name in (("disk", "disk"), ("memory", "memory"), ("disk_full", "disk, full eviction")):
        r = nd.get(f"drain_{mode}")
        if r:
            row(f"3 node producer, {name}", r["items_per_s"], f"items/s, {r['MB_per_s']} MB/s")
    for c in (1, 4):
        r = nd.get(f"ingest_{c}")
        if r:
            row(f"3 node ingest, {c} connection(s)", r["sets_per_s"], "sets/s")
    e = res.get("e2e")
    if e:
        if "cold_command_wall_s" in e:
            row("4 cold `dcptool backup` command, wall", e["cold_command_wall_s"],
                f"s, {e['cold_command_items_per_s']} items/s (exec to exit; "
                f"its own timing {e['cold_command_seconds']} s)")
            row("4 cold command's Spark start-up", e["cold_command_spark_startup_s"],
                f"s (its --json), share {e['cold_command_spark_share']} of its wall")
        row("4 backup end to end, wall", e["backup_wall_s"], "s (Spark already started)")
        row("4 backup end to end", e["backup_items_per_s"], "items/s")
        row("4 Spark start-up in the benchmark", e["spark_startup_s"],
            f"s (get_spark + first job), share {e['spark_overhead_share']}")
        row("4 archive / raw values", e["archive_vs_raw"], "")
        row("4 archive / zstd -3 of raw values", e["archive_vs_zstd3"], "")
        row("5 restore end to end", e["restore_items_per_s"], "items/s")
        ing = nd.get("ingest_4")
        if ing:
            row("5 restore / node ingest, 4 connections", round(
                e["restore_items_per_s"] / ing["sets_per_s"], 3),
                f"x; {e['restore_items_per_s']} against {ing['sets_per_s']} sets/s")
    cl = res.get("cluster")
    if cl:
        row("9 restore to a 3-member cluster", cl["restore"]["median_items_per_s"],
            f"items/s (median of {cl['restore']['items_per_s']})")
        row("9 cluster ingest, 4 connections a member", cl["ingest"]["median_items_per_s"],
            f"sets/s (median of {cl['ingest']['items_per_s']})")
        row("9 cluster restore / cluster ingest", cl["restore_over_ingest"],
            f"x (rounds: {cl['ratios']}); per CPU second {cl['cpu_ratio']}")
    sn = res.get("snappy")
    if sn:
        for way, name in (("task", "task loop"), ("e2e", "end to end")):
            r = sn.get(way, {}).get("snappy")
            if r:
                row(f"7 backup {name}, snappy / off", r["ratio_to_off"],
                    f"x; {r['best_items_per_s']} against {sn[way]['off']['best_items_per_s']} "
                    f"items/s (median ratio {r['median_ratio_to_off']})")
    co = res.get("collections")
    if co:
        base = co["task"]["legacy"]["best_items_per_s"]
        for m, name in (("default", "default collection only"),
                        ("100-coll", f"{co['collections']} collections")):
            r = co["task"][m]
            row(f"8 backup task, {name} / without collections", r["ratio_to_legacy"],
                f"x; {r['best_items_per_s']} against {base} items/s "
                f"(median ratio {r['median_ratio_to_legacy']})")
    rs = res.get("rss")
    if rs:
        for k, v in rs.items():
            name = k.replace("node_full", "node (full eviction)").replace(
                "node_", "node (value eviction)_").replace("_", " ")
            if isinstance(v, dict):
                row(f"6 peak RSS {name} docs", v["peak_rss_MB"], "MB")
            else:
                row(f"6 {name}", v, "x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks run",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200k documents, no 4M RSS run")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("-n", type=int, default=None, help="documents (default 1M, 200k quick)")
    ap.add_argument("--repeat", type=int, default=None, help="best of R replays (3, 2 quick)")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections of {', '.join(SECTIONS)}")
    a = ap.parse_args(argv)
    n = a.n or (200_000 if a.quick else 1_000_000)
    repeat = a.repeat or (2 if a.quick else 3)
    sections = set(a.only.split(","))
    res: dict = {"command": "python -m benchmarks run " + " ".join(argv or sys.argv[2:]),
                 "n": n, "value_size": VALUE_SIZE, "quick": a.quick,
                 "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                             "loadavg_start": os.getloadavg()},
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = Path(tempfile.mkdtemp(prefix="dcptool-bench-run-"))
    t0 = time.perf_counter()
    try:
        if sections & {"limit", "task"}:
            print("replay (items 1-2)", file=sys.stderr, flush=True)
            res["replay"] = measure_replay(n, tmp, repeat, sections)
        if sections & {"node", "ingest"}:
            print("node (item 3)", file=sys.stderr, flush=True)
            res["node"] = measure_node(n, sections)
        if "e2e" in sections:
            print("backup and restore end to end (items 4-5)", file=sys.stderr, flush=True)
            res["e2e"] = backup_restore.run(n, VALUE_SIZE, 1024, cold=True)
            # stop Spark before the memory section, so its JVM and Python workers take no
            # CPU or memory from the processes measured there (pyspark's worker daemon may
            # print a BrokenPipeError as it goes: that is Spark's, not a failure)
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()
        if "cluster" in sections:
            print("restore and ingest on a 3-member cluster (item 9)", file=sys.stderr,
                  flush=True)
            res["cluster"] = restore_ingest.run(n, 2 if a.quick else 3, cluster=True)
            from pyspark.sql import SparkSession

            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()
        if "rss" in sections:
            print("peak memory (item 6)", file=sys.stderr, flush=True)
            res["rss"] = measure_rss(n, a.quick, tmp, res.get("node", {}).get("drain_disk"))
        if "snappy" in sections:
            print("backup with and without Snappy (item 7)", file=sys.stderr, flush=True)
            res["snappy"] = snappy_backup.run(min(n, 100_000 if a.quick else 200_000), 64,
                                              3 if a.quick else 5)
        if "collections" in sections:
            print("backup with collections (item 8)", file=sys.stderr, flush=True)
            res["collections"] = collections_backup.run(min(n, 100_000 if a.quick else 200_000),
                                                        64, 3 if a.quick else 5)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["documents_made_seconds"] = round(docs.made_seconds, 1)  # of res["seconds"]
    res["machine"]["loadavg_end"] = os.getloadavg()
    print(table(res))
    print(f"(documents made in {res['documents_made_seconds']} s of the run's {res['seconds']} s)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
