"""Backup items/s with collections: a default-collection-only bucket and a 100-collection one.

    python benchmarks/collections_backup.py [-n 200000] [--vbuckets 64] [--rounds 3] [--json F]
    python -m benchmarks run --only collections

Two reference nodes hold the same N JSON documents (built like the travel sample's, see
`benchmarks/docs.py`: ~0.9 KB on average, `zstd -3` takes them to ~0.24 of their
size): one all in the default collection, the other spread evenly over 100 collections
(10 scopes of 10, created over the node's REST port). The backup task's loop
(`dcptool.pipeline.backup.write_events` into archive writers, no Spark) then streams each
node from 0 to its high seqnos, the modes alternating in every round:

- `legacy`: the default-only node, the DCP connection without HELLO Collections: what a
  client that knows nothing of collections does, and what dcptool did before collections
  (the baseline);
- `default`: the same node with Collections negotiated, as `dcptool backup` runs now;
- `100-coll`: the 100-collection node, Collections negotiated (system events recorded too).

Reported per mode: items/s of each round, the best and the median, the node's CPU seconds,
and the ratio of the best to the best of `legacy` measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402
from dcptool.protocol import HEADER, vbucket_of  # noqa: E402
from dcptool.protocol.collections import doc_key  # noqa: E402
from dcptool.protocol.constants import Magic, Opcode  # noqa: E402
from benchmarks.backup_restore import SET_EXTRAS  # noqa: E402
from benchmarks.docs import values  # noqa: E402
from benchmarks.snappy_backup import DOC_SIZE  # noqa: E402
from benchmarks.snappy_backup import task_backup as snappy_task_backup  # noqa: E402

MODES = ("legacy", "default", "100-coll")
SCOPES = 10
PER_SCOPE = 10


def make_collections(opts: ConnOptions) -> list[int]:
    """10 scopes x 10 collections over the node's REST port; their collection ids."""
    from dcptool.client.rest import RestClient, rest_port_of
    from dcptool.client.topology import cluster_config

    with opts.connect() as conn:
        port = rest_port_of(cluster_config(conn))
    rest = RestClient.for_options(opts, port)
    for s in range(SCOPES):
        rest.create_scope(f"scope{s}")
        for c in range(PER_SCOPE):
            rest.create_collection(f"scope{s}", f"coll{c}")
    man = rest.manifest()
    return sorted(c for c in man.collection_ids() if c != 0)


def load(opts: ConnOptions, n: int, vbuckets: int, cids: list[int] | None,
         window: int = 5000) -> int:
    """SETQ `n` documents (JSON datatype), round-robin over `cids` (None: the default
    collection on a legacy connection); the bytes of their values."""
    raw = 0
    i = 0
    docs = values(n, DOC_SIZE)
    with opts.connect(collections=cids is not None) as conn:
        while i < n:
            buf = bytearray()
            for j, val in zip(range(i, min(n, i + window)), docs):
                key = f"doc::{j:09d}".encode()
                raw += len(val)
                wire_key = doc_key(cids[j % len(cids)], key) if cids else key
                buf += HEADER.pack(Magic.REQUEST, Opcode.SETQ, len(wire_key), 8, 1,
                                   vbucket_of(key, vbuckets), 8 + len(wire_key) + len(val),
                                   j, 0)
                buf += SET_EXTRAS.pack(0, 0) + wire_key + val
            i = min(n, i + window)
            buf += HEADER.pack(Magic.REQUEST, Opcode.NOOP, 0, 0, 0, 0, 0, 0xFFFFFFFF, 0)
            conn.send_bytes(buf)
            while True:
                f = conn.recv_frame(timeout=120)
                if f.opcode == Opcode.NOOP:
                    break
                if f.status:
                    raise RuntimeError(f"SETQ failed: status {f.status:#x}")
    return raw


def task_backup(opts: ConnOptions, scratch: Path, node_pid: int, collections: bool) -> dict:
    """The backup task's loop (`benchmarks/snappy_backup.py`'s), with or without Collections."""
    return snappy_task_backup(opts, scratch, node_pid, collections=collections,
                              name="bench-collections")


