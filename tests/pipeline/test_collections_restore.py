"""Issue 19's "done when" for restore: real node processes, real Spark, real archives.

A bucket with 3 scopes x 4 collections and documents in each (and in the default
collection), a collection dropped and created again under the same name (a new id); backed
up full and incremental; restored whole (latest and older backup), filtered and remapped
into fresh nodes; every result compared document by document with the expected state
(value, cas, rev seqno, flags, expiry, scope and collection). A restore into a node where
the user may not create collections stops with one line before writing anything.
"""
from __future__ import annotations

import time

import pytest
from collarchive import BUCKET as ARC_BUCKET
from collarchive import build as build_archive
from collarchive import expected as archive_expected
from docutil import _pipeline, opts_for
from nodeprocutil import NodeProcess

from dcptool.client.connection import COLLECTION_FEATURES, Connection
from dcptool.client.events import DELETION, EXPIRATION, MUTATION
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.client.position import ZERO
from dcptool.client.rest import RestClient
from dcptool.client.session import SessionConfig
from dcptool.errors import DcptoolError
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore
from dcptool.protocol import Delete, Set, vbucket_of
from dcptool.protocol.collections import doc_key, split_doc_key

VBS = 16
SCOPES = ("s1", "s2", "s3")
COLLS = ("c1", "c2", "c3", "c4")
RESTRICTED = ("restorer", "restorer-pw")


def rest(node, user=None) -> RestClient:
    u, p = user or (node.username, node.password)
    return RestClient(node.host, node.rest_port, username=u, password=p, bucket=node.bucket)


def coll_conn(node) -> Connection:
    return Connection.open(node.host, node.port, username=node.username,
                           password=node.password, bucket=node.bucket,
                           features=COLLECTION_FEATURES)


def write(node, docs: dict[tuple[str, str, str], bytes], *, flags: int = 0,
          expiry: int = 0) -> None:
    """SET {(scope, collection, key): value} into the node's collections."""
    m = rest(node).manifest()
    msgs = []
    for (s, c, k), v in docs.items():
        kb = k.encode()
        msgs.append(Set(key=doc_key(m.collection(s, c).uid, kb), value=v, flags=flags,
                        expiry=expiry, vbucket=vbucket_of(kb, VBS), datatype=1))
    with coll_conn(node) as conn:
        assert conn.collections
        _pipeline(conn, msgs)


def delete(node, docs) -> None:
    m = rest(node).manifest()
    with coll_conn(node) as conn:
        _pipeline(conn, [Delete(key=doc_key(m.collection(s, c).uid, k.encode()),
                                vbucket=vbucket_of(k.encode(), VBS)) for s, c, k in docs])


def state(node) -> dict[tuple[str, str, str], tuple]:
    """Everything the node holds, over DCP on a collections connection:
    {(scope, collection, key): (kind, value, cas, rev, flags, expiry)}."""
    names = rest(node).manifest().collection_ids()
    opts = opts_for(node)
    with coll_conn(node) as conn:  # a legacy connection sees the default collection's seqnos
        seqnos = get_vbucket_seqnos(conn, state=1)
    out = {}
    consumer = opts.consumer(SessionConfig(name="test-state", consistent=True,
                                           collections=True))
    try:
        consumer.add_streams({vb: (ZERO, hi) for vb, hi in seqnos.items()})
        for events in consumer.batches(tick=1.0):
            for ev in events:
                if ev[0] not in (MUTATION, DELETION, EXPIRATION):
                    continue
                cid, key = split_doc_key(bytes(ev[8]))
                s, c = names[cid]
                if ev[0] == MUTATION:
                    out[(s, c, key.decode())] = ("live", bytes(ev[9]), ev[4], ev[3], ev[5],
                                                 ev[6])
                else:
                    out[(s, c, key.decode())] = ("deleted", b"", ev[4], ev[3], 0, 0)
    finally:
        consumer.close()
    return out


def add_user_before_start(data_dir, user: str, password: str, role: str) -> None:
    from client.nodeutil import run_cli

    data_dir.mkdir(parents=True, exist_ok=True)
    r = run_cli("node", "user", "add", user, "--role", role, "--data", str(data_dir),
                env_extra={"DCPTOOL_PASSWORD": password})
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def source(tmp_path_factory, spark):
    """The source bucket and its archive: full backup, then drop and re-create s1.c1,
    change documents, incremental backup. Returns (archive, ids, state1, state2)."""
    base = tmp_path_factory.mktemp("coll-restore")
    with NodeProcess(base / "src", vbuckets=VBS) as node:
        r = rest(node)
        for s in SCOPES:
            r.create_scope(s)
            for c in COLLS:
                r.create_collection(s, c, 3600 if (s, c) == ("s3", "c4") else 0)
        docs = {("_default", "_default", f"d{i}"): b'{"d":%d}' % i for i in range(3)}
        for s in SCOPES:
            for c in COLLS:
                docs.update({(s, c, f"old-{s}-{c}-{i}"): b'{"%s%s":%d}' % (s.encode(),
                             c.encode(), i) for i in range(2)})
        write(node, docs, flags=7)
        write(node, {("s2", "c3", "ttl"): b'{"t":1}'}, expiry=int(time.time()) + 7200)
        opts = opts_for(node)
        archive = base / "archive"
        full = run_backup(opts, archive, spark=spark)
        state1 = state(node)
        old_c1 = r.manifest().collection("s1", "c1").uid
        r.drop_collection("s1", "c1")
        r.create_collection("s1", "c1")
        assert r.manifest().collection("s1", "c1").uid != old_c1
        write(node, {("s1", "c1", f"new-{i}"): b'{"new":%d}' % i for i in range(2)}, flags=9)
        write(node, {("s2", "c2", "old-s2-c2-0"): b'{"updated":1}'}, flags=11)
        delete(node, [("s3", "c3", "old-s3-c3-1")])
        incr = run_backup(opts, archive, spark=spark)
        assert incr.type == "incremental"
        state2 = state(node)
    ids = [full.backup_id, incr.backup_id]
    assert not any(k[2].startswith("old-") for k in state2 if k[:2] == ("s1", "c1"))
    return archive, ids, state1, state2


