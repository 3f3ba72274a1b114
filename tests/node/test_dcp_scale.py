"""DCP at size: a full drain of 1024 vbuckets, fairness between streams, and a stalled client
whose cursor is dropped while memory stays within the budget."""
from __future__ import annotations

import time

import pytest

from dcptool.protocol import decode_message
from dcptool.protocol.constants import Opcode, SnapshotFlag, Status, StreamEndReason
from dcptool.protocol.messages import DcpMutation, DcpStreamEnd, DcpStreamReq

from .dcputil import DcpClient, connect, dcp_connect, high_seqno
from .mcbputil import wait_persisted


def all_high_seqnos(c) -> dict[int, int]:
    return dict(decode_message(c.call(Opcode.GET_ALL_VB_SEQNOS)).entries)


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_full_drain_of_1024_vbuckets(node_factory, source):
    node = node_factory(vbuckets=1024)
    docs = {}
    with connect(node) as kv:
        kv.set_many((b"drain-%05d" % i, b"v%d" % i) for i in range(12000))
        kv.set_many((b"drain-%05d" % i, b"w%d" % i) for i in range(0, 12000, 5))  # updates
        for i in range(12000):
            docs[b"drain-%05d" % i] = (b"w%d" if i % 5 == 0 else b"v%d") % i
        highs = all_high_seqnos(kv)
        if source == "disk":
            wait_persisted(kv, timeout=30)
    if source == "disk":
        node.restart()
    assert len(highs) == 1024
    with dcp_connect(node, "drain") as c:
        c.control("connection_buffer_size", "1048576")
        for vb, high in highs.items():
            assert c.stream_req(vb, end=high).status == Status.SUCCESS
        c.drain(streams=1024, ack_every=200000, timeout=120)
        got = {}
        for vb, high in highs.items():
            log = c.log(vb)
            assert log.end == StreamEndReason.OK
            log.check_consistent()
            if high:
                assert log.markers and log.markers[-1].end_seqno >= high
                want = SnapshotFlag.DISK if source == "disk" else SnapshotFlag.MEMORY
                assert all(m.flags & want for m in log.markers)
            for it in log.items:
                assert c.vb(it.key) == vb
                got[it.key] = it.value
        assert got == docs


