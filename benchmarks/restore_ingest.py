"""Restore against the node's own write rate, in alternating rounds (issue 37).

    python -m benchmarks.restore_ingest [-n 200000] [--rounds 3] [--cluster] [--json FILE]
                                        [--archive DIR] [--partitions P]

One archive of N JSON documents of ~256 bytes (`benchmarks/docs.py`, 1024 vbuckets) is
made first (a node loaded and backed up with local Spark started in this process), or
taken from --archive. Then each round, in alternating order (so the machine's other load
hits both alike), into fresh nodes:

* restore: `run_restore` of the archive (end to end: the chain checked as verify does,
  the target checked, the Spark tasks; until every write was confirmed);
* ingest: N plain SETs of the same documents over 4 connections (`benchmarks/node_ingest.py`:
  one client process per connection, 512 requests in flight each, every answer parsed).

With --cluster the target is a cluster of 3 reference nodes (`dcptool cluster create
--replicas 0`), and the ingest writes every member in parallel by vbucket ownership:
4 connections per member (12 client processes), each sending only keys whose vbucket is
active on its member.

Reported per side: the rounds' items/s and their median, the ratio of the medians
(restore / ingest), the ratio of items per CPU second of all the side's processes
(`cpu_ratio`, restore over ingest), and CPU seconds by process (the nodes; for the restore the driver,
Spark's JVM and its Python workers; for the ingest its client processes), which the
machine's other load disturbs less than the wall clock.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from benchmarks import docs, node_ingest  # noqa: E402
from benchmarks.results import print_and_keep  # noqa: E402
from benchmarks.backup_restore import set_documents  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.protocol import encode_frame, vbucket_of  # noqa: E402
from dcptool.protocol.constants import Opcode  # noqa: E402
from nodeprocutil import NodeProcess  # noqa: E402

VALUE_SIZE = 256
VBUCKETS = 1024
CONNECTIONS = 4
WINDOW = 512
MEMBERS = 3


# -- CPU by process ------------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, str, float] | None:
    """(parent pid, command name, CPU seconds of the process and its reaped children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, _, rest = f.read().rpartition(")")
    except OSError:
        return None
    fields = rest.split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = sum(int(x) for x in fields[11:15]) / tick
    return int(fields[1]), head.partition("(")[2], cpu


def tree_cpu(root: int) -> dict[int, tuple[str, float]]:
    """{pid: (kind, CPU seconds)} of `root` and every process below it."""
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (s := _stat(int(d))) is not None:
            procs[int(d)] = s
    out = {}
    for pid, (ppid, name, cpu) in procs.items():
        p, chain = pid, []
        while p in procs and p != root and len(chain) < 50:
            chain.append(p)
            p = procs[p][0]
        if p == root:
            out[pid] = (name, cpu)
    if root in procs:
        out[root] = (procs[root][1], procs[root][2])
    return out


def kind_of(pid: int, name: str, root: int, nodes: set[int]) -> str:
    if pid == root:
        return "driver"
    if pid in nodes:
        return "nodes"
    if name == "java":
        return "spark JVM"
    if name.startswith("python"):
        return "python workers"
    return "other"


def cpu_by_kind(before: dict, after: dict, root: int, nodes: set[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        k = kind_of(pid, name, root, nodes)
        if k == "other":
            continue
        was = before.get(pid, (name, 0.0))[1]
        out[k] = round(out.get(k, 0.0) + cpu - was, 2)
    return out


# -- targets ---------------------------------------------------------------------------------------

def start_target(base: Path, cluster: bool, password: str) -> list[NodeProcess]:
    names = ["a", "b", "c"] if cluster else ["a"]
    nodes = [NodeProcess(base / n, vbuckets=VBUCKETS, password=password) for n in names]
    try:
        for n in nodes:
            n.start()
        if cluster:
            env = dict(os.environ, PYTHONPATH=str(REPO), DCPTOOL_USERNAME=nodes[0].username,
                       DCPTOOL_PASSWORD=password)
            r = subprocess.run([sys.executable, "-m", "dcptool", "cluster", "create",
                                *(x for m in nodes for x in ("-c", f"{m.host}:{m.port}")),
                                "--replicas", "0"], capture_output=True, text=True, env=env,
                               cwd=REPO, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"cluster create failed: {r.stderr.strip()}")
    except BaseException:
        stop_target(nodes)
        raise
    return nodes


def stop_target(nodes: list[NodeProcess]) -> None:
    for n in nodes:
        if n.running():
            n.stop(timeout=600)


def owners(nodes: list[NodeProcess], password: str) -> dict[int, int]:
    """{vbucket: index in `nodes` of its active member}."""
    from dcptool.pipeline.nodeinfo import active_nodes

    opts = ConnOptions(nodes[0].host, nodes[0].port, "Administrator", password)
    with opts.connect() as conn:
        found = active_nodes(opts, conn)
    where = {f"{n.host}:{n.port}": i for i, n in enumerate(nodes)}
    if found is None:
        return dict.fromkeys(range(VBUCKETS), 0)
    return {vb: where[node] for node, vbs in found[1].items() for vb in vbs}


# -- ingest ----------------------------------------------------------------------------------------

def ingest(nodes: list[NodeProcess], password: str, n: int, prefix: bytes) -> dict:
    """N SETs of the documents, 4 connections per member (each member its own keys)."""
    own = owners(nodes, password)
    for _ in docs.values(n, VALUE_SIZE):  # made once here: the forked clients inherit them
        pass
    ctx = mp.get_context("fork")
    # the keys of each member, spread over its connections
    per_member: list[list[int]] = [[] for _ in nodes]
    for i in range(n):
        per_member[own[vbucket_of(b"%s%010d" % (prefix, i), VBUCKETS)]].append(i)
    jobs = []
    for m, idx in enumerate(per_member):
        for c in range(CONNECTIONS):
            jobs.append((nodes[m], idx[c::CONNECTIONS]))
    barrier = ctx.Barrier(len(jobs))
    q = ctx.Queue()
    procs = [ctx.Process(target=_ingest_keys, args=(node.host, node.port, password, idx, prefix,
                                                    barrier, q))
             for node, idx in jobs]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    wall = max(r[2] for r in results) - min(r[1] for r in results)
    total = sum(r[0] for r in results)
    # the clients' CPU while they sent (not while they built their frames)
    return {"items": total, "seconds": round(wall, 3), "items_per_s": round(total / wall),
            "clients": len(procs), "clients_cpu_s": round(sum(r[3] for r in results), 2)}


def _ingest_keys(host, port, password, idx, prefix, barrier, q) -> None:
    s = node_ingest._session(host, port, password)
    values = docs.values(max(idx) + 1 if idx else 0, VALUE_SIZE)
    frames = []
    want = set(idx)
    for i, body in enumerate(values):
        if i in want:
            key = b"%s%010d" % (prefix, i)
            frames.append(encode_frame(0x80, Opcode.SET, vbucket_of(key, VBUCKETS), i,
                                       datatype=0x01, extras=b"\x00" * 8, key=key, value=body))
    barrier.wait()
    c0 = time.process_time()
    t0 = time.perf_counter()
    node_ingest.send_frames(s, frames, WINDOW)
    t1 = time.perf_counter()
    s.close()
    q.put((len(frames), t0, t1, time.process_time() - c0))


# -- the archive -----------------------------------------------------------------------------------

def make_archive(work: Path, n: int, spark, password: str) -> Path:
    from dcptool.pipeline.backup import run_backup

    with NodeProcess(work / "source", vbuckets=VBUCKETS, password=password) as src:
        opts = ConnOptions(src.host, src.port, "Administrator", password)
        set_documents(opts, ((f"order::{i:09d}".encode(), v)
                             for i, v in enumerate(docs.values(n, VALUE_SIZE))), VBUCKETS)
        run_backup(opts, work / "archive", spark=spark)
    return work / "archive"


def restore(archive: Path, nodes: list[NodeProcess], password: str, spark,
            partitions: int | None) -> dict:
    from dcptool.pipeline.restore import run_restore

    dst = ConnOptions(nodes[0].host, nodes[0].port, "Administrator", password)
    t = time.perf_counter()
    r = run_restore(str(archive), dst, spark=spark, partitions=partitions).as_dict()
    wall = time.perf_counter() - t
    items = sum(r["restored"].values())
    if sum(r["failed"].values()) or items == 0:
        raise RuntimeError(f"restore failed: {r}")
    return {"items": items, "seconds": round(wall, 3), "items_per_s": round(items / wall)}


# -- the rounds ------------------------------------------------------------------------------------

def run(n: int = 200_000, rounds: int = 3, *, cluster: bool = False, archive: str | None = None,
        partitions: int | None = None, spark=None, work_dir: str | None = None) -> dict:
    from dcptool.pipeline.runtime import get_spark

    work = Path(work_dir or tempfile.mkdtemp(prefix="dcptool-bench-ri-"))
    password = secrets.token_urlsafe(10)
    me = os.getpid()
    res: dict = {"n": n, "value_size": VALUE_SIZE, "vbuckets": VBUCKETS,
                 "target": f"{MEMBERS}-member cluster, no replicas" if cluster else "one node",
                 "ingest_connections": (f"{CONNECTIONS} per member ({CONNECTIONS * MEMBERS})"
                                        if cluster else str(CONNECTIONS)),
                 "rounds": rounds, "load_average_before": round(os.getloadavg()[0], 2)}
    try:
        spark = spark or get_spark("local[*]")
        spark.sparkContext.parallelize([0], 1).count()
        arch = Path(archive) if archive else make_archive(work, n, spark, password)
        for _ in docs.values(n, VALUE_SIZE):  # the ingest's documents, made before the rounds
            pass
        sides = {"restore": [], "ingest": []}
        for i in range(rounds):
            order = ("restore", "ingest") if i % 2 == 0 else ("ingest", "restore")
            for side in order:
                nodes = start_target(work / f"{side}-{i}", cluster, password)
                try:
                    node_pids = {nd.pid for nd in nodes}
                    before = tree_cpu(me)
                    if side == "restore":
                        r = restore(arch, nodes, password, spark, partitions)
                    else:
                        r = ingest(nodes, password, n, b"ingest-%d-" % i)
                    r["cpu_s"] = cpu_by_kind(before, tree_cpu(me), me, node_pids)
                    if side == "ingest":  # (the driver only built and routed the keys; the
                        # idle Spark of the benchmark is no part of it)
                        r["cpu_s"] = {"nodes": r["cpu_s"].get("nodes", 0.0),
                                      "clients": r.pop("clients_cpu_s")}
                    r["cpu_s"] = {k: v for k, v in r["cpu_s"].items() if v}
                finally:
                    stop_target(nodes)
                    shutil.rmtree(work / f"{side}-{i}", ignore_errors=True)
                sides[side].append(r)
                print(f"  round {i} {side}: {r}", file=sys.stderr, flush=True)
        for side, rs in sides.items():
            res[side] = {"items_per_s": [r["items_per_s"] for r in rs],
                         "median_items_per_s": round(statistics.median(
                             r["items_per_s"] for r in rs)),
                         "cpu_s": {k: round(statistics.median(r["cpu_s"].get(k, 0.0) for r in rs), 2)
                                   for k in sorted({k for r in rs for k in r["cpu_s"]})}}
        res["restore_over_ingest"] = round(res["restore"]["median_items_per_s"]
                                           / res["ingest"]["median_items_per_s"], 3)
        res["ratios"] = [round(r["items_per_s"] / g["items_per_s"], 3)
                         for r, g in zip(sides["restore"], sides["ingest"])]
        # items per CPU second of every process of a side (the nodes, and the restore's
        # driver, JVM and workers or the ingest's clients), restore over ingest: what the
        # wall ratio would be on cores that nothing else uses, were both CPU-bound
        cpu = {side: statistics.median(sum(r["cpu_s"].values()) for r in rs)
               for side, rs in sides.items()}
        res["cpu_s_total"] = {k: round(v, 2) for k, v in cpu.items()}
        res["cpu_ratio"] = round(cpu["ingest"] / cpu["restore"], 3) if cpu["restore"] else None
        res["load_average_after"] = round(os.getloadavg()[0], 2)
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cluster", action="store_true", help="a 3-member cluster as the target")
    ap.add_argument("--archive", default=None, help="restore this archive (made by an "
                                                    "earlier run with --dir) instead")
    ap.add_argument("--partitions", type=int, default=None)
    ap.add_argument("--dir", default=None, help="work here and keep it")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run(a.n, a.rounds, cluster=a.cluster, archive=a.archive, partitions=a.partitions,
              work_dir=a.dir)
    return print_and_keep(res, a.json_out)


if __name__ == "__main__":
    main()
