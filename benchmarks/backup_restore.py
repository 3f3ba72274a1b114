"""Back up N JSON documents of ~S bytes from a local node with local Spark, then restore them.

    python benchmarks/backup_restore.py -n 1000000 -s 256 [--vbuckets 1024] [--json out.json]

Reports, measured in one run on this machine: load rate, (with --cold) the wall time of a
cold `dcptool backup` command of the same node and its Spark start-up, Spark start-up in
this process, backup wall time,
items/s and MB/s of values, archive size against the raw values and against `zstd -3` of
the concatenated raw values, Spark's per-job overhead (an empty job with as many tasks),
and the restore rate into a second node (until every write was confirmed, then until the
node had persisted everything, and the node's CPU seconds).

    python benchmarks/backup_restore.py --restore-only DIR/archive [--partitions P] [--repeat R]

restores an archive kept by an earlier run with --dir into fresh nodes.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zstandard  # noqa: E402

from benchmarks import docs  # noqa: E402

from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402
from dcptool.pipeline.backup import run_backup  # noqa: E402
from dcptool.pipeline.restore import run_restore  # noqa: E402
from dcptool.pipeline.runtime import get_spark, plan_groups, default_parallelism  # noqa: E402
from dcptool.protocol import HEADER, vbucket_of  # noqa: E402
from dcptool.protocol.constants import Magic, Opcode  # noqa: E402

SET_EXTRAS = struct.Struct(">II")


def set_documents(opts: ConnOptions, docs, vbuckets: int, window: int = 5000) -> None:
    """SETQ the (key, value) pairs of `docs` (JSON datatype) in windows closed by a NOOP."""
    docs = iter(docs)
    with opts.connect() as conn:
        while True:
            buf = bytearray()
            for i, (key, val) in zip(range(window), docs):
                buf += HEADER.pack(Magic.REQUEST, Opcode.SETQ, len(key), 8, 1,
                                   vbucket_of(key, vbuckets), 8 + len(key) + len(val), i, 0)
                buf += SET_EXTRAS.pack(0, 0) + key + val
            if not buf:
                return
            buf += HEADER.pack(Magic.REQUEST, Opcode.NOOP, 0, 0, 0, 0, 0, 0xFFFFFFFF, 0)
            conn.send_bytes(buf)
            while True:
                f = conn.recv_frame(timeout=120)
                if f.opcode == Opcode.NOOP:
                    break
                if f.status:
                    raise RuntimeError(f"SETQ failed: status {f.status:#x}")


def load(opts: ConnOptions, n: int, size: int, vbuckets: int, window: int = 5000) -> list[bytes]:
    """SETQ `n` JSON documents of ~`size` bytes on average (`benchmarks/docs.py`)."""
    values = list(docs.values(n, size))
    set_documents(opts, ((f"order::{i:09d}".encode(), v) for i, v in enumerate(values)),
                  vbuckets, window)
    return values


def node_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_restore(archive: Path, node_dir: Path, password: str, vbuckets: int, spark,
                    partitions: int | None) -> dict:
    """Restore `archive` into a fresh node in `node_dir`: the rate until `run_restore`
    returned (every write confirmed by the node), the time until the node had persisted
    everything, and the node's CPU seconds for the whole."""
    from benchmarks.node_ingest import wait_persisted

    res: dict = {}
    with LocalNode(node_dir, password=password, vbuckets=vbuckets) as bnode:
        dst = ConnOptions(bnode.host, bnode.port, "Administrator", password)
        cpu0 = node_cpu_seconds(bnode.proc.pid)
        t = time.perf_counter()
        r = run_restore(str(archive), dst, spark=spark, partitions=partitions).as_dict()
        wall = time.perf_counter() - t
        persisted = wait_persisted(bnode.host, bnode.port, password)
        res["restore_node_cpu_s"] = round(node_cpu_seconds(bnode.proc.pid) - cpu0, 2)
    restored = sum(r["restored"].values())
    res["restore_wall_s"] = round(wall, 2)
    res["restore_items_per_s"] = round(restored / wall)
    res["restore_persisted_after_s"] = round(persisted, 2)
    res["restore_failed"] = sum(r["failed"].values())
    return res


