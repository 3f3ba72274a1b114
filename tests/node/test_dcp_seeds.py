"""The seeds' DCP examples, with their numbers, against a real node over TCP."""
from __future__ import annotations

from dcptool.protocol.constants import SnapshotFlag, Status, StreamEndReason

from .dcputil import (
    connect,
    dcp_connect,
    failover_log,
    high_seqno,
    rollback_seqno,
    vb_uuid,
)
from .mcbputil import wait_persisted

MEM = SnapshotFlag.MEMORY
DISK = SnapshotFlag.DISK
CHK = SnapshotFlag.CHECKPOINT


def marker_tuple(m):
    return (m.start_seqno, m.end_seqno)


def test_seed_003_dedup_a_b_a_gives_marker_2_3(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as kv:
        for key, val in ((b"A", b"a1"), (b"B", b"b1"), (b"A", b"a2")):
            assert kv.set(key, val, vbucket=0).status == Status.SUCCESS
    with dcp_connect(node) as c:
        assert c.stream_req(0, end=3).status == Status.SUCCESS
        c.drain()
        log = c.log(0)
        assert [marker_tuple(m) for m in log.markers] == [(2, 3)]
        assert log.markers[0].flags & MEM
        assert [(i.by_seqno, i.key, i.value) for i in log.items] == [(2, b"B", b"b1"),
                                                                     (3, b"A", b"a2")]
        assert log.end == StreamEndReason.OK


def _fill(kv, lo: int, hi: int) -> None:
    for i in range(lo, hi + 1):
        assert kv.set(b"k%03d" % i, b"v" * 10, vbucket=0).status == Status.SUCCESS


def test_seed_003_point_in_time_snapshots_r1_r2(node_factory):
    node = node_factory(vbuckets=4)
    per_item = 24 + 31 + 4 + 10
    kv = connect(node)
    _fill(kv, 1, 100)
    # R1 asks for everything; its flow-control window is exactly the first snapshot, so it
    # holds still (like a client busy elsewhere) until it acknowledges
    r1 = dcp_connect(node, "R1")
    assert r1.control("connection_buffer_size", str(44 + 100 * per_item)).status == Status.SUCCESS
    assert r1.stream_req(0).status == Status.SUCCESS
    r1.read_n(101)
    _fill(kv, 101, 120)
    r2 = dcp_connect(node, "R2")
    assert r2.control("connection_buffer_size", str(44 + 120 * per_item)).status == Status.SUCCESS
    assert r2.stream_req(0).status == Status.SUCCESS
    r2.read_n(121)
    _fill(kv, 121, 150)
    r1.ack(r1.received_bytes)
    r1.read_n(51)
    r2.ack(r2.received_bytes)
    r2.read_n(31)
    l1, l2 = r1.log(0), r2.log(0)
    assert [marker_tuple(m) for m in l1.markers] == [(0, 100), (101, 150)]
    assert [marker_tuple(m) for m in l2.markers] == [(0, 120), (121, 150)]
    assert all(m.flags & MEM and not m.flags & DISK for m in l1.markers + l2.markers)
    assert l1.seqnos() == list(range(1, 151)) and l2.seqnos() == list(range(1, 151))
    for c in (kv, r1, r2):
        c.close()


def test_disk_backfill_from_the_middle_15_of_1_60(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as kv:
        # three flusher batches: three disk snapshots (1..20, 21..30, 31..60)
        for lo, hi in ((1, 20), (21, 30), (31, 60)):
            for i in range(lo, hi + 1):
                kv.set(b"d%02d" % i, b"v", vbucket=0)
            wait_persisted(kv)
        uuid = vb_uuid(kv, 0)
    node.restart()  # memory now starts at 61: everything older comes from disk
    with dcp_connect(node) as c:
        assert c.stream_req(0, start=15, uuid=uuid, end=60).status == Status.SUCCESS
        c.drain()
        log = c.log(0)
        assert [marker_tuple(m) for m in log.markers] == [(15, 60)]
        assert log.markers[0].flags & DISK and log.markers[0].flags & CHK
        assert log.seqnos() == list(range(16, 61))
        # from the start the merged disk snapshots are sent as one
        assert c.stream_req(0, end=60, opaque=7).status == Status.SUCCESS
        c.drain(streams=2)
        log = c.log(0, 7)
        assert [marker_tuple(m) for m in log.markers] == [(0, 60)]
        assert log.seqnos() == list(range(1, 61))


def test_disk_snapshot_has_the_newest_version_of_each_key_then_memory_follows(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as kv:
        for i in range(10):
            kv.set(b"x%d" % i, b"old", vbucket=0)       # 1..10
        kv.set(b"x3", b"new", vbucket=0)                # 11 (x3@4 superseded)
        kv.delete(b"x5", vbucket=0)                     # 12 (x5@6 deleted)
        wait_persisted(kv)
    node.restart()
    with connect(node) as kv, dcp_connect(node) as c:
        assert c.stream_req(0).status == Status.SUCCESS
        msgs = c.read_n(1 + 10)
        log = c.log(0)
        assert [marker_tuple(m) for m in log.markers] == [(0, 12)]
        assert log.seqnos() == [1, 2, 3, 5, 7, 8, 9, 10, 11, 12]
        assert log.items[-2].value == b"new"
        assert type(log.items[-1]).__name__ == "DcpDeletion" and log.items[-1].key == b"x5"
        assert len(msgs) == 11
        kv.set(b"x0", b"live", vbucket=0)               # 13, from memory
        c.read_n(2)
        assert marker_tuple(log.markers[-1]) == (13, 13) and log.markers[-1].flags & MEM
        assert log.items[-1].value == b"live"
        log.check_consistent()


def test_seed_004_rollback_to_900_then_resume_from_900(node_factory):
    # node C's history: W from 0; 900 mutations reach disk; 100 more are acknowledged and
    # streamed to a client but lost when the node dies; after an unclean restart the node
    # starts a new branch X at 900
    node = node_factory(vbuckets=1)
    with connect(node) as kv:
        for i in range(900):
            kv.set(b"s%04d" % i, b"v", vbucket=0)
        wait_persisted(kv)
        w = vb_uuid(kv, 0)
    node.stop()
    node.extra_args = ("--flush-interval", "3600")
    node.start()
    with connect(node) as kv:
        for i in range(900, 1000):
            kv.set(b"s%04d" % i, b"v", vbucket=0)
        assert high_seqno(kv, 0) == 1000
    with dcp_connect(node, "node-B") as b:
        assert b.stream_req(0, end=1000).status == Status.SUCCESS
        b.drain()
        assert b.log(0).seqnos()[-1] == 1000  # node B has (W, 1000)
    node.kill()
    node.extra_args = ()
    node.start()
    with dcp_connect(node, "node-B") as b:
        log = b.get_failover_log(0)
        assert len(log) == 2 and log[1] == (w, 0) and log[0][1] == 900
        f = b.stream_req(0, start=1000, uuid=w)
        assert rollback_seqno(f) == 900
        f = b.stream_req(0, start=900, uuid=w)
        assert f.status == Status.SUCCESS
        assert failover_log(f) == log
        # and it receives what comes after 900 on the new branch
        with connect(node) as kv:
            kv.set(b"after", b"v", vbucket=0)
        b.read_n(2)
        assert b.log(0).seqnos() == [901]


def test_unknown_uuid_rolls_back_to_zero_and_start_zero_never_does(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as kv:
        _fill(kv, 1, 5)
    with dcp_connect(node) as c:
        assert rollback_seqno(c.stream_req(0, start=3, uuid=0x1234)) == 0
        assert rollback_seqno(c.stream_req(0, start=3, uuid=0)) == 0
        assert c.stream_req(0, start=0, uuid=0x1234).status == Status.SUCCESS


def test_resume_from_the_middle_of_a_snapshot_loses_and_repeats_nothing(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as kv:
        for i in range(300):
            kv.set(b"m%03d" % i, b"v%d" % i, vbucket=0)
        for i in range(0, 300, 3):
            kv.set(b"m%03d" % i, b"w%d" % i, vbucket=0)  # 301..400, dedup inside the snapshot
        uuid = vb_uuid(kv, 0)
    for restart in (False, True):
        if restart:
            node.restart()  # the same, served from disk
        got = {}
        seen = []
        with dcp_connect(node, "first") as c:
            assert c.control("connection_buffer_size", "3000").status == Status.SUCCESS
            assert c.stream_req(0).status == Status.SUCCESS
            msgs = []
            while len([m for m in msgs if hasattr(m, "by_seqno")]) < 40:
                msgs.append(c.next_message())
            marker = c.log(0).markers[-1]
            items = c.log(0).items
            last = items[-1].by_seqno
            assert marker.start_seqno < last < marker.end_seqno, "stopped inside the snapshot"
            for it in items:
                got[it.key] = it.value
                seen.append(it.by_seqno)
        with dcp_connect(node, "again") as c:
            f = c.stream_req(0, start=last, uuid=uuid, snap_start=marker.start_seqno,
                             snap_end=marker.end_seqno, end=400)
            assert f.status == Status.SUCCESS
            c.drain()
            for it in c.log(0).items:
                got[it.key] = it.value
                seen.append(it.by_seqno)
        assert seen == sorted(set(seen)), "no seqno twice, none out of order"
        assert seen[-1] == 400
        assert got == {b"m%03d" % i: (b"w%d" if i % 3 == 0 else b"v%d") % i for i in range(300)}
