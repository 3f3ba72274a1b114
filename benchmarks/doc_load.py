"""`dcptool doc load` into one node and into a three-node cluster (one replica), in one run.

    python benchmarks/doc_load.py [-n 200000] [--vbuckets 64] [--rounds 3] [--json out.json]
        [--baseline-tree DIR]

Starts four reference nodes (real `dcptool node start` processes in a temporary
directory): one alone, three made a cluster with `dcptool cluster create --replicas 1`.
Each round runs `dcptool doc load --count N --json` as a separate process once against
the node alone and once through one member of the cluster (alternating which goes
first), each with a fresh key prefix. The documents are doc load's own: small JSON
objects (id, name, kind, a timestamp; ~70 bytes) whose text compresses like real JSON.

Reported per target: documents/s of each round (from the command's own `seconds`, which
covers its connections, the cluster map and the writes; not the interpreter's start-up)
and the best, and the ratio of the cluster's best to the node alone's best. On the
cluster the nodes also replicate every write to a second member, all on the same
machine, so the ratio says as much about the machine's cores as about the client.
`--baseline-tree DIR` also runs the single-node load with the dcptool found in DIR (e.g.
an export of an older commit) for a before/after figure on one node.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from nodeprocutil import NodeProcess  # noqa: E402


def _load(node: NodeProcess, n: int, prefix: str, tree: Path = REPO) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), DCPTOOL_CLUSTER=f"{node.host}:{node.port}",
               DCPTOOL_USERNAME=node.username, DCPTOOL_PASSWORD=node.password, NO_COLOR="1")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "dcptool", "doc", "load", "--count", str(n),
                        "--prefix", prefix, "--json", "--timeout", "60"], capture_output=True,
                       text=True, env=env, cwd=tree, timeout=1800)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"doc load failed: {r.stderr.strip()}")
    out = json.loads(r.stdout)
    return {"seconds": out["seconds"], "wall": round(wall, 3),
            "docs_per_s": round(n / out["seconds"], 1), "members": out.get("members", 1),
            "resent": out.get("resent", 0)}


def run(n: int, vbuckets: int, rounds: int, *, baseline_tree: str | None = None,
        work_dir: str | None = None) -> dict:
    base = Path(work_dir or tempfile.mkdtemp(prefix="dcptool-docload-"))
    nodes = {name: NodeProcess(base / name, vbuckets=vbuckets) for name in ("one", "a", "b", "c")}
    runs: dict[str, list[dict]] = {"1 node": [], "3-node cluster": []}
    if baseline_tree:
        runs["1 node, baseline"] = []
    try:
        for node in nodes.values():
            node.start()
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        env = dict(os.environ, PYTHONPATH=str(REPO), DCPTOOL_USERNAME=a.username,
                   DCPTOOL_PASSWORD=a.password)
        r = subprocess.run([sys.executable, "-m", "dcptool", "cluster", "create",
                            *(x for m in (a, b, c) for x in ("-c", f"{m.host}:{m.port}")),
                            "--replicas", "1"], capture_output=True, text=True, env=env,
                           cwd=REPO, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"cluster create failed: {r.stderr.strip()}")
        for i in range(rounds):
            order = [("1 node", nodes["one"]), ("3-node cluster", b)]
            if i % 2:
                order.reverse()
            for label, node in order:
                runs[label].append(_load(node, n, f"r{i}-{label[0]}::"))
            if baseline_tree:
                runs["1 node, baseline"].append(
                    _load(nodes["one"], n, f"r{i}-base::", Path(baseline_tree)))
    finally:
        for node in nodes.values():
            if node.running():
                node.stop()
        if work_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    best = {label: max(x["docs_per_s"] for x in rs) for label, rs in runs.items()}
    ratios = {label: round(v / best["1 node"], 2) for label, v in best.items()}
    return {"n": n, "vbuckets": vbuckets, "rounds": rounds, "cpus": os.cpu_count(),
            "runs": runs, "best_docs_per_s": best, "ratio_to_1_node": ratios}


def table(res: dict) -> str:
    lines = [f"doc load: {res['n']} documents, {res['vbuckets']} vbuckets, {res['rounds']} "
             f"rounds, {res['cpus']} CPUs",
             f"{'target':<20} {'best docs/s':>12} {'ratio':>6}  rounds (docs/s)"]
    for label, rs in res["runs"].items():
        lines.append(f"{label:<20} {res['best_docs_per_s'][label]:>12,.0f} "
                     f"{res['ratio_to_1_node'][label]:>6.2f}  "
                     + ", ".join(f"{x['docs_per_s']:,.0f}" for x in rs))
    if "command" in res:
        lines.append(f"command: {res['command']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--vbuckets", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-tree", default=None,
                    help="also load one node with the dcptool in this directory")
    ap.add_argument("--dir", default=None, help="work here and keep it (default: a temp dir)")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run(a.n, a.vbuckets, a.rounds, baseline_tree=a.baseline_tree, work_dir=a.dir)
    res["command"] = "python benchmarks/doc_load.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(table(res))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