def _live(st):
    return {k: v for k, v in st.items() if v[0] == "live"}


def test_restore_latest_into_a_fresh_node(source, spark, tmp_path):
    archive, ids, _s1, s2 = source
    with NodeProcess(tmp_path / "a", vbuckets=VBS) as dst:
        res = run_restore(str(archive), opts_for(dst), spark=spark).as_dict()
        assert sum(res["failed"].values()) == 0, res["errors"]
        got = state(dst)
        assert res["restored"]["mutation"] == len(_live(s2)), res
        assert _live(got) == _live(s2)
        # the dropped s1.c1's documents are not resurrected; the re-created one's are there
        assert {k[2] for k in got if k[:2] == ("s1", "c1")} == {"new-0", "new-1"}
        assert rest(dst).manifest().collection("s3", "c4").max_ttl == 3600
        assert set(res["collections"]["created"]) >= {"s1 (scope)", "s1.c1", "s3.c4"}


def test_restore_older_backup_brings_the_dropped_collection_back(source, spark, tmp_path):
    archive, ids, s1, _s2 = source
    with NodeProcess(tmp_path / "b", vbuckets=VBS) as dst:
        res = run_restore(str(archive), opts_for(dst), backup=ids[0], spark=spark).as_dict()
        assert sum(res["failed"].values()) == 0, res["errors"]
        got = state(dst)
        assert _live(got) == _live(s1)
        assert {k[2] for k in got if k[:2] == ("s1", "c1")} == {"old-s1-c1-0", "old-s1-c1-1"}


def test_filtered_remapped_restore_and_a_user_who_may_not_create(source, spark, tmp_path):
    archive, ids, _s1, s2 = source
    node = NodeProcess(tmp_path / "c", vbuckets=VBS)
    add_user_before_start(node.data_dir, *RESTRICTED, "restore")
    with node as dst:
        # a user who may write documents but not create collections: one line, nothing written
        ro = opts_for(dst)
        from dataclasses import replace

        ro = replace(ro, username=RESTRICTED[0], password=RESTRICTED[1])
        with pytest.raises(DcptoolError) as exc:
            run_restore(str(archive), ro, spark=spark)
        msg = str(exc.value)
        assert "may not create" in msg and "\n" not in msg and "nothing was written" in msg
        assert state(dst) == {}
        # filtered and remapped, as the administrator
        res = run_restore(str(archive), opts_for(dst), spark=spark,
                          include_data=[f"{dst.bucket}.s2,{dst.bucket}.s3.c1"],
                          exclude_data=[f"{dst.bucket}.s2.c4"],
                          map_data=["s2.c1=t9.x", "s2=t8"]).as_dict()
        assert sum(res["failed"].values()) == 0, res["errors"]
        want = {}
        for (s, c, k), v in _live(s2).items():
            if s == "s2" and c != "c4":
                want[("t9", "x", k) if c == "c1" else ("t8", c, k)] = v
            elif (s, c) == ("s3", "c1"):
                want[(s, c, k)] = v
        assert _live(state(dst)) == want
        m = rest(dst).manifest()
        assert m.scope("s1") is None and m.collection("t8", "c4") is None


def test_restore_of_a_written_archive_with_key_filter(tmp_path, spark):
    """An archive with a dropped and re-created collection (written through the archive
    API) restored with --filter-keys (matched without the collection prefix): every
    document as written (value, cas, rev seqno, flags), the dropped c1 not resurrected."""
    from collarchive import C2

    a, ids, written = build_archive(tmp_path / "arc")
    with NodeProcess(tmp_path / "d", vbuckets=4, bucket=ARC_BUCKET) as dst:
        res = run_restore(str(a.path), opts_for(dst), spark=spark, key_filter="^[ab]")
        assert sum(res.as_dict()["failed"].values()) == 0
        got = {(s, c, k): (v[1], v[2], v[3], v[4]) for (s, c, k), v in state(dst).items()}
    want = {}
    for (cid, k), (value, flags) in archive_expected(True).items():
        if k[:1] not in (b"a", b"b"):
            continue
        seqno, cas, rev, v, f = written[vbucket_of(k, 4)][doc_key(cid, k)]
        want[("s1", "c2" if cid == C2 else "c1", k.decode())] = (value, cas, rev, flags)
    assert got == want
