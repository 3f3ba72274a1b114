"""Scopes and collections in a cluster of node processes: a REST change made through any
member reaches every member's manifest (SET_COLLECTIONS_MANIFEST from the member that took
it), each active vbucket gets its system events, and replica vbuckets stay at the same
seqnos as their actives; the manifest survives a member's restart."""
from __future__ import annotations

import base64
import json
import struct
import urllib.parse
import urllib.request

from clusterutil import abc  # noqa: F401  (the fixture)
from clusterutil import make_cluster, status, wait_until
from dcptool.protocol import vbucket_of
from dcptool.protocol.collections import doc_key
from dcptool.protocol.constants import Feature, Opcode, Status
from node.mcbputil import DEFAULT_FEATURES, connect

COLL_FEATURES = DEFAULT_FEATURES + (Feature.COLLECTIONS,)

VBS = 4
SCOPES = "/pools/default/buckets/default/scopes"


def rest(node, method: str, path: str, form: dict | None = None):
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{node.rest_port}{path}", data=data,
                                 method=method)
    token = base64.b64encode(f"{node.username}:{node.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=30) as rsp:
        return rsp.status, json.loads(rsp.read())


def manifest(node) -> dict:
    return rest(node, "GET", SCOPES)[1]


def test_rest_changes_reach_every_member_and_replicas_follow(abc):
    a, b, c = abc["a"], abc["b"], abc["c"]
    members = [a, b, c]
    # every vbucket active on one member with a replica on the next
    vbmap = [[vb % 3, (vb + 1) % 3] for vb in range(VBS)]
    make_cluster(members, vbmap, replicas=1)
    assert rest(a, "POST", SCOPES, {"name": "s"}) == (200, {"uid": "1"})
    assert rest(b, "POST", f"{SCOPES}/s/collections", {"name": "c1", "maxTTL": "50"}) == (
        200, {"uid": "2"})
    assert rest(c, "POST", f"{SCOPES}/s/collections", {"name": "c2"}) == (200, {"uid": "3"})
    want = manifest(a)
    assert want["uid"] == "3"
    for m in members:
        assert manifest(m) == want
    cid = int([s for s in want["scopes"] if s["name"] == "s"][0]["collections"][1]["uid"], 16)
    # a document in the collection on each vbucket's active
    for vb in range(VBS):
        active = members[vbmap[vb][0]]
        with connect(active, features=COLL_FEATURES) as cl:
            key = next(k for k in (b"doc%d" % i for i in range(1000))
                       if vbucket_of(k, VBS) == vb)
            f = cl.call(Opcode.SET, key=doc_key(cid, key), value=b"v",
                        extras=struct.pack(">II", 0, 0), vbucket=vb)
            assert f.status == Status.SUCCESS
    def high(node, vb):   # the vbucket's high seqno (not the default collection's)
        return status(node)["vbuckets"][str(vb)]["high_seqno"]

    # each active vbucket holds the three system events and the document; its replica
    # reaches the same seqno
    for vb in range(VBS):
        active, replica = members[vbmap[vb][0]], members[vbmap[vb][1]]
        assert high(active, vb) == 4
        wait_until(lambda: high(replica, vb) == 4, what=f"replica of vbucket {vb}")
    # a drop through another member
    assert rest(c, "DELETE", f"{SCOPES}/s/collections/c2") == (200, {"uid": "4"})
    for m in members:
        assert manifest(m)["uid"] == "4"
    with connect(a, features=COLL_FEATURES) as cl:
        f = cl.call(Opcode.GET, key=doc_key(cid, b"doc0"), vbucket=vbucket_of(b"doc0", VBS))
        assert f.status == Status.UNKNOWN_COLLECTION
    # a member restarted keeps the manifest
    b.stop()
    b.start()
    assert manifest(b) == manifest(a)
