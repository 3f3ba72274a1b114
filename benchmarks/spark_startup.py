"""The command line's cold Spark start-up, with and without each of its shortcuts (issue 20).

    python benchmarks/spark_startup.py [--repeat N] [--docs N] [--skip-backup] [--json FILE]

Prints one JSON object (and writes it to FILE with --json). Every sample is a fresh Python
process (a cold JVM), the variants alternate round by round (the machine's other load hits
them alike), and each figure is the median over N rounds.

1. "startup": `get_spark()` as the command line runs it (`set_jvm_output("quiet")`), then a
   first job that imports the backup task's modules in its Python workers, per variant:
   "pyspark" (none of the shortcuts: what PySpark does), "jvm_flags" (C1 only, serial GC),
   "cds" (the class-data archive; the script writes it first), "jvm_flags+cds", that with
   the recorded java command ("+launch": no spark-submit scripts or launcher JVM; the first
   run records it) or with the Python daemon prepared while the JVM starts ("+daemon"), and
   "all". Seconds: "session" (get_spark) and "first_job".
2. "backup": `dcptool backup` of DOCS documents (default 200,000, ~256 bytes) from a local
   node, as a command, per variant (those of 1). Seconds: "wall" (the command, from exec to
   exit) and, measured in the same round, "warm" (the same backup in a process whose Spark
   already runs and has run a backup: the backup's own work). Spark's share of the cold
   command is (wall - warm) / wall.

The ratios are against "pyspark" of the same run.
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

_OFF = {"jvm_flags": False, "cds": False, "launch": False, "daemon": False}
VARIANTS = {
    "pyspark": dict(_OFF),
    "jvm_flags": {**_OFF, "jvm_flags": True},
    "cds": {**_OFF, "cds": True},
    "jvm_flags+cds": {**_OFF, "jvm_flags": True, "cds": True},
    "+launch": {**_OFF, "jvm_flags": True, "cds": True, "launch": True},
    "+daemon": {**_OFF, "jvm_flags": True, "cds": True, "daemon": True},
    "all": {"jvm_flags": True, "cds": True, "launch": True, "daemon": True},
}
#: (--variants picks some of them; the first is the ratios' baseline)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.pop("DCPTOOL_SPARK_MASTER", None)
    return env


# -- child processes ---------------------------------------------------------------------------

def _child_startup(fast: dict) -> None:
    from dcptool.pipeline import runtime

    runtime.set_jvm_output("quiet")
    runtime._fast.update(fast)
    t0 = time.monotonic()
    spark = runtime.get_spark()
    t1 = time.monotonic()

    def task(x):
        import dcptool.pipeline.backup  # noqa: F401
        return x

    n = 2 * runtime.default_parallelism(spark)
    spark.sparkContext.parallelize(range(n), n).map(task).collect()
    t2 = time.monotonic()
    print(json.dumps({"session": t1 - t0, "first_job": t2 - t1}))


def _child_command(fast: dict, argv: list[str]) -> None:
    from dcptool.pipeline import runtime

    runtime._fast.update(fast)
    from dcptool.cli.app import main

    main(argv)


def _child_warm(host: str, port: int, password: str, archive: str) -> None:
    from dcptool.client.options import ConnOptions
    from dcptool.pipeline.backup import run_backup
    from dcptool.pipeline.runtime import get_spark

    spark = get_spark()
    spark.sparkContext.parallelize(range(4), 4).map(lambda x: x).collect()
    opts = ConnOptions(host, port, "Administrator", password)
    run_backup(opts, archive + "-first", spark=spark)  # the workers have run a backup task
    t = time.monotonic()
    run_backup(opts, archive, spark=spark)
    print(json.dumps({"warm": time.monotonic() - t}))


def _run_child(args: list[str], env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         env=env or _env(), timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{args[:2]}: exit {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the measurements --------------------------------------------------------------------------

def _prime_cds() -> None:
    """Run once with the archive option so the archive exists (the JVM writes it at its exit;
    the next run adopts it)."""
    from dcptool.pipeline import runtime

    for flags in ([], runtime.JVM_FLAGS):
        fast = {**_OFF, "jvm_flags": bool(flags), "cds": True}
        key = runtime._cds_key(flags)
        final = runtime._cache_dir() / "spark-cds" / f"{key}.jsa"
        for _ in range(3):
            if final.is_file():
                break
            _run_child(["--child-startup", json.dumps(fast)])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                    runtime._complete_archive(p) for p in final.parent.glob(f"{key}.*.tmp")):
                time.sleep(0.5)
            runtime._cds_options(flags)  # adopts it


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def measure_startup(repeat: int, only: list[str] | None = None) -> dict:
    _prime_cds()
    variants = {v: VARIANTS[v] for v in only} if only else VARIANTS
    samples: dict[str, dict[str, list[float]]] = {
        v: {"session": [], "first_job": []} for v in variants}
    for fast in variants.values():  # a round not counted: it records the java commands
        _run_child(["--child-startup", json.dumps(fast)])
    for _ in range(repeat):
        for name, fast in variants.items():
            r = _run_child(["--child-startup", json.dumps(fast)])
            for k in ("session", "first_job"):
                samples[name][k].append(r[k])
    out = {}
    base = None
    for name, s in samples.items():
        med = {k: _median(v) for k, v in s.items()}
        med["total"] = round(med["session"] + med["first_job"], 3)
        base = base or med
        out[name] = {"median": med,
                     "ratio": {k: round(med[k] / base[k], 3) for k in med},
                     "runs": {k: [round(x, 3) for x in v] for k, v in s.items()}}
    return out


def measure_backup(repeat: int, docs: int, only: list[str] | None = None) -> dict:
    sys.path.insert(0, str(REPO))
    from benchmarks.backup_restore import load
    from dcptool.client.options import ConnOptions
    from dcptool.node.launcher import LocalNode

    work = Path(tempfile.mkdtemp(prefix="dcptool-spark-startup-"))
    password = secrets.token_urlsafe(10)
    variants = {v: VARIANTS[v] for v in only} if only else VARIANTS
    samples: dict[str, dict[str, list[float]]] = {
        v: {"wall": [], "warm": [], "share": []} for v in variants}
    try:
        with LocalNode(work / "node", password=password, vbuckets=1024) as node:
            load(ConnOptions(node.host, node.port, "Administrator", password), docs, 256, 1024)
            env = _env()
            env["DCPTOOL_PASSWORD"] = password
            i = 0
            for _ in range(repeat):
                for name, fast in variants.items():
                    i += 1
                    warm = _run_child(["--child-warm", node.host, str(node.port), password,
                                       str(work / f"warm{i}")])["warm"]
                    archive = work / f"cold{i}"
                    argv = ["backup", "-c", node.address, "-u", "Administrator", str(archive),
                            "-q", "--no-progress"]
                    t = time.monotonic()
                    subprocess.run([sys.executable, __file__, "--child-command",
                                    json.dumps(fast), *argv],
                                   env=env, check=True, timeout=600, stdout=subprocess.DEVNULL)
                    wall = time.monotonic() - t
                    samples[name]["wall"].append(wall)
                    samples[name]["warm"].append(warm)
                    samples[name]["share"].append((wall - warm) / wall)
                    shutil.rmtree(archive, ignore_errors=True)
                    shutil.rmtree(work / f"warm{i}", ignore_errors=True)
                    shutil.rmtree(work / f"warm{i}-first", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {}
    base = None
    for name, s in samples.items():
        med = {k: _median(v) for k, v in s.items()}
        base = base or med
        out[name] = {"median": med, "wall_ratio": round(med["wall"] / base["wall"], 3),
                     "runs": {k: [round(x, 3) for x in v] for k, v in s.items()}}
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("--child-"):
        sys.path.insert(0, str(REPO))
        what, rest = sys.argv[1], sys.argv[2:]
        if what == "--child-startup":
            _child_startup(json.loads(rest[0]))
        elif what == "--child-command":
            _child_command(json.loads(rest[0]), rest[1:])
        elif what == "--child-warm":
            _child_warm(rest[0], int(rest[1]), rest[2], rest[3])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--skip-backup", action="store_true")
    p.add_argument("--skip-startup", action="store_true")
    p.add_argument("--variants", help="the variants, comma-separated (default all)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    res: dict = {"repeat": args.repeat, "cpus": os.cpu_count(),
                 "load_average_before": os.getloadavg()[0]}
    if not args.skip_startup:
        res["startup"] = measure_startup(args.repeat, args.variants and args.variants.split(","))
    if not args.skip_backup:
        res["backup"] = {"docs": args.docs, **measure_backup(args.repeat, args.docs,
                                                          args.variants and args.variants.split(","))}
    res["load_average_after"] = os.getloadavg()[0]
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
