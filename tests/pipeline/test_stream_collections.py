"""The `dcptool-stream` source on a bucket with collections, against a real node: every
collection is streamed (the offsets are the vbuckets' high seqnos, not the default
collection's), keys without their prefix, `scope`, `collection` and `collection_id` columns,
a collection created between two runs streamed and named in the next."""
from __future__ import annotations

from docutil import opts_for
from test_stream import run_once, sink_rows

from dcptool.client.rest import RestClient
from dcptool.protocol import vbucket_of
from dcptool.protocol.collections import doc_key
from dcptool.protocol.messages import Set

VBS = 4


def _set(node, cid: int, keys) -> None:
    with opts_for(node).connect(collections=True) as c:
        for k in keys:
            assert c.request(Set(key=doc_key(cid, k), value=b'{"a":1}', datatype=1,
                                 vbucket=vbucket_of(k, VBS))).status == 0


def test_stream_source_names_collections(spark, node_factory, tmp_path):
    node = node_factory(vbuckets=VBS)
    rest = RestClient(node.host, node.rest_port, username=node.username,
                      password=node.password, bucket=node.bucket)
    rest.create_scope("inventory")
    rest.create_collection("inventory", "hotels")
    hotels = rest.manifest().collection("inventory", "hotels").uid
    _set(node, 0, [b"d%d" % i for i in range(5)])
    _set(node, hotels, [b"h%d" % i for i in range(7)])
    sink, ckpt = tmp_path / "sink", tmp_path / "ckpt"
    run_once(spark, node, sink, ckpt)
    rows = [r for r in sink_rows(spark, sink) if r["type"] == "mutation"]
    got = sorted((r["scope"], r["collection"], r["collection_id"], r["key"]) for r in rows)
    assert got == sorted([("_default", "_default", 0, f"d{i}") for i in range(5)]
                         + [("inventory", "hotels", hotels, f"h{i}") for i in range(7)])
    # a collection created after the first run: its documents come in the next one, named
    rest.create_collection("inventory", "routes")
    routes = rest.manifest().collection("inventory", "routes").uid
    _set(node, routes, [b"r0"])
    run_once(spark, node, sink, ckpt)
    rows = [r for r in sink_rows(spark, sink) if r["type"] == "mutation"]
    assert len(rows) == 13
    r0 = next(r for r in rows if r["key"] == "r0")
    assert (r0["scope"], r0["collection"], r0["collection_id"]) == ("inventory", "routes",
                                                                   routes)
