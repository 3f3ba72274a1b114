"""Full eviction (`dcptool node start --eviction full`): with a tiny --memory-quota most
documents are not resident, and every command still answers as if they were; the bloom
filter spares disk lookups of keys that do not exist; warm-up loads no documents."""
from __future__ import annotations

import time

import pytest

from dcptool.protocol.constants import MetaOption, Opcode, Status
from dcptool.protocol.messages import DcpMutation

from .dcputil import dcp_connect
from .mcbputil import Client, connect, wait_persisted
from .test_ingest_path import WITH_META, frame
from .test_node_kv import meta_of, with_meta

QUOTA = 4096
FULL = ("--eviction", "full", "--memory-quota", str(QUOTA), "--flush-interval", "0.005",
        "--expiry-pager-interval", "0.2")
VBS = 4
N = 300


def value_of(i: int) -> bytes:
    return b"value-%05d-" % i + b"x" * 150


def key_of(i: int) -> bytes:
    return b"doc-%05d" % i


def stat_int(c: Client, name: str) -> int:
    return int(c.stats()[name])


def settle(c: Client, timeout: float = 10.0) -> dict[str, str]:
    """Wait until everything is on disk and eviction brought the cache under its quota."""
    wait_persisted(c)
    deadline = time.monotonic() + timeout
    while True:
        st = c.stats()
        if int(st["ep_kv_size"]) <= QUOTA:
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"resident bytes stay at {st['ep_kv_size']}: {st}")
        time.sleep(0.02)


def push_out(c: Client) -> None:
    """Write the last 40 documents again (same values): being the newest, they push every
    older document out of the cache."""
    c.set_many([(key_of(i), value_of(i)) for i in range(N - 40, N)])
    settle(c)


@pytest.fixture
def loaded(node_factory):
    """A full-eviction node holding N documents, almost all of them evicted."""
    node = node_factory(vbuckets=VBS, extra_args=FULL)
    c = connect(node)
    frames = c.set_many([(key_of(i), value_of(i)) for i in range(N)])
    cas = {key_of(i): f.cas for i, f in enumerate(frames)}
    settle(c)
    yield node, c, cas
    c.close()


def fetches(c: Client) -> int:
    return stat_int(c, "ep_bg_fetched")


def test_documents_are_evicted_and_read_back_from_disk(loaded):
    _node, c, _cas = loaded
    st = c.stats()
    assert st["ep_item_eviction_policy"] == "full_eviction"
    assert int(st["ep_num_value_ejects"]) > N // 2
    assert int(st["ep_resident_items"]) < N // 2
    assert int(st["curr_items"]) == N
    assert int(st["ep_num_non_resident"]) == N - int(st["ep_resident_items"])
    before = fetches(c)
    for i in range(N):
        f = c.get(key_of(i))
        assert f.status == Status.SUCCESS and f.value == value_of(i), i
    assert fetches(c) - before >= N // 2
    # the cache stays bounded while reads bring documents back
    assert int(settle(c)["ep_kv_size"]) <= QUOTA


def test_replace_add_cas_and_delete_on_evicted_documents(loaded):
    _node, c, cas = loaded
    b0 = fetches(c)
    assert c.set(key_of(0), b"replaced", opcode=Opcode.REPLACE).status == Status.SUCCESS
    assert fetches(c) == b0 + 1   # it was not resident
    assert c.get(key_of(0)).value == b"replaced"
    assert c.set(key_of(1), b"added", opcode=Opcode.ADD).status == Status.KEY_EEXISTS
    assert c.get(key_of(1)).value == value_of(1)
    assert c.set(key_of(2), b"new", cas=cas[key_of(2)] + 1).status == Status.KEY_EEXISTS
    assert c.set(key_of(3), b"cas-ok", cas=cas[key_of(3)]).status == Status.SUCCESS
    assert c.get(key_of(3)).value == b"cas-ok"
    assert c.delete(key_of(4), cas=cas[key_of(4)] + 1).status == Status.KEY_EEXISTS
    assert c.delete(key_of(5)).status == Status.SUCCESS
    assert c.get(key_of(5)).status == Status.KEY_ENOENT
    assert c.delete(key_of(5)).status == Status.KEY_ENOENT
    # a REPLACE of a deleted and evicted document finds no live document
    push_out(c)
    b0 = fetches(c)
    assert c.set(key_of(5), b"x", opcode=Opcode.REPLACE).status == Status.KEY_ENOENT
    assert fetches(c) == b0 + 1
    st = c.stats()
    assert int(st["curr_items"]) == N - 1
    assert int(st["ep_tombstones"]) == 1
    # the delete's tombstone carries the next revision of the evicted document
    _, m = meta_of(c, key_of(5))
    assert m["deleted"] and m["rev"] == 2


