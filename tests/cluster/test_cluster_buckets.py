"""Every bucket of a cluster: buckets created, written, replicated, failed over and dropped
across two real node processes.

Two nodes, `dcptool cluster create --replicas 1`, then three buckets of different settings
created through one member (`dcptool bucket create` against A): one fullEviction, one with
a maxTTL, one of 64 vbuckets beside the nodes' first bucket of 8. Each exists on both
members with its own map (the same on both); documents written by a client that follows
each bucket's map land on both members' actives and reach the replicas; a bucket dropped
through one member is gone on both; `cluster failover` promotes the replicas of every
bucket and no acknowledged document is lost; `cluster create` refuses a bucket that only
some members hold, or that has different vbucket counts, naming it, and maps one both hold;
`cluster move -b NAME` moves a vbucket of that bucket only.
"""
from __future__ import annotations

import json
import struct
import urllib.error

import pytest

from pathlib import Path

from client.nodeutil import run_cli
from cliutil import documented_examples
from clusterutil import addr, rest, start_nodes, stop_nodes, wait_until
from dcptool.client.ops import get_failover_logs, get_vbucket_seqnos
from dcptool.client.topology import cluster_config, node_status
from dcptool.protocol import Get, Set, vbucket_of
from dcptool.protocol.constants import Feature, Opcode, Status, VBucketState
from dcptool.protocol.messages import GenericRequest
from docutil import opts_for
from node.mcbputil import Client

VBS = 8  # the nodes' first bucket
#: the buckets created through A: name -> `dcptool bucket create` options
BUCKETS = {
    "full": ("--eviction-policy", "fullEviction", "--replicas", "1", "--num-vbuckets", "8"),
    "ttl": ("--max-ttl", "3600", "--replicas", "1", "--num-vbuckets", "8"),
    "wide": ("--num-vbuckets", "64", "--replicas", "1"),
}
NVB = {"default": VBS, "full": 8, "ttl": 8, "wide": 64}
DOCS = 120  # documents per bucket
DOCUMENTED = documented_examples(Path(__file__).resolve().parents[2] / "docs" / "json-output.md")


def same_fields(doc: dict, title: str) -> None:
    """`doc` has the fields docs/json-output.md shows for `title`, per bucket too."""
    shown = DOCUMENTED[title]
    assert set(doc) == set(shown), title
    one = next(iter(shown["buckets"].values()))
    for name, b in doc["buckets"].items():
        assert set(b) == set(one), (title, name)


def rest_status(node, path: str) -> int:
    try:
        rest(node, path)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


def make_buckets(a) -> None:
    for name, args in BUCKETS.items():
        r = run_cli("bucket", "create", name, "--ram-quota", "100", *args, node=a)
        assert r.returncode == 0, r.stderr


def kv_map(node, bucket: str) -> dict:
    with opts_for(node, bucket).connect() as conn:
        return cluster_config(conn)


def write_by_map(nodes, bucket: str, docs: dict[str, dict]) -> dict[str, str]:
    """SET each document on the member the bucket's map names active for its vbucket (the
    map read with GET_CLUSTER_CONFIG, as a Couchbase client does). Returns {key: member}."""
    by_addr = {addr(n): n for n in nodes}
    smap = kv_map(nodes[0], bucket)["vBucketServerMap"]
    conns = {}
    where = {}
    try:
        for key, doc in docs.items():
            vb = vbucket_of(key.encode(), len(smap["vBucketMap"]))
            member = smap["serverList"][smap["vBucketMap"][vb][0]]
            if member not in conns:
                conns[member] = opts_for(by_addr[member], bucket).connect()
            rsp = conns[member].request(Set(key=key.encode(), value=json.dumps(doc).encode(),
                                            vbucket=vb, datatype=1))
            assert rsp.status == Status.SUCCESS, (bucket, key, member, rsp.status)
            where[key] = member
    finally:
        for c in conns.values():
            c.close()
    return where


def seqnos(node, bucket: str) -> dict[int, int]:
    with opts_for(node, bucket).connect() as conn:
        return get_vbucket_seqnos(conn)


