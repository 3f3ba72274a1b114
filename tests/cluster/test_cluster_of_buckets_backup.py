"""A whole cluster backed up and built again: two real node processes with three buckets of
different settings, collections and users with bucket-scoped roles, backed up into one
cluster archive (full, then incremental after a bucket was dropped and created again) and
restored into an empty two-node cluster with --auto-create-buckets --enable-users.

Source: A and B, `dcptool cluster create --replicas 1`, then through A the buckets `full`
(fullEviction), `ttl` (maxTTL 3600) and `wide` (64 vbuckets), a scope and collection in
`full`, documents in every bucket (by each bucket's map), and the users ann
(data_reader[full]) and bob (data_backup[wide]) made over Couchbase's RBAC REST endpoint on
A: each is made on both members. Target: C and D, one cluster of their first bucket only.
After the restore the target cluster has, on both members, the same buckets with the same
settings, the same collections, the same documents with their metadata (cas, revision,
flags, expiry), and ann and bob log in to either member with their passwords. An old
single-bucket archive of the source's first bucket keeps working beside it.
"""
from __future__ import annotations

import json

from client.nodeutil import run_cli
from clusterutil import addr, rest, start_nodes, stop_nodes
from docutil import node_documents, opts_for

from dcptool.client.options import ConnOptions
from dcptool.protocol.collections import split_doc_key

BUCKETS = {
    "full": ("--eviction-policy", "fullEviction", "--replicas", "1", "--num-vbuckets", "8"),
    "ttl": ("--max-ttl", "3600", "--replicas", "1", "--num-vbuckets", "8"),
    "wide": ("--num-vbuckets", "64", "--replicas", "1"),
}
USERS = {"ann": ("ann-secret-1", "data_reader[full]"), "bob": ("bob-secret-2", "data_backup[wide]")}


def ok(*args, node, timeout: float = 240):
    r = run_cli(*args, node=node, timeout=timeout)
    assert r.returncode == 0, (args, r.stderr)
    return r


def cluster_documents(members, bucket: str) -> dict[tuple[str, bytes], tuple]:
    """Every document of `bucket` in the cluster (each member's active vbuckets), by
    ("scope.collection", key): collection ids are each cluster's own."""
    names = {c["uid"]: f"{s['name']}.{c['name']}"
             for s in rest(members[0], f"/pools/default/buckets/{bucket}/scopes")["scopes"]
             for c in s["collections"]}
    out: dict[tuple[str, bytes], tuple] = {}
    for m in members:
        for dkey, doc in node_documents(opts_for(m, bucket), collections=True).items():
            cid, key = split_doc_key(dkey)
            out[(names[format(cid, "x")], key)] = doc
    return out


def settings(node, bucket: str) -> dict:
    doc = rest(node, f"/pools/default/buckets/{bucket}")
    return {k: doc.get(k) for k in ("evictionPolicy", "maxTTL", "numVBuckets", "replicaNumber",
                                    "conflictResolutionType", "compressionMode")}


def collections(node, bucket: str) -> dict[str, list[str]]:
    doc = rest(node, f"/pools/default/buckets/{bucket}/scopes")
    return {s["name"]: sorted(c["name"] for c in s["collections"]) for s in doc["scopes"]}


