"""Seed 002, "Intra-cluster replication of HWT", "Synchronized tombstone purgers" and
"Synchronized HWT replication", on real node processes: a replica installs a high
watermark row only once it has replicated up to the row's seqno; a replica's purger never
goes beyond its source's (each hop of a chain beyond the previous hop's); after a failover
a client that registered on the old active resumes on the new one without missing a
deletion."""
from __future__ import annotations

import pytest
from client.nodeutil import run_cli
from clusterutil import (
    addr, failover_log, keys_in, make_cluster, seqnos, start_nodes, stop_nodes,
    vbucket_stream, wait_seqno, wait_until,
)
from docutil import delete, load, opts_for
from node.hwtutil import compact
from node.mcbputil import connect

from dcptool.client.topology import hold_replication, set_map
from dcptool.client.events import DELETION, MUTATION, ROLLBACK, STREAM_END
from dcptool.client.position import Position
from dcptool.client.session import SessionConfig
from dcptool.client.watermark import list_watermarks, register_watermark

VBS = 4
ARGS = ("--purge-age", "0")


def table(node) -> dict:
    with opts_for(node).connect() as conn:
        return list_watermarks(conn)


def replicated(node, vb: int = 0) -> dict[tuple[str, str], dict]:
    return {(r["name"], r["instance"]): r for r in table(node)["replicated"]
            if r["vbucket"] == vb}


def source_purge(node, vb: int = 0) -> int | None:
    d = table(node)["source_purge_seqnos"].get(str(vb))
    return None if d is None else d["purge_seqno"]


def register(node, name: str, seqnos: dict[int, int], instance: str = "r1") -> None:
    with opts_for(node).connect() as conn:
        register_watermark(conn, name, instance, seqnos, ttl=3600)


def compact_drop(node, vb: int = 0, before_seq: int = 0) -> dict:
    """COMPACT_DB with drop_deletes: the age does not matter, only the watermarks and caps."""
    c = connect(node, timeout=30)
    try:
        return compact(c, vb, drop=1, before_seq=before_seq)
    finally:
        c.close()


def purge_seqno(node, vb: int = 0) -> int:
    c = connect(node)
    try:
        return int(c.stats(f"vbucket-seqno {vb}")[f"vb_{vb}:purge_seqno"])
    finally:
        c.close()


def sets_then_deletes(node, n: int) -> list[str]:
    """n documents in vbucket 0 (seqnos 1..n), then all deleted (n+1..2n)."""
    keys = keys_in(0, VBS, n)
    with opts_for(node).connect() as conn:
        load(conn, {k: {"n": i} for i, k in enumerate(keys)}, VBS)
        delete(conn, keys, VBS)
    return keys


def deletions_in(node, vb: int = 0) -> int:
    docs, _ = vbucket_stream(node, vb)
    return sum(1 for d in docs.values() if d[0] == "deleted")


@pytest.fixture
def ab(tmp_path):
    nodes = start_nodes(tmp_path, ["a", "b"], vbuckets=VBS, extra_args=ARGS)
    make_cluster([nodes["a"], nodes["b"]], [[0, 1]] * VBS, replicas=1)
    yield nodes
    stop_nodes(nodes)


def test_seed002_row_ahead_of_the_replica_waits_for_replication(ab):
    """Local replication at 100, XDCR registered 200 on the active: the replica keeps
    XDCR's older row (100) and lists 200 as pending; released, it installs 200."""
    a, b = ab["a"], ab["b"]
    keys = keys_in(0, VBS, 200)
    with opts_for(a).connect() as conn:
        load(conn, {k: {"n": i} for i, k in enumerate(keys[:100])}, VBS)
    wait_seqno(b, 0, 100)
    register(a, "xdcr", {0: 100})
    wait_until(lambda: replicated(b).get(("xdcr", "r1"), {}).get("seqno") == 100,
               what="B installing XDCR's row at 100")
    with opts_for(b).connect() as conn:
        hold_replication(conn, 0, 100)
    with opts_for(a).connect() as conn:
        load(conn, {k: {"n": i} for i, k in enumerate(keys[100:])}, VBS)
    register(a, "xdcr", {0: 200})
    wait_until(lambda: any(p["seqno"] == 200 for p in table(b)["pending"].get("0", [])),
               what="B listing XDCR's row at 200 as pending")
    assert seqnos(b)[0] == 100
    row = replicated(b)[("xdcr", "r1")]
    assert row["seqno"] == 100 and row["source"] == addr(a)
    with opts_for(b).connect() as conn:
        hold_replication(conn, 0, None)
    wait_seqno(b, 0, 200)
    wait_until(lambda: replicated(b).get(("xdcr", "r1"), {}).get("seqno") == 200,
               what="B installing XDCR's row at 200")
    assert "0" not in table(b)["pending"]
    # the row's client data came along
    assert replicated(b)[("xdcr", "r1")]["expires_at"] == \
        [e for e in table(a)["entries"] if e["name"] == "xdcr"][0]["expires_at"]


