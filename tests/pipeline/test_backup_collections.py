"""Backups of a bucket with scopes and collections, against real node processes: every
collection and its system events, the node's manifest in each backup, a drop (and a
re-creation under the same name) recorded by the next incremental, and --include-data /
--exclude-data streaming only the collections selected, kept along the chain."""
from __future__ import annotations

import pytest
from client.nodeutil import run_cli
from docutil import opts_for

from dcptool.archive import Archive
from dcptool.archive.format import ITEM_TYPES, REC_SYSTEM_EVENT
from dcptool.archive.verify import verify_archive
from dcptool.client.rest import RestClient
from dcptool.errors import UsageError
from dcptool.pipeline.backup import run_backup
from dcptool.protocol import vbucket_of
from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_END_COLLECTION,
    Manifest,
    doc_key,
    split_doc_key,
)
from dcptool.protocol.messages import Delete, Set

VBS = 4
LAYOUT = {"s1": ("c1", "c2"), "s2": ("c3", "c4"), "s3": ("c5",)}


def _rest(node) -> RestClient:
    return RestClient(node.host, node.rest_port, username=node.username,
                      password=node.password, bucket=node.bucket)


def _load(node, cid: int, keys, tag: str) -> None:
    with opts_for(node).connect(collections=True) as c:
        assert c.collections
        for k in keys:
            rsp = c.request(Set(key=doc_key(cid, k), value=b'{"t":"%s"}' % tag.encode(),
                                datatype=1, vbucket=vbucket_of(k, VBS)))
            assert rsp.status == 0, (k, rsp)


def _ids(node) -> dict[str, int]:
    m = _rest(node).manifest()
    return {f"{s.name}.{c.name}": c.uid for s in m.scopes for c in s.collections}


@pytest.fixture
def cnode(node_factory):
    node = node_factory(vbuckets=VBS)
    rest = _rest(node)
    for scope, colls in LAYOUT.items():
        rest.create_scope(scope)
        for c in colls:
            rest.create_collection(scope, c)
    for name, cid in _ids(node).items():
        _load(node, cid, [b"%s-%d" % (name.encode(), i) for i in range(12)], "v1")
    return node


def _archive_items(path) -> dict[bytes, tuple]:
    """{doc key: newest record} over every backup, and the system events by vbucket."""
    a = Archive.open(path)
    out = {}
    for bid in a.committed_ids():
        b = a.backup(bid)
        for vb in b.vbuckets:
            for r in b.records(vb):
                if r[0] in ITEM_TYPES:
                    out[r[7] if r[0] == 3 else r[4]] = r
    return out


def _events(path, bid) -> dict[int, list[tuple]]:
    b = Archive.open(path).backup(bid)
    return {vb: [r for r in b.records(vb) if r[0] == REC_SYSTEM_EVENT] for vb in b.vbuckets}


def _names(keys, ids: dict[str, int]) -> dict[str, int]:
    by_id = {v: k for k, v in ids.items()}
    out: dict[str, int] = {}
    for k in keys:
        cid, _ = split_doc_key(k)
        out[by_id.get(cid, hex(cid))] = out.get(by_id.get(cid, hex(cid)), 0) + 1
    return out