def states(node, bucket: str) -> dict[int, int]:
    with opts_for(node, bucket).connect() as conn:
        return {int(vb): d["state"] for vb, d in node_status(conn)["vbuckets"].items()}


def caught_up(nodes, bucket: str) -> bool:
    """Every vbucket of `bucket` is at the same high seqno on both members."""
    a, b = (seqnos(n, bucket) for n in nodes)
    return set(a) == set(b) == set(range(NVB[bucket])) and a == b


def get(node, bucket: str, key: str, vbuckets: int):
    with opts_for(node, bucket).connect() as conn:
        return conn.request(Get(key=key.encode(), vbucket=vbucket_of(key.encode(), vbuckets)))


def cluster_of_buckets(a, b, doc) -> dict[str, dict[str, str]]:
    """A and B made one cluster (`cluster create --replicas 1`), the buckets created through
    A, and DOCS documents `doc(bucket, i)` written to every bucket by its map: {bucket:
    {key: the member it was written to}}."""
    r = run_cli("cluster", "create", "-c", addr(a), "-c", addr(b), "--replicas", "1", node=a)
    assert r.returncode == 0, r.stderr
    make_buckets(a)
    return {name: write_by_map([a, b], name, {f"{name}-{i:04d}": doc(name, i)
                                              for i in range(DOCS)})
            for name in NVB}


@pytest.fixture(scope="module")
def ab(tmp_path_factory):
    """Two members, one cluster (`cluster create --replicas 1`), three buckets created
    through A afterwards, documents written to every bucket by map."""
    nodes = start_nodes(tmp_path_factory.mktemp("clbuckets"), ["a", "b"], vbuckets=VBS)
    a, b = nodes["a"], nodes["b"]
    try:
        nodes["written"] = cluster_of_buckets(a, b, lambda name, i: {"bucket": name, "n": i})
        yield nodes
    finally:
        stop_nodes({k: v for k, v in nodes.items() if k in ("a", "b")})


def test_buckets_created_through_one_member_have_one_map_on_both(ab):
    a, b = ab["a"], ab["b"]
    for name, nvb in NVB.items():
        docs = [rest(n, f"/pools/default/buckets/{name}") for n in (a, b)]
        maps = [d["vBucketServerMap"] for d in docs]
        assert maps[0] == maps[1], name
        assert maps[0]["serverList"] == [addr(a), addr(b)]
        assert maps[0]["numReplicas"] == 1
        assert len(maps[0]["vBucketMap"]) == nvb and docs[1]["numVBuckets"] == nvb
        assert {tuple(c) for c in maps[0]["vBucketMap"]} == {(0, 1), (1, 0)}
        assert [n["hostname"] for n in docs[1]["nodes"]] == \
            [f"127.0.0.1:{x.rest_port}" for x in (a, b)]
        # GET_CLUSTER_CONFIG with the bucket selected answers the same map on both
        for n in (a, b):
            cfg = kv_map(n, name)
            assert cfg["name"] == name and cfg["vBucketServerMap"] == maps[0]
            assert rest(n, f"/pools/default/b/{name}") == cfg
    # the settings were made on B too
    assert rest(b, "/pools/default/buckets/full")["evictionPolicy"] == "fullEviction"
    assert rest(b, "/pools/default/buckets/ttl")["maxTTL"] == 3600
    # each member's vbucket states follow each bucket's own map
    for name, nvb in NVB.items():
        sa, sb = states(a, name), states(b, name)
        assert sorted(sa.values()).count(VBucketState.ACTIVE) == nvb // 2
        for vb in range(nvb):
            assert {sa[vb], sb[vb]} == {VBucketState.ACTIVE, VBucketState.REPLICA}