def test_replica_purger_never_beyond_the_active(ab):
    a, b = ab["a"], ab["b"]
    sets_then_deletes(a, 50)                      # tombstones at 51..100
    wait_seqno(b, 0, 100)
    wait_until(lambda: source_purge(b) == 0, what="B reading A's purge seqno")
    # A has purged nothing: B's purger, old enough and told to drop deletes, keeps them all
    got = compact_drop(b)
    assert got["purged"] == 0 and purge_seqno(b) == 0
    assert deletions_in(b) == 50
    # A purges up to 80; B may follow up to 80 and no further
    got = compact_drop(a, before_seq=80)
    assert got["purge_seqno"] == 80
    wait_until(lambda: source_purge(b) == 80, what="B reading A's purge seqno 80")
    got = compact_drop(b)
    assert got["purged"] == 30 and purge_seqno(b) == 80
    assert deletions_in(b) == 20


def test_failover_consumer_resumes_on_the_promoted_replica_without_missing_deletions(ab):
    a, b = ab["a"], ab["b"]
    keys = keys_in(0, VBS, 50)
    with opts_for(a).connect() as conn:
        load(conn, {k: {"n": i} for i, k in enumerate(keys)}, VBS)
    # a client reads vbucket 0 up to 50 from A and registers its watermark there
    consumer = opts_for(a).consumer(SessionConfig(name="xdcr-like"))
    try:
        consumer.add_stream(0, Position(), end_seqno=50)
        for _ in consumer.batches(tick=1.0):
            pass
        pos = consumer.position(0)
    finally:
        consumer.close()
    assert pos.seqno == 50
    register(a, "xdcr", {0: 50})
    with opts_for(a).connect() as conn:
        delete(conn, keys[:30], VBS)              # deletions at 51..80
    wait_seqno(b, 0, 80)
    wait_until(lambda: replicated(b).get(("xdcr", "r1"), {}).get("seqno") == 50,
               what="B installing the client's row")

    a.kill()
    b.restart()  # the replicated row is on B's disk, not only in its memory
    names = [addr(a), addr(b)]
    with opts_for(b).connect() as conn:
        set_map(conn, {"rev": 2, "nodes": names, "this": 1, "replicas": 1,
                       "vbmap": [[1, -1]] * VBS,
                       "auth": {"username": b.username, "password": b.password}})
    assert len(failover_log(b, 0)) == 2
    # the new active's purger is held by the replicated row: nothing above 50 goes
    got = compact_drop(b)
    assert got["purged"] == 0 and purge_seqno(b) == 0
    assert ("xdcr", "r1") in replicated(b)

    # the client resumes on B from its position: no rollback, every deletion arrives
    kinds, deleted = [], set()
    consumer = opts_for(b).consumer(SessionConfig(name="xdcr-like"))
    try:
        consumer.add_stream(0, pos, end_seqno=80)
        for events in consumer.batches(tick=1.0):
            for ev in events:
                kinds.append(ev[0])
                if ev[0] == DELETION:
                    deleted.add(bytes(ev[8]).decode())
    finally:
        consumer.close()
    assert ROLLBACK not in kinds and STREAM_END in kinds
    assert MUTATION not in kinds
    assert deleted == set(keys[:30])


