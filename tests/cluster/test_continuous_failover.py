"""`dcptool backup --continuous` through a failover of a 3-node cluster.

Nodes A, B, C; vbucket 0 active on A (replicas B, C), C's replica held at seqno 900. The
continuous backup runs through B and checkpoints A's documents up to 1000; A dies, C is
promoted for vbucket 0 (its history branches at 900). The continuous backup retries while
the map is in flux, then records vbucket 0's rollback as a batch backup does, and goes on
from C: the archive restores to exactly C's history. Restored to a time before the
failover, vbucket 0 is A's branch as the node held it then (the rollback was learnt later).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from clusterutil import (
    addr, load_each_active, make_cluster, seed004_first_900, seed004_last_100, start_nodes,
    stop_nodes, vbucket_stream,
)
from docutil import load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.archive.pointintime import parse_time
from dcptool.client.topology import set_map
from dcptool.pipeline.restore import run_restore

VBS = 4
VBMAP = [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]]
#: the documents of A's branch of vbucket 0 (the one the failover loses past 900)
BRANCH_A = lambda i: {"n": i, "branch": "A"}  # noqa: E731


@pytest.fixture
def nodes(tmp_path):
    nodes = start_nodes(tmp_path, ["a", "b", "c"], vbuckets=VBS)
    yield nodes
    stop_nodes(nodes)


def _start(node: NodeProcess, archive) -> tuple[subprocess.Popen, list, list]:
    env = dict(os.environ, DCPTOOL_PASSWORD=node.password)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcptool", "backup", "-c", f"{node.host}:{node.port}", "-b",
         "default", str(archive), "--continuous", "--checkpoint", "1s", "--json",
         "--master", "local[2]", "--partitions", "2"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    recs: list[dict] = []
    err: list[str] = []

    def read(stream, out):
        for line in stream:
            (recs.append(json.loads(line)) if out and line.strip() else
             err.append(line.rstrip("\n")) if not out else None)

    for s, o in ((proc.stdout, True), (proc.stderr, False)):
        threading.Thread(target=read, args=(s, o), daemon=True).start()
    return proc, recs, err


def _wait(pred, proc, err, timeout=120.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert proc.poll() is None, "\n".join(err)
        assert time.monotonic() < deadline, f"{what}: {err}"
        time.sleep(0.1)


def _backed_up_to(archive, vb: int) -> int:
    try:
        a = Archive.open(archive)
        return int(a.end_positions()[vb].seqno) if a.latest_id() else 0
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def test_failover_while_running_records_the_rollback(nodes, spark, tmp_path):
    a, b, c = (nodes[n] for n in "abc")
    make_cluster([a, b, c], VBMAP, replicas=2)
    others = load_each_active({1: b, 2: c, 3: a}, VBS)
    keys0 = seed004_first_900(a, b, c, VBS, doc=BRANCH_A)
    archive = tmp_path / "archive"
    proc, recs, err = _start(b, archive)
    try:
        # the first checkpoint (a full backup) ends at 900, the common history
        _wait(lambda: _backed_up_to(archive, 0) >= 900, proc, err, what="the first 900")
        seed004_last_100(a, keys0, VBS, doc=BRANCH_A)
        # a checkpoint holds A's branch up to 1000
        _wait(lambda: _backed_up_to(archive, 0) >= 1000, proc, err, what="A's 1000 backed up")
        t_dead = time.time_ns()  # A's branch is the node's state, 901-1000 about to be lost
        a.kill()
        time.sleep(1.5)  # a checkpoint or two find A gone
        names = [addr(n) for n in (a, b, c)]
        after = [[2, 1, -1], [1, 2, -1], [2, 1, -1], [1, 2, -1]]
        for i, n in ((2, c), (1, b)):
            with opts_for(n).connect() as conn:
                set_map(conn, {"rev": 2, "nodes": names, "this": i, "replicas": 2,
                               "vbmap": after,
                               "auth": {"username": n.username, "password": n.password}})
        with opts_for(c).connect() as conn:
            load(conn, {keys0[950]: {"branch": "C"}}, VBS)
            load(conn, {f"new-{k}": {"branch": "C"} for k in keys0[:5]}, VBS)
        t = time.time()
        _wait(lambda: any(r.get("event") == "checkpoint" and r["rollbacks"] for r in recs),
              proc, err, what="the rollback recorded")
        _wait(lambda: any(r.get("event") == "checkpoint" and _when(r) > t
                          and r["lag"]["default"]["items"] == 0 for r in recs),
              proc, err, what="caught up after the failover")
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(120)
    assert rc == 0, err
    rb = [r for r in recs if r.get("event") == "checkpoint" and r["rollbacks"]]
    assert len(rb) == 1 and rb[0]["rollbacks"] == 1
    want = {}
    for vb, node in {0: c, 1: b, 2: c, 3: b}.items():
        docs, _ = vbucket_stream(node, vb)
        want.update({k: v[1] for k, v in docs.items() if v[0] == "live"})
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        res = run_restore(str(archive), opts_for(dst), spark=spark).as_dict()
        assert sum(res["failed"].values()) == 0
        got = {k: v[1] for k, v in node_documents(opts_for(dst)).items() if v[0] == "live"}
    assert {k: json.loads(v) for k, v in got.items()} == \
        {k: json.loads(v) for k, v in want.items()}
    dead = {k.encode() for k in keys0[900:]} - {keys0[950].encode()}
    assert not dead & set(got)
    # restore --to-time while A's branch was the node's state: the rollback the archive
    # learnt of later (a backup that began after the time) does not apply, so vbucket 0 is
    # as A held it, 1000 documents (docs/archive-format.md, "Point in time"); a time after
    # the failover's checkpoint is C's history
    rb_began = parse_time(rb[0]["time"]) - int(rb[0]["seconds"] * 1e9)
    last = parse_time([r for r in recs if r.get("event") == "checkpoint"][-1]["time"])
    for when, branch in ((t_dead, "A"), (last, "C")):
        with NodeProcess(tmp_path / f"dst-{branch}", vbuckets=VBS) as dst:
            res = run_restore(str(archive), opts_for(dst), spark=spark,
                              to_time=when).as_dict()
            assert sum(res["failed"].values()) == 0
            cut = {c["vbucket"]: c for c in res["point_in_time"]["vbuckets"]}[0]
            held = {k: json.loads(v[1]) for k, v in node_documents(opts_for(dst)).items()
                    if v[0] == "live"}
        if branch == "A":
            assert when < rb_began and cut["seqno"] == 1000, cut
            assert held == {**{k.encode(): BRANCH_A(i) for i, k in enumerate(keys0)},
                            **{k.encode(): {"vb": vb} for vb, ks in others.items()
                               for k in ks}}
        else:
            assert held == {k: json.loads(v) for k, v in want.items()}
            assert not dead & set(held)
    r = subprocess.run([sys.executable, "-m", "dcptool", "verify", str(archive)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def _when(rec: dict) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).timestamp() - rec["seconds"]
