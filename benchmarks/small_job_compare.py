"""Two trees of dcptool side by side on the small job of benchmarks/small_job.sh.

    python benchmarks/small_job_compare.py OLD_TREE NEW_TREE [--rounds 8] [--port 12430]

One reference node (1,024 vbuckets, 20,000 documents); for each tree a `dcptool engine` of
its own (started from that tree) and an archive of its own with a full backup. Then, in
each round, the two trees alternating: `dcptool --version`, a 1,000-change incremental
(the same 1,000 new documents for both archives) and a no-change incremental; after the
rounds, each archive's chain is brought to ~20 backups and a no-change and a 1,000-change
incremental are timed on it. Every command runs as `python -m dcptool` with PYTHONPATH
set to its tree (exec to exit, wall seconds and the CPU seconds of the process). Prints
the medians (and the range) per tree.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(tree: str, env: dict[str, str], *args: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "dcptool", *args], cwd=tree,
                       env={**env, "PYTHONPATH": tree}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{tree}: dcptool {' '.join(args)} failed: {r.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--port", type=int, default=12430)
    a = ap.parse_args()
    trees = {"old": str(Path(a.old).resolve()), "new": str(Path(a.new).resolve())}
    d = Path(tempfile.mkdtemp(prefix="dcptool-compare-"))
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base.update(DCPTOOL_PASSWORD="password", DCPTOOL_USERNAME="Administrator",
                DCPTOOL_MANIFEST_CACHE=str(d / "manifest-cache"))
    c = f"127.0.0.1:{a.port}"
    envs = {k: {**base, "DCPTOOL_ENGINE_DIR": str(d / f"eng-{k}")} for k in trees}
    node = subprocess.Popen([sys.executable, "-m", "dcptool", "node", "start", "--data",
                             str(d / "node"), "--port", str(a.port), "--vbuckets", "1024"],
                            cwd=trees["new"], env={**base, "PYTHONPATH": trees["new"]},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: dict[str, dict[str, list[tuple[float, float]]]] = {k: {} for k in trees}

    def timed(what: str, k: str, *args: str) -> None:
        results[k].setdefault(what, []).append(run(trees[k], envs[k], *args))

    try:
        time.sleep(3)
        run(trees["new"], envs["new"], "doc", "load", "--count", "20000", "-c", c, "-q")
        for k in trees:
            run(trees[k], envs[k], "engine", "start", "-q")
            run(trees[k], envs[k], "backup", "-c", c, "-b", "default", str(d / f"arch-{k}"), "-q")
        for r in range(a.rounds):
            for k in trees:
                timed("dcptool --version", k, "--version")
            run(trees["new"], envs["new"], "doc", "load", "--count", "1000", "--prefix",
                f"r{r}::", "-c", c, "-q")
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for k in order:
                timed("1k-change incremental", k, "backup", "-c", c, "-b", "default",
                      str(d / f"arch-{k}"), "-q")
            for k in order:
                timed("no-change incremental", k, "backup", "-c", c, "-b", "default",
                      str(d / f"arch-{k}"), "-q")
        # the chains to ~20 backups: 1 full + 2 per round so far
        for i in range(max(0, 19 - (1 + 2 * a.rounds))):
            run(trees["new"], envs["new"], "doc", "load", "--count", "50", "--prefix",
                f"c{i}::", "-c", c, "-q")
            for k in trees:
                run(trees[k], envs[k], "backup", "-c", c, "-b", "default",
                    str(d / f"arch-{k}"), "-q")
        for r in range(3):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for k in order:
                timed("chain of ~20: no change", k, "backup", "-c", c, "-b", "default",
                      str(d / f"arch-{k}"), "-q")
            run(trees["new"], envs["new"], "doc", "load", "--count", "1000", "--prefix",
                f"z{r}::", "-c", c, "-q")
            for k in order:
                timed("chain of ~20: 1k changes", k, "backup", "-c", c, "-b", "default",
                      str(d / f"arch-{k}"), "-q")
    finally:
        for k in trees:
            subprocess.run([sys.executable, "-m", "dcptool", "engine", "stop", "-q"],
                           cwd=trees[k], env={**envs[k], "PYTHONPATH": trees[k]})
        node.terminate()
        node.wait(timeout=30)
    print(f"{'':28} {'old wall':>18} {'new wall':>18} {'old CPU':>8} {'new CPU':>8}")
    for what in results["old"]:
        row = []
        for k in trees:
            walls = [w for w, _ in results[k][what]]
            row.append(f"{statistics.median(walls):5.2f} ({min(walls):.2f}-{max(walls):.2f})")
        cpus = [statistics.median([u for _, u in results[k][what]]) for k in trees]
        print(f"{what:28} {row[0]:>18} {row[1]:>18} {cpus[0]:8.2f} {cpus[1]:8.2f}")
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
