"""`dcptool backup --continuous` under load: the highest write rate it keeps up with.

    python -m benchmarks.continuous_sustain [--rates 2000,4000,8000,16000,32000]
        [--probe-seconds 60] [--seconds 600] [--checkpoint 10s] [--json FILE]

Reference nodes (1,024 vbuckets, full eviction with a 64 MiB quota, so that their memory
stays flat while millions of new documents go in; a fresh one for each run) on 127.0.0.1,
and on the same machine (node, writer and backup sharing its cores):

1. the node's own ingest rate: 100,000 documents over 4 connections with 512 writes in
   flight each (`benchmarks/node_ingest.py`), nothing else running;
2. a continuous backup (`python -m dcptool backup ... --continuous --checkpoint 10s --json`,
   a process of its own with its own local Spark) while one writer process sets new
   documents (a new key each: ~260 B JSON from `benchmarks/docs.py`, a pool of 8,192 used in
   turn) at a steady RATE: every 50 ms a window of RATE/20 SETQs closed by a NOOP, whose
   answer acknowledges the window. Each probe rate runs --probe-seconds (lowest first);
   the highest rate that kept up is then held for --seconds (10 minutes).

The lag. A checkpoint reads the node's high seqnos when it begins and commits the archive
up to them, so a write acknowledged after checkpoint i-1 began is committed when
checkpoint i ends: the worst lag of the writes of that stretch is end(i) - start(i-1). A
rate is kept up with when, over the whole run (from its second checkpoint on), that worst
lag stays below two checkpoint intervals, the writer held its rate (>= 0.97 of it), and
the archive holds every write at the end (the items of its backups = the writes; after
SIGINT, which commits a last checkpoint). Reported per run: the writes, the rate the writer
reached, the checkpoints, their duration (median, max), the worst lag and its ratio to the
interval, the items behind at the worst checkpoint end, the backup's CPU share (its process
tree) and its RSS at the start and the end, and the node's ingest rate of step 1 beside.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from benchmarks import continuous as cont  # noqa: E402
from benchmarks import node_ingest  # noqa: E402
from benchmarks.docs import values  # noqa: E402
from nodeprocutil import NodeProcess  # noqa: E402

from dcptool.archive import Archive  # noqa: E402
from dcptool.protocol import vbucket_of  # noqa: E402
from dcptool.protocol.constants import Opcode  # noqa: E402

VBUCKETS = 1024
POOL = 8192
TICK = 0.05
HDR = node_ingest.HDR  # a request or response header



def _writer(host: str, port: int, password: str, rate: float, seconds: float, prefix: str,
            out) -> None:
    """The writer process: RATE new documents a second for SECONDS; puts (writes, seconds)."""
    s = node_ingest._session(host, port, password)
    pool = list(values(POOL, 256))
    per = max(1, round(rate * TICK))
    extras = struct.pack(">II", 0, 0)
    t0 = time.monotonic()
    n = tick = 0
    buf = bytearray()
    while time.monotonic() - t0 < seconds:
        frames = bytearray()
        for _ in range(per):
            key = b"%s%09d" % (prefix, n)
            val = pool[n % POOL]
            frames += HDR.pack(0x80, Opcode.SETQ, len(key), 8, 1, vbucket_of(key, VBUCKETS),
                               8 + len(key) + len(val), n, 0)
            frames += extras + key + val
            n += 1
        frames += HDR.pack(0x80, Opcode.NOOP, 0, 0, 0, 0, 0, 0xFFFFFFFF, 0)
        s.sendall(frames)
        while True:  # quiet SETs answer only when they fail; the NOOP closes the window
            data = s.recv(1 << 16)
            if not data:
                raise RuntimeError("the node closed the writer's connection")
            buf += data
            done = False
            while len(buf) >= 24:
                _m, op, _kl, _el, _dt, status, bl, _o, _c = HDR.unpack_from(buf)
                if len(buf) < 24 + bl:
                    break
                if op != Opcode.NOOP and status:
                    raise RuntimeError(f"a SET failed with status {status:#x}")
                del buf[:24 + bl]
                done = done or op == Opcode.NOOP
            if done:
                break
        tick += 1
        time.sleep(max(0.0, t0 + tick * TICK - time.monotonic()))
    out.put((n, time.monotonic() - t0))
    s.close()


def _node(where: Path) -> NodeProcess:
    return NodeProcess(where, vbuckets=VBUCKETS,
                       extra_args=("--eviction", "full", "--memory-quota", "64MiB"))


def run_rate(work: Path, rate: float, seconds: float, checkpoint: str, name: str) -> dict:
    """One run at `rate` on a node of its own (empty: the first checkpoint has nothing)."""
    with _node(work / f"node-{name}") as node:
        return _run_rate(node, work, rate, seconds, checkpoint, name)


def _run_rate(node: NodeProcess, work: Path, rate: float, seconds: float, checkpoint: str,
              name: str) -> dict:
    from dcptool.node.config import parse_duration

    every = parse_duration(checkpoint)
    archive = work / name
    proc, recs = cont._start(node, archive, checkpoint)
    cont._wait_first(proc, recs)
    tree = cont._tree(proc.pid)
    c0, r0 = cont._usage(tree)
    t0 = time.monotonic()
    q = mp.get_context("fork").Queue()
    w = mp.get_context("fork").Process(
        target=_writer, args=(node.host, node.port, node.password, rate, seconds,
                              name.encode() + b"::", q))
    w.start()
    writes, wsecs = q.get()
    w.join()
    c1, r1 = cont._usage(cont._tree(proc.pid))
    wall = time.monotonic() - t0
    # the checkpoint after the writer stopped commits its last writes
    time.sleep(every + 1)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(600)
    cps = [r for r in recs if r.get("event") == "checkpoint"]
    # the writes' checkpoints: from the second on (the first is the full backup of what
    # was there before); start = end - duration
    spans = [(cont._epoch(r["time"]) - r["seconds"], cont._epoch(r["time"]), r) for r in cps]
    lags = [(e - spans[i - 1][0], r) for i, (_s, e, r) in enumerate(spans) if i >= 1]
    worst, worst_rec = max(lags, key=lambda x: x[0]) if lags else (None, None)
    a = Archive.open(archive)
    held = sum(b.manifest["totals"]["mutations"] for b in a.chain()) - cps[0]["items"]
    durations = [r["seconds"] for r in cps[1:]] or [0.0]
    return {
        "rate": rate, "seconds": round(wall, 1), "writes": writes,
        "writer_rate": round(writes / wsecs), "writer_kept_rate": writes / wsecs >= 0.97 * rate,
        "held_in_archive": held, "exit": rc, "checkpoints": len(cps),
        "checkpoint_seconds_median": round(statistics.median(durations), 2),
        "checkpoint_seconds_max": round(max(durations), 2),
        "worst_lag_seconds": None if worst is None else round(worst, 2),
        "worst_lag_over_interval": None if worst is None else round(worst / every, 2),
        "items_behind_at_worst": None if worst_rec is None else
        worst_rec["lag"][node.bucket]["items"],
        "backup_cpu_share_of_one_core": round((c1 - c0) / wall, 3),
        "backup_rss_start_mb": round(r0 / 2**20, 1), "backup_rss_end_mb": round(r1 / 2**20, 1),
        "kept_up": (worst is not None and worst < 2 * every and writes / wsecs >= 0.97 * rate
                    and held == writes and rc == 0),
        "command": "python -m dcptool " + proc.argv_text,  # type: ignore[attr-defined]
        # each checkpoint: seconds after the writer began when it ended, its duration, the
        # items it committed and the items behind at its end; the retries, if any
        "timeline": [[round(e - (time.time() - (time.monotonic() - t0)), 1), r["seconds"],
                      r["items"], r["lag"][node.bucket]["items"]] for _s, e, r in spans],
        "retries": [r for r in recs if r.get("event") == "retry"],
    }


def _line(r: dict) -> str:
    return (f"rate {r['rate']:>7,.0f}/s for {r['seconds']:>5.0f} s: writer {r['writer_rate']:,}/s, "
            f"{r['writes']:,} writes, {r['held_in_archive']:,} in the archive; "
            f"{r['checkpoints']} checkpoints of {r['checkpoint_seconds_median']} s (max "
            f"{r['checkpoint_seconds_max']}); worst lag {r['worst_lag_seconds']} s "
            f"({r['worst_lag_over_interval']}x the interval); backup CPU "
            f"{100 * r['backup_cpu_share_of_one_core']:.0f}% of a core, RSS "
            f"{r['backup_rss_start_mb']} -> {r['backup_rss_end_mb']} MiB: "
            f"{'kept up' if r['kept_up'] else 'fell behind'}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="2000,4000,8000,16000,32000")
    ap.add_argument("--probe-seconds", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=600.0, help="the long run (0: none)")
    ap.add_argument("--checkpoint", default="10s")
    ap.add_argument("--json", dest="json_file")
    a = ap.parse_args(argv)
    out: dict = {"command": "python -m benchmarks.continuous_sustain " + " ".join(
        argv if argv is not None else sys.argv[1:]), "checkpoint": a.checkpoint,
        "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "probes": [], "long": None}
    with tempfile.TemporaryDirectory(prefix="dcp-sustain-") as d:
        work = Path(d)
        with _node(work / "node-ingest") as node:
            ing = node_ingest.run(node.host, node.port, node.password, 100_000, 256, VBUCKETS,
                                  4, 512, b"ingest-")
        out["node_ingest_4"] = ing
        print(f"node ingest, 4 connections: {ing['sets_per_s']:,} sets/s", flush=True)
        best = None
        for i, rate in enumerate(float(x) for x in a.rates.split(",")):
            r = run_rate(work, rate, a.probe_seconds, a.checkpoint, f"probe{i}")
            out["probes"].append(r)
            print("probe " + _line(r), flush=True)
            if not r["kept_up"]:
                break
            best = rate
        if best is not None and a.seconds > 0:
            r = run_rate(work, best, a.seconds, a.checkpoint, "long")
            r["rate_over_node_ingest"] = round(r["writer_rate"] / ing["sets_per_s"], 3)
            out["long"] = r
            print("long  " + _line(r) + f"; {r['rate_over_node_ingest']} of the node's "
                  "ingest rate", flush=True)
    out["loadavg_end"] = os.getloadavg()
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