def test_with_meta_conflict_resolution_against_evicted_documents(loaded):
    _node, c, _cas = loaded
    k = key_of(7)
    _, m = meta_of(c, k)
    assert m["rev"] == 1
    push_out(c)
    b0 = fetches(c)
    # rev 1 against rev 1 with a lower CAS loses
    assert with_meta(c, k, rev=1, cas=1, value=b"older").status == Status.KEY_EEXISTS
    assert fetches(c) == b0 + 1
    push_out(c)
    assert with_meta(c, k, rev=5, cas=1, value=b"newer").status == Status.SUCCESS
    assert c.get(k).value == b"newer"
    # the pipelined write path resolves against an evicted document too
    k2 = key_of(8)
    b0 = fetches(c)
    c.send(frame(Opcode.SETQ_WITH_META, c.vb(k2), 1, WITH_META.pack(0, 0, 1, 1), k2, b"old")
           + frame(Opcode.SET_WITH_META, c.vb(k2), 2, WITH_META.pack(0, 0, 9, 1), k2, b"won")
           + frame(Opcode.NOOP, 0, 3))
    replies = [c.recv() for _ in range(3)]
    assert [(f.opaque, f.status) for f in replies] == [
        (1, Status.KEY_EEXISTS), (2, Status.SUCCESS), (3, Status.SUCCESS)]
    assert fetches(c) == b0 + 1
    assert c.get(k2).value == b"won"
    # a forced write skips resolution
    push_out(c)
    assert with_meta(c, k, rev=1, cas=1, value=b"forced",
                     options=MetaOption.SKIP_CONFLICT_RESOLUTION).status == Status.SUCCESS
    assert c.get(k).value == b"forced"
    assert int(c.stats()["curr_items"]) == N


def test_restart_loads_no_documents_and_reads_and_backfills_everything(loaded):
    node, c, _cas = loaded
    assert c.delete(key_of(10)).status == Status.SUCCESS
    c.close()
    node.restart()
    with connect(node) as c2:
        st = c2.stats()
        assert int(st["curr_items"]) == N - 1
        assert int(st["ep_tombstones"]) == 1
        assert int(st["ep_resident_items"]) == 0
        warm = c2.stats("warmup")
        assert warm["ep_warmup_items_loaded"] == "0"
        assert warm["ep_warmup_keys_on_disk"] == str(N)
        assert c2.get(key_of(10)).status == Status.KEY_ENOENT
        assert c2.get(key_of(11)).value == value_of(11)
        # a new write after warm-up gets a CAS above every stored one
        f = c2.set(key_of(12), b"after")
        assert f.cas > max(_cas.values())
        got = {}
        deleted = set()
        highs = wait_persisted(c2)
        with dcp_connect(node) as d:
            for vb in range(VBS):
                end = int(highs[f"vb_{vb}:high_seqno"])
                assert d.stream_req(vb, end=end).status == Status.SUCCESS
            d.drain(streams=VBS)
            for vb in range(VBS):
                for m in d.log(vb).items:
                    if isinstance(m, DcpMutation):
                        got[m.key] = m.value
                    else:
                        deleted.add(m.key)
        want = {key_of(i): value_of(i) for i in range(N) if i not in (10, 12)}
        want[key_of(12)] = b"after"
        assert got == want
        assert deleted == {key_of(10)}


def test_expiry_of_evicted_documents_on_get_and_after_restart(node_factory):
    node = node_factory(vbuckets=VBS, extra_args=FULL)
    with connect(node) as c:
        # far enough ahead that a loaded machine still restarts the node before it
        expires = int(time.time()) + 8
        assert c.set(b"ttl-get", b"v", expiry=expires).status == Status.SUCCESS
        assert c.set(b"ttl-pager", b"v", expiry=expires).status == Status.SUCCESS
        c.set_many([(key_of(i), value_of(i)) for i in range(100)])
        settle(c)
    node.restart()
    with connect(node) as c:
        assert time.time() < expires - 1, "the restart took longer than the documents live"
        assert c.get(b"ttl-get").value == b"v"
        assert int(c.stats()["curr_items"]) == 102
        settle(c)
        time.sleep(max(0.0, expires - time.time()) + 1.1)
        assert c.get(b"ttl-get").status == Status.KEY_ENOENT
        # the pager found the other one from the expiry heap warm-up built
        deadline = time.monotonic() + 5
        while int(c.stats()["curr_items"]) != 100:
            assert time.monotonic() < deadline, c.stats()["curr_items"]
            time.sleep(0.05)
        _, m = meta_of(c, b"ttl-pager")
        assert m["deleted"]


def test_compaction_purges_evicted_tombstones(node_factory):
    from .hwtutil import compact

    node = node_factory(vbuckets=VBS, extra_args=(*FULL, "--purge-age", "0"))
    with connect(node) as c:
        c.set_many([(key_of(i), value_of(i)) for i in range(N)])
        for i in range(0, 60):
            assert c.delete(key_of(i)).status == Status.SUCCESS
        # one of them written again: its tombstone is no longer the key's version
        assert c.set(key_of(0), b"back").status == Status.SUCCESS
        push_out(c)
        st = c.stats()
        assert int(st["ep_tombstones"]) == 59
        assert int(st["ep_resident_items"]) < 40
        time.sleep(1.1)   # deleted in an earlier second than the cut-off below
        purged = sum(compact(c, vb, drop=1)["purged"] for vb in range(VBS))
        assert purged == 59
        st = c.stats()
        assert int(st["ep_tombstones"]) == 0
        assert int(st["curr_items"]) == N - 59
        assert c.get(key_of(0)).value == b"back"
        assert c.get(key_of(1)).status == Status.KEY_ENOENT
        # a purged key can be added again as a new document
        assert c.set(key_of(1), b"new", opcode=Opcode.ADD).status == Status.SUCCESS
        assert int(c.stats()["curr_items"]) == N - 58


