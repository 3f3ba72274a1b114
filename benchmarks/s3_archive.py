"""Backup and restore with the archive on S3 against the archive on a local disk, same run.

    python -m benchmarks.s3_archive [-n 200000] [-s 256] [--vbuckets 1024] [--rounds 3]
                                    [--json FILE]

Loads N product-catalogue documents of S bytes (the documents of benchmarks/engine_backup.py:
they compress like real JSON, zstd -3 ratio about 5) into a reference node, starts an S3
server on 127.0.0.1 (SeaweedFS, as the tests run it: tests/s3util.py) and a `dcptool engine`
(so both sides skip Spark's start-up and the figures compare the archive's storage), then
per round, in alternating order:

* `dcptool backup DIR` and `dcptool backup s3://BUCKET/PREFIX` (full, into a new archive);
* `dcptool restore` of each into a new node.

Each figure is a whole command's wall time (a new process each, start to exit). Reported:
the rounds, the medians, and s3/local for backup and restore.
"""
from __future__ import annotations

import argparse
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from benchmarks.backup_restore import report, set_documents  # noqa: E402
from benchmarks.engine_backup import _med, cli, docs  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402
from s3util import S3Server  # noqa: E402


def run(n: int = 200_000, size: int = 256, vbuckets: int = 1024, rounds: int = 3) -> dict:
    work = Path(tempfile.mkdtemp(prefix="dcptool-bench-s3-"))
    password = secrets.token_urlsafe(10)
    res: dict = {"n": n, "value_size": size, "vbuckets": vbuckets, "rounds": rounds}
    server = S3Server(work / "s3").start()
    env = server.env(PYTHONPATH=str(REPO), DCPTOOL_PASSWORD=password,
                     DCPTOOL_ENGINE_DIR=str(work / "engine"))
    env.pop("DCPTOOL_SPARK_MASTER", None)
    times: dict[str, list[float]] = {k: [] for k in
                                     ("backup_local", "backup_s3", "restore_local", "restore_s3")}
    try:
        bucket = server.new_bucket()
        with LocalNode(work / "node", password=password, vbuckets=vbuckets) as node:
            opts = ConnOptions(node.host, node.port, "Administrator", password)
            set_documents(opts, docs(n, size), vbuckets)
            cli(["engine", "start", "--json"], env)
            src = ["-c", f"couchbase://{node.host}:{node.port}", "--json", "--no-watermark"]
            for i in range(rounds):
                targets = [("local", str(work / f"local-{i}")), ("s3", f"s3://{bucket}/a-{i}")]
                if i % 2:
                    targets.reverse()
                for kind, where in targets:
                    wall, out = cli(["backup", where, *src], env)
                    assert out.get("mutations") == n, out
                    times[f"backup_{kind}"].append(wall)
                    if kind == "s3":  # what the backup is made of, as objects
                        listed = server.client().list_objects_v2(
                            Bucket=bucket, Prefix=f"a-{i}/backups/{out['backup_id']}/")
                        names = [o["Key"].rsplit("/", 1)[1] for o in listed["Contents"]]
                        res["s3_objects_per_backup"] = len(names)
                        res["s3_packs_per_backup"] = sum(x.startswith("pack-") for x in names)
                for kind, where in targets:
                    with LocalNode(work / f"dst-{kind}-{i}", password=password,
                                   vbuckets=vbuckets) as dst:
                        wall, out = cli(["restore", where, "-c",
                                         f"couchbase://{dst.host}:{dst.port}", "--json"], env)
                        times[f"restore_{kind}"].append(wall)
                    shutil.rmtree(work / f"dst-{kind}-{i}", ignore_errors=True)
            cli(["engine", "stop", "--json"], env)
    finally:
        subprocess.run([sys.executable, "-m", "dcptool", "engine", "stop", "--now"], env=env,
                       capture_output=True)
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    for k, v in times.items():
        res[f"{k}_s"] = [round(x, 2) for x in v]
        res[f"{k}_median_s"] = _med(v)
    res["backup_s3_vs_local"] = round(_med(times["backup_s3"]) / _med(times["backup_local"]), 3)
    res["restore_s3_vs_local"] = round(_med(times["restore_s3"]) / _med(times["restore_local"]), 3)
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("-s", type=int, default=256)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run(a.n, a.s, a.vbuckets, a.rounds)
    report(res, a.json_out)
    return res


if __name__ == "__main__":
    main()
