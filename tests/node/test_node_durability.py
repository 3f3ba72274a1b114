"""End to end: what survives a clean stop, a kill after a flush, and a kill before one (seed 004)."""
from __future__ import annotations

import struct

from dcptool.protocol import decode_message
from dcptool.protocol.constants import Opcode, Status

from .mcbputil import connect, wait_persisted


def failover_logs(c, vbuckets: int) -> dict[int, tuple]:
    return {vb: decode_message(c.call(Opcode.GET_FAILOVER_LOG, vbucket=vb)).entries
            for vb in range(vbuckets)}


def load(c, n: int, prefix: bytes = b"key-") -> dict[bytes, bytes]:
    docs = {}
    for i in range(n):
        k = prefix + b"%05d" % i
        v = b'{"i": %d}' % i
        assert c.set(k, v).status == Status.SUCCESS
        docs[k] = v
    return docs


def test_sigterm_then_restart_keeps_every_acknowledged_item_and_the_failover_log(node_factory):
    node = node_factory(vbuckets=16)
    with connect(node) as c:
        docs = load(c, 500)
        for i in range(0, 500, 7):  # some updates and deletions too
            k = b"key-%05d" % i
            if i % 2:
                assert c.delete(k).status == Status.SUCCESS
                del docs[k]
            else:
                assert c.set(k, b"updated").status == Status.SUCCESS
                docs[k] = b"updated"
        seqnos = c.stats("vbucket-seqno")
        logs = failover_logs(c, 16)
        cas = {k: c.get(k).cas for k in list(docs)[:20]}
    assert node.stop() == 0, "a clean SIGTERM shutdown exits 0"
    node.start()
    with connect(node) as c:
        for k, v in docs.items():
            f = c.get(k)
            assert (f.status, f.value) == (Status.SUCCESS, v)
        for k, v in cas.items():
            assert c.get(k).cas == v
        assert failover_logs(c, 16) == logs, "no new failover entry after a clean shutdown"
        after = c.stats("vbucket-seqno")
        for vb in range(16):
            assert after[f"vb_{vb}:high_seqno"] == seqnos[f"vb_{vb}:high_seqno"]
            assert after[f"vb_{vb}:last_persisted_seqno"] == seqnos[f"vb_{vb}:high_seqno"]
        assert int(c.stats("")["curr_items"]) == len(docs)
        # the CAS clock goes on above everything stored
        k = next(iter(docs))
        assert c.set(k, b"later").cas > max(cas.values())
        # seqnos continue where they were
        f = c.set(b"key-new", b"v")
        vb = c.vb(b"key-new")
        assert struct.unpack(">QQ", f.extras)[1] == int(seqnos[f"vb_{vb}:high_seqno"]) + 1


def test_sigkill_after_a_flush_adds_one_failover_entry_per_active_vbucket(node_factory):
    node = node_factory(vbuckets=16)
    with connect(node) as c:
        docs = load(c, 300)
        # one vbucket is a replica: it must not get a new entry
        assert c.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=5).status == Status.SUCCESS
        persisted = wait_persisted(c)
        before = failover_logs(c, 16)
    node.kill()
    node.start()
    with connect(node) as c:
        after = failover_logs(c, 16)
        for vb in range(16):
            if vb == 5:
                assert after[vb] == before[vb]
                continue
            assert len(after[vb]) == len(before[vb]) + 1
            assert after[vb][1:] == before[vb]
            uuid, seqno = after[vb][0]
            assert uuid not in (0, before[vb][0][0]) and uuid < 2**48
            assert seqno == int(persisted[f"vb_{vb}:last_persisted_seqno"])
        for k, v in docs.items():
            if c.vb(k) != 5:
                assert c.get(k).value == v
        st = c.stats("vbucket-seqno")
        assert int(st["vb_0:uuid"]) == after[0][0][0]
        assert c.stats("warmup")["ep_warmup_clean_shutdown"] == "false"
    # a clean restart now adds nothing
    node.restart()
    with connect(node) as c:
        assert failover_logs(c, 16) == after


def test_items_never_persisted_are_gone_after_a_kill(node_factory):
    node = node_factory(vbuckets=4, extra_args=("--flush-interval", "60"))
    with connect(node) as c:
        for i in range(50):
            assert c.set(b"lost-%d" % i, b"v").status == Status.SUCCESS
        st = c.stats("vbucket-seqno")
        assert all(st[f"vb_{vb}:last_persisted_seqno"] == "0" for vb in range(4))
    node.kill()
    node.start()
    with connect(node) as c:
        assert all(c.get(b"lost-%d" % i).status == Status.KEY_ENOENT for i in range(50))
        for vb in range(4):
            log = decode_message(c.call(Opcode.GET_FAILOVER_LOG, vbucket=vb)).entries
            assert len(log) == 2 and log[0][1] == 0
        # seqnos are reused from the persisted point on a new branch
        f = c.set(b"lost-0", b"v")
        assert struct.unpack(">QQ", f.extras)[1] == 1
