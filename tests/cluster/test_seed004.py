"""Seed 004's failover scenario with its numbers: nodes A, B, C; vbucket 0 active on A
with failover log [(W, 0)]; 1000 mutations; B has all of them, C is held at 900; A dies;
C is promoted ([(X, 900), (W, 0)]); B asks C from (W, 1000), is told to roll back to 900,
does, and ends with exactly C's data and failover log."""
from __future__ import annotations

from clusterutil import abc  # noqa: F401  (the fixture)
from clusterutil import (
    failover_log, make_cluster, seed004_failover, seed004_writes, seqnos, status,
    vbucket_stream, wait_seqno, wait_until,
)
from docutil import load, opts_for


VBS = 4  # the vbuckets of clusterutil's `abc` nodes


def test_seed004_failover_promotes_c_and_b_rolls_back_to_900(abc):
    a, b, c = abc["a"], abc["b"], abc["c"]
    log_a = failover_log(a, 0)
    assert len(log_a) == 1 and log_a[0][1] == 0          # [(W, 0)]
    w = log_a[0][0]
    make_cluster([a, b, c], [[0, 1, 2]] * VBS, replicas=2)
    keys = seed004_writes(a, b, c, VBS, doc=lambda i: {"n": i, "branch": "A"})
    assert seqnos(a)[0] == 1000 and seqnos(c)[0] == 900
    # the handshake gave every replica A's history
    assert failover_log(b, 0) == [(w, 0)] and failover_log(c, 0) == [(w, 0)]

    a.kill()
    # failover: C (the seed's choice) becomes active, B replicates from it
    seed004_failover(a, b, c, VBS)
    log_c = failover_log(c, 0)
    assert len(log_c) == 2 and log_c[0][1] == 900 and log_c[1] == (w, 0)
    x = log_c[0][0]
    assert x != w
    # B asked from (W, 1000), was told 900, rolled back and took C's log
    wait_until(lambda: failover_log(b, 0) == log_c, what="B taking C's failover log")
    assert seqnos(b)[0] == 900
    st = status(b)["vbuckets"]["0"]["replication"]
    assert st["rollbacks"] == 1 and st["source"] == 2
    docs_b, _ = vbucket_stream(b, 0)
    docs_c, _ = vbucket_stream(c, 0)
    assert len(docs_c) == 900 and docs_b == docs_c
    assert not any(k.decode() in docs_c for k in []) and set(docs_c) == {k.encode() for k in keys[:900]}
    # new writes on C reach B
    with opts_for(c).connect() as conn:
        load(conn, {keys[950]: {"branch": "C"}}, VBS)
    wait_seqno(b, 0, 901)
    docs_b, _ = vbucket_stream(b, 0)
    docs_c, _ = vbucket_stream(c, 0)
    assert docs_b == docs_c and docs_c[keys[950].encode()][2] == 901
    assert failover_log(b, 0) == failover_log(c, 0) == [(x, 900), (w, 0)]