def test_bloom_filter_spares_disk_lookups_of_new_keys(node_factory):
    node = node_factory(vbuckets=VBS, extra_args=FULL)
    with connect(node) as c:
        # a restore into an empty node: SET_WITH_META of keys that do not exist
        parts = [frame(Opcode.SETQ_WITH_META, c.vb(key_of(i)), i, WITH_META.pack(0, 0, 3, 1000 + i),
                       key_of(i), value_of(i)) for i in range(N)]
        c.send(b"".join(parts) + frame(Opcode.NOOP, 0, 99999))
        assert c.recv().opaque == 99999   # no error replies before the NOOP's
        st = settle(c)
        assert int(st["curr_items"]) == N
        assert int(st["ep_bg_fetch_avoided"]) >= N
        # only bloom false positives reach the disk (about 1%)
        assert int(st["ep_bg_fetched"]) <= N // 20
        assert int(st["ep_bloom_filter_key_count"]) == N
        b0, a0 = fetches(c), stat_int(c, "ep_bg_fetch_avoided")
        missing = [b"missing-%d" % i for i in range(200)]
        for k in missing:
            assert c.get(k).status == Status.KEY_ENOENT
        st = c.stats()
        assert int(st["ep_bg_fetch_avoided"]) - a0 + int(st["ep_bg_fetched"]) - b0 == 200
        assert int(st["ep_bg_fetch_avoided"]) - a0 >= 180
        # stored documents are all there, read back from disk
        for i in range(0, N, 7):
            _, m = meta_of(c, key_of(i))
            assert (m["rev"], m["cas"]) == (3, 1000 + i)


def test_value_eviction_keeps_everything_resident(node_factory):
    node = node_factory(vbuckets=VBS)
    with connect(node) as c:
        c.set_many([(key_of(i), value_of(i)) for i in range(50)])
        wait_persisted(c)
        st = c.stats()
        assert st["ep_item_eviction_policy"] == "value_only"
        assert int(st["ep_resident_items"]) == 50
        assert int(st["ep_num_non_resident"]) == 0
        assert "ep_bg_fetched" not in st


@pytest.mark.parametrize("args, words", [
    (("--eviction", "partial"), "--eviction"),
    (("--eviction", "full", "--memory-quota", "12"), "--memory-quota"),
    (("--eviction", "full", "--memory-quota", "lots"), "--memory-quota"),
])
def test_bad_eviction_options_are_one_line_errors(tmp_path, args, words):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "dcptool", "node", "start", "--data",
                        str(tmp_path / "n"), "--port", "0", "--password", "pw", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert words in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) <= 2, p.stderr


def test_replica_rollback_with_evicted_documents(tmp_path):
    """Seed 004's failover with every node in full eviction: B holds 1000 mutations of
    vbucket 0, mostly evicted; C (held at 900) is promoted; B rolls back to 900 and its
    counts and documents equal C's."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "cluster"))
    from clusterutil import (
        failover_log, make_cluster, seed004_failover, seed004_writes, seqnos, start_nodes,
        stop_nodes, vbucket_stream, wait_seqno, wait_until,
    )
    from docutil import load, opts_for

    nodes = start_nodes(tmp_path, ["a", "b", "c"], vbuckets=VBS, extra_args=FULL)
    try:
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        make_cluster([a, b, c], [[0, 1, 2]] * VBS, replicas=2)
        keys = seed004_writes(a, b, c, VBS)
        with connect(b) as cb:
            st = settle(cb)
            assert int(st["vb_replica_curr_items"]) == 1000
            assert int(st["ep_num_value_ejects"]) > 500
        a.kill()
        seed004_failover(a, b, c, VBS)
        wait_until(lambda: failover_log(b, 0) == failover_log(c, 0), what="B rolled back")
        assert seqnos(b)[0] == 900
        with connect(b) as cb:
            assert int(cb.stats()["vb_replica_curr_items"]) == 900
        docs_b, _ = vbucket_stream(b, 0)
        docs_c, _ = vbucket_stream(c, 0)
        assert len(docs_c) == 900 and docs_b == docs_c
        # a write on C that replaces a document B no longer holds in memory
        with opts_for(c).connect() as conn:
            load(conn, {keys[10]: {"n": "again"}}, VBS)
        wait_seqno(b, 0, 901)
        with connect(b) as cb:
            assert int(cb.stats()["vb_replica_curr_items"]) == 900
    finally:
        stop_nodes(nodes)