def test_full_and_incremental_backup_record_collections_and_a_drop(cnode, spark, tmp_path):
    opts = opts_for(cnode)
    ids = _ids(cnode)
    arc = tmp_path / "arc"
    full = run_backup(opts, arc, spark=spark, watermark=False)
    assert full.type == "full" and full.mutations == 12 * 6  # 5 collections and the default
    a = Archive.open(arc)
    m = a.manifest(full.backup_id)
    assert Manifest.from_json(m["collections"]) == _rest(cnode).manifest()
    assert full.collections == 6 and "data" not in m
    keys = _archive_items(arc)
    assert _names(keys, ids) == {n: 12 for n in ids}
    # every vbucket holds the creations in seqno order: 3 scopes, 5 collections
    for vb, evs in _events(arc, full.backup_id).items():
        assert [e[2] for e in evs].count(EVENT_CREATE_SCOPE) == 3
        assert sorted(e[5] for e in evs if e[2] == EVENT_BEGIN_COLLECTION) == \
            sorted(v for n, v in ids.items() if n != "_default._default")
        assert [e[1] for e in evs] == sorted(e[1] for e in evs)
    assert full.system_events == VBS * 8

    # drop s1.c2, create it again (a new id), write to it and to c1, delete one document
    rest = _rest(cnode)
    rest.drop_collection("s1", "c2")
    rest.create_collection("s1", "c2")
    ids2 = _ids(cnode)
    assert ids2["s1.c2"] != ids["s1.c2"]
    _load(cnode, ids2["s1.c2"], [b"again-%d" % i for i in range(5)], "v2")
    _load(cnode, ids["s1.c1"], [b"s1.c1-0"], "v2")
    with opts.connect(collections=True) as c:
        k = b"s2.c3-1"
        assert c.request(Delete(key=doc_key(ids["s2.c3"], k), vbucket=vbucket_of(k, VBS))
                         ).status == 0
    inc = run_backup(opts, arc, spark=spark, watermark=False)
    assert inc.type == "incremental"
    assert (inc.mutations, inc.deletions) == (6, 1)
    m2 = Archive.open(arc).manifest(inc.backup_id)
    assert Manifest.from_json(m2["collections"]).collection("s1", "c2").uid == ids2["s1.c2"]
    for vb, evs in _events(arc, inc.backup_id).items():
        # each vbucket: the old c2 dropped, then the new c2 created
        assert [(e[2], e[5]) for e in evs] == [(EVENT_END_COLLECTION, ids["s1.c2"]),
                                              (EVENT_BEGIN_COLLECTION, ids2["s1.c2"])]
        assert evs[1][6] == "c2"
    report = verify_archive(arc)
    assert report.ok, report.problems
    keys = _archive_items(arc)
    assert _names([k for k in keys if split_doc_key(k)[0] == ids2["s1.c2"]], ids2) == {"s1.c2": 5}