def test_a_two_node_cluster_of_three_buckets_is_backed_up_and_built_again(tmp_path, on_engine):
    nodes = start_nodes(tmp_path, ["a", "b", "c", "d"], vbuckets=8)
    a, b, c, d = (nodes[n] for n in "abcd")
    try:
        ok("cluster", "create", "-c", addr(a), "-c", addr(b), "--replicas", "1", node=a)
        ok("cluster", "create", "-c", addr(c), "-c", addr(d), "--replicas", "1", node=c)
        for name, args in BUCKETS.items():
            ok("bucket", "create", name, "--ram-quota", "100", *args, node=a)
        ok("collection", "create", "inventory", "-b", "full", node=a)
        ok("collection", "create", "inventory.hotels", "-b", "full", node=a)
        for name in ("default", *BUCKETS):
            ok("doc", "load", "--count", "60", "-b", name, "-q", node=a)
        ok("doc", "load", "--count", "25", "--prefix", "hotel::", "-b", "full", "--collection",
           "inventory.hotels", "-q", node=b)
        for user, (password, role) in USERS.items():  # through A: made on both members
            rest(a, f"/settings/rbac/users/local/{user}", "PUT",
                 {"password": password, "roles": role})
        assert {u["id"] for u in rest(b, "/settings/rbac/users")} >= set(USERS)
        # an old single-bucket archive of the first bucket, taken before
        old = tmp_path / "old-default"
        ok("backup", "-c", addr(a), "-b", "default", str(old), "--no-watermark", "-q", node=a)

        archive = tmp_path / "cluster"
        full = json.loads(ok("backup", "-c", addr(a), str(archive), "--all-buckets", "--json",
                             node=a).stdout)
        assert sorted(full["buckets"]) == ["default", "full", "ttl", "wide"]
        assert {x["status"] for x in full["buckets"].values()} == {"full"}
        assert full["buckets"]["full"]["backup"]["mutations"] == 85

        # between the backups: changes, and ttl dropped and created again (through B)
        ok("doc", "load", "--count", "10", "--prefix", "more::", "-b", "wide", "-q", node=a)
        ok("doc", "delete", "doc::3", "-b", "full", node=a)
        ok("bucket", "drop", "ttl", node=b)
        ok("bucket", "create", "ttl", "--ram-quota", "100", *BUCKETS["ttl"], node=b)
        ok("doc", "load", "--count", "7", "--prefix", "again::", "-b", "ttl", "-q", node=a)
        incr = json.loads(ok("backup", "-c", addr(b), str(archive), "--json",
                             node=b).stdout)
        assert incr["buckets"]["wide"]["status"] == "incremental"
        assert incr["buckets"]["wide"]["backup"]["mutations"] == 10
        assert incr["buckets"]["ttl"]["status"] == "recreated"
        assert incr["buckets"]["default"]["backup"]["mutations"] == 0

        source = {n: cluster_documents([a, b], n) for n in ("default", *BUCKETS)}
        r = ok("restore", str(archive), "-c", addr(c), "--auto-create-buckets",
               "--enable-users", "--json", node=c)
        done = json.loads(r.stdout)
        assert sorted(done["created_buckets"]) == sorted(BUCKETS)
        for member in (c, d):  # every member of the target has the buckets and users
            assert {x["name"] for x in rest(member, "/pools/default/buckets")} == \
                {"default", *BUCKETS}
            for name in BUCKETS:
                assert settings(member, name) == settings(a, name), (member.port, name)
            assert collections(member, "full") == collections(a, "full")
            assert {u["id"] for u in rest(member, "/settings/rbac/users")} >= set(USERS)
        for name, docs in source.items():
            assert cluster_documents([c, d], name) == docs, name
        assert len(source["ttl"]) == 7 and len(source["full"]) == 85
        # the archive compares equal with the target cluster, every bucket of it
        r = ok("verify", str(archive), "--against", "-c", addr(d), "--json", node=d)
        assert json.loads(r.stdout)["ok"] is True, r.stdout
        assert [v[0] for v in source["full"].values()].count("deleted") == 1  # doc::3
        # the users log in to either member with their passwords, in their buckets
        for member in (c, d):
            for user, (password, role) in USERS.items():
                bucket = role[role.index("[") + 1:-1]
                with ConnOptions(member.host, member.port, user, password,
                                 bucket=bucket).connect():
                    pass
        # the old single-bucket archive still reads, verifies, takes an incremental backup
        # and compares equal with the target's restored first bucket
        ok("info", str(old), node=a)
        ok("verify", str(old), node=a)
        more = json.loads(ok("backup", "-c", addr(a), "-b", "default", str(old), "--json",
                             "--no-watermark", node=a).stdout)
        assert more["type"] == "incremental" and more["mutations"] == 0
        ok("verify", str(old), "--against", "-c", addr(c), "-b", "default", node=c)
    finally:
        stop_nodes(nodes)