def test_documents_written_by_map_land_on_both_actives_and_reach_the_replicas(ab):
    a, b = ab["a"], ab["b"]
    for name, nvb in NVB.items():
        where = ab["written"][name]
        assert set(where.values()) == {addr(a), addr(b)}, name  # both members hold actives
        wait_until(lambda: caught_up((a, b), name), timeout=30,
                   what=f"the replicas of bucket {name}")
        # a document read from either member: the replica holds what the active took
        smap = kv_map(a, name)["vBucketServerMap"]
        for key in list(where)[:10]:
            vb = vbucket_of(key.encode(), nvb)
            replica = smap["serverList"][smap["vBucketMap"][vb][1]]
            node = a if replica == addr(a) else b
            with opts_for(node, name).connect() as conn:
                rsp = conn.request(GenericRequest(op=Opcode.GET_REPLICA, key=key.encode(),
                                                  vbucket=vb))
                assert rsp.status == Status.SUCCESS, (name, key)
                assert json.loads(bytes(rsp.value))["bucket"] == name


def test_not_my_vbucket_follows_each_buckets_map(ab):
    a, b = ab["a"], ab["b"]
    for name, nvb in NVB.items():
        smap = kv_map(a, name)["vBucketServerMap"]
        key = next(iter(ab["written"][name]))
        vb = vbucket_of(key.encode(), nvb)
        active = smap["serverList"][smap["vBucketMap"][vb][0]]
        other = b if active == addr(a) else a
        rsp = get(other, name, key, nvb)
        assert rsp.status == Status.NOT_MY_VBUCKET, name
        # the answer carries the bucket's own map
        body = json.loads(bytes(rsp.value))
        assert body["name"] == name and len(body["vBucketServerMap"]["vBucketMap"]) == nvb
        assert get(a if other is b else b, name, key, nvb).status == Status.SUCCESS


def test_a_buckets_collections_reach_every_member(ab):
    a, b = ab["a"], ab["b"]
    r = run_cli("collection", "create", "inventory", "-b", "wide", node=a)
    assert r.returncode == 0, r.stderr
    r = run_cli("collection", "create", "inventory.hotels", "-b", "wide", node=a)
    assert r.returncode == 0, r.stderr
    for n in (a, b):
        scopes = {s["name"]: [c["name"] for c in s["collections"]]
                  for s in rest(n, "/pools/default/buckets/wide/scopes")["scopes"]}
        assert scopes.get("inventory") == ["hotels"], n.data_dir.name
    # the other buckets' manifests did not change
    names = {s["name"] for s in rest(b, "/pools/default/buckets/full/scopes")["scopes"]}
    assert names == {"_default"}


