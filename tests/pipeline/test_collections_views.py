"""Collections in the archive's readers: resolution ends dropped collections, names come
from manifests and system events, merges keep them, the data source and examine show
scope and collection. Real archive files written through the archive writer API."""
from __future__ import annotations

import pytest
from collarchive import BUCKET, C1, C1B, C2, DOCS1, DOCS2, VBS, build, expected

from dcptool.archive import Archive, VBucketHistory
from dcptool.archive.resolve import resolve
from dcptool.errors import UsageError
from dcptool.pipeline.collnames import chain_collections
from dcptool.pipeline.datafilter import selection
from dcptool.pipeline.datasource import read_all
from dcptool.pipeline.restore import plan_collections, resolved_records
from dcptool.protocol.collections import doc_key, split_doc_key


@pytest.fixture
def arc(tmp_path):
    return build(tmp_path / "arc")


def _resolved(a, upto_backup=None, upto_seqno=None):
    chain = a.chain(upto_backup)
    out = {}
    for vb in range(VBS):
        parts = [VBucketHistory(b, vb) for b in chain if b.entry(vb) is not None]
        for k, r in resolve(parts, upto_seqno=upto_seqno).items():
            if r[0] == 3:
                out[split_doc_key(k)] = (r[8], r[4])
    return out


def test_latest_state_does_not_resurrect_a_dropped_collection(arc):
    a, ids, _w = arc
    got = _resolved(a)
    assert got == expected(latest=True)
    assert not any(cid == C1 for cid, _k in got)  # the dropped c1 (id 9) is gone
    assert any(cid == C1B for cid, _k in got)  # the re-created c1 (id 11) is there


def test_older_backup_restores_the_dropped_collection(arc):
    a, ids, _w = arc
    assert _resolved(a, ids[0]) == expected(latest=False)


def test_point_before_the_drop_restores_the_collection(arc):
    a, ids, written = arc
    # every vbucket's first backup ends at 3 + its documents; the drop is the next seqno.
    # As of a seqno at or above every first end but below every drop point, c1 is alive
    ends = [3 + sum(1 for (c, k) in DOCS1 if _vb(k) == vb) for vb in range(VBS)]
    point = min(ends)
    got = _resolved(a, upto_seqno=point)
    assert {k for k in got if k[0] == C1} == {k for k in DOCS1 if k[0] == C1
                                              and written[_vb(k[1])][doc_key(*k)][0] <= point}


def _vb(key):
    from dcptool.protocol.vbucket import vbucket_of

    return vbucket_of(key, VBS)


def test_names_and_live_collections_of_a_chain(arc):
    a, ids, _w = arc
    names, live = chain_collections(a.chain())
    assert names.names(C1) == ("s1", "c1") and names.names(C1B) == ("s1", "c1")
    assert names.names(C2) == ("s1", "c2") and names.max_ttl(C2) == 60
    assert live == {0, C2, C1B}
    names0, live0 = chain_collections(a.chain(ids[0]))
    assert live0 == {0, C1, C2} and names0.names(C1B) is None


def test_restore_plan_selects_and_maps_by_name(arc):
    a, ids, _w = arc
    chain = a.chain()
    sel = selection([f"{BUCKET}.s1"], [f"{BUCKET}.s1.c2"], ["s1.c1=s2.x"], bucket=BUCKET)
    setup = plan_collections(chain, list(range(VBS)), sel)
    assert setup.restored == {"s1.c1": "s2.x"}
    assert setup.excluded == ["_default._default", "s1.c2"]
    recs = [r for vb in range(VBS) for r in resolved_records(
        str(a.path), vb, None, chain=chain, collections=setup.plan)]
    assert {split_doc_key(r[1]) for r in recs} == set(DOCS2) - {(0, b"d0")}
    with pytest.raises(UsageError, match="s9 is not in the archive"):
        plan_collections(chain, list(range(VBS)), selection([f"{BUCKET}.s9"], bucket=BUCKET))
    with pytest.raises(UsageError, match="names bucket 'other'"):
        selection(["other.s1"], bucket=BUCKET)


def test_default_only_plan_needs_no_per_item_work(arc):
    a, _ids, _w = arc
    setup = plan_collections(a.chain(), list(range(VBS)), selection(bucket=BUCKET))
    assert not setup.plan.per_item


def test_filter_keys_matches_the_key_without_prefix(arc):
    a, _ids, _w = arc
    chain = a.chain()
    recs = [r for vb in range(VBS) for r in resolved_records(str(a.path), vb, None, "^a",
                                                             chain=chain)]
    assert {split_doc_key(r[1]) for r in recs} == {k for k in expected(True) if k[1][:1] == b"a"}


