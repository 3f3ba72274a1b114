"""Compaction, the purger and the high watermark table against a real node process.

The seed 002 scenario with its own numbers: vbucket 128, the purger at 1000, XDCR at 2000,
a backup further ahead; deletions below and above 2000. Delete times are whole seconds,
so "old enough" is made exact with COMPACT_DB's purge_before_ts (a cut-off between two
batches of deletions) on a node started with --purge-age 0.
"""
from __future__ import annotations

import time

from dcptool.protocol.constants import Opcode, SnapshotFlag, Status, StreamFlag
from dcptool.protocol.messages import (
    DcpDeletion,
    DcpMutation,
    DcpSnapshotMarker,
    DcpStreamEnd,
)

from .dcputil import dcp_connect, rollback_seqno, vb_uuid
from .hwtutil import (
    compact,
    del_frame,
    entries,
    keys_for,
    listing,
    next_second,
    pipeline,
    register,
    set_frame,
    vb_stats,
)
from .mcbputil import connect, wait_persisted

VB = 128


def stream_all(node, vb: int, *, name: str = "reader") -> tuple[list[int], list[int]]:
    """(mutation seqnos, deletion seqnos) on disk: a DiskOnly stream of `vb` from 0.

    (Checkpoint memory still holds purged tombstones until it is freed; a memory stream
    may send them, as kv_engine's does.)"""
    with connect(node) as c:
        high = vb_stats(c, vb)["high_seqno"]
    d = dcp_connect(node, name)
    try:
        f = d.stream_req(vb, start=0, end=high, flags=StreamFlag.DISK_ONLY)
        assert f.status == Status.SUCCESS, f
        d.drain(streams=1, timeout=30)
        log = d.log(vb)
        log.check_consistent()
        muts = [m.by_seqno for m in log.items if isinstance(m, DcpMutation)]
        dels = [m.by_seqno for m in log.items if isinstance(m, DcpDeletion)]
        return muts, dels
    finally:
        d.close()


def pairs(keys: list[bytes], vb: int) -> list[bytes]:
    """SET then DELETE of each key: seqnos n+1 (mutation), n+2 (tombstone), ..."""
    out = []
    for k in keys:
        out += [set_frame(k, vb), del_frame(k, vb)]
    return out


