"""`dcptool backup --continuous`: its RPO under a steady writer, and what it costs idle.

    python benchmarks/continuous.py [--rate 50] [--seconds 40] [--intervals 10s,2s]
                                    [--idle-seconds 120] [--busy-seconds 0] [--vbuckets 64]
                                    [--json FILE]

A reference node; for each checkpoint interval a continuous backup (`python -m dcptool
backup ... --continuous --checkpoint I --json`, a process of its own with its own local
Spark, no rotation) runs while a writer sets RATE new documents a second (a new key each,
so no later write hides one) for SECONDS, logging when each SET was acknowledged. The
run is then stopped with SIGINT (a last checkpoint). The RPO of a write is the time from
its acknowledgement to the commit of the first backup that holds it (the backup
manifest's `finished` time): reported as median, p99 and max, and as a ratio of the
interval.

Idle: a continuous backup (checkpoint 10 s) of a node nobody writes to, for IDLE-SECONDS
after its first checkpoint; the CPU time of its whole process tree (the driver, Spark's
JVM, the Python workers) over that window as a share of one core, and the tree's RSS at
the start and the end of the window (flat: the same within noise).

Busy (--busy-seconds): the same figures under the writer, checkpoint 2 s and a rotation
every 5 minutes, from the end of the first minute on: what a long run's memory does while
every checkpoint runs a Spark job.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from nodeprocutil import NodeProcess  # noqa: E402

from dcptool.archive import Archive  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.protocol import Set, vbucket_of  # noqa: E402
from dcptool.protocol.constants import Status  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _opts(node: NodeProcess) -> ConnOptions:
    return ConnOptions(node.host, node.port, node.username, node.password, node.bucket)


def _start(node: NodeProcess, archive: Path, checkpoint: str,
           rotate: str = "366d") -> tuple[subprocess.Popen, list]:
    env = dict(os.environ, DCPTOOL_PASSWORD=node.password, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "dcptool", "backup", "-c", f"{node.host}:{node.port}",
            "-b", node.bucket, str(archive), "--continuous", "--checkpoint", checkpoint,
            "--rotate", rotate, "--json", "--no-watermark"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    recs: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            if line.strip():
                recs.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    proc.argv_text = " ".join(shlex.quote(a) for a in argv[3:])  # type: ignore[attr-defined]
    return proc, recs


def _wait_first(proc: subprocess.Popen, recs: list, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not any(r.get("event") == "checkpoint" for r in recs):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the continuous backup made no checkpoint")
        time.sleep(0.1)


def _write(node: NodeProcess, rate: float, seconds: float, vbuckets: int,
           prefix: str) -> dict[str, float]:
    """A new key every 1/rate s for `seconds`; {key: time acknowledged}."""
    acked: dict[str, float] = {}
    with _opts(node).connect() as conn:
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < seconds:
            key = f"{prefix}{i:08d}".encode()
            f = Set(key=key, value=b'{"i": %d}' % i, vbucket=vbucket_of(key, vbuckets),
                    datatype=1).to_frame()
            f.opaque = i
            conn.send_bytes(f.encode())
            resp = conn.recv_frame(timeout=30)
            assert resp.status == Status.SUCCESS, resp.status
            acked[key.decode()] = time.time()
            i += 1
            nxt = t0 + i / rate
            time.sleep(max(0.0, nxt - time.monotonic()))
    return acked


def _committed(archive: Path) -> dict[str, float]:
    """{key: commit time of the first backup that holds it}."""
    a = Archive.open(archive)
    out: dict[str, float] = {}
    for b in a.chain():
        done = _epoch(b.manifest["finished"])
        for e in b.manifest["vbuckets"]:
            for rec in b.items(e["vbucket"]):
                k = bytes(rec[7] if rec[0] == 3 else rec[4])
                k = k[1:].decode(errors="replace")  # the default collection's id, 0x00
                out.setdefault(k, done)
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def rpo(node: NodeProcess, work: Path, interval: str, rate: float, seconds: float,
        vbuckets: int) -> dict:
    from dcptool.node.config import parse_duration

    archive = work / f"rpo-{interval}"
    proc, recs = _start(node, archive, interval)
    _wait_first(proc, recs)
    acked = _write(node, rate, seconds, vbuckets, f"rpo-{interval}::")
    time.sleep(parse_duration(interval) + 1)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(180)
    have = _committed(archive)
    lost = [k for k in acked if k not in have]
    lags = [have[k] - t for k, t in acked.items() if k in have]
    every = parse_duration(interval)
    cps = [r for r in recs if r.get("event") == "checkpoint"]
    return {"interval": interval, "interval_seconds": every, "writes": len(acked),
            "lost": len(lost), "exit": rc, "checkpoints": len(cps),
            "checkpoint_seconds_median": round(statistics.median(r["seconds"] for r in cps), 3),
            "rpo_median": round(statistics.median(lags), 3), "rpo_p99": round(_pct(lags, 0.99), 3),
            "rpo_max": round(max(lags), 3),
            "p99_over_interval": round(_pct(lags, 0.99) / every, 2),
            "command": "python -m dcptool " + proc.argv_text}  # type: ignore[attr-defined]


def _tree(sid: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            # the session of the command, and the JVM it starts in a process group of its
            # own (its parent is the driver)
            if int(fields[3]) == sid or int(fields[1]) == sid:
                pids.append(int(d))
    # children of those (the JVM's Python workers)
    more = True
    while more:
        more = False
        for d in os.listdir("/proc"):
            if d.isdigit() and int(d) not in pids:
                try:
                    stat = open(f"/proc/{d}/stat").read()
                except OSError:
                    continue
                if int(stat[stat.rindex(")") + 2:].split()[1]) in pids:
                    pids.append(int(d))
                    more = True
    return pids


def _usage(pids: list[int]) -> tuple[float, int]:
    """(CPU seconds, RSS bytes) of the processes."""
    cpu = 0.0
    rss = 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read()
        except OSError:
            continue
        fields = f[f.rindex(")") + 2:].split()
        cpu += (int(fields[11]) + int(fields[12])) / CLK
        rss += int(fields[21]) * PAGE
    return cpu, rss


def idle(node: NodeProcess, work: Path, seconds: float) -> dict:
    archive = work / "idle"
    proc, recs = _start(node, archive, "10s")
    _wait_first(proc, recs)
    time.sleep(5)  # the first checkpoint's work done
    pids = _tree(proc.pid)
    c0, r0 = _usage(pids)
    t0 = time.monotonic()
    samples = [r0]
    while time.monotonic() - t0 < seconds:
        time.sleep(min(10.0, seconds))
        samples.append(_usage(_tree(proc.pid))[1])
    c1, r1 = _usage(_tree(proc.pid))
    wall = time.monotonic() - t0
    proc.send_signal(signal.SIGINT)
    proc.wait(180)
    cps = [r for r in recs if r.get("event") == "checkpoint"]
    return {"seconds": round(wall, 1), "processes": len(pids),
            "cpu_share_of_one_core": round((c1 - c0) / wall, 4),
            "rss_start_mb": round(r0 / 2**20, 1), "rss_end_mb": round(r1 / 2**20, 1),
            "rss_max_mb": round(max(samples) / 2**20, 1),
            "rss_end_over_start": round(r1 / r0, 3),
            # the tree's RSS every ~5 minutes (every 30th sample of 10 s)
            "rss_every_5min_mb": [round(r / 2**20, 1) for r in samples[::30]],
            "checkpoints": len(cps),
            "idle_checkpoints": sum(1 for r in cps if r["backup_id"] is None),
            "command": "python -m dcptool " + proc.argv_text}  # type: ignore[attr-defined]


def busy(node: NodeProcess, work: Path, seconds: float, rate: float, vbuckets: int) -> dict:
    """RSS of the process tree under a steady writer (checkpoint 2 s, rotation every 5
    minutes): at the first minute's end and at the end, and the CPU share."""
    archive = work / "busy"
    proc, recs = _start(node, archive, "2s", rotate="5m")
    _wait_first(proc, recs)
    stop = threading.Event()
    done: dict = {}

    def writer() -> None:
        n = 0
        while not stop.is_set():
            done.update(_write(node, rate, 5.0, vbuckets, f"busy{n}::"))
            n += 1

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    time.sleep(min(60.0, seconds / 4))
    c0, r0 = _usage(_tree(proc.pid))
    t0 = time.monotonic()
    rss = [r0]
    while time.monotonic() - t0 < seconds:
        time.sleep(min(30.0, seconds))
        rss.append(_usage(_tree(proc.pid))[1])
    c1, r1 = _usage(_tree(proc.pid))
    wall = time.monotonic() - t0
    stop.set()
    t.join(30)
    proc.send_signal(signal.SIGINT)
    proc.wait(300)
    cps = [r for r in recs if r.get("event") == "checkpoint"]
    return {"seconds": round(wall, 1), "writes": len(done), "checkpoints": len(cps),
            "rotations": sum(1 for r in cps if r.get("rotated")),
            "cpu_share_of_one_core": round((c1 - c0) / wall, 4),
            "rss_start_mb": round(r0 / 2**20, 1), "rss_end_mb": round(r1 / 2**20, 1),
            "rss_max_mb": round(max(rss) / 2**20, 1), "rss_end_over_start": round(r1 / r0, 3),
            "command": "python -m dcptool " + proc.argv_text}  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=50.0, help="writes per second")
    ap.add_argument("--seconds", type=float, default=40.0, help="writing time per interval")
    ap.add_argument("--intervals", default="10s,2s",
                    help="checkpoint intervals of the RPO runs (empty: none)")
    ap.add_argument("--idle-seconds", type=float, default=120.0)
    ap.add_argument("--busy-seconds", type=float, default=0.0,
                    help="also: RSS and CPU under the writer this long (checkpoint 2 s)")
    ap.add_argument("--vbuckets", type=int, default=64)
    ap.add_argument("--json", dest="json_file")
    a = ap.parse_args(argv)
    out: dict = {"rate": a.rate, "vbuckets": a.vbuckets, "rpo": [], "idle": None, "busy": None}
    with tempfile.TemporaryDirectory(prefix="dcp-cont-") as d:
        work = Path(d)
        with NodeProcess(work / "node", vbuckets=a.vbuckets) as node:
            for interval in filter(None, a.intervals.split(",")):
                r = rpo(node, work, interval, a.rate, a.seconds, a.vbuckets)
                out["rpo"].append(r)
                print(f"checkpoint {interval}: {r['writes']} writes, {r['lost']} lost; RPO "
                      f"median {r['rpo_median']} s, p99 {r['rpo_p99']} s (p99/interval "
                      f"{r['p99_over_interval']}), max {r['rpo_max']} s; a checkpoint took "
                      f"{r['checkpoint_seconds_median']} s (median)\n  {r['command']}",
                      flush=True)
            if a.idle_seconds > 0:
                r = idle(node, work, a.idle_seconds)
                out["idle"] = r
                print(f"idle {r['seconds']} s: CPU {100 * r['cpu_share_of_one_core']:.2f}% of "
                      f"one core ({r['processes']} processes); RSS {r['rss_start_mb']} -> "
                      f"{r['rss_end_mb']} MiB (end/start {r['rss_end_over_start']}, max "
                      f"{r['rss_max_mb']}); {r['idle_checkpoints']}/{r['checkpoints']} "
                      f"checkpoints idle\n  {r['command']}", flush=True)
            if a.busy_seconds > 0:
                r = busy(node, work, a.busy_seconds, a.rate, a.vbuckets)
                out["busy"] = r
                print(f"busy {r['seconds']} s ({r['writes']} writes, {r['checkpoints']} "
                      f"checkpoints, {r['rotations']} rotations): CPU "
                      f"{100 * r['cpu_share_of_one_core']:.1f}% of one core; RSS "
                      f"{r['rss_start_mb']} -> {r['rss_end_mb']} MiB (end/start "
                      f"{r['rss_end_over_start']}, max {r['rss_max_mb']})\n  {r['command']}",
                      flush=True)
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