def test_chain_replication_carries_data_failover_log_rows_and_purge_caps(tmp_path):
    nodes = start_nodes(tmp_path, ["a", "b", "c"], vbuckets=VBS, extra_args=ARGS)
    try:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        make_cluster([a, b, c], [[0, 1, 2]] * VBS, replicas=2, topology="chain")
        sets_then_deletes(a, 50)                  # tombstones at 51..100
        register(a, "xdcr", {0: 90})
        wait_seqno(c, 0, 100)
        # data and failover log reached C through B
        assert failover_log(c, 0) == failover_log(b, 0) == failover_log(a, 0)
        assert vbucket_stream(c, 0)[0] == vbucket_stream(a, 0)[0]
        # the row reached C, from B
        wait_until(lambda: replicated(c).get(("xdcr", "r1"), {}).get("seqno") == 90,
                   what="C installing the row")
        assert replicated(c)[("xdcr", "r1")]["source"] == addr(b)
        assert replicated(b)[("xdcr", "r1")]["source"] == addr(a)
        # A purges to 80; B has not compacted: C, whose source is B, purges nothing
        assert compact_drop(a, before_seq=80)["purge_seqno"] == 80
        wait_until(lambda: source_purge(b) == 80, what="B reading A's purge seqno")
        wait_until(lambda: source_purge(c) == 0, what="C reading B's purge seqno")
        got = compact_drop(c)
        assert got["purged"] == 0 and purge_seqno(c) == 0
        # B follows A to 80, then C follows B to 80 (the row at 90 is above both)
        assert compact_drop(b)["purge_seqno"] == 80
        wait_until(lambda: source_purge(c) == 80, what="C reading B's purge seqno 80")
        got = compact_drop(c)
        assert got["purged"] == 30 and purge_seqno(c) == 80
        # A purges up to the row (90); C stays at 80 until B has followed
        assert compact_drop(a)["purge_seqno"] == 90
        assert compact_drop(c)["purge_seqno"] == 80
    finally:
        stop_nodes(nodes)


def test_chain_next_hop_takes_the_history_its_source_took_later(tmp_path):
    """C is given the map first and streams from B while B still has its own history;
    when B takes A's failover log, C asks again and takes it too."""
    nodes = start_nodes(tmp_path, ["a", "b", "c"], vbuckets=VBS)
    try:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        with opts_for(a).connect() as conn:
            load(conn, {k: {"n": i} for i, k in enumerate(keys_in(0, VBS, 20))}, VBS)
        names = [addr(n) for n in (a, b, c)]
        for i, n in ((2, c), (1, b), (0, a)):
            with opts_for(n).connect() as conn:
                set_map(conn, {"rev": 1, "nodes": names, "this": i, "replicas": 2,
                               "topology": "chain", "vbmap": [[0, 1, 2]] * VBS,
                               "auth": {"username": n.username, "password": n.password}})
        wait_seqno(c, 0, 20)
        wait_until(lambda: failover_log(c, 0) == failover_log(a, 0),
                   what="C taking A's failover log through B")
        assert failover_log(b, 0) == failover_log(a, 0)
        assert vbucket_stream(c, 0)[0] == vbucket_stream(a, 0)[0]
    finally:
        stop_nodes(nodes)


def test_move_takes_the_old_actives_rows_to_the_new_active(tmp_path):
    """A controlled move (takeover) to a node that held no copy: the new active gets the
    old active's row and its purger keeps the deletions above it."""
    nodes = start_nodes(tmp_path, ["a", "b"], vbuckets=VBS, extra_args=ARGS)
    try:
        a, b = nodes["a"], nodes["b"]
        make_cluster([a, b], [[0], [1], [0], [1]], replicas=0)
        sets_then_deletes(a, 50)                  # tombstones at 51..100
        register(a, "xdcr", {0: 60})
        r = run_cli("cluster", "move", "-c", addr(a), "--vbuckets", "0", "--to", addr(b),
                    node=a, timeout=120)
        assert r.returncode == 0, r.stderr
        row = replicated(b)[("xdcr", "r1")]
        assert row["seqno"] == 60 and row["source"] == addr(a)
        got = compact_drop(b)
        assert got["purged"] == 10 and purge_seqno(b) == 60
        assert deletions_in(b) == 40
    finally:
        stop_nodes(nodes)