def test_include_and_exclude_stream_only_the_selected_collections(cnode, spark, tmp_path):
    opts = opts_for(cnode)
    ids = _ids(cnode)
    b = opts.bucket
    # a whole scope (a scope filter) minus nothing, plus the default collection excluded
    arc = tmp_path / "only-s1"
    r = run_backup(opts, arc, spark=spark, watermark=False, include_data=[f"{b}.s1"])
    assert r.data == {"include": ["s1"], "exclude": []} and r.mutations == 24
    assert _names(_archive_items(arc), ids) == {"s1.c1": 12, "s1.c2": 12}
    evs = [e for v in _events(arc, r.backup_id).values() for e in v]
    assert {e[4] for e in evs} == {_rest(cnode).manifest().scope("s1").uid}  # s1's only
    # collections of two scopes, one left out, given as a comma list and a repeat
    arc2 = tmp_path / "mixed"
    r2 = run_backup(opts, arc2, spark=spark, watermark=False,
                    include_data=[f"{b}.s2,{b}.s3.c5", f"{b}._default"],
                    exclude_data=[f"{b}.s2.c4"])
    assert _names(_archive_items(arc2), ids) == {"s2.c3": 12, "s3.c5": 12,
                                                 "_default._default": 12}
    assert Archive.open(arc2).manifest(r2.backup_id)["data"] == {
        "include": ["s2", "s3.c5", "_default"], "exclude": ["s2.c4"]}
    # the incremental keeps the selection; new data outside it is not streamed
    _load(cnode, ids["s2.c4"], [b"later"], "v2")
    _load(cnode, ids["s2.c3"], [b"later"], "v2")
    inc = run_backup(opts, arc2, spark=spark, watermark=False)
    assert inc.type == "incremental" and inc.mutations == 1
    assert inc.data == r2.data
    assert doc_key(ids["s2.c3"], b"later") in _archive_items(arc2)
    # exclude alone: everything but s1
    arc3 = tmp_path / "not-s1"
    run_backup(opts, arc3, spark=spark, watermark=False, exclude_data=[f"{b}.s1"])
    assert set(_names(_archive_items(arc3), ids)) == {"s2.c3", "s2.c4", "s3.c5",
                                                      "_default._default"}
    assert verify_archive(arc2).ok and verify_archive(arc3).ok
    # another selection on an incremental, unknown names, another bucket: user errors
    with pytest.raises(UsageError, match="keeps its selection"):
        run_backup(opts, arc2, spark=spark, watermark=False, include_data=[f"{b}.s1"])
    with pytest.raises(UsageError, match="collection default.s1.nope does not exist"):
        run_backup(opts, tmp_path / "x", spark=spark, watermark=False,
                   include_data=[f"{b}.s1.nope"])
    with pytest.raises(UsageError, match="names bucket 'other'"):
        run_backup(opts, tmp_path / "y", spark=spark, watermark=False,
                   exclude_data=["other.s1"])
    # nothing was written for the refused runs
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_cli_include_data_from_the_environment_and_its_errors(cnode, tmp_path):
    arc = tmp_path / "cli"
    b = cnode.bucket
    r = run_cli("backup", str(arc), "-b", b, "--no-watermark", "--json", node=cnode,
                env_extra={"DCPTOOL_INCLUDE_DATA": f"{b}.s3.c5"})
    assert r.returncode == 0, r.stderr
    ids = _ids(cnode)
    assert _names(_archive_items(arc), ids) == {"s3.c5": 12}
    bad = run_cli("backup", str(tmp_path / "bad"), "-b", b, "--no-watermark",
                  "--include-data", f"{b}.nosuch", node=cnode)
    assert bad.returncode == 2
    assert "scope default.nosuch does not exist" in bad.stderr
    assert len([ln for ln in bad.stderr.splitlines() if ln.strip()]) <= 2  # message (+ hint)


def test_a_filtered_incremental_records_the_drop_of_a_selected_collection(cnode, spark,
                                                                          tmp_path):
    opts = opts_for(cnode)
    ids = _ids(cnode)
    b = opts.bucket
    arc = tmp_path / "arc"
    run_backup(opts, arc, spark=spark, watermark=False,
               include_data=[f"{b}.s2.c3,{b}.s3.c5"])
    rest = _rest(cnode)
    rest.drop_collection("s2", "c3")
    _load(cnode, ids["s1.c1"], [b"outside"], "v2")  # not selected
    _load(cnode, ids["s3.c5"], [b"inside"], "v2")
    notices: list[str] = []
    inc = run_backup(opts, arc, spark=spark, watermark=False, notice=notices.append)
    assert any("were dropped since the last backup" in n for n in notices)
    assert inc.mutations == 1 and inc.data == {"include": ["s2.c3", "s3.c5"], "exclude": []}
    for vb, evs in _events(arc, inc.backup_id).items():
        assert [(e[2], e[5]) for e in evs] == [(EVENT_END_COLLECTION, ids["s2.c3"])]
    keys = _archive_items(arc)
    assert doc_key(ids["s3.c5"], b"inside") in keys
    assert doc_key(ids["s1.c1"], b"outside") not in keys
    assert set(_names(keys, ids)) == {"s2.c3", "s3.c5"}
    assert verify_archive(arc).ok
    # the next incremental streams with a filter again (the drop is behind it)
    notices.clear()
    _load(cnode, ids["s3.c5"], [b"again"], "v3")
    nxt = run_backup(opts, arc, spark=spark, watermark=False, notice=notices.append)
    assert nxt.mutations == 1 and not any("dropped since" in n for n in notices)