def test_one_busy_vbucket_does_not_starve_the_others(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as kv:
        kv.set_many((b"busy-%05d" % i, b"x" * 200, 0) for i in range(20000))
        for vb in (1, 2, 3):
            kv.set_many((b"quiet-%d-%d" % (vb, i), b"y", vb) for i in range(50))
        highs = all_high_seqnos(kv)
    with dcp_connect(node, "fair") as c:
        # all four requests in one write, the busy vbucket first
        c.send(b"".join(DcpStreamReq(vbucket=vb, opaque=0x100000 + vb, end_seqno=highs[vb]).encode()
                        for vb in range(4)))
        order = []
        ends = {}
        while len(ends) < 4:
            f = c.recv(timeout=30)
            if f.magic == 0x81:
                assert f.opcode == Opcode.DCP_STREAM_REQ and f.status == Status.SUCCESS
                continue
            c.backlog.appendleft(f)
            m = c.next_message(timeout=30)
            order.append(m.vbucket)
            if isinstance(m, DcpStreamEnd):
                ends[m.vbucket] = len(order)
        total = len(order)
        for vb in (1, 2, 3):
            assert ends[vb] < total * 0.1, f"vb {vb} ended at message {ends[vb]} of {total}"
        assert ends[0] == total


def _rss_and_ckpt(kv) -> tuple[int, int, int]:
    st = kv.stats()
    return int(st["mem_rss"]), int(st["ep_checkpoint_memory"]), int(st["ep_cursors_dropped"])


def test_stalled_client_cursor_is_dropped_and_it_resumes_from_disk(node_factory):
    budget = 4 * 1024 * 1024
    node = node_factory(vbuckets=4, extra_args=("--checkpoint-memory", "4MiB",
                                                "--checkpoint-max-items", "200"))
    value = lambda i, r: (b"%06d-%03d-" % (i, r)) + b"z" * 1000  # noqa: E731
    nkeys = 500
    with connect(node) as kv:
        kv.set_many((b"slow-%03d" % i, value(0, 0), 0) for i in range(nkeys))
        slow = DcpClient(node.host, node.port, vbuckets=4, rcvbuf=32 * 1024)
        slow.setup()
        assert slow.open("slow").status == Status.SUCCESS
        assert slow.stream_req(0).status == Status.SUCCESS
        # the client now stops reading; a writer keeps updating the same keys
        rss0, _, _ = _rss_and_ckpt(kv)
        peak_ckpt = 0
        peak_rss = rss0
        final = {}
        for r in range(1, 121):
            kv.set_many((b"slow-%03d" % i, value(i, r), 0) for i in range(nkeys))
            if r % 10 == 0:
                rss, ckpt, _ = _rss_and_ckpt(kv)
                peak_ckpt = max(peak_ckpt, ckpt)
                peak_rss = max(peak_rss, rss)
        for i in range(nkeys):
            final[b"slow-%03d" % i] = value(i, 120)
        written = 121 * nkeys * 1000
        rss, ckpt, dropped = _rss_and_ckpt(kv)
        assert dropped >= 1, "the stalled cursor was dropped"
        assert peak_ckpt <= budget + 1024 * 1024, f"checkpoint memory peaked at {peak_ckpt}"
        # ~60 MB were written; memory grew by far less (budget, socket buffers, a margin)
        assert peak_rss - rss0 < 40 * 1024 * 1024, (rss0, peak_rss, written)
        high = high_seqno(kv, 0)
    # the client wakes up and gets everything, the gap from a disk snapshot
    got = {}
    log = None
    deadline = time.monotonic() + 60
    while True:
        m = slow.next_message(timeout=30)
        if isinstance(m, DcpMutation):
            got[m.key] = m.value
            if m.by_seqno == high:
                break
        assert time.monotonic() < deadline
    log = slow.log(0)
    log.check_consistent()
    assert got == final
    # the first snapshot may come from disk or memory (the flusher can free the initial
    # checkpoints before the stream asks); after the cursor was dropped, the gap was filled
    # by a disk snapshot that starts in the middle of the history
    assert any(m.flags & SnapshotFlag.DISK and m.start_seqno > 0 for m in log.markers)
    assert any(m.flags & SnapshotFlag.MEMORY for m in log.markers)
    assert log.end is None
    slow.close()


def test_a_stalled_client_cannot_hold_every_backfill_slot(node_factory):
    node = node_factory(vbuckets=4, extra_args=("--max-backfills", "2"))
    with connect(node) as kv:
        for vb in range(3):
            kv.set_many((b"bf-%d-%05d" % (vb, i), b"q" * 1000, vb) for i in range(12000))
        kv.set_many((b"bf-3-%05d" % i, b"q" * 1000, 3) for i in range(4000))
        wait_persisted(kv, timeout=60)
    node.restart()  # every stream now starts with a disk backfill
    stalled = DcpClient(node.host, node.port, vbuckets=4, rcvbuf=16 * 1024)
    stalled.setup()
    assert stalled.open("stalled").status == Status.SUCCESS
    for vb in (0, 1, 2):
        assert stalled.stream_req(vb).status == Status.SUCCESS
    time.sleep(1.0)  # it reads nothing more: its transport fills and its backfills stall
    with connect(node) as kv:
        assert int(kv.stats()["ep_dcp_backfills_running"]) == 1, "one slot per connection"
    with dcp_connect(node, "other") as c:
        assert c.stream_req(3, end=4000).status == Status.SUCCESS
        c.drain(timeout=20)
        assert c.log(3).seqnos() == list(range(1, 4001))
    stalled.close()
