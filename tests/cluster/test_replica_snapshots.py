"""Seed 003, "Streaming from a replica vbucket": a replica that has received only part of
a snapshot from its active holds none of it, and a client streaming from the replica gets
only complete snapshots (here: A's one disk snapshot of 1000 items, B held at 500)."""
from __future__ import annotations

import threading

import pytest
from clusterutil import (
    keys_in, make_cluster, seqnos, start_nodes, status, stop_nodes, vbucket_stream, wait_seqno,
    wait_until,
)
from docutil import load, opts_for

from dcptool.client.topology import hold_replication

VBS = 4


@pytest.fixture
def ab(tmp_path):
    nodes = start_nodes(tmp_path, ["a", "b"], vbuckets=VBS)
    yield nodes
    stop_nodes(nodes)


def test_client_on_a_mid_snapshot_replica_gets_no_partial_snapshot(ab):
    a, b = ab["a"], ab["b"]
    keys = keys_in(0, VBS, 1000)
    with opts_for(a).connect() as conn:
        load(conn, {k: {"n": i} for i, k in enumerate(keys)}, VBS)
    a.restart()  # memory is empty: B's stream starts with one disk snapshot [0, 1000]
    with opts_for(b).connect() as conn:
        hold_replication(conn, 0, 500)
    make_cluster([a, b], [[0, 1]] * VBS, replicas=1)
    repl = lambda: status(b)["vbuckets"]["0"].get("replication", {})  # noqa: E731
    wait_until(lambda: repl().get("received") == 500, what="B receiving up to the hold")
    assert repl()["snapshot_end"] == 1000 and repl()["buffered"] == 500
    assert seqnos(b)[0] == 0  # half a snapshot is not applied

    result = {}
    reader = threading.Thread(target=lambda: result.update(
        zip(("docs", "markers"), vbucket_stream(b, 0, end=1000))))
    reader.start()
    with opts_for(b).connect() as conn:
        hold_replication(conn, 0, None)
    wait_seqno(b, 0, 1000)
    reader.join(60)
    assert not reader.is_alive()
    # every snapshot the client got from B ends where one of A's snapshots ends
    assert result["markers"] and all(end == 1000 for _s, end in result["markers"])
    assert result["docs"] == vbucket_stream(a, 0)[0]
