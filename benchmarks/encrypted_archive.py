"""Backup and restore into an encrypted archive against a plain one, same run.

    python -m benchmarks.encrypted_archive [-n 200000] [-s 256] [--vbuckets 1024]
                                           [--rounds 3] [--json FILE]

Loads N product-catalogue documents of S bytes (the documents of benchmarks/engine_backup.py:
they compress like real JSON, zstd -3 ratio about 5) into a reference node and starts a
`dcptool engine` (so both sides skip Spark's start-up and the figures compare the archive
work), then per round, in alternating order:

* `dcptool backup DIR` (plain) and `dcptool backup DIR --encrypt` (full, into a new archive;
  the passphrase in DCPTOOL_ARCHIVE_PASSPHRASE);
* `dcptool restore` of each into a new node.

Each figure is a whole command's wall time (a new process each, start to exit; an encrypted
run includes one scrypt of its passphrase, ~0.5 s at N=2^17). Also measured, in this process: the
archive layer alone, writing and reading the same records into a plain and an encrypted
archive (no node, no Spark). Reported: the rounds, the medians, and encrypted/plain.
"""
from __future__ import annotations

import argparse
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
sys.path.insert(0, str(REPO / "tests"))

from benchmarks.backup_restore import report, set_documents  # noqa: E402
from benchmarks.engine_backup import cli, docs  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402


def _med(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def archive_layer(work: Path, n: int, size: int, vbuckets: int, rounds: int) -> dict:
    """Write n documents into a plain and an encrypted archive through the archive API
    and read them back (resolve every vbucket); seconds of each, alternating."""
    from dcptool.archive import Archive

    per_vb: dict[int, list] = {}
    for i, (k, v) in enumerate(docs(n, size)):
        per_vb.setdefault(i % vbuckets, []).append((k, v))
    t: dict[str, list[float]] = {k: [] for k in ("create_plain", "create_enc", "write_plain",
                                                 "write_enc", "read_plain", "read_enc")}
    for r in range(rounds):
        order = [("plain", None), ("enc", "bench passphrase")]
        if r % 2:
            order.reverse()
        for kind, pw in order:
            path = work / f"layer-{kind}-{r}"
            # (creating the encrypted archive runs scrypt once, ~0.5 s: reported apart)
            t0 = time.perf_counter()
            a = Archive.create(path, bucket="default", vbuckets=vbuckets, passphrase=pw)
            t[f"create_{kind}"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            bw = a.begin_backup("full")
            sums = []
            for vb, recs in per_vb.items():
                w = bw.vbucket(vb, {"uuid": 7, "seqno": 0, "snap_start": 0, "snap_end": 0},
                               [[7, 0]])
                w.write([(2, 1, len(recs), 2)] + [
                    (3, s, 1, 1_700_000_000_000_000_000 + s, 0, 0, 1, b"\x00" + k, v, None)
                    for s, (k, v) in enumerate(recs, 1)])
                e = len(recs)
                sums.append(w.close({"uuid": 7, "seqno": e, "snap_start": e, "snap_end": e}))
            bw.commit(sums)
            t[f"write_{kind}"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = sum(len(a.resolve_vbucket(vb)) for vb in per_vb)
            t[f"read_{kind}"].append(time.perf_counter() - t0)
            assert got == n, got
            shutil.rmtree(path)
    out = {}
    for k, v in t.items():
        out[f"layer_{k}_median_s"] = _med(v)
    out["layer_write_enc_vs_plain"] = round(_med(t["write_enc"]) / _med(t["write_plain"]), 3)
    out["layer_read_enc_vs_plain"] = round(_med(t["read_enc"]) / _med(t["read_plain"]), 3)
    return out


def run(n: int = 200_000, size: int = 256, vbuckets: int = 1024, rounds: int = 3,
        layer: bool = True) -> dict:
    import os

    work = Path(tempfile.mkdtemp(prefix="dcptool-bench-enc-"))
    password = secrets.token_urlsafe(10)
    res: dict = {"n": n, "value_size": size, "vbuckets": vbuckets, "rounds": rounds}
    env = dict(os.environ, PYTHONPATH=str(REPO), DCPTOOL_PASSWORD=password,
               DCPTOOL_ENGINE_DIR=str(work / "engine"),
               DCPTOOL_ARCHIVE_PASSPHRASE=secrets.token_urlsafe(16))
    env.pop("DCPTOOL_SPARK_MASTER", None)
    env.pop("DCPTOOL_ARCHIVE_PASSPHRASE_FILE", None)
    times: dict[str, list[float]] = {k: [] for k in
                                     ("backup_plain", "backup_enc", "restore_plain", "restore_enc")}
    sizes: dict[str, int] = {}
    try:
        with LocalNode(work / "node", password=password, vbuckets=vbuckets) as node:
            opts = ConnOptions(node.host, node.port, "Administrator", password)
            set_documents(opts, docs(n, size), vbuckets)
            cli(["engine", "start", "--json"], env)
            src = ["-c", f"couchbase://{node.host}:{node.port}", "--json", "--no-watermark"]
            for i in range(rounds):
                targets = [("plain", str(work / f"plain-{i}"), []),
                           ("enc", str(work / f"enc-{i}"), ["--encrypt"])]
                if i % 2:
                    targets.reverse()
                for kind, where, extra in targets:
                    wall, out = cli(["backup", where, *src, *extra], env)
                    assert out.get("mutations") == n, out
                    times[f"backup_{kind}"].append(wall)
                    sizes[kind] = out.get("size_on_disk", 0)
                for kind, where, _extra in targets:
                    with LocalNode(work / f"dst-{kind}-{i}", password=password,
                                   vbuckets=vbuckets) as dst:
                        wall, out = cli(["restore", where, "-c",
                                         f"couchbase://{dst.host}:{dst.port}", "--json"], env)
                        assert out["restored"]["mutation"] == n, out
                        times[f"restore_{kind}"].append(wall)
                    shutil.rmtree(work / f"dst-{kind}-{i}", ignore_errors=True)
            cli(["engine", "stop", "--json"], env)
        if layer:
            res.update(archive_layer(work, n, size, min(vbuckets, 64), rounds))
    finally:
        subprocess.run([sys.executable, "-m", "dcptool", "engine", "stop", "--now"], env=env,
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    for k, v in times.items():
        res[f"{k}_s"] = [round(x, 2) for x in v]
        res[f"{k}_median_s"] = _med(v)
    res["size_on_disk_plain"] = sizes.get("plain")
    res["size_on_disk_enc"] = sizes.get("enc")
    res["backup_enc_vs_plain"] = round(_med(times["backup_enc"]) / _med(times["backup_plain"]), 3)
    res["restore_enc_vs_plain"] = round(_med(times["restore_enc"]) /
                                        _med(times["restore_plain"]), 3)
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("-s", type=int, default=256)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-layer", action="store_true", help="Skip the archive-layer figures.")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run(a.n, a.s, a.vbuckets, a.rounds, layer=not a.no_layer)
    report(res, a.json_out)
    return res


if __name__ == "__main__":
    main()
