"""Where the test suite's CPU goes: run pytest and count the CPU of every process it starts,
by kind (Spark driver JVMs, Python Spark daemons and workers, nodes and commands forked by
the tests' zygotes, fresh `python -m dcptool` processes, the xdist workers themselves...).

    python -m benchmarks.suite_cpu [--json FILE] [-- PYTEST ARGS...]

Every process whose environment carries the run's marker (DCPTOOL_SUITE_CPU=<token>, which
the tests' processes inherit) or the checkout on its PYTHONPATH is counted; daemons (a
`dcptool engine`, its JVM) included, which `time pytest` misses once they leave its process
tree. /proc is read twice a second: a process that lives less than that is counted from
its first sample (so the short ones are undercounted), the figures are a floor. The CPU
total over the two cores is the wall time the suite cannot go below however it is
scheduled.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HZ = os.sysconf("SC_CLK_TCK")


def kind(cmdline: bytes) -> str:
    c = cmdline.replace(b"\0", b" ").decode(errors="replace")
    first = c.split(" ", 1)[0]
    if first.endswith("/java") or first == "java":
        if "deploy.master" in c or "deploy.worker" in c:
            return "Spark standalone daemons (JVM)"
        if "CoarseGrainedExecutor" in c:
            return "Spark executors (JVM)"
        return "Spark drivers (JVM)"
    if "weed" in first:
        return "S3 server (weed)"
    if "sparkdaemon" in c or "pyspark.daemon" in c or "pyspark/worker" in c \
            or "pyspark.sql.worker" in c or "python_streaming" in c:
        return "Spark Python daemons and workers"
    if "exec(eval(sys.stdin" in c:
        return "xdist workers (test code in-process)"
    if "zygote.serve" in c:
        return "forked by the zygotes (nodes, commands)"
    if "-m dcptool" in c:
        rest = c.split("-m dcptool", 1)[1].split()
        words = [w for w in rest if not w.startswith("-")]
        return "fresh python -m dcptool " + (words[0] if words else "")
    if "-m pytest" in c:
        return "pytest controller"
    return "other: " + os.path.basename(first)


class Sampler(threading.Thread):
    def __init__(self, markers: list[bytes]):
        super().__init__(daemon=True)
        self.markers = markers
        self.seen: dict[tuple[int, str], list] = {}  # (pid, start time) -> [kind, cpu, module]
        self.skip: set[tuple[int, str]] = set()
        self.jvms: list[tuple[str, list]] = []  # (test, record) of every Spark driver JVM
        self.stop = threading.Event()

    def sample(self) -> None:
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ident = (int(d), st[19])
            if ident in self.skip:
                continue
            cpu = (int(st[11]) + int(st[12])) / HZ
            rec = self.seen.get(ident)
            if rec is None:
                try:
                    with open(f"/proc/{d}/environ", "rb") as f:
                        env = f.read()
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        cmd = f.read()
                except OSError:
                    continue
                if not any(m in env for m in self.markers):
                    self.skip.add(ident)
                    continue
                self.seen[ident] = rec = [kind(cmd), cpu, test_module(env)]
                if rec[0] == "Spark drivers (JVM)":
                    self.jvms.append((current_test(env), rec))
            rec[1] = cpu
            if rec[0].startswith("forked by the zygotes"):
                try:  # a forked child that exec'd something else since
                    with open(f"/proc/{d}/cmdline", "rb") as f:
                        k = kind(f.read())
                    if not k.startswith(("forked", "other")):
                        rec[0] = k
                except OSError:
                    pass

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.5)

    def table(self) -> tuple[Counter, Counter]:
        cpu, n = Counter(), Counter()
        for k, c, _ in self.seen.values():
            cpu[k] += c
            n[k] += 1
        return cpu, n

    def by_module(self) -> dict[str, Counter]:
        """CPU seconds of the processes a test started, by the test's module and kind (the
        module is the one in PYTEST_CURRENT_TEST when the process was started; processes
        started outside a test, such as session fixtures' daemons, fall under "-")."""
        out: dict[str, Counter] = {}
        for k, c, m in self.seen.values():
            out.setdefault(m, Counter())[k] += c
        return out


def test_module(env: bytes) -> str:
    return current_test(env).split("::", 1)[0]


def current_test(env: bytes) -> str:
    """The test (pytest's PYTEST_CURRENT_TEST, without its phase) in a process's environment
    when it started, or "-"."""
    for item in env.split(b"\0"):
        if item.startswith(b"PYTEST_CURRENT_TEST="):
            return item.split(b"=", 1)[1].decode(errors="replace").rsplit(" ", 1)[0]
    return "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--by-module", type=int, default=0, metavar="N",
                    help="also print the N modules whose tests' processes took most CPU")
    ap.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    a = ap.parse_args(argv)
    token = secrets.token_hex(8)
    env = dict(os.environ, DCPTOOL_SUITE_CPU=token)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    sampler = Sampler([f"DCPTOOL_SUITE_CPU={token}".encode(),
                       f"PYTHONPATH={REPO}".encode()])
    sampler.start()
    t0 = time.monotonic()
    rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *a.pytest_args], cwd=REPO, env=env)
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    cpu, n = sampler.table()
    total = sum(cpu.values())
    cores = os.cpu_count() or 1
    print(f"\nwall {wall:.0f} s, CPU counted {total:.0f} s (a floor), "
          f"CPU / {cores} cores = {total / cores:.0f} s = {total / cores / wall:.2f} of the wall")
    for k, c in cpu.most_common():
        print(f"{c:8.1f} s {c / total:6.1%} {n[k]:6d} processes  {k}")
    mods = sampler.by_module()
    if a.by_module:
        print("\nCPU of the processes each module's tests started (xdist workers excluded):")
        ranked = sorted(mods.items(), key=lambda kv: -sum(
            c for k, c in kv[1].items() if not k.startswith("xdist")))
        for m, kinds in ranked[:a.by_module]:
            sub = {k: c for k, c in kinds.items() if not k.startswith("xdist")}
            print(f"{sum(sub.values()):8.1f} s  {m}: " + ", ".join(
                f"{k} {c:.1f}" for k, c in sorted(sub.items(), key=lambda x: -x[1])))
    if a.by_module:
        per_test: dict[str, list[float]] = {}
        for test, rec in sampler.jvms:
            per_test.setdefault(test, []).append(rec[1])
        print(f"\nthe tests that started Spark driver JVMs ({len(sampler.jvms)} JVMs):")
        for test, cpus in sorted(per_test.items(), key=lambda kv: -sum(kv[1])):
            print(f"{sum(cpus):8.1f} s {len(cpus):3d} JVMs  {test}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "by_module": {m: {k: round(c, 1) for k, c in kinds.items()}
                          for m, kinds in mods.items()},
            "wall_seconds": round(wall, 1), "cpu_seconds": round(total, 1), "cores": cores,
            "by_kind": {k: {"cpu_seconds": round(c, 1), "processes": n[k]}
                        for k, c in cpu.most_common()}}, indent=2))
    return rc


if __name__ == "__main__":
    sys.exit(main())
