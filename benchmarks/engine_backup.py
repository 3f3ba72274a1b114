"""`dcptool backup` as a user runs it, cold and on a running `dcptool engine`.

    python -m benchmarks.engine_backup [-n 200000] [-s 256] [--vbuckets 1024] [--changes 1000]
                                       [--rounds 3] [--interleave] [--json FILE]

Loads N documents of S bytes into a reference node (1024 vbuckets), then times whole commands
(`python -m dcptool backup ... --json`, a new process each, from start to exit):

* cold: DCPTOOL_ENGINE=off, every command starts its own Spark (the baseline);
* engine: `dcptool engine start` first, then the same full backup into a fresh archive;
* incremental: CHANGES documents changed, then `dcptool backup` into an archive that holds a
  full backup, on the engine (and cold, for the ratio);
* no change: then `dcptool backup` again on the engine with nothing changed (the floor: the
  node's seqnos read, no Spark job).

By default all cold commands run first, then the engine starts; with --interleave the engine
starts first and cold and engine commands alternate (on a machine with other load).

Reported: each round's wall time, the median, the engine/cold ratio, and Spark's share of the
cold command: (cold - engine) / cold, i.e. the part of the cold command that a running engine
removes (JVM, SparkContext, Python workers); and the share that the command itself reports as
the driver's wait for Spark (`spark_startup_seconds` / wall).

The documents are a product catalogue's JSON (names, brands, categories, descriptions from a
vocabulary, prices, stock, ratings, EAN codes), compact, with the description cut or filled with
text to make exactly S bytes: they compress like real documents (the zstd -3 ratio of the
concatenated values is reported: about 5.1), not like repeated padding.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
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

import zstandard  # noqa: E402

from benchmarks.backup_restore import report, set_documents  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402

_WORDS = ("the of and a to in is you that it he was for on are as with his they at be this "
          "have from or one had by word but not what all were we when your can said there use an "
          "each which she do how their if will up other about out many then them these so some "
          "her would make like him into time has look two more write go see number no way could "
          "people my than first water been call who oil its now find long down day did get come "
          "made may part soft light durable classic premium compact wireless portable steel "
          "cotton leather organic natural fresh modern vintage ergonomic waterproof").split()
_CUM = list(itertools.accumulate(1 / (k + 1) for k in range(len(_WORDS))))
_BRANDS = ("Acme Globex Initech Umbrella Stark Wayne Wonka Tyrell Cyberdyne Soylent Hooli "
           "Vandelay Oceanic Massive Dynamic").split()
_CATS = ["kitchen/cookware", "kitchen/cutlery", "garden/tools", "outdoor/camping", "home/lighting",
         "home/textiles", "office/furniture", "sports/running", "toys/puzzles", "audio/headphones"]
_COLOURS = "black white red blue green grey silver navy olive sand".split()


def _text(r: random.Random, n: int) -> str:
    return " ".join(r.choices(_WORDS, cum_weights=_CUM, k=n))


def _words(r: random.Random, n: int) -> str:
    """Words of the vocabulary, any equally often (a product text's rarer words)."""
    return " ".join(r.choices(_WORDS, k=n))


def make_value(i: int, size: int, r: random.Random) -> bytes:
    """Product `i` of a catalogue as compact JSON of exactly `size` bytes."""
    doc = {"type": "product", "sku": f"SKU-{i:08d}", "brand": r.choice(_BRANDS),
           "name": _text(r, r.randint(2, 4)).title(), "category": r.choice(_CATS),
           "price": round(r.uniform(2, 500), 2), "currency": "EUR",
           "stock": r.randint(0, 500), "colour": r.choice(_COLOURS),
           "rating": round(r.uniform(1, 5), 1), "reviews": r.randint(0, 2000),
           "ean": f"{r.randrange(10 ** 13):013d}",
           "description": _words(r, 40)}
    raw = json.dumps(doc, separators=(",", ":"))
    while len(raw) > size and doc["description"]:  # shorten the description word by word
        doc["description"] = doc["description"].rpartition(" ")[0]
        raw = json.dumps(doc, separators=(",", ":"))
    if len(raw) > size:
        raise ValueError(f"a product document needs more than {size} bytes")
    # fill the last bytes with text, not padding: the start of one more word, then letters
    gap = size - len(raw)
    tail = (" " + _words(r, 3))[:gap] if gap else ""
    tail += "".join(r.choices("etaoinshrdlu", k=gap - len(tail)))
    doc["description"] += tail
    raw = json.dumps(doc, separators=(",", ":"))
    return raw.encode()


def docs(n: int, size: int, seed: int = 42, prefix: str = "product"):
    r = random.Random(seed)
    for i in range(n):
        yield f"{prefix}::{i:09d}".encode(), make_value(i, size, r)


def cli(args: list[str], env: dict[str, str]) -> tuple[float, dict]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "dcptool", *args], env=env,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"dcptool {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return wall, (json.loads(p.stdout) if p.stdout.strip().startswith("{") else {})


def _med(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def run(n: int = 200_000, size: int = 256, vbuckets: int = 1024, changes: int = 1000,
        rounds: int = 3, interleave: bool = False) -> dict:
    work = Path(tempfile.mkdtemp(prefix="dcptool-bench-engine-"))
    password = secrets.token_urlsafe(10)
    res: dict = {"n": n, "value_size": size, "vbuckets": vbuckets, "changes": changes,
                 "rounds": rounds, "interleave": interleave,
                 "load_average_before": os.getloadavg()[0]}
    env = dict(os.environ)
    env.update(PYTHONPATH=str(REPO), DCPTOOL_PASSWORD=password,
               DCPTOOL_ENGINE_DIR=str(work / "engine"))
    env.pop("DCPTOOL_SPARK_MASTER", None)
    cold_env = {**env, "DCPTOOL_ENGINE": "off"}
    try:
        with LocalNode(work / "node", password=password, vbuckets=vbuckets) as node:
            opts = ConnOptions(node.host, node.port, "Administrator", password)
            values = [v for _, v in docs(min(n, 20000), size)]
            raw = b"".join(values)
            res["zstd3_ratio"] = round(len(raw) / len(zstandard.ZstdCompressor(level=3)
                                                      .compress(raw)), 2)
            t = time.perf_counter()
            set_documents(opts, docs(n, size), vbuckets)
            res["load_s"] = round(time.perf_counter() - t, 1)
            conn = ["-c", f"couchbase://{node.host}:{node.port}", "--json", "--no-watermark"]

            def backup(archive: Path, e: dict) -> tuple[float, dict]:
                return cli(["backup", str(archive), *conn], e)

            def change(round_no: int) -> None:
                r = random.Random(1000 + round_no)
                keys = r.sample(range(n), changes)
                set_documents(opts, ((f"product::{i:09d}".encode(), make_value(i, size, r))
                                     for i in keys), vbuckets)

            cold, cold_wait, inc_cold = [], [], []
            warm, warm_wait, inc_warm = [], [], []
            none_warm: list[float] = []  # incrementals of no change at all, on the engine

            def cold_full(i: int) -> None:
                wall, out = backup(work / f"cold-{i}", cold_env)
                cold.append(wall)
                cold_wait.append(out.get("spark_startup_seconds", 0.0))
                res["items"] = out.get("mutations")

            def cold_inc(i: int) -> None:
                change(i)
                wall, out = backup(work / "cold-0", cold_env)
                assert out.get("type") == "incremental", out
                inc_cold.append(wall)
                res["incremental_items"] = out.get("mutations")

            def warm_full(i: int) -> None:
                wall, out = backup(work / f"warm-{i}", env)
                warm.append(wall)
                warm_wait.append(out.get("spark_startup_seconds", 0.0))

            def warm_inc(i: int) -> None:
                change(rounds + i)
                wall, out = backup(work / "warm-0", env)
                assert out.get("type") == "incremental", out
                inc_warm.append(wall)

            def warm_none(i: int) -> None:
                wall, out = backup(work / "warm-0", env)
                assert out.get("type") == "incremental" and not out.get("mutations"), out
                none_warm.append(wall)

            def start_engine() -> None:
                t = time.perf_counter()
                cli(["engine", "start", "--json"], env)
                res["engine_start_s"] = round(time.perf_counter() - t, 2)

            if interleave:
                # the engine runs (idle) during the cold commands too; a cold and an engine
                # command alternate, so the machine's other load hits both alike
                start_engine()
                for i in range(rounds):
                    cold_full(i)
                    warm_full(i)
                for i in range(rounds):
                    cold_inc(i)
                    warm_inc(i)
            else:
                # cold full backups (the baseline), then the incremental cold; then the engine
                for i in range(rounds):
                    cold_full(i)
                for i in range(rounds):
                    cold_inc(i)
                start_engine()
                for i in range(rounds):
                    warm_full(i)
                for i in range(rounds):
                    warm_inc(i)
            for i in range(rounds):
                warm_none(i)
            cli(["engine", "stop", "--json"], env)
    finally:
        subprocess.run([sys.executable, "-m", "dcptool", "engine", "stop", "--now"], env=env,
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    res.update({
        "cold_full_s": [round(x, 2) for x in cold], "cold_full_median_s": _med(cold),
        "engine_full_s": [round(x, 2) for x in warm], "engine_full_median_s": _med(warm),
        "cold_incremental_s": [round(x, 2) for x in inc_cold],
        "cold_incremental_median_s": _med(inc_cold),
        "engine_incremental_s": [round(x, 2) for x in inc_warm],
        "engine_incremental_median_s": _med(inc_warm),
        "engine_no_change_s": [round(x, 2) for x in none_warm],
        "engine_no_change_median_s": _med(none_warm),
        "engine_vs_cold_full": round(_med(warm) / _med(cold), 3),
        "engine_vs_cold_incremental": round(_med(inc_warm) / _med(inc_cold), 3),
        "spark_share_cold": round((_med(cold) - _med(warm)) / _med(cold), 3),
        "spark_wait_share_cold": round(statistics.median(
            w / c for w, c in zip(cold_wait, cold)), 3),
        "spark_wait_engine_s": _med(warm_wait),
        "load_average_after": os.getloadavg()[0],
    })
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("-s", type=int, default=256)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--changes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interleave", action="store_true",
                    help="start the engine first and alternate cold and engine commands")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run(a.n, a.s, a.vbuckets, a.changes, a.rounds, a.interleave)
    report(res, a.json_out)
    return res


if __name__ == "__main__":
    main()
