"""Backup, restore and failover-log on a cluster, with seed 004's numbers.

Nodes A, B, C, one active vbucket on each (and a fourth on A); vbucket 0 is active on A with
replicas on B and C. A full backup through A at 1000 (C held at 900); A dies and C is promoted
for vbucket 0. An incremental backup through B streams every vbucket from its new active,
records the rollback of vbucket 0, and restoring the archive into another cluster gives
exactly the data of C's history: documents 901-1000 of A's dead branch are not restored.
"""
from __future__ import annotations

import json

import pytest
from client.nodeutil import run_cli
from clusterutil import (
    addr, failover_log, load_each_active, make_cluster, seed004_first_900, seed004_last_100,
    start_nodes, stop_nodes, vbucket_stream, wait_seqno, wait_until,
)
from docutil import load, opts_for

from dcptool.client.topology import set_map
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore

VBS = 4
# vbucket 0 on A (replicas B, C), 1 on B, 2 on C, 3 on A
VBMAP = [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]]
#: the documents of A's branch of vbucket 0 (the one the failover loses past 900)
BRANCH_A = lambda i: {"n": i, "branch": "A"}  # noqa: E731


@pytest.fixture
def nodes(tmp_path):
    nodes = start_nodes(tmp_path, ["a", "b", "c", "d", "e"], vbuckets=VBS)
    yield nodes
    stop_nodes(nodes)


def _contents(actives: dict[int, object]) -> dict[bytes, tuple]:
    """{key: (kind, value, rev, cas)} over every vbucket, each read from its active node."""
    out: dict[bytes, tuple] = {}
    for vb, node in actives.items():
        docs, _ = vbucket_stream(node, vb)
        out.update({k: (v[0], v[1], v[3], v[4]) for k, v in docs.items()})
    return out


def test_backup_across_a_failover_restores_only_cs_history(nodes, spark, tmp_path):
    a, b, c, d, e = (nodes[n] for n in "abcde")
    make_cluster([a, b, c], VBMAP, replicas=2)
    w = failover_log(a, 0)[0][0]
    others = load_each_active({1: b, 2: c, 3: a}, VBS)
    keys0 = seed004_first_900(a, b, c, VBS, doc=BRANCH_A)
    seed004_last_100(a, keys0, VBS, doc=BRANCH_A)
    wait_seqno(b, 0, 1000)
    wait_seqno(b, 3, 20)
    wait_seqno(c, 3, 20)

    # failover-log through B: each vbucket's log from its active (A for 0, not B's replica)
    r = run_cli("failover-log", "--json", node=b)
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(r.stdout)) == ["0", "1", "2", "3"]
    assert json.loads(r.stdout)["0"] == [{"uuid": w, "seqno": 0}]

    archive = tmp_path / "archive"
    full = run_backup(opts_for(a), archive, spark=spark)
    assert full.type == "full" and full.vbuckets == VBS
    assert full.mutations == 1000 + 60 and full.rollbacks == 0

    a.kill()
    names = [addr(n) for n in (a, b, c)]
    after = [[2, 1, -1], [1, 2, -1], [2, 1, -1], [1, 2, -1]]
    for i, n in ((2, c), (1, b)):
        with opts_for(n).connect() as conn:
            set_map(conn, {"rev": 2, "nodes": names, "this": i, "replicas": 2, "vbmap": after,
                           "auth": {"username": n.username, "password": n.password}})
    log_c = failover_log(c, 0)
    assert log_c[0][1] == 900 and log_c[1] == (w, 0)
    wait_until(lambda: failover_log(b, 0) == log_c, what="B following C")
    with opts_for(c).connect() as conn:
        load(conn, {keys0[950]: {"branch": "C"}}, VBS)
    with opts_for(b).connect() as conn:
        load(conn, {others[3][0]: {"vb": 3, "on": "B"}}, VBS)

    r = run_cli("failover-log", "--vbuckets", "0", "--json", node=b)
    assert r.returncode == 0, r.stderr
    assert [(e["uuid"], e["seqno"]) for e in json.loads(r.stdout)["0"]] == log_c

    # the incremental through B: vbucket 0 from C, told to roll back below A's 1000
    incr = run_backup(opts_for(b), archive, spark=spark)
    assert incr.type == "incremental" and incr.vbuckets == VBS
    assert incr.rollbacks == 1
    (rb,) = incr.rollback_details
    assert rb["vbucket"] == 0 and rb["seqno"] <= 900
    assert incr.watermark["registered"] and incr.watermark["vbuckets"] == VBS, incr.watermark

    # restore into another cluster (D, E): each key goes to its vbucket's active there
    make_cluster([d, e], [[0], [1], [0], [1]], replicas=0)
    res = run_restore(str(archive), opts_for(e), spark=spark)
    assert res.counts.failed == {"mutation": 0, "deletion": 0, "expiration": 0}
    want = _contents({0: c, 1: b, 2: c, 3: b})
    got = _contents({0: d, 1: e, 2: d, 3: e})
    assert got == want
    assert len([k for k in want if k in {x.encode() for x in keys0}]) == 901
    assert want[keys0[950].encode()][1] == b'{"branch":"C"}' or \
        json.loads(want[keys0[950].encode()][1]) == {"branch": "C"}
    # A's dead branch: the documents only A held (901-1000 but the one C rewrote)
    dead = {k.encode() for k in keys0[900:]} - {keys0[950].encode()}
    assert not dead & set(got)
