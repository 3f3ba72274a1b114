"""`dcptool cluster create/status/failover` and `dcptool tail` across a failover, with seed
004's numbers: vbucket 0 active on A, replicas on B and C; 1000 mutations, C held at 900;
A killed; C promoted. A tail that had seen 1000 from A resumes from its state file against
the cluster, reports the rollback to 900 and then follows C's history."""
from __future__ import annotations

import json

from client.nodeutil import json_lines, run_cli
from cluster.clusterutil import abc  # noqa: F401  (the fixture)
from cluster.clusterutil import (
    addr, failover_log, seed004_writes, status, vbucket_stream, wait_seqno, wait_until,
)
from docutil import load, opts_for


VBS = 4  # the vbuckets of clusterutil's `abc` nodes


def test_create_status_failover_and_tail_across_the_failover(abc, tmp_path):
    a, b, c = abc["a"], abc["b"], abc["c"]
    r = run_cli("cluster", "create", "-c", addr(a), "-c", addr(b), "-c", addr(c),
                "--replicas", "2", "--json", node=a)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["vbmap"][0] == [0, 1, 2]
    # actives spread evenly: each node is active for at least one vbucket
    assert {chain[0] for chain in plan["vbmap"]} == {0, 1, 2}
    w = failover_log(a, 0)[0][0]
    keys = seed004_writes(a, b, c, VBS)

    r = run_cli("cluster", "status", "--json", node=b)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rev"] == plan["rev"]  # the map's rev, not the node's config rev
    st = {n["node"]: n for n in doc["nodes"]}
    assert st[addr(c)]["lag"] >= 100 and st[addr(b)]["replica"] >= 1
    assert all(n["up"] for n in st.values())

    state = tmp_path / "tail.state"
    r = run_cli("tail", "--from", "beginning", "--vbuckets", "0", "--state", str(state),
                "--until-idle", "1", "--json", node=b)
    assert r.returncode == 0, r.stderr
    seen = [d for d in json_lines(r.stdout) if d["type"] == "mutation"]
    assert len(seen) == 1000 and seen[-1]["seqno"] == 1000

    a.kill()
    r = run_cli("cluster", "failover", "-c", addr(a), "--via", addr(b), "--promote", addr(c),
                "--json", node=b)
    assert r.returncode == 0, r.stderr
    failed = json.loads(r.stdout)
    assert failed["promoted"]["0"] == addr(c) and failed["rev"] > plan["rev"]
    log_c = failover_log(c, 0)
    assert log_c[0][1] == 900 and log_c[1] == (w, 0)
    wait_until(lambda: failover_log(b, 0) == log_c, what="B following C")
    with opts_for(c).connect() as conn:
        load(conn, {keys[990]: {"n": "C"}}, VBS)
    wait_seqno(b, 0, 901)

    r = run_cli("cluster", "status", "--json", node=c)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rev"] == failed["rev"] and doc["config_rev"] >= doc["rev"]
    st = {n["node"]: n for n in doc["nodes"]}
    assert not st[addr(a)]["up"] and st[addr(a)]["failed_over"]
    assert [n["node"] for n in doc["nodes"] if not n["failed_over"]] == [addr(b), addr(c)]

    # the tail resumes from (W, 1000) through any member: rollback to 900, then C's history
    r = run_cli("tail", "--state", str(state), "--until-idle", "2", "--json", node=b)
    assert r.returncode == 0, r.stderr
    out = json_lines(r.stdout)
    rb = [d for d in out if d["type"] == "rollback"]
    assert rb and rb[0]["rollback_seqno"] == 900
    after = [d for d in out[out.index(rb[0]):] if d["type"] == "mutation"]
    docs_c, _ = vbucket_stream(c, 0)
    # the tail got A's 1000 as one snapshot, so it holds no consistent point at 900 and
    # goes back to 0: what follows is C's whole history, A's 901-1000 are not in it
    assert rb[0]["from_seqno"] == 1000 and rb[0]["to_seqno"] <= 900
    history = sorted((v[2], k.decode()) for k, v in docs_c.items() if v[2] > rb[0]["to_seqno"])
    assert [(d["seqno"], d["key"]) for d in after] == history
    assert history[-1] == (901, keys[990]) and len(docs_c) == 901
    # B, the other replica, holds exactly C's data and log
    assert vbucket_stream(b, 0)[0] == docs_c
    rep = status(b)  # the source is C (the failed node left the map: C is index 1 now)
    assert rep["nodes"][rep["vbuckets"]["0"]["replication"]["source"]] == addr(c)
