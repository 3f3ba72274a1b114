"""Cold `dcptool backup` commands of two (or more) dcptool trees, alternating (issue 20).

    python -m benchmarks.cold_backup_ab [--rounds 8] [-n 200000] [-s 256] [--vbuckets 1024]
                                        NAME=TREE[:FAST] ... [--json FILE]

Each NAME=TREE is a checkout of dcptool (e.g. `git worktree add /tmp/base main`); its
commands run with PYTHONPATH=TREE and DCPTOOL_ENGINE=off (each starts its own local Spark),
as new processes, from exec to exit, like benchmarks/engine_backup's cold commands. FAST, a
JSON object, switches the command line's start-up shortcuts (`runtime._fast`) for that
variant, e.g. `nodaemon=.:{"daemon": false}`. The variants alternate round by round, so the
machine's other load hits them alike; reported are each one's median, its ratio to the first
variant's, and how many rounds it was faster than the first in (paired).

One reference node with N documents of S bytes (benchmarks/engine_backup's product
documents) serves every command; each backup is a full one into a new archive.
"""
from __future__ import annotations

import argparse
import json
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
sys.path.insert(0, str(REPO))

from benchmarks.backup_restore import report, set_documents  # noqa: E402
from benchmarks.engine_backup import docs  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402

_WITH_FAST = """
import json, sys
from dcptool.pipeline import runtime
runtime._fast.update(json.loads(sys.argv[1]))
from dcptool.cli.app import main
main(sys.argv[2:])
"""


def parse_variant(text: str) -> tuple[str, str, dict | None]:
    name, _, rest = text.partition("=")
    tree, _, fast = rest.partition(":")
    if not name or not tree:
        raise SystemExit(f"bad variant {text!r}: NAME=TREE[:FAST]")
    return name, str(Path(tree).resolve()), json.loads(fast) if fast else None


def run(variants: list[tuple[str, str, dict | None]], rounds: int = 8, n: int = 200_000,
        size: int = 256, vbuckets: int = 1024) -> dict:
    work = Path(tempfile.mkdtemp(prefix="dcptool-bench-cold-ab-"))
    password = secrets.token_urlsafe(10)
    walls: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    res: dict = {"n": n, "value_size": size, "vbuckets": vbuckets, "rounds": rounds,
                 "variants": {name: {"tree": tree, "fast": fast} for name, tree, fast in variants},
                 "load_average_before": os.getloadavg()[0]}
    try:
        with LocalNode(work / "node", password=password, vbuckets=vbuckets) as node:
            set_documents(ConnOptions(node.host, node.port, "Administrator", password),
                          docs(n, size), vbuckets)
            for _ in range(rounds):
                for name, tree, fast in variants:
                    env = dict(os.environ, PYTHONPATH=tree, DCPTOOL_PASSWORD=password,
                               DCPTOOL_ENGINE="off")
                    env.pop("DCPTOOL_SPARK_MASTER", None)
                    archive = work / f"arch-{name}"
                    args = ["backup", str(archive), "-c", f"couchbase://{node.host}:{node.port}",
                            "--json", "--no-watermark"]
                    head = ["-c", _WITH_FAST, json.dumps(fast)] if fast else ["-m", "dcptool"]
                    t = time.perf_counter()
                    p = subprocess.run([sys.executable, *head, *args], env=env, cwd=tree,
                                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
                    wall = time.perf_counter() - t
                    if p.returncode != 0:
                        raise RuntimeError(f"{name}: exit {p.returncode}: {p.stderr.strip()}")
                    walls[name].append(wall)
                    shutil.rmtree(archive, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    first = variants[0][0]
    base = statistics.median(walls[first])
    for name, xs in walls.items():
        med = statistics.median(xs)
        res[name] = {"runs_s": [round(x, 2) for x in xs], "median_s": round(med, 3),
                     "ratio": round(med / base, 3),
                     "faster_rounds": sum(1 for a, b in zip(walls[first], xs) if b < a)}
    res["load_average_after"] = os.getloadavg()[0]
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="+", metavar="NAME=TREE[:FAST]")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("-s", type=int, default=256)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run([parse_variant(v) for v in a.variants], a.rounds, a.n, a.s, a.vbuckets)
    report(res, a.json_out)
    return res


if __name__ == "__main__":
    main()