def test_cluster_status_shows_every_bucket(ab):
    a = ab["a"]
    r = run_cli("cluster", "status", "-c", addr(a), "--json", node=a)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["buckets"]) == set(NVB)
    same_fields(doc, "dcptool cluster status")
    for name, nvb in NVB.items():
        rows = doc["buckets"][name]["nodes"]
        assert doc["buckets"][name]["vbuckets"] == nvb
        assert [(r["active"], r["replica"]) for r in rows] == [(nvb // 2, nvb // 2)] * 2, name
    r = run_cli("cluster", "status", "-c", addr(a), node=a)
    assert r.returncode == 0, r.stderr
    for name in BUCKETS:
        assert f"Bucket {name}: map rev" in r.stdout


def test_a_bucket_edited_or_dropped_through_one_member_is_so_on_both(ab):
    a, b = ab["a"], ab["b"]
    # created with a plain REST POST (as an SDK's bucket manager or curl sends it)
    rest(b, "/pools/default/buckets", "POST",
         {"name": "scratch", "ramQuota": "100", "replicaNumber": "1", "numVBuckets": "64"})
    docs = [rest(n, "/pools/default/buckets/scratch") for n in (a, b)]
    assert docs[0]["vBucketServerMap"] == docs[1]["vBucketServerMap"]
    assert docs[0]["vBucketServerMap"]["serverList"] == [addr(a), addr(b)]
    assert docs[0]["numVBuckets"] == 64 and docs[0]["uuid"] != docs[1]["uuid"]
    r = run_cli("bucket", "edit", "scratch", "--max-ttl", "60", node=a)
    assert r.returncode == 0, r.stderr
    assert [rest(n, "/pools/default/buckets/scratch")["maxTTL"] for n in (a, b)] == [60, 60]
    r = run_cli("bucket", "drop", "scratch", node=b)
    assert r.returncode == 0, r.stderr
    for n in (a, b):
        assert rest_status(n, "/pools/default/buckets/scratch") == 404
        assert "scratch" not in {d["name"] for d in rest(n, "/pools/default/buckets")}
    assert not (a.data_dir / "buckets" / "scratch").exists()


def test_failover_loses_no_acknowledged_document_of_any_bucket(tmp_path):
    nodes = start_nodes(tmp_path, ["a", "b"], vbuckets=VBS)
    a, b = nodes["a"], nodes["b"]
    try:
        written = cluster_of_buckets(a, b, lambda name, i: {"n": i})
        for name in NVB:
            wait_until(lambda: caught_up((a, b), name), timeout=30,
                       what=f"the replicas of bucket {name}")
        logs_before = {}
        for name in NVB:
            with opts_for(a, name).connect() as conn:
                logs_before[name] = get_failover_logs(conn, list(range(NVB[name])))
        # connections that asked for map changes, one per bucket
        pushed = {}
        for name in NVB:
            c = Client(a.host, a.port)
            c.setup(a.username, a.password, bucket=name,
                    features=(Feature.XERROR, Feature.JSON, Feature.SELECT_BUCKET,
                              Feature.DUPLEX, Feature.CLUSTERMAP_CHANGE_NOTIFICATION))
            pushed[name] = c
        b.kill()
        # a bucket needs every member: with B gone, a create through A is refused and undone
        r = run_cli("bucket", "create", "late", "--ram-quota", "100", node=a)
        assert r.returncode != 0 and addr(b) in r.stderr and "Traceback" not in r.stderr
        assert rest_status(a, "/pools/default/buckets/late") == 404
        r = run_cli("cluster", "failover", "-c", addr(b), "--via", addr(a), "--json", node=a)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert set(doc["buckets"]) == set(NVB)
        same_fields(doc, "dcptool cluster failover")
        # each connection was pushed its own bucket's new map
        for name, c in pushed.items():
            while True:
                f = c.recv(timeout=10)
                if (f.magic, f.opcode) != (0x82, 0x01):
                    continue
                epoch, rev = struct.unpack(">QQ", f.extras)
                if rev == doc["rev"]:
                    break
            cfg = json.loads(f.value)
            assert epoch == 2 and f.key == name.encode() and cfg["name"] == name
            assert cfg["vBucketServerMap"]["serverList"] == [addr(a)]
            assert len(cfg["vBucketServerMap"]["vBucketMap"]) == NVB[name]
            c.close()
        for name, nvb in NVB.items():
            assert len(doc["buckets"][name]["promoted"]) == nvb // 2, name
            smap = kv_map(a, name)["vBucketServerMap"]
            assert smap["serverList"] == [addr(a)]
            assert all(chain[0] == 0 for chain in smap["vBucketMap"])
            assert set(states(a, name).values()) == {VBucketState.ACTIVE}
            # every acknowledged document is on A
            for key in written[name]:
                rsp = get(a, name, key, nvb)
                assert rsp.status == Status.SUCCESS, (name, key)
            # the promoted vbuckets started a new history (a new failover entry), per bucket
            with opts_for(a, name).connect() as conn:
                logs = get_failover_logs(conn, list(range(nvb)))
            for vb in map(int, doc["buckets"][name]["promoted"]):
                assert len(logs[vb]) == len(logs_before[name][vb]) + 1, (name, vb)
        # a bucket created on what is left of the cluster is mapped there too
        r = run_cli("bucket", "create", "late", "--ram-quota", "100", node=a)
        assert r.returncode == 0, r.stderr
        cfg = kv_map(a, "late")
        assert cfg["vBucketServerMap"]["serverList"] == [addr(a)]
        assert cfg["dcptoolMapRev"] == doc["rev"]
        # each bucket's map is kept in its data directory: A restarts with every one
        assert (a.data_dir / "buckets" / "wide" / "cluster.json").exists()
        member = addr(a)
        a.restart()  # (on new ports; the map keeps naming A as it did)
        for name, nvb in NVB.items():
            smap = kv_map(a, name)["vBucketServerMap"]
            assert smap["serverList"] == [member] and len(smap["vBucketMap"]) == nvb
            assert set(states(a, name).values()) == {VBucketState.ACTIVE}
            assert get(a, name, next(iter(written[name])), nvb).status == Status.SUCCESS
    finally:
        stop_nodes(nodes)


def test_cluster_create_refuses_unshared_buckets_maps_shared_ones_and_move_takes_any(tmp_path):
    nodes = start_nodes(tmp_path, ["a", "b"], vbuckets=VBS)
    a, b = nodes["a"], nodes["b"]
    try:
        r = run_cli("bucket", "create", "lonely", "--ram-quota", "100", node=a)
        assert r.returncode == 0, r.stderr
        r = run_cli("cluster", "create", "-c", addr(a), "-c", addr(b), node=a)
        assert r.returncode != 0
        line = r.stderr.strip()
        assert "\n" not in line and "Traceback" not in r.stderr
        assert "lonely" in line and addr(b) in line
        r = run_cli("bucket", "create", "lonely", "--ram-quota", "100", "--num-vbuckets",
                    "64", node=b)
        assert r.returncode == 0, r.stderr
        r = run_cli("cluster", "create", "-c", addr(a), "-c", addr(b), node=a)
        assert r.returncode != 0
        line = r.stderr.strip()
        assert "\n" not in line and "lonely" in line and "vbucket counts" in line
        # nothing was mapped: both still alone
        assert kv_map(a, "default")["vBucketServerMap"]["serverList"] == [addr(a)]
        # the same bucket on both (made before the cluster): mapped with the others
        r = run_cli("bucket", "drop", "lonely", node=b)
        assert r.returncode == 0, r.stderr
        r = run_cli("bucket", "create", "lonely", "--ram-quota", "100", "--replicas", "1",
                    node=b)
        assert r.returncode == 0, r.stderr
        r = run_cli("cluster", "create", "-c", addr(a), "-c", addr(b), "--json", node=a)
        assert r.returncode == 0, r.stderr
        assert sorted(json.loads(r.stdout)["buckets"]) == ["default", "lonely"]
        same_fields(json.loads(r.stdout), "dcptool cluster create")
        for n in (a, b):
            smap = kv_map(n, "lonely")["vBucketServerMap"]
            # A's copy says replicaNumber 0: fewer than the cluster's 1, so none
            assert smap["serverList"] == [addr(a), addr(b)] and smap["numReplicas"] == 0
            assert len(smap["vBucketMap"]) == VBS
            assert {tuple(c) for c in smap["vBucketMap"]} == {(0,), (1,)}
        # a vbucket of that bucket moves to B (which held no copy): only its map changes
        keys = [k for k in (f"m{i:03d}" for i in range(200)) if vbucket_of(k.encode(), VBS) == 0]
        assert kv_map(a, "lonely")["vBucketServerMap"]["vBucketMap"][0] == [0]
        write_by_map([a, b], "lonely", {k: {"k": k} for k in keys})
        r = run_cli("cluster", "move", "-b", "lonely", "-c", addr(a), "--vbuckets", "0",
                    "--to", addr(b), "--json", node=a)
        assert r.returncode == 0, r.stderr
        assert [m["vbucket"] for m in json.loads(r.stdout)["moved"]] == [0]
        for n in (a, b):
            assert kv_map(n, "lonely")["vBucketServerMap"]["vBucketMap"][0] == [1]
            assert kv_map(n, "default")["vBucketServerMap"]["vBucketMap"][0] == [0, 1]
        assert all(get(b, "lonely", k, VBS).status == Status.SUCCESS for k in keys)
        assert get(a, "lonely", keys[0], VBS).status == Status.NOT_MY_VBUCKET
    finally:
        stop_nodes(nodes)