def test_seed_002_scenario(node_factory):
    node = node_factory(vbuckets=256, extra_args=("--purge-age", "0", "--hwt-max-hold", "1h"))
    keys = keys_for(VB, 256, 1000 + 500 + 500)
    with connect(node, timeout=30) as c:
        # seqnos 1..1000: 500 documents, then all 500 deleted; the purger takes them
        pipeline(c, [set_frame(k, VB) for k in keys[:500]])
        pipeline(c, [del_frame(k, VB) for k in keys[:500]])
        wait_persisted(c)
        got = compact(c, VB, before_seq=1000)
        assert (got["purged"], got["purge_seqno"]) == (500, 1000)
        assert vb_stats(c, VB)["purge_seqno"] == 1000, "the purger is at 1000"

        # 1001..1900: 450 set/delete pairs (tombstones on even seqnos), deleted "long ago"
        pipeline(c, pairs(keys[500:950], VB))
        cut = next_second()
        # 1901..2000 and 2001..3000: younger deletions, below and above 2000
        pipeline(c, pairs(keys[950:1000], VB))
        pipeline(c, pairs(keys[1000:1500], VB))
        st = wait_persisted(c)
        assert st[f"vb_{VB}:high_seqno"] == "3000"

        xdcr = register(c, "xdcr", "replicator-1", {VB: 2000})
        assert xdcr["replaced"] is False and xdcr["behind_purge_seqno"] == {}
        register(c, "backup", "archive-a", {VB: 2600, 5: 0}, ttl=7 * 86400)

        # the slowest client, XDCR at 2000, is the bound; only old-enough tombstones go
        got = compact(c, VB, before_ts=cut)
        assert got["purged"] == 450
        assert got["purge_seqno"] == 1900
        _, dels = stream_all(node, VB)
        assert dels == list(range(1902, 3001, 2))

        # once they are old enough, everything at or below 2000 goes, nothing above
        got = compact(c, VB)
        assert (got["purged"], got["purge_seqno"]) == (50, 2000)
        _, dels = stream_all(node, VB, name="reader-2")
        assert dels == list(range(2002, 3001, 2))
        table = entries(c)
        held = table[("xdcr", "replicator-1")]["holding"][str(VB)]
        assert held["tombstones"] == 500 and held["up_to_seqno"] == 3000
        assert table[("backup", "archive-a")]["holding"][str(VB)]["tombstones"] == 200

        # a client at 1500 (behind the purger) is told to roll back to 0
        uuid = vb_uuid(c, VB)
        d = dcp_connect(node, "late")
        assert rollback_seqno(d.stream_req(VB, start=1500, uuid=uuid)) == 0
        # XDCR at its watermark is not
        f = d.stream_req(VB, start=2000, uuid=uuid, end=2000)
        assert f.status == Status.SUCCESS
        d.close()

        # XDCR reports again with a short TTL (same name and instance: the row is replaced)
        again = register(c, "xdcr", "replicator-1", {VB: 2000}, ttl=0.5)
        assert again["replaced"] is True
        assert len(listing(c)["entries"]) == 2
        time.sleep(0.6)
        assert entries(c)[("xdcr", "replicator-1")]["state"] == "expired"
        # the expired row is dropped at the next purger run and holds nothing back
        got = compact(c, VB)
        assert got["expired_rows"] == ["xdcr/replicator-1"]
        assert (got["purged"], got["purge_seqno"]) == (300, 2600)
        assert list(entries(c)) == [("backup", "archive-a")]
        # XDCR comes back from 2000 after the purger passed it: roll back to 0
        d = dcp_connect(node, "xdcr-returns")
        assert rollback_seqno(d.stream_req(VB, start=2000, uuid=uuid)) == 0
        assert d.stream_req(VB, start=0, end=3000).status == Status.SUCCESS
        d.close()

        # compaction moved neither the high seqno nor the persisted seqno
        s = vb_stats(c, VB)
        assert (s["high_seqno"], s["last_persisted_seqno"], s["purge_seqno"]) == (3000, 3000, 2600)
        tombstones_before = int(c.stats("")["ep_tombstones"])
    node.stop()
    node.start()
    with connect(node) as c:
        s = vb_stats(c, VB)
        assert (s["high_seqno"], s["last_persisted_seqno"], s["purge_seqno"]) == (3000, 3000, 2600)
        assert int(c.stats("")["ep_tombstones"]) == tombstones_before
        # the table is kept with the node's data
        table = entries(c)
        assert list(table) == [("backup", "archive-a")]
        assert table[("backup", "archive-a")]["vbuckets"] == {"5": 0, str(VB): 2600}
        # new writes go on from 3000
        f = c.set(keys[0], b"back", vbucket=VB)
        assert f.status == Status.SUCCESS
        assert vb_stats(c, VB)["high_seqno"] == 3001
    _, dels = stream_all(node, VB, name="reader-3")
    assert dels == list(range(2602, 3001, 2))


