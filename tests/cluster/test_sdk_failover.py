"""Replica reads, and a long-lived application across a failover: Couchbase's official SDK stays connected
to a 3-node `dcptool cluster` while a member dies and is failed over, then reads every key
at once with the same client (the failed node left the bucket's map, so the client drops
its session to it). Skipped only where the couchbase package cannot be installed."""
from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

couchbase = pytest.importorskip("couchbase", reason="the couchbase SDK is not installed")

from couchbase.auth import PasswordAuthenticator  # noqa: E402
from couchbase.cluster import Cluster  # noqa: E402
from couchbase.options import ClusterOptions, ClusterTimeoutOptions  # noqa: E402

from client.nodeutil import run_cli  # noqa: E402
from clusterutil import abc  # noqa: E402,F401  (the fixture)
from clusterutil import addr  # noqa: E402

KEYS = [f"app::{i}" for i in range(40)]


def test_a_connected_sdk_reads_every_key_right_after_a_failover(abc):
    a, b, c = abc["a"], abc["b"], abc["c"]
    r = run_cli("cluster", "create", "-c", addr(a), "-c", addr(b), "-c", addr(c),
                "--replicas", "1", "--json", node=a)
    assert r.returncode == 0, r.stderr
    opts = ClusterOptions(PasswordAuthenticator(a.username, a.password),
                          timeout_options=ClusterTimeoutOptions(
                              kv_timeout=timedelta(seconds=5),
                              connect_timeout=timedelta(seconds=30)))
    cluster = Cluster(f"couchbase://{a.host}:{a.port}", opts)
    try:
        coll = cluster.bucket(a.bucket).default_collection()
        for i, k in enumerate(KEYS):
            coll.upsert(k, {"i": i})
        # every key is on its replica before the active's node dies
        deadline = time.monotonic() + 30
        while True:
            st = run_cli("cluster", "status", "-c", addr(a), "--json", node=a)
            if st.returncode == 0 and all(
                    n["lag"] == 0 for n in json.loads(st.stdout)["nodes"] if n["up"]):
                break
            assert time.monotonic() < deadline, st.stdout
            time.sleep(0.5)
        assert {coll.get(k).content_as[dict]["i"] for k in KEYS} == set(range(len(KEYS)))
        # replica reads (GET_REPLICA on the node that holds the vbucket's replica)
        copies = list(coll.get_all_replicas(KEYS[0]))
        assert [x.is_replica for x in copies].count(True) == 1
        assert all(x.content_as[dict] == {"i": 0} for x in copies)
        c.kill()
        r = run_cli("cluster", "failover", "-c", addr(c), "--via", addr(a), "--json", node=a)
        assert r.returncode == 0, r.stderr
        started = time.monotonic()
        got = {k: coll.get(k).content_as[dict]["i"] for k in KEYS}
        took = time.monotonic() - started
        assert got == {k: i for i, k in enumerate(KEYS)}
        # within the first read's timeout, not after a dead session's timeouts
        assert took < 5, f"reading every key after the failover took {took:.1f} s"
    finally:
        cluster.close()
