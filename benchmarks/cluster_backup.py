"""One `dcptool backup --all-buckets` of a node's three buckets against three single-bucket
backups of the same buckets, as a user runs them (cold commands, each its own Spark).

    python -m benchmarks.cluster_backup [-n 200000] [-s 256] [--vbuckets 1024] [--rounds 2]
                                        [--json FILE]

A reference node gets two more buckets (`dcptool bucket create`) beside its first, and N
documents of ~S bytes in each (benchmarks/docs.py: JSON that compresses like real
documents). Each round then times, from start to exit, in alternating order (so the
machine's other load hits both alike):

* cluster: `dcptool backup ARCHIVE --all-buckets --json` into a new archive;
* singles: `dcptool backup -b NAME ARCHIVE-NAME --json` for each bucket, one after the other,
  into new archives: their walls summed.

Reported: the medians, cluster / singles (below 1: the cluster run is faster; it saves the
Spark start-ups of the second and third bucket), and the items each backed up.
"""
from __future__ import annotations

import argparse
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

from benchmarks import docs  # noqa: E402
from benchmarks.backup_restore import report, set_documents  # noqa: E402
from benchmarks.engine_backup import cli  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402

BUCKETS = ("default", "travel", "beer")


def run(n: int = 200_000, size: int = 256, vbuckets: int = 1024, rounds: int = 2) -> dict:
    work = Path(tempfile.mkdtemp(prefix="dcptool-bench-cluster-"))
    password = secrets.token_urlsafe(10)
    env = dict(os.environ)
    env.update(PYTHONPATH=str(REPO), DCPTOOL_PASSWORD=password, DCPTOOL_ENGINE="off",
               DCPTOOL_ENGINE_DIR=str(work / "engine"))
    env.pop("DCPTOOL_SPARK_MASTER", None)
    res: dict = {"n_per_bucket": n, "value_size": size, "vbuckets": vbuckets,
                 "buckets": len(BUCKETS), "rounds": rounds,
                 "load_average_before": os.getloadavg()[0]}
    try:
        with LocalNode(work / "node", password=password, vbuckets=vbuckets) as node:
            where = f"{node.host}:{node.port}"
            for name in BUCKETS[1:]:
                subprocess.run([sys.executable, "-m", "dcptool", "bucket", "create", name,
                                "-c", where, "--num-vbuckets", str(vbuckets)],
                               env=env, check=True, capture_output=True)
            t = time.perf_counter()
            for b in BUCKETS:
                opts = ConnOptions(node.host, node.port, "Administrator", password, bucket=b)
                set_documents(opts, ((f"{b}::{i:09d}".encode(), v)
                                     for i, v in enumerate(docs.values(n, size))), vbuckets)
            res["load_s"] = round(time.perf_counter() - t, 1)
            conn = ["-c", where, "--json", "--no-watermark", "--no-progress"]
            cluster, singles = [], []
            for i in range(rounds):
                def one_cluster() -> None:
                    wall, out = cli(["backup", str(work / f"cluster-{i}"), "--all-buckets",
                                     "--disable-users", *conn], env)
                    cluster.append(wall)
                    res["cluster_items"] = out["totals"]["mutations"]

                def three_singles() -> None:
                    total, items = 0.0, 0
                    for b in BUCKETS:
                        wall, out = cli(["backup", str(work / f"single-{i}-{b}"), "-b", b,
                                         *conn], env)
                        total += wall
                        items += out["mutations"]
                    singles.append(total)
                    res["singles_items"] = items

                for step in ((one_cluster, three_singles) if i % 2 == 0
                             else (three_singles, one_cluster)):
                    step()
            res["cluster_s"] = [round(x, 2) for x in cluster]
            res["singles_s"] = [round(x, 2) for x in singles]
            res["cluster_median_s"] = round(statistics.median(cluster), 2)
            res["singles_median_s"] = round(statistics.median(singles), 2)
            res["cluster_over_singles"] = round(res["cluster_median_s"]
                                                / res["singles_median_s"], 3)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("-s", type=int, default=256)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    report(run(args.n, args.s, args.vbuckets, args.rounds), args.json_out)


if __name__ == "__main__":
    main()