def test_a_lost_row_stops_holding_back(node_factory):
    node = node_factory(vbuckets=16, extra_args=("--purge-age", "0", "--hwt-max-hold", "2s"))
    vb = 3
    keys = keys_for(vb, 16, 50)
    with connect(node) as c:
        pipeline(c, pairs(keys, vb))                      # tombstones at 2, 4, ..., 100
        wait_persisted(c)
        register(c, "stuck", "1", {vb: 10})
        register(c, "healthy", "1", {vb: 100, 4: 0})
        got = compact(c, vb)
        # "stuck" holds for less than 2 s: tombstones up to 10 go, the rest stays
        assert got["lost_rows"] == [] and (got["purged"], got["purge_seqno"]) == (5, 10)
        time.sleep(3.1)
        got = compact(c, vb)
        assert got["lost_rows"] == ["stuck/1"]
        assert (got["purged"], got["purge_seqno"]) == (45, 100)
        table = entries(c)
        assert table[("stuck", "1")]["state"] == "lost"
        assert "vbucket 3" in table[("stuck", "1")]["lost_reason"]
        assert table[("stuck", "1")]["holding"] == {}
        assert table[("healthy", "1")]["state"] == "ok"
        assert int(c.stats("")["ep_hwt_lost"]) == 1
        # registering again makes it a live row once more
        again = register(c, "stuck", "1", {vb: 100})
        assert again["replaced"] and again["behind_purge_seqno"] == {}
        assert entries(c)[("stuck", "1")]["state"] == "ok"
        assert register(c, "late", "1", {vb: 40})["behind_purge_seqno"] == {str(vb): 100}


def test_scheduled_compaction_purges_old_tombstones(node_factory):
    node = node_factory(vbuckets=16, extra_args=("--purge-age", "0", "--compaction-interval",
                                                 "0.2s"))
    keys = keys_for(0, 16, 20) + keys_for(1, 16, 20)
    with connect(node) as c:
        pipeline(c, [set_frame(k, c.vb(k)) for k in keys])
        pipeline(c, [del_frame(k, c.vb(k)) for k in keys[:10] + keys[20:30]])
        deadline = time.monotonic() + 15
        while True:
            s0, s1 = vb_stats(c, 0), vb_stats(c, 1)
            if s0["purge_seqno"] == 30 and s1["purge_seqno"] == 30:
                break
            assert time.monotonic() < deadline, (s0, s1)
            time.sleep(0.1)
        st = c.stats("")
        assert int(st["ep_compactions"]) >= 1 and int(st["ep_tombstones_purged"]) == 20
        assert st["ep_tombstones"] == "0" and st["curr_items"] == "20"
        assert (s0["high_seqno"], s0["last_persisted_seqno"]) == (30, 30)
    muts, dels = stream_all(node, 0)
    assert dels == [] and muts == list(range(11, 21))


def test_compaction_during_a_backfill_keeps_its_snapshot(node_factory):
    node = node_factory(vbuckets=16, extra_args=("--purge-age", "0",))
    vb = 0
    keys = keys_for(vb, 16, 12000)
    with connect(node, timeout=30) as c:
        pipeline(c, [set_frame(k, vb, b'{"pad":"' + b"x" * 100 + b'"}') for k in keys])
        pipeline(c, [del_frame(k, vb) for k in keys[::2]])  # tombstones at 12001..18000
        wait_persisted(c, timeout=30)
    node.stop()
    node.start()  # memory is empty after a restart: a stream from 0 is a disk backfill
    d = dcp_connect(node, "slow-backfill")
    d.control("connection_buffer_size", "65536")
    assert d.stream_req(vb, start=0, end=18000).status == Status.SUCCESS
    first = d.read_n(20)
    assert isinstance(first[0], DcpSnapshotMarker) and first[0].flags & SnapshotFlag.DISK
    with connect(node, timeout=60) as c:
        # more tombstones than one compaction step takes: several short transactions
        got = compact(c, vb)
        assert (got["purged"], got["purge_seqno"]) == (6000, 18000)
    # the stream that started before goes on reading its snapshot: every deletion is there
    d.drain(streams=1, timeout=60, ack_every=32768)
    log = d.log(vb)
    assert log.end == 0
    log.check_consistent()
    dels = [m.by_seqno for m in log.items if isinstance(m, DcpDeletion)]
    assert dels == list(range(12001, 18001))
    assert len(log.items) == 12000
    d.close()
    # a stream from 0 now sees no tombstones, a stream from below 18000 rolls back to 0
    muts, dels = stream_all(node, vb, name="after")
    assert dels == [] and len(muts) == 6000
    with connect(node) as c:
        uuid = vb_uuid(c, vb)
        assert c.stats("")["ep_tombstones"] == "0"
    d = dcp_connect(node, "behind")
    assert rollback_seqno(d.stream_req(vb, start=12000, uuid=uuid)) == 0
    d.close()


