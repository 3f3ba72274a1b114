"""`dcptool tail` on a bucket with scopes and collections, against a real node: scope and
collection names in the human and --json output, system events, --collection filters
(the node streams only those), --filter on the key alone, unknown names refused."""
from __future__ import annotations

import pytest
from client.nodeutil import json_lines, run_cli

from dcptool.client.options import ConnOptions
from dcptool.client.rest import RestClient
from dcptool.protocol.collections import doc_key
from dcptool.protocol.messages import Set


@pytest.fixture(scope="module")
def cnode(module_node_factory):
    """One node for the module: its tests only read."""
    node = module_node_factory(vbuckets=2)
    rest = RestClient(node.host, node.rest_port, username=node.username,
                      password=node.password, bucket=node.bucket)
    rest.create_scope("inventory")
    rest.create_collection("inventory", "hotels")
    rest.create_collection("inventory", "routes")
    ids = {c.name: c.uid for s in rest.manifest().scopes for c in s.collections}
    opts = ConnOptions(node.host, node.port, node.username, node.password, node.bucket)
    with opts.connect(collections=True) as c:
        for cid, key in ((0, b"plain"), (ids["hotels"], b"h1"), (ids["hotels"], b"h2"),
                         (ids["routes"], b"r1")):
            assert c.request(Set(key=doc_key(cid, key), value=b'{"k":"%s"}' % key,
                                 datatype=1, vbucket=0)).status == 0
    node.ids = ids
    return node


def test_tail_json_names_collections_and_shows_system_events(cnode):
    r = run_cli("tail", "--from", "beginning", "--until-idle", "1.5", "--json",
                "--vbuckets", "0", node=cnode)
    assert r.returncode == 0, r.stderr
    out = json_lines(r.stdout)
    docs = [(o["scope"], o["collection"], o["key"]) for o in out if o["type"] == "mutation"]
    assert docs == [("_default", "_default", "plain"), ("inventory", "hotels", "h1"),
                    ("inventory", "hotels", "h2"), ("inventory", "routes", "r1")]
    hotel = next(o for o in out if o.get("key") == "h1")
    assert hotel["collection_id"] == format(cnode.ids["hotels"], "x")
    events = [o for o in out if o["type"] == "system_event"]
    assert [(e["event"], e.get("scope"), e.get("collection")) for e in events] == [
        ("create-scope", "inventory", None), ("create-collection", "inventory", "hotels"),
        ("create-collection", "inventory", "routes")]
    assert [e["seqno"] for e in events] == [1, 2, 3]


def test_tail_collection_filter_and_the_human_output(cnode):
    r = run_cli("tail", "--from", "beginning", "--until-idle", "1.5", "--json", "--vbuckets",
                "0", "--collection", "inventory.hotels", "--filter", "^h2$", node=cnode)
    assert r.returncode == 0, r.stderr
    out = json_lines(r.stdout)
    assert [o["key"] for o in out if o["type"] == "mutation"] == ["h2"]
    assert [o["collection"] for o in out if o["type"] == "system_event"] == ["hotels"]
    # human output: one line per system event, scope.collection before each key
    r = run_cli("tail", "--from", "beginning", "--until-idle", "1.5", "--vbuckets", "0",
                "--collection", "inventory.routes", node=cnode)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any("create-collection inventory.routes" in ln for ln in lines), r.stdout
    doc = [ln for ln in lines if " mutation " in ln]
    assert len(doc) == 1 and "inventory.routes r1" in doc[0]
    # the collections of another scope (and the default one) never came
    assert "hotels" not in r.stdout and "plain" not in r.stdout


def test_tail_unknown_collection_is_a_one_line_error(cnode):
    r = run_cli("tail", "--from", "beginning", "--until-idle", "1", "--collection",
                "inventory.nope", node=cnode)
    assert r.returncode == 2
    assert "collection inventory.nope does not exist" in r.stderr
    r = run_cli("tail", "--from", "beginning", "--until-idle", "1", "--collection", "flat",
                node=cnode)
    assert r.returncode == 2 and "is not scope.collection" in r.stderr


def test_failover_log_on_a_bucket_with_collections(cnode):
    r = run_cli("failover-log", "--json", node=cnode)
    assert r.returncode == 0, r.stderr
    logs = json_lines(r.stdout)[0]
    assert sorted(logs) == ["0", "1"]
    assert all(e["seqno"] == 0 and e["uuid"] > 0 for log in logs.values() for e in log)
