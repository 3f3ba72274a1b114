"""dcptool at scale: full and incremental backup, restore and verify of up to 10M documents.

    python -m benchmarks.ten_million [--sizes 1000000,10000000] [--json FILE] [--keep DIR]

For each size N of --sizes, smallest first, in one run on one machine:

1. a reference node starts (`dcptool node start`, 1,024 vbuckets, 127.0.0.1, a free port,
   its data in a temporary directory) with `--eviction full --memory-quota 64MiB`;
2. N JSON documents of ~790 B on average (`benchmarks/docs.py`, `values(n, 800)`: the travel
   sample's mix of routes, airlines, airports and hotels) are loaded over several forked
   connections (`benchmarks/node_drain.py`'s loader, SETs with a window in flight), a slice of
   ~100k documents at a time so that no process holds more than one slice of documents; then
   the benchmark waits until the node has persisted everything. The load's seconds and rate
   are reported but are not a measured step;
3. measured steps, each the real CLI in a new process (`python -m dcptool ... --json`, with
   DCPTOOL_ENGINE=off so that each command starts its own local Spark, as a user's first
   command of the day does; the steps are long enough at scale for the start-up, ~10 s,
   to be a small share):
   a. `backup` (full) of the node's bucket into a local bucket archive;
   b. N/100 documents changed (keys 0, 100, 200, ...: spread over every vbucket, new
      documents of another seed, SETQ windows over one connection; persisted before the
      step), then `backup` (incremental);
   c. `restore` of the archive into a second, fresh node with the same eviction settings;
   d. `verify --against` the second node (a node with a history of its own: compared
      document by document, all it holds).

Per step: wall seconds (exec to exit), items/s (N for a, c and d; N/100 for b) and the peak
RSS of every process involved, read from /proc/PID/status (VmRSS) every 0.2 s by one thread:
the command's Python driver, its Spark JVM and its Spark Python workers (the pyspark daemon
and the workers it forks: the largest one, and the sum at the moment the sum peaked), found
by walking the process tree under the command (children of children; new pids only, read
once), and each node process (`node_source`, `node_target`). Also the archive's size on disk
after a and after b, the raw bytes of the documents, and each node's peak RSS during the load.

At the end: per step the ratio of time per item at the largest size to the smallest (goal
<= 1.2), and per process kind the ratio of peak RSS (goal ~1.0; the nodes hold per-key data
of their own, see below); a table that fits 100 columns on stdout, everything as JSON with
--json.

The memory quota. With full eviction the node keeps resident only the documents not yet
persisted and as many others as fit in --memory-quota (counted as key + value + 120 B, so
64 MiB is ~70k documents of ~0.8 KB): smaller than the smallest size measured, so at every
size the cache is full and bounded by the quota, not by the data. 64 MiB is the node's
default and the figure `docs/eviction.md` measures with; what still grows with the number of
keys is the node's own per-key data (its bloom filters, ~1-2 bytes a key, and SQLite's page
cache of a larger file), and the writes not yet flushed during a load. The node's peak RSS
per size is reported (`node_bytes_per_doc`: the growth between two sizes per document).

Everything started is stopped on exit, also on Ctrl-C, SIGTERM or an exception (commands run
in a process group of their own and are killed as a group); the temporary directory goes too
unless --keep DIR, which keeps the nodes' data and archives there.

Before it starts, the run checks the free disk space in the work directory against what the
largest size needs (two nodes' SQLite files at ~2.2 x the raw bytes each, the archive at
~0.4 x; these factors come from the validation runs) and stops if it is short.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import docs, node_drain  # noqa: E402
from benchmarks.backup_restore import set_documents  # noqa: E402
from benchmarks.node_ingest import wait_persisted  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402

VBUCKETS = 1024
DOC_SIZE = 800  # docs.values' target mean: ~790 B
MEMORY_QUOTA = "64MiB"
NODE_ARGS = ("--eviction", "full", "--memory-quota", MEMORY_QUOTA)
SLICE = 100 * docs.CHUNK  # documents a loader makes, sends and forgets at a time
SAMPLE_S = 0.2
KINDS = ("driver", "jvm", "python_workers", "node_source", "node_target")
STEPS = ("full_backup", "incremental_backup", "restore", "verify_against")
#: disk a size needs, as multiples of the documents' raw bytes (two nodes and the archive)
DISK_FACTOR = 2 * 2.2 + 0.4


# --------------------------------------------------------------------------- sampling

def _name_rss_kb(pid: int) -> tuple[str, int] | None:
    """(Name, VmRSS in KiB) of /proc/PID/status; None when the process is gone."""
    name, kb = "", 0  # a zombie has no VmRSS line
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Name:"):
                    name = line.split(None, 1)[1].strip().decode(errors="replace")
                elif line.startswith(b"VmRSS:"):
                    kb = int(line.split()[1])
                    break
    except (OSError, ValueError, IndexError):
        return None
    return name, kb


def _ppid_comm(pid: int) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
    except OSError:
        return None
    lp, rp = s.index(b"("), s.rindex(b")")
    return int(s[rp + 2:].split()[1]), s[lp + 1:rp].decode(errors="replace")


class Sampler:
    """One thread: every SAMPLE_S seconds the VmRSS of the nodes and of every process under
    `root` (the command), by kind; keeps each kind's peak. New pids are classified once (their
    parent and name from /proc/PID/stat): the root is the driver, a `java` under it the JVM,
    any other process under it (the pyspark daemon and its forked workers) a Python worker."""

    def __init__(self, nodes: dict[str, int]) -> None:
        self.nodes = nodes
        self.root: int | None = None
        #: pid -> under the command's tree (True), or not (False); read once per pid
        self.ours: dict[int, bool] = {}
        #: pid -> its kind, once known for good (see `_kind`)
        self.kinds: dict[int, str] = {}
        self.peak_kb: dict[str, int] = {}
        self.workers_max_one_kb = 0
        self.workers_sum_kb = 0
        self.samples = 0
        #: CPU seconds of the sampling thread itself (its cost), and its share of wall
        self.cpu_s = 0.0
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, root: int | None) -> None:
        """Start a step: forget the peaks, follow `root`'s tree (None: the nodes only)."""
        with self._lock:
            self.root = root
            self.ours = {} if root is None else {root: True}
            self.kinds = {}
            self.peak_kb = {}
            self.workers_max_one_kb = self.workers_sum_kb = 0
            self.samples = 0

    def _classify(self, pids) -> None:
        for pid in pids:
            if pid in self.ours:
                continue
            pc = _ppid_comm(pid)
            if pc is None:
                continue
            ppid = pc[0]
            if ppid not in self.ours and ppid > 1:
                self._classify([ppid])  # a parent forked between two scans
            self.ours[pid] = self.ours.get(ppid, False)

    def _kind(self, pid: int, name: str) -> str:
        """The kind of a process of the command's tree: its program (argv[0]) once it is
        java or python (spark-submit's script execs the JVM: a script is looked at again
        at the next sample), else by its name now."""
        kind = self.kinds.get(pid)
        if kind is not None:
            return kind
        if pid == self.root:
            kind = "driver"
        else:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    prog = os.path.basename(f.read().split(b"\0", 1)[0]).decode(errors="replace")
            except OSError:
                prog = name
            if prog == "java" or name == "java":
                kind = "jvm"
            elif prog.startswith("python") or name.startswith("python"):
                kind = "python_workers"
            else:
                return "other"
        self.kinds[pid] = kind
        return kind

    def sample(self) -> None:
        with self._lock:
            vals: dict[str, int] = {}
            for kind, pid in self.nodes.items():
                got = _name_rss_kb(pid)
                if got is not None:
                    vals[kind] = got[1]
            if self.root is not None:
                pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
                self._classify(pids)
                workers_sum = workers_one = 0
                for pid in pids:
                    if not self.ours.get(pid):
                        continue
                    got = _name_rss_kb(pid)
                    if got is None:
                        continue
                    kind = self._kind(pid, got[0])
                    kb = got[1]
                    if kind == "python_workers":
                        workers_sum += kb
                        workers_one = max(workers_one, kb)
                    else:
                        vals[kind] = vals.get(kind, 0) + kb
                if workers_sum:
                    vals["python_workers"] = workers_sum
                    self.workers_max_one_kb = max(self.workers_max_one_kb, workers_one)
                    self.workers_sum_kb = max(self.workers_sum_kb, workers_sum)
                # a pid that is gone may come back as another process: forget the dead
                live = set(pids)
                for pid in [p for p in self.ours if p not in live]:
                    del self.ours[pid]
                    self.kinds.pop(pid, None)
            for kind, kb in vals.items():
                if kb > self.peak_kb.get(kind, 0):
                    self.peak_kb[kind] = kb
            self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()
            self.cpu_s = time.thread_time()

    def cost(self) -> dict:
        wall = time.perf_counter() - self._t0
        return {"cpu_s": round(self.cpu_s, 2), "wall_s": round(wall, 1),
                "cpu_share": round(self.cpu_s / wall, 4) if wall else None}

    def peaks_mb(self) -> dict:
        with self._lock:
            out = {k: round(v / 1024, 1) for k, v in self.peak_kb.items()}
            if self.workers_sum_kb:
                out["python_workers"] = {"max_one": round(self.workers_max_one_kb / 1024, 1),
                                         "sum": round(self.workers_sum_kb / 1024, 1)}
            out["samples"] = self.samples
            return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