def test_a_backfill_that_starts_after_compaction_below_the_purge_seqno_rolls_back(node_factory):
    node = node_factory(vbuckets=16, extra_args=("--purge-age", "0", "--max-backfills", "1"))
    busy = keys_for(0, 16, 3000)
    late = keys_for(1, 16, 20)
    with connect(node, timeout=30) as c:
        pipeline(c, [set_frame(k, 0, b'{"pad":"' + b"x" * 200 + b'"}') for k in busy])
        pipeline(c, [set_frame(k, 1) for k in late])            # vb 1: 1..20
        pipeline(c, [del_frame(k, 1) for k in late])            # vb 1: tombstones 21..40
        wait_persisted(c)
    node.stop()
    node.start()
    with connect(node) as c:
        uuid1 = vb_uuid(c, 1)
    # A holds the only backfill slot (it does not read) ...
    a = dcp_connect(node, "holder")
    a.control("connection_buffer_size", "65536")
    assert a.stream_req(0, start=0, end=3000).status == Status.SUCCESS
    a.read_n(5)
    # ... so B's stream from 25 is accepted (nothing purged yet) and waits for a slot
    b = dcp_connect(node, "waiter")
    assert b.stream_req(1, start=25, uuid=uuid1).status == Status.SUCCESS
    with connect(node) as c:
        got = compact(c, 1)
        assert got["purge_seqno"] == 40
    a.drain(streams=1, timeout=60, ack_every=32768)
    a.close()
    # B's backfill opens after the purge: it would miss 26..40, so the stream ends ROLLBACK
    end = None
    deadline = time.monotonic() + 30
    while end is None and time.monotonic() < deadline:
        msg = b.next_message(timeout=30)
        if isinstance(msg, DcpStreamEnd):
            end = msg.reason
    assert end == 6  # StreamEndReason.ROLLBACK
    assert not [m for m in b.log(1).items]
    assert rollback_seqno(b.stream_req(1, start=25, uuid=uuid1, opaque=7)) == 0
    b.close()


def test_compact_db_requests(node_factory):
    node = node_factory(vbuckets=16, extra_args=("--purge-age", "1d"))
    keys = keys_for(2, 16, 10)
    with connect(node) as c:
        pipeline(c, pairs(keys, 2))
        wait_persisted(c)
        # the node's purge age (1 day) keeps fresh tombstones
        assert compact(c, 2)["purged"] == 0
        # purge_before_seq caps the seqno; purge_before_ts replaces the age
        got = compact(c, 2, before_ts=int(time.time()) + 1, before_seq=8)
        assert (got["purged"], got["purge_seqno"]) == (4, 8)
        # drop_deletes ignores the age (the watermarks still apply)
        register(c, "w", "1", {2: 14})
        got = compact(c, 2, drop=1)
        assert (got["purged"], got["purge_seqno"]) == (3, 14)
        # header and extras must not name different vbuckets; unknown vbuckets are refused
        from dcptool.protocol.messages import CompactDb
        f = c.call_msg(CompactDb(vbucket=2, db_file_id=3, opaque=c.next_opaque()))
        assert f.status == Status.EINVAL and b"vbucket" in f.value
        f = c.call_msg(CompactDb(vbucket=99, opaque=c.next_opaque()))
        assert f.status == Status.NOT_MY_VBUCKET
        f = c.call(Opcode.COMPACT_DB, vbucket=2, extras=b"\x00" * 23)
        assert f.status == Status.EINVAL
