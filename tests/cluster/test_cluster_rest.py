"""The REST port of cluster members: after `dcptool cluster create` every node's REST port
serves the whole cluster's map (the one GET_CLUSTER_CONFIG serves) with every member's
data and REST ports; after a failover the lost member leaves the bucket's map and
/pools/default lists it as inactiveFailed with its ports."""
from __future__ import annotations

import base64
import json
import urllib.request

from client.nodeutil import run_cli
from clusterutil import abc  # noqa: F401  (the fixture)
from clusterutil import addr
from dcptool.client.topology import cluster_config
from docutil import opts_for

VBS = 4  # the vbuckets of clusterutil's `abc` nodes


def rest(node, path: str):
    req = urllib.request.Request(f"http://127.0.0.1:{node.rest_port}{path}")
    token = base64.b64encode(f"{node.username}:{node.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(req, timeout=10) as rsp:
        assert rsp.status == 200
        return json.loads(rsp.read())


def kv_config(node) -> dict:
    with opts_for(node).connect() as conn:
        return cluster_config(conn)


def test_every_member_serves_the_whole_map_over_rest(abc):
    members = [abc["a"], abc["b"], abc["c"]]
    r = run_cli("cluster", "create", *[a for m in members for a in ("-c", addr(m))],
                "--replicas", "1", "--json", node=members[0])
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    services = [{"kv": m.port, "mgmt": m.rest_port} for m in members]
    for i, m in enumerate(members):
        doc = rest(m, "/pools/default/buckets/default")
        smap = doc["vBucketServerMap"]
        assert smap["serverList"] == [addr(x) for x in members]
        assert smap["vBucketMap"] == plan["vbmap"] and len(smap["vBucketMap"]) == VBS
        assert smap["numReplicas"] == 1
        assert [n["hostname"] for n in doc["nodes"]] == \
            [f"127.0.0.1:{x.rest_port}" for x in members]
        assert [n["ports"]["direct"] for n in doc["nodes"]] == [x.port for x in members]
        assert [n["thisNode"] for n in doc["nodes"]] == [j == i for j in range(3)]
        assert [e["services"] for e in doc["nodesExt"]] == services
        assert [e["thisNode"] for e in doc["nodesExt"]] == [j == i for j in range(3)]
        assert rest(m, "/pools/default/nodeServices")["nodesExt"] == doc["nodesExt"]
        assert [n["hostname"] for n in rest(m, "/pools/default")["nodes"]] == \
            [f"127.0.0.1:{x.rest_port}" for x in members]
        cfg = kv_config(m)
        assert cfg["vBucketServerMap"] == smap
        assert [e["services"] for e in cfg["nodesExt"]] == services
        assert rest(m, "/pools/default/b/default") == cfg
    # one revision for the map, whichever member serves it (and newer than any a member
    # served alone)
    revs = {(kv_config(m)["revEpoch"], kv_config(m)["rev"]) for m in members}
    assert revs == {(2, plan["rev"])}

    c = members[2]
    c.kill()
    r = run_cli("cluster", "failover", "-c", addr(c), "--via", addr(members[1]), "--json",
                node=members[1])
    assert r.returncode == 0, r.stderr
    for m in members[:2]:
        doc = rest(m, "/pools/default/buckets/default")
        # the bucket's map no longer names the lost member (ns_server's failover)
        assert doc["vBucketServerMap"]["serverList"] == [addr(x) for x in members[:2]]
        assert [n["hostname"] for n in doc["nodes"]] == \
            [f"127.0.0.1:{x.rest_port}" for x in members[:2]]
        assert [e["services"] for e in doc["nodesExt"]] == services[:2]
        assert all(n in (0, 1, -1) for chain in doc["vBucketServerMap"]["vBucketMap"]
                   for n in chain)
        cfg = kv_config(m)
        assert cfg["vBucketServerMap"] == doc["vBucketServerMap"]
        # the cluster's node list keeps it, failed, with the ports the map before told
        pool = rest(m, "/pools/default")
        assert [n["clusterMembership"] for n in pool["nodes"]] == \
            ["active", "active", "inactiveFailed"]
        assert pool["nodes"][2]["hostname"] == f"127.0.0.1:{c.rest_port}"
    # one revision for the whole cluster, every member the same
    revs = {(kv_config(m)["revEpoch"], kv_config(m)["rev"]) for m in members[:2]}
    assert len(revs) == 1 and revs.pop()[1] == json.loads(r.stdout)["rev"]