def cold_command(host: str, port: int, password: str, archive: Path) -> dict:
    """`python -m dcptool backup` of the node as a process of its own (a cold JVM, no
    engine: what a user's first command pays), this tree's dcptool: its wall time, from
    exec to exit, and its --json's Spark start-up."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    env = dict(os.environ, DCPTOOL_PASSWORD=password, DCPTOOL_ENGINE="off",
               PYTHONPATH=os.pathsep.join(filter(None, (str(repo), os.environ.get("PYTHONPATH")))))
    env.pop("DCPTOOL_SPARK_MASTER", None)
    t = time.perf_counter()
    # -b: the bucket's own archive (without it, a cluster archive of every bucket, whose
    # --json gives totals per run instead)
    p = subprocess.run([sys.executable, "-m", "dcptool", "backup", str(archive), "-b", "default",
                        "-c", f"couchbase://{host}:{port}", "--json"], env=env, cwd=repo,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"dcptool backup: exit {p.returncode}: {p.stderr.strip()[-2000:]}")
    d = json.loads(p.stdout)
    items = d["mutations"] + d["deletions"] + d["expirations"]
    return {"cold_command_wall_s": round(wall, 2),
            "cold_command_seconds": d["seconds"],  # the command's own timing (after imports)
            "cold_command_spark_startup_s": d["spark_startup_seconds"],
            "cold_command_spark_share": round(d["spark_startup_seconds"] / wall, 3),
            "cold_command_items_per_s": round(items / wall)}


def run(n: int, size: int, vbuckets: int = 1024, *, master: str = "local[*]",
        partitions: int | None = None, work_dir: str | None = None,
        cold: bool = False) -> dict:
    """Load, back up and restore; the measurements as a dict (see the module's doc).
    `cold`: first time a cold `dcptool backup` command of the same node (`cold_command`)."""
    args = SimpleNamespace(n=n, s=size, vbuckets=vbuckets, master=master, partitions=partitions,
                           dir=work_dir)
    work = Path(args.dir or tempfile.mkdtemp(prefix="dcptool-bench-"))
    password = secrets.token_urlsafe(10)
    res: dict = {"n": args.n, "value_size": args.s, "vbuckets": args.vbuckets}
    try:
        with LocalNode(work / "a", password=password, vbuckets=args.vbuckets) as a:
            src = ConnOptions(a.host, a.port, "Administrator", password)
            t = time.perf_counter()
            values = load(src, args.n, args.s, args.vbuckets)
            res["load_sets_per_s"] = round(args.n / (time.perf_counter() - t))
            raw = b"".join(values)
            res["raw_value_bytes"] = len(raw)
            t = time.perf_counter()
            res["zstd3_bytes"] = len(zstandard.ZstdCompressor(level=3).compress(raw))
            res["zstd3_seconds"] = round(time.perf_counter() - t, 2)
            del raw

            if cold:  # before this process's Spark starts: nothing of it warm or busy
                res.update(cold_command(a.host, a.port, password, work / "cold-archive"))
                shutil.rmtree(work / "cold-archive", ignore_errors=True)
            t = time.perf_counter()
            spark = get_spark(args.master)
            spark.sparkContext.parallelize([0], 1).count()
            res["spark_startup_s"] = round(time.perf_counter() - t, 2)
            parts = args.partitions or 2 * default_parallelism(spark)
            t = time.perf_counter()
            spark.sparkContext.parallelize(range(parts), parts).map(lambda x: x).collect()
            res["spark_empty_job_s"] = round(time.perf_counter() - t, 3)

            archive = work / "archive"
            t = time.perf_counter()
            b = run_backup(src, archive, spark=spark, partitions=args.partitions)
            wall = time.perf_counter() - t
            res["backup_wall_s"] = round(wall, 2)
            res["backup_items"] = b.items
            res["backup_items_per_s"] = round(b.items / wall)
            res["backup_value_MB_per_s"] = round(b.value_bytes / wall / 1e6, 1)
            res["archive_bytes"] = b.bytes
            res["archive_vs_raw"] = round(b.bytes / res["raw_value_bytes"], 3)
            res["archive_vs_zstd3"] = round(b.bytes / res["zstd3_bytes"], 3)
            res["spark_overhead_share"] = round(
                (res["spark_startup_s"] + res["spark_empty_job_s"]) / (res["spark_startup_s"] + wall), 3)
            res.update(measure_restore(archive, work / "b", password, args.vbuckets, spark,
                                       args.partitions))
            res["restore_value_MB_per_s"] = round(
                res["raw_value_bytes"] / res["restore_wall_s"] / 1e6, 1)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return res


def report(res: dict, json_out: str | None) -> None:
    """Print a benchmark's figures one a line, aligned; write them as JSON to `json_out`."""
    width = max(len(k) for k in res)
    for k, v in res.items():
        print(f"{k:<{width}}  {v}")
    if json_out:
        Path(json_out).write_text(json.dumps(res, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=1_000_000)
    ap.add_argument("-s", type=int, default=256)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--cold", action="store_true",
                    help="first time a cold `dcptool backup` command of the same node")
    ap.add_argument("--restore-only", metavar="ARCHIVE", default=None,
                    help="only restore this archive (made by an earlier run with --dir) into a "
                         "fresh node, --repeat times")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()

    if args.restore_only:
        spark = get_spark(args.master)
        spark.sparkContext.parallelize([0], 1).count()
        for i in range(args.repeat):
            work = Path(tempfile.mkdtemp(prefix="dcptool-bench-"))
            try:
                r = measure_restore(Path(args.restore_only), work / "b", secrets.token_urlsafe(10),
                                    args.vbuckets, spark, args.partitions)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            print(json.dumps({"partitions": args.partitions, "loadavg": os.getloadavg()[0], **r}),
                  flush=True)
        return
    res = run(args.n, args.s, args.vbuckets, master=args.master, partitions=args.partitions,
              work_dir=args.dir, cold=args.cold)
    report(res, args.json_out)


if __name__ == "__main__":
    main()