# --------------------------------------------------------------------------- loading

def _load_share(args) -> int:
    """A forked loader: documents lo..hi-1 a slice at a time (`node_drain._load` sends them),
    the slice's documents forgotten after it; returns their raw bytes."""
    host, port, password, lo, hi = args
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the pool's end is not the run's Ctrl-C
    raw = 0
    for a in range(lo, hi, SLICE):
        b = min(hi, a + SLICE)
        raw += sum(len(v) for v in docs.values(b - a, DOC_SIZE, start=a))  # made and kept
        node_drain._load((host, port, password, a, b, DOC_SIZE, VBUCKETS))  # sent from the cache
        docs.clear()
    return raw


def load(node: LocalNode, n: int, procs: int) -> tuple[int, float]:
    """N documents over `procs` forked connections; (raw bytes, seconds)."""
    t0 = time.perf_counter()
    # shares of whole chunks (docs.CHUNK): each chunk is made once, by one loader
    per = -(-n // procs // docs.CHUNK) * docs.CHUNK
    jobs = [(node.host, node.port, node.password, lo, min(n, lo + per))
            for lo in range(0, n, per)]
    with mp.get_context("fork").Pool(len(jobs)) as pool:
        raw = sum(pool.map(_load_share, jobs))
    return raw, time.perf_counter() - t0


def change(node: LocalNode, n: int) -> tuple[int, float]:
    """Overwrite keys 0, 100, 200, ... (N/100 of them, over every vbucket) with documents of
    another seed; (documents changed, seconds)."""
    opts = ConnOptions(node.host, node.port, "Administrator", node.password)
    keys = range(0, n, 100)
    t0 = time.perf_counter()
    set_documents(opts, ((b"doc-%09d" % i, v) for i, v in
                         zip(keys, docs.values(len(keys), DOC_SIZE, seed=4337))), VBUCKETS)
    docs.clear()
    return len(keys), time.perf_counter() - t0


# --------------------------------------------------------------------------- steps

class Run:
    """The processes of one run, all stopped by `close()`."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.password = secrets.token_urlsafe(12)
        self.nodes: list[LocalNode] = []
        self.cmd: subprocess.Popen | None = None
        self.sampler: Sampler | None = None

    def node(self, name: str) -> LocalNode:
        node = LocalNode(self.work / name, password=self.password, vbuckets=VBUCKETS,
                         extra_args=NODE_ARGS)
        self.nodes.append(node)
        return node.start()

    def command(self, args: list[str], sampler: Sampler, timeout: float) -> tuple[dict, float]:
        """`python -m dcptool ARGS --json` in a process group of its own, sampled; (its JSON,
        wall seconds)."""
        env = dict(os.environ, DCPTOOL_PASSWORD=self.password, DCPTOOL_ENGINE="off", NO_COLOR="1")
        env.pop("DCPTOOL_SPARK_MASTER", None)
        err = open(self.work / "commands.stderr.log", "ab")
        t0 = time.perf_counter()
        self.cmd = subprocess.Popen([sys.executable, "-m", "dcptool", *args, "--json"],
                                    stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                    env=env, cwd=REPO, start_new_session=True)
        err.close()
        sampler.watch(self.cmd.pid)
        try:
            out, _ = self.cmd.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_cmd()
            raise RuntimeError(f"dcptool {args[0]} did not finish in {timeout:.0f} s")
        wall = time.perf_counter() - t0
        sampler.sample()
        rc, self.cmd = self.cmd.returncode, None
        if rc != 0:
            tail = (self.work / "commands.stderr.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"dcptool {args[0]} exited {rc}: {tail.strip()}")
        return json.loads(out), wall

    def _kill_cmd(self) -> None:
        """Kill the running command and every process under it (Spark's JVM and its Python
        daemon run in sessions of their own: found by their parents, before any dies)."""
        cmd, self.cmd = self.cmd, None
        if cmd is None:
            return
        pids = _descendants(cmd.pid)
        for pid in [cmd.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.killpg(cmd.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        cmd.wait(30)

    def close(self) -> None:
        self._kill_cmd()
        if self.sampler is not None:
            self.sampler.close()
        for node in self.nodes:
            node.stop()
        self.nodes = []


def _descendants(root: int) -> list[int]:
    """Every process under `root` (children of children), from /proc."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            pc = _ppid_comm(int(p))
            if pc is not None:
                children.setdefault(pc[0], []).append(int(p))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            out.append(c)
            todo.append(c)
    return out


def _du(path: Path) -> int:
    """Bytes on disk (allocated blocks) under `path`."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _handled(name: str, out: dict) -> int | None:
    """The documents the command says it handled (its --json)."""
    if "backup" in name:
        return out.get("mutations")
    if name == "restore":
        return sum((out.get("restored") or {}).values())
    return out.get("keys_node") if out.get("ok") else None


def _step(run: Run, sampler: Sampler, name: str, args: list[str], items: int,
          timeout: float) -> dict:
    print(f"  {name} ...", file=sys.stderr, flush=True)
    out, wall = run.command(args, sampler, timeout)
    handled = _handled(name, out)
    if handled != items:  # a figure of a run that did not do the work would mislead
        raise RuntimeError(f"{name}: {handled} documents handled, {items} expected")
    r = {"wall_s": round(wall, 2), "items": items, "items_per_s": round(items / wall),
         "us_per_item": round(wall / items * 1e6, 2), "peak_rss_MB": sampler.peaks_mb(),
         # the command's --json without its long parts (verify's 1,024 vbuckets, say)
         "output": {k: v for k, v in out.items() if len(json.dumps(v)) < 400}}
    print(f"  {name}: {r['wall_s']} s, {r['items_per_s']:,} items/s, "
          f"RSS {json.dumps(r['peak_rss_MB'])}", file=sys.stderr, flush=True)
    return r


def measure(n: int, work: Path, procs: int) -> dict:
    """Load N documents, then the four measured steps (see the module's doc)."""
    work.mkdir(parents=True, exist_ok=True)
    run = Run(work)
    res: dict = {"n": n}
    timeout = max(600.0, n / 2000)  # a step slower than 2,000 items/s is a failure
    try:
        src = run.node("node-source")
        sampler = run.sampler = Sampler({"node_source": src.proc.pid})
        sampler.watch(None)
        print(f"N={n:,}: loading", file=sys.stderr, flush=True)
        raw, secs = load(src, n, procs)
        t = time.perf_counter()
        persisted = wait_persisted(src.host, src.port, src.password, timeout=timeout)
        res["load"] = {"seconds": round(secs, 1), "docs_per_s": round(n / secs),
                       "persisted_after_s": round(persisted, 1),
                       "node_source_peak_rss_MB": sampler.peaks_mb().get("node_source")}
        res["raw_doc_bytes"] = raw
        res["mean_doc_bytes"] = round(raw / n, 1)
        print(f"  loaded in {secs:.1f} s ({n / secs:,.0f} docs/s), persisted "
              f"{time.perf_counter() - t:.1f} s later", file=sys.stderr, flush=True)
        src_url = f"couchbase://{src.host}:{src.port}"
        archive = work / "archive"
        steps: dict = {}
        steps["full_backup"] = _step(run, sampler, "full backup",
                                     ["backup", str(archive), "-c", src_url, "-b", "default",
                                      "--no-progress"], n, timeout)
        res["archive_bytes_after_full"] = _du(archive)

        sampler.watch(None)
        changed, secs = change(src, n)
        persisted = wait_persisted(src.host, src.port, src.password, timeout=timeout)
        res["change"] = {"docs": changed, "seconds": round(secs, 1),
                         "persisted_after_s": round(persisted, 1)}
        steps["incremental_backup"] = _step(run, sampler, "incremental backup",
                                            ["backup", str(archive), "-c", src_url, "-b",
                                             "default", "--no-progress"], changed, timeout)
        res["archive_bytes_after_incremental"] = _du(archive)

        dst = run.node("node-target")
        sampler.nodes = {"node_source": src.proc.pid, "node_target": dst.proc.pid}
        dst_url = f"couchbase://{dst.host}:{dst.port}"
        steps["restore"] = _step(run, sampler, "restore",
                                 ["restore", str(archive), "-c", dst_url, "--no-progress"],
                                 n, timeout)
        sampler.watch(None)
        t = time.perf_counter()
        res["restore_persisted_after_s"] = round(
            wait_persisted(dst.host, dst.port, dst.password, timeout=timeout), 1)
        print(f"  restored documents persisted {time.perf_counter() - t:.1f} s later",
              file=sys.stderr, flush=True)
        steps["verify_against"] = _step(run, sampler, "verify --against",
                                        ["verify", str(archive), "--against", "-c", dst_url,
                                         "--no-progress"], n, timeout)
        res["steps"] = steps
        res["node_disk_bytes"] = {"source": _du(work / "node-source"),
                                  "target": _du(work / "node-target")}
        res["sampler"] = sampler.cost()
    finally:
        run.close()
    return res


# --------------------------------------------------------------------------- report

def _peak(step: dict, kind: str) -> float | None:
    v = step["peak_rss_MB"].get(kind)
    return v["sum"] if isinstance(v, dict) else v


def summarize(results: list[dict]) -> dict:
    """Largest size against the smallest: time per item and peak RSS per kind."""
    lo, hi = results[0], results[-1]
    out: dict = {"smallest": lo["n"], "largest": hi["n"], "time_per_item": {}, "peak_rss": {}}
    for s in STEPS:
        out["time_per_item"][s] = round(hi["steps"][s]["us_per_item"]
                                        / lo["steps"][s]["us_per_item"], 3)
        for kind in KINDS:
            a, b = _peak(lo["steps"][s], kind), _peak(hi["steps"][s], kind)
            if a and b:
                out["peak_rss"].setdefault(kind, {})[s] = round(b / a, 3)
    a = lo["steps"]["full_backup"]["peak_rss_MB"].get("node_source")
    b = hi["steps"]["full_backup"]["peak_rss_MB"].get("node_source")
    if a and b and hi["n"] > lo["n"]:
        out["node_bytes_per_doc"] = round((b - a) * 2**20 / (hi["n"] - lo["n"]), 1)
    out["goal_time_per_item_max"] = 1.2
    out["time_per_item_ok"] = all(v <= 1.2 for v in out["time_per_item"].values())
    return out


def table(results: list[dict], summary: dict | None) -> str:
    """The figures, at most 100 columns wide."""
    short = {"full_backup": "full backup", "incremental_backup": "incremental",
             "restore": "restore", "verify_against": "verify --against"}
    lines = []
    for r in results:
        ld = r["load"]
        lines.append(f"N = {r['n']:,}: {r['mean_doc_bytes']} B/doc, raw {r['raw_doc_bytes'] / 1e6:,.1f}"
                     f" MB; load {ld['seconds']} s ({ld['docs_per_s']:,}/s, not measured)")
        lines.append(f"  archive {r['archive_bytes_after_full'] / 1e6:,.1f} MB after the full "
                     f"backup, {r['archive_bytes_after_incremental'] / 1e6:,.1f} MB after the "
                     f"incremental")
        lines.append(f"  {'step':<16}{'wall s':>9}{'items/s':>10}{'driver':>8}{'jvm':>7}"
                     f"{'wrk max':>8}{'wrk sum':>8}{'node src':>9}{'node tgt':>9} (RSS MB)")
        for s in STEPS:
            st = r["steps"][s]
            p = st["peak_rss_MB"]
            w = p.get("python_workers") or {}

            def f(v):
                return f"{v:.0f}" if isinstance(v, (int, float)) else "-"
            lines.append(f"  {short[s]:<16}{st['wall_s']:>9.1f}{st['items_per_s']:>10,}"
                         f"{f(p.get('driver')):>8}{f(p.get('jvm')):>7}{f(w.get('max_one')):>8}"
                         f"{f(w.get('sum')):>8}{f(p.get('node_source')):>9}"
                         f"{f(p.get('node_target')):>9}")
    if summary and summary["largest"] != summary["smallest"]:
        lines.append(f"{summary['largest']:,} / {summary['smallest']:,} documents: time per item "
                     f"(goal <= 1.2), peak RSS (goal ~1.0)")
        lines.append(f"  {'step':<17}{'time/item':>10}{'driver':>8}{'jvm':>7}{'workers':>8}"
                     f"{'node src':>9}{'node tgt':>9}")
        for s in STEPS:
            pr = summary["peak_rss"]

            def g(kind):
                v = pr.get(kind, {}).get(s)
                return f"{v:.2f}" if v is not None else "-"
            lines.append(f"  {short[s]:<17}{summary['time_per_item'][s]:>10.2f}{g('driver'):>8}"
                         f"{g('jvm'):>7}{g('python_workers'):>8}{g('node_source'):>9}"
                         f"{g('node_target'):>9}")
        if "node_bytes_per_doc" in summary:
            lines.append(f"  node's peak RSS growth (full backup): "
                         f"{summary['node_bytes_per_doc']} B per document")
    return "\n".join(lines)


# --------------------------------------------------------------------------- main

def check_resources(sizes: list[int], work: Path) -> dict:
    """Free disk in `work` against what the largest size needs; the memory available."""
    need = int(max(sizes) * DOC_SIZE * DISK_FACTOR)
    free = shutil.disk_usage(work).free
    mem = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            mem[k] = int(v.split()[0]) * 1024
    out = {"disk_free_bytes": free, "disk_needed_bytes": need,
           "mem_total_bytes": mem["MemTotal"], "mem_available_bytes": mem["MemAvailable"]}
    if need > free:
        raise SystemExit(f"not enough disk in {work}: {need / 1e9:.1f} GB needed for "
                         f"{max(sizes):,} documents, {free / 1e9:.1f} GB free")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ten_million",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,10000000",
                    help="comma-separated document counts, run smallest first")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--keep", type=Path, default=None,
                    help="work in DIR and keep the nodes' data and archives")
    ap.add_argument("--loaders", type=int, default=3, help="forked loader connections")
    a = ap.parse_args(argv)
    sizes = sorted(int(x.replace("_", "")) for x in a.sizes.split(",") if x)
    if not sizes or min(sizes) < 100:
        ap.error("--sizes: counts of at least 100")
    # every command and node runs this tree's dcptool
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
    work = a.keep or Path(tempfile.mkdtemp(prefix="dcptool-tenm-"))

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C also when started where SIGINT was ignored (a shell's background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    res: dict = {"command": "python -m benchmarks.ten_million " + " ".join(
                     sys.argv[1:] if argv is None else argv),
                 "sizes": sizes, "vbuckets": VBUCKETS, "doc_size_target": DOC_SIZE,
                 "node_args": list(NODE_ARGS), "sample_interval_s": SAMPLE_S,
                 "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
                 "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.perf_counter()
    try:
        res["resources"] = check_resources(sizes, work)
        results = []
        for n in sizes:
            results.append(measure(n, work / f"n{n}", a.loaders))
            if not a.keep:
                shutil.rmtree(work / f"n{n}", ignore_errors=True)
        res["results"] = results
        res["summary"] = summarize(results) if len(results) > 1 else None
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["machine"]["loadavg_end"] = os.getloadavg()
    print(table(res["results"], res["summary"]))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted: every process started was stopped", file=sys.stderr)
        sys.exit(130)