def test_data_source_has_scope_and_collection_columns(arc):
    a, ids, _w = arc
    rows = [r for b in read_all(a.path, resolved=True) for r in b.to_pylist()]
    got = {(r["scope"], r["collection"], r["collection_id"], r["key"]) for r in rows}
    want = {("_default" if c == 0 else "s1", "_default" if c == 0 else
             ("c2" if c == C2 else "c1"), c, k.decode()) for c, k in expected(True)}
    assert got == want
    every = [r for b in read_all(a.path) for r in b.to_pylist()]
    assert len(every) == len(DOCS1) + len(DOCS2)
    assert {r["collection_id"] for r in every if r["scope"] == "s1"
            and r["collection"] == "c1"} == {C1, C1B}
    assert all(not r["key"].startswith("\x00") for r in every)


def test_merge_keeps_system_events_and_the_manifest(arc, tmp_path):
    from dcptool.archive.merging import StagedMerge, merge_vbucket, plan_merge

    a, ids, _w = arc
    before = _resolved(a)
    first_collections = a.manifest(ids[0])["collections"]
    with a.lock("merge"):
        plan = plan_merge(a)
        staged = StagedMerge.begin(a, plan)
        sums = [merge_vbucket(staged.target, p) for p in plan.vbuckets.values()]
        m = staged.commit(sums)
        staged.publish()
    assert m["collections"] == first_collections
    assert m["totals"].get("system_events") == 5 * VBS
    a = Archive.open(a.path)
    assert a.committed_ids() == [plan.merged_id]
    assert _resolved(a) == before
    names, live = chain_collections(a.chain())
    assert live == {0, C2, C1B} and names.names(C1) == ("s1", "c1")


def test_examine_shows_collection_and_drop(arc):
    from dcptool.pipeline.examine import examine_key

    a, ids, _w = arc
    d = examine_key(a.path, "a0")
    vs = [(v["backup"], v["scope"], v["collection"], v["collection_id"],
           v["collection_dropped"], v["restored"]) for v in d["versions"]]
    assert vs == [(ids[0], "s1", "c1", "9", True, False), (ids[1], "s1", "c1", "b", False, True)]
    old = examine_key(a.path, "a0", backup=ids[0])
    assert [(v["collection_id"], v["restored"]) for v in old["versions"]] == [("9", True)]
    only = examine_key(a.path, "d0", collection="_default._default")
    assert [v["scope"] for v in only["versions"]] == ["_default", "_default"]
    assert examine_key(a.path, "d0", collection="s1.c2")["versions"] == []
    assert [v["collection"] for v in examine_key(a.path, "b1")["versions"]] == ["c2"]


def test_examine_cli_json_and_table(arc, capsys):
    import json

    from cliutil import cli

    a, ids, _w = arc
    rc, out, err = cli(capsys, "examine", a.path, "a0", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert [(v["scope"], v["collection"], v["collection_dropped"]) for v in d["versions"]] \
        == [("s1", "c1", True), ("s1", "c1", False)]
    rc, out, err = cli(capsys, "examine", a.path, "a0")
    assert rc == 0, err
    assert "collection dropped" in out and "s1" in out


def test_data_names_and_mappings_parse():
    from dcptool.pipeline.datafilter import parse_map

    sel = selection(["b.s1,b.s2.c1", "b.s3"], ["b.s1.c9"], ["s1.c1=t.x,b.s2=u"], bucket="b")
    assert sel.include == (("s1", None), ("s2", "c1"), ("s3", None))
    assert sel.selects("s1", "c2") and not sel.selects("s1", "c9") and not sel.selects("s4", "c")
    assert sel.target("s1", "c1") == ("t", "x") and sel.target("s1", "c2") == ("s1", "c2")
    assert parse_map(["b.s2.c1=b.s3.c2"], "b", "b") == [(("s2", "c1"), ("s3", "c2"))]
    for bad, msg in ((["s1=t.x"], "scope to a collection"), (["s1"], "not SRC=DST"),
                     (["z.s.c=s.c"], "names bucket 'z'")):
        with pytest.raises(UsageError, match=msg):
            parse_map(bad, "b", "b")
    with pytest.raises(UsageError, match="not bucket.scope"):
        selection(["b"], bucket="b")


def test_restore_dry_run_counts_what_the_selection_writes(arc, spark):
    from dcptool.pipeline.restore import run_restore

    a, ids, _w = arc
    d = run_restore(str(a.path), None, dry_run=True, spark=spark,
                    include_data=[f"{BUCKET}.s1"]).as_dict()
    assert d["restored"]["mutation"] == sum(1 for c, _k in expected(True) if c != 0)
    assert d["collections"]["restored"] == {"s1.c1": "s1.c1", "s1.c2": "s1.c2"}
    old = run_restore(str(a.path), None, dry_run=True, spark=spark, backup=ids[0]).as_dict()
    assert old["restored"]["mutation"] == len(DOCS1)
