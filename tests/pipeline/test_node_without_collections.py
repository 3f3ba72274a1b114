"""dcptool against a data node without collections (`dcptool node start --no-collections`,
which answers like Couchbase Server 6.x: HELLO Collections not acknowledged, the collections
commands unknown): backup, restore and tail work as before, keys land in the default
collection, and an archive holding named collections cannot be restored into such a node
(one line, nothing written)."""
from __future__ import annotations

import json

import pytest
from collarchive import build
from docutil import load, node_documents, opts_for

from dcptool.archive import Archive
from dcptool.archive.verify import verify_archive
from dcptool.errors import DcptoolError
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore

VBS = 4
LEGACY = ("--no-collections",)


def _live(opts) -> dict[bytes, bytes]:
    return {k: v[1] for k, v in node_documents(opts).items() if v[0] == "live"}


def test_a_node_without_collections_says_so(node_factory):
    from dcptool.client.ops import get_collections_manifest

    node = node_factory("legacy", vbuckets=VBS, extra_args=LEGACY)
    with opts_for(node).connect(collections=True) as conn:
        assert not conn.collections
        assert get_collections_manifest(conn, missing_ok=True) is None


def test_backup_and_restore_between_nodes_without_and_with_collections(
        node_factory, spark, tmp_path):
    old = node_factory("legacy", vbuckets=VBS, extra_args=LEGACY)
    docs = {f"k{i}": {"n": i} for i in range(40)}
    with opts_for(old).connect() as conn:
        load(conn, docs, VBS)
    arc = tmp_path / "archive"
    b = run_backup(opts_for(old), arc, spark=spark, watermark=False)
    assert b.mutations == 40 and b.collections is None
    assert Archive.open(str(arc)).manifest(b.backup_id)["collections"] is None
    assert verify_archive(arc).ok
    want = {k.encode(): json.dumps(v).encode() for k, v in docs.items()}
    # into another node without collections, and into one with them (default collection)
    for name, extra in (("old2", LEGACY), ("new", ())):
        target = node_factory(name, vbuckets=VBS, extra_args=extra)
        r = run_restore(str(arc), opts_for(target), spark=spark)
        assert sum(r.as_dict()["failed"].values()) == 0
        assert _live(opts_for(target)) == want


def test_named_collections_cannot_go_into_a_node_without_them(node_factory, spark, tmp_path):
    archive, _ids, _ = build(tmp_path / "coll")
    target = node_factory("legacy", vbuckets=4, bucket="b", extra_args=LEGACY)
    with pytest.raises(DcptoolError) as exc:
        run_restore(str(archive.path), opts_for(target), spark=spark)
    assert "\n" not in str(exc.value) and "collection" in str(exc.value)
    assert _live(opts_for(target)) == {}
    # the default collection alone may go there
    r = run_restore(str(archive.path), opts_for(target), spark=spark,
                    include_data=["b._default._default"])
    assert sum(r.as_dict()["failed"].values()) == 0
    live = _live(opts_for(target))
    assert live and all(k.startswith(b"d") for k in live)
