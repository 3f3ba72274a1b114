"""A restore into a cluster whose map changes while it runs: each window of documents goes
to its vbucket's active as the map says when it is sent. A window answered NOT_MY_VBUCKET
(the old active is alive and now a replica) or sent to a node that died (a failover) is
sent again to the new active found in the map read again from the members."""
from __future__ import annotations

import pytest
from clusterutil import addr, keys_in, make_cluster, start_nodes, stop_nodes, vbucket_stream, wait_seqno
from docutil import delete, load, opts_for

from dcptool.client.topology import set_map
from dcptool.pipeline import metawriter as mw
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.plans import RestoreTask
from dcptool.pipeline.restore import restore_task
from dcptool.protocol.constants import VBucketState

VBS = 4


def send_map(members, vbmap, rev: int, *, only=None) -> None:
    names = [addr(m) for m in members]
    for i, m in enumerate(members):
        if only is not None and m not in only:
            continue
        with opts_for(m).connect() as conn:
            set_map(conn, {"rev": rev, "nodes": names, "this": i, "replicas": 1,
                           "vbmap": vbmap, "auth": {"username": m.username,
                                                    "password": m.password}})


def vb_state(node, vb: int) -> int:
    from clusterutil import status
    return status(node)["vbuckets"][str(vb)]["state"]


@pytest.fixture
def ab(tmp_path):
    nodes = start_nodes(tmp_path, ["a", "b"], vbuckets=VBS)
    make_cluster([nodes["a"], nodes["b"]], [[0, 1], [1, 0], [0, 1], [1, 0]], replicas=1)
    yield nodes
    stop_nodes(nodes)


def test_window_answered_not_my_vbucket_goes_to_the_new_active(ab):
    """vbucket 0 moves from A to B in the middle of its documents: the window A refuses
    is written to B, and B ends with every document, each written once."""
    a, b = ab["a"], ab["b"]
    keys = keys_in(0, VBS, 200)

    def records():
        for i, k in enumerate(keys):
            if i == 100:  # two windows went to A; B replicated them; then the map changes
                wait_seqno(b, 0, 100)
                send_map([a, b], [[1, 0], [1, 0], [0, 1], [1, 0]], rev=2)
            yield (mw.WRITE_MUTATION, k.encode(), b'{"i": %d}' % i, 0, 0, 1, 1000 + i, 1)

    routes = {0: addr(a), 1: addr(b), 2: addr(a), 3: addr(b)}   # the plan before the move
    counts = mw.write_to_actives(opts_for(a), routes, VBS, [(0, records())], window=50)
    assert counts.restored[mw.WRITE_MUTATION] == 200 and counts.failed[mw.WRITE_MUTATION] == 0
    assert vb_state(a, 0) == VBucketState.REPLICA and vb_state(b, 0) == VBucketState.ACTIVE
    docs, _ = vbucket_stream(b, 0)
    assert set(docs) == {k.encode() for k in keys}
    assert docs[keys[150].encode()][1] == b'{"i": 150}'
    # A, now B's replica, catches up with what went to B after the move
    wait_seqno(a, 0, 200)


def test_restore_task_planned_before_a_failover_writes_to_the_promoted_node(ab, spark,
                                                                            tmp_path):
    """The restore's plan names A for vbuckets 0 and 2; A dies and B is promoted before
    the task writes: every document of the archive ends on B."""
    a, b = ab["a"], ab["b"]
    src = start_nodes(tmp_path / "src", ["s"], vbuckets=VBS)["s"]
    try:
        per_vb = {vb: keys_in(vb, VBS, 30, prefix=f"v{vb}-") for vb in range(VBS)}
        with opts_for(src).connect() as conn:
            load(conn, {k: {"vb": vb} for vb, ks in per_vb.items() for k in ks}, VBS)
            delete(conn, [ks[0] for ks in per_vb.values()], VBS)
        archive = tmp_path / "archive"
        run_backup(opts_for(src), archive, spark=spark)
    finally:
        src.stop()
    from dcptool.archive import Archive

    opened = Archive.open(str(archive))
    backup_id = opened.chain(None)[-1].id
    task = RestoreTask(opts_for(b), opened, backup_id, tuple(range(VBS)), VBS,
                       routes={0: addr(a), 1: addr(b), 2: addr(a), 3: addr(b)})
    a.kill()
    send_map([a, b], [[1, -1]] * VBS, rev=2, only=[b])
    out = restore_task(task).counts
    assert out["restored"][mw.WRITE_MUTATION] == 4 * 29 and out["restored"][mw.WRITE_DELETION] == 4
    assert out["failed"] == {mw.WRITE_MUTATION: 0, mw.WRITE_DELETION: 0, mw.WRITE_EXPIRATION: 0}
    for vb, ks in per_vb.items():
        docs, _ = vbucket_stream(b, vb)
        assert {k.decode() for k, d in docs.items() if d[0] == "live"} == set(ks[1:])
        assert docs[ks[0].encode()][0] == "deleted"