def _summary(rounds: list[dict]) -> dict:
    rates = [r["items_per_s"] for r in rounds]
    return {"items_per_s_rounds": [round(x) for x in rates],
            "best_items_per_s": round(max(rates)),
            "median_items_per_s": round(statistics.median(rates)),
            "node_cpu_s": round(statistics.median(r["node_cpu_s"] for r in rounds), 2),
            "items": rounds[-1]["items"], "system_events": rounds[-1]["system_events"],
            "archive_bytes": rounds[-1]["archive_bytes"]}


def run(n: int = 200_000, vbuckets: int = 64, rounds: int = 3,
        work_dir: str | None = None) -> dict:
    """Load both nodes, then alternate the modes (see the module's doc); the figures."""
    work = Path(work_dir or tempfile.mkdtemp(prefix="dcptool-bench-collections-"))
    password = secrets.token_urlsafe(10)
    res: dict = {"n": n, "vbuckets": vbuckets, "rounds": rounds,
                 "collections": SCOPES * PER_SCOPE, "loadavg_start": os.getloadavg()[0]}
    try:
        with LocalNode(work / "default", password=password, vbuckets=vbuckets) as plain, \
                LocalNode(work / "many", password=password, vbuckets=vbuckets) as many:
            o_plain = ConnOptions(plain.host, plain.port, "Administrator", password, timeout=60)
            o_many = ConnOptions(many.host, many.port, "Administrator", password, timeout=60)
            t = time.perf_counter()
            raw = load(o_plain, n, vbuckets, None)
            cids = make_collections(o_many)
            load(o_many, n, vbuckets, cids)
            res["load_seconds"] = round(time.perf_counter() - t, 2)
            res["mean_value_bytes"] = round(raw / n, 1)
            target = {"legacy": (o_plain, plain, False), "default": (o_plain, plain, True),
                      "100-coll": (o_many, many, True)}
            got: dict[str, list] = {m: [] for m in MODES}
            for m in MODES:  # warm-up: the first stream of each node reads from disk
                o, node, coll = target[m]
                task_backup(o, work / "warm", node.proc.pid, coll)
            for i in range(rounds):
                order = MODES if i % 2 == 0 else tuple(reversed(MODES))
                for m in order:
                    o, node, coll = target[m]
                    r = task_backup(o, work / "archive", node.proc.pid, coll)
                    got[m].append(r)
                    print(f"round {i + 1} {m:<9} {r['items_per_s']:>10,.0f} items/s",
                          file=sys.stderr, flush=True)
            out = {m: _summary(got[m]) for m in MODES}
            ref = out["legacy"]
            for m in MODES:
                out[m]["ratio_to_legacy"] = round(out[m]["best_items_per_s"]
                                                  / ref["best_items_per_s"], 3)
                out[m]["median_ratio_to_legacy"] = round(out[m]["median_items_per_s"]
                                                         / ref["median_items_per_s"], 3)
            res["task"] = out
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)
    res["loadavg_end"] = os.getloadavg()[0]
    return res


def table(res: dict) -> str:
    lines = [f"{'mode':<10} {'best items/s':>13} {'median':>10} {'ratio':>7}  note"]
    for m in MODES:
        r = res.get("task", {}).get(m)
        if not r:
            continue
        note = (f"rounds {r['items_per_s_rounds']}, node CPU {r['node_cpu_s']} s, "
                f"{r['items']:,} items, {r['system_events']} system events")
        lines.append(f"{m:<10} {r['best_items_per_s']:>13,} {r['median_items_per_s']:>10,} "
                     f"{r['ratio_to_legacy']:>7}  {note}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--vbuckets", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="work here and keep it (default: a temp dir)")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run(a.n, a.vbuckets, a.rounds, work_dir=a.dir)
    res["command"] = "python benchmarks/collections_backup.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(table(res))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
