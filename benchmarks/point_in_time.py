"""Restore to a time against a restore of the newest backup: same archive, same run.

    python benchmarks/point_in_time.py [-n 200000] [-s 256] [--rounds 8] [--vbuckets 64]
                                       [--repeat 2] [--json out.json]

One local node is loaded with N JSON documents of ~S bytes (`benchmarks/docs.py`) and
backed up in full; then, ROUNDS times, a tenth of the documents is updated and an
incremental backup taken, so the chain has ROUNDS + 1 backups and many snapshot
boundaries. TIME is the middle of the rounds (after round ROUNDS/2 was backed up).

Measured, in alternating order, REPEAT times each, with local Spark started once in this
process:

- `restore --dry-run` of the newest backup and `restore --dry-run --to-time TIME`: the
  reading and resolving alone (the archive's check, the chain's records decoded, the cut
  and the resolution), what the time cut costs over a plain restore;
- `restore` of the newest backup and `restore --to-time TIME` into fresh nodes: the whole
  restore, writes included;

and the ratio of each to-time figure to the newest one, and the cuts' worst and median
lag. The figures belong to this machine and this run only.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import docs  # noqa: E402
from benchmarks.backup_restore import set_documents  # noqa: E402

from dcptool.archive.pointintime import iso  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402
from dcptool.pipeline.backup import run_backup  # noqa: E402
from dcptool.pipeline.restore import run_restore  # noqa: E402
from dcptool.pipeline.runtime import get_spark  # noqa: E402

PASSWORD = "pit-bench-password"


def build(work: Path, n: int, size: int, rounds: int, vbuckets: int, spark) -> tuple[Path, int]:
    """The archive (a full backup and `rounds` incrementals) and TIME (ns)."""
    archive = work / "archive"
    rng = random.Random(7)
    values = list(docs.values(n, size))
    keys = [f"order::{i:09d}".encode() for i in range(n)]
    at = None
    with LocalNode(work / "src", password=PASSWORD, vbuckets=vbuckets) as node:
        opts = ConnOptions(node.host, node.port, "Administrator", PASSWORD)
        set_documents(opts, zip(keys, values), vbuckets)
        run_backup(opts, archive, spark=spark)
        for r in range(rounds):
            picked = rng.sample(range(n), max(1, n // 10))
            set_documents(opts, ((keys[i], values[(i + r + 1) % n]) for i in picked), vbuckets)
            run_backup(opts, archive, spark=spark)
            if r == rounds // 2 - 1:
                at = time.time_ns()
                time.sleep(0.05)
    return archive, at if at is not None else time.time_ns()


def timed_restore(archive: Path, dst: ConnOptions | None, spark, at: int | None) -> dict:
    t = time.perf_counter()
    r = run_restore(str(archive), dst, spark=spark, dry_run=dst is None, to_time=at).as_dict()
    wall = time.perf_counter() - t
    out = {"seconds": round(wall, 3), "items": sum(r["restored"].values()),
           "failed": sum(r["failed"].values())}
    if r["point_in_time"]:
        out["lag"] = r["point_in_time"]["lag"]
    return out


def run(n: int, size: int, rounds: int, vbuckets: int, repeat: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="dcptool-pit-bench-"))
    try:
        t = time.perf_counter()
        spark = get_spark("local[*]")
        res: dict = {"n": n, "value_size": size, "rounds": rounds, "vbuckets": vbuckets,
                     "spark_startup_s": round(time.perf_counter() - t, 2)}
        t = time.perf_counter()
        archive, at = build(work, n, size, rounds, vbuckets, spark)
        res["build_s"] = round(time.perf_counter() - t, 2)
        res["to_time"] = iso(at)
        runs: dict[str, list[dict]] = {"dry_newest": [], "dry_to_time": [], "newest": [],
                                       "to_time": []}
        for i in range(repeat):
            order = [("dry_newest", None), ("dry_to_time", at)]
            order += [("newest", None), ("to_time", at)]
            if i % 2:
                order = [order[1], order[0], order[3], order[2]]
            for name, when in order:
                if name.startswith("dry"):
                    runs[name].append(timed_restore(archive, None, spark, when))
                    continue
                ndir = work / f"dst-{name}-{i}"
                with LocalNode(ndir, password=PASSWORD, vbuckets=vbuckets) as dst:
                    opts = ConnOptions(dst.host, dst.port, "Administrator", PASSWORD)
                    runs[name].append(timed_restore(archive, opts, spark, when))
                shutil.rmtree(ndir, ignore_errors=True)
        for name, rs in runs.items():
            res[f"{name}_s"] = min(r["seconds"] for r in rs)
            res[f"{name}_items"] = rs[0]["items"]
        res["dry_ratio"] = round(res["dry_to_time_s"] / res["dry_newest_s"], 3)
        res["restore_ratio"] = round(res["to_time_s"] / res["newest_s"], 3)
        res["lag"] = runs["to_time"][0].get("lag")
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(res: dict, json_out: str | None) -> None:
    rows = [("documents", f"{res['n']:,} of ~{res['value_size']} B, {res['vbuckets']} vbuckets"),
            ("chain", f"1 full + {res['rounds']} incrementals (a tenth updated each)"),
            ("TIME", res["to_time"]),
            ("dry run, newest", f"{res['dry_newest_s']:.2f} s ({res['dry_newest_items']:,} items)"),
            ("dry run, --to-time", f"{res['dry_to_time_s']:.2f} s ({res['dry_to_time_items']:,} "
                                   f"items), x{res['dry_ratio']}"),
            ("restore, newest", f"{res['newest_s']:.2f} s ({res['newest_items']:,} items)"),
            ("restore, --to-time", f"{res['to_time_s']:.2f} s ({res['to_time_items']:,} items), "
                                   f"x{res['restore_ratio']}"),
            ("lag of the cuts", f"worst {res['lag']['worst_seconds']} s, median "
                                f"{res['lag']['median_seconds']} s, "
                                f"{res['lag']['exact_vbuckets']} exact" if res.get("lag")
                                else "-")]
    w = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"{a:<{w}}  {b}")
    if json_out:
        Path(json_out).write_text(json.dumps(res, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000, help="documents (default 200,000)")
    ap.add_argument("-s", type=int, default=256, help="average value bytes (default 256)")
    ap.add_argument("--rounds", type=int, default=8, help="incremental backups (default 8)")
    ap.add_argument("--vbuckets", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each restore (the best "
                                                          "counts; default 2)")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    report(run(args.n, args.s, args.rounds, args.vbuckets, args.repeat), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