def test_restore_into_a_cluster_of_another_vbucket_count(ab, tmp_path, spark):
    """An archive of 16 vbuckets restored into a cluster of 4: each key goes to the active
    node of the target's vbucket for it, every document with its metadata."""
    from docutil import node_documents
    from nodeprocutil import NodeProcess

    from dcptool.pipeline.restore import run_restore

    a, b = ab["a"], ab["b"]
    with NodeProcess(tmp_path / "src", vbuckets=16) as src:
        with opts_for(src).connect() as conn:
            load(conn, {f"k{i:03d}": {"i": i} for i in range(200)}, 16)
        run_backup(opts_for(src), tmp_path / "arc", spark=spark)
        want = node_documents(opts_for(src))
    res = run_restore(str(tmp_path / "arc"), opts_for(a), spark=spark)
    assert res.counts.restored[mw.WRITE_MUTATION] == 200 and not res.counts.failed[
        mw.WRITE_MUTATION]
    assert res.target["rerouted"] and res.target["vbuckets"] == VBS and res.target["nodes"] == 2
    got_a, got_b = node_documents(opts_for(a)), node_documents(opts_for(b))
    assert got_a and got_b and {**got_a, **got_b} == want


def test_restore_tasks_are_grouped_by_the_member_they_write():
    """With at least as many tasks as members, each task's vbuckets are active on one
    member, and the members share the tasks by their vbuckets; with fewer, round-robin."""
    from dcptool.pipeline.restore import member_groups

    routes = {vb: ("a:1" if vb % 3 == 0 else "b:2" if vb % 3 == 1 else "c:3")
              for vb in range(12)}
    groups = member_groups(list(range(12)), 4, routes)
    assert sorted(vb for g in groups for vb in g) == list(range(12))
    assert len(groups) == 4 and all(len({routes[vb] for vb in g}) == 1 for g in groups)
    assert sorted(len(g) for g in groups) == [2, 2, 4, 4]   # the fourth task: a member's half
    assert member_groups(list(range(12)), 2, routes) == [list(range(0, 12, 2)),
                                                         list(range(1, 12, 2))]
    assert member_groups([0, 1, 2], 4, None) == [[0], [1], [2]]


def test_restore_into_a_cluster_with_a_task_per_member(ab, tmp_path, spark):
    """One task per member (--partitions 2 on two members): every document of the archive
    lands on its vbucket's active member, with its metadata."""
    from docutil import node_documents
    from nodeprocutil import NodeProcess

    from dcptool.pipeline.restore import run_restore

    a, b = ab["a"], ab["b"]
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as src:
        with opts_for(src).connect() as conn:
            load(conn, {f"k{i:03d}": {"i": i} for i in range(300)}, VBS)
            delete(conn, ["k000", "k001"], VBS)
        run_backup(opts_for(src), tmp_path / "arc", spark=spark)
        want = node_documents(opts_for(src))
    res = run_restore(str(tmp_path / "arc"), opts_for(b), spark=spark, partitions=2)
    assert res.counts.restored == {mw.WRITE_MUTATION: 298, mw.WRITE_DELETION: 2,
                                   mw.WRITE_EXPIRATION: 0}
    got_a, got_b = node_documents(opts_for(a)), node_documents(opts_for(b))
    assert got_a and got_b and {**got_a, **got_b} == want
