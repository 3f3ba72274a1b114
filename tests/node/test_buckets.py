"""Many buckets in one node, against real node processes: creating them over REST with
Couchbase's settings and validation errors, SELECT_BUCKET, documents and DCP streams that
stay in their bucket, the bucket maxTTL, drop and recreate (a new uuid, no old documents),
a restart keeping every bucket, and a one-bucket data directory opening unchanged."""
from __future__ import annotations

import json
import struct
import time

import pytest

from client.nodeutil import run_cli
from dcptool.protocol.constants import Opcode, Status
from nodeprocutil import NodeProcess
from restutil import rest_request

from .dcputil import DcpClient
from .mcbputil import Client

VBS = 16
ADMIN = ("Administrator", "password")
#: the three buckets the module's node gets: (name, form)
BUCKETS = {
    "evicted": {"ramQuota": "128", "evictionPolicy": "fullEviction", "replicaNumber": "1",
                "compressionMode": "active", "durabilityMinLevel": "majority"},
    "capped": {"ramQuotaMB": "100", "maxTTL": "3600", "conflictResolutionType": "lww",
               "flushEnabled": "1"},
    "small": {"ramQuota": "100", "numVBuckets": "64", "bucketType": "couchbase"},
}


def rest(node, method: str, path: str, form: dict | None = None, auth=ADMIN):
    """(status, body bytes) of a REST request with a form body."""
    return rest_request(node, method, path, form, auth=auth, timeout=30)


def get_json(node, path: str):
    status, body = rest(node, "GET", path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def create(node, name: str, **form) -> None:
    status, body = rest(node, "POST", "/pools/default/buckets", {"name": name, **form})
    assert status == 202, (status, body)


def client(node, bucket: str, vbuckets: int = VBS) -> Client:
    return Client(node.host, node.port, vbuckets=vbuckets).setup(bucket=bucket)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("buckets") / "node", vbuckets=VBS) as n:
        for name, form in BUCKETS.items():
            create(n, name, **form)
        yield n


def test_three_buckets_read_back_with_their_settings(node):
    docs = {d["name"]: d for d in get_json(node, "/pools/default/buckets")}
    assert list(docs) == ["default", "evicted", "capped", "small"]
    ev, cap, small = docs["evicted"], docs["capped"], docs["small"]
    assert ev["evictionPolicy"] == "fullEviction" and ev["quota"]["ram"] == 128 * 1024 * 1024
    assert ev["replicaNumber"] == 1 and ev["compressionMode"] == "active"
    assert ev["durabilityMinLevel"] == "majority" and ev["numVBuckets"] == VBS
    assert cap["maxTTL"] == 3600 and cap["conflictResolutionType"] == "lww"
    assert cap["evictionPolicy"] == "valueOnly" and "flush" in cap["controllers"]
    assert small["numVBuckets"] == 64 and len(small["vBucketServerMap"]["vBucketMap"]) == 64
    assert small["bucketType"] == "membase"
    assert len({d["uuid"] for d in docs.values()}) == 4
    one = get_json(node, "/pools/default/buckets/small")
    assert one["uuid"] == small["uuid"]
    assert get_json(node, "/pools/default/b/capped")["name"] == "capped"
    assert get_json(node, "/pools/default/buckets/evicted/scopes")["scopes"]
    assert rest(node, "GET", "/pools/default/buckets/nosuch")[0] == 404
    assert rest(node, "GET", "/pools/default/b/nosuch")[0] == 404


@pytest.mark.parametrize("form, field", [
    ({"name": "", "ramQuota": "100"}, "name"),
    ({"name": "bad name!", "ramQuota": "100"}, "name"),
    ({"name": ".dot", "ramQuota": "100"}, "name"),
    ({"name": "evicted", "ramQuota": "100"}, "name"),
    ({"name": "q"}, "ramQuota"),
    ({"name": "q", "ramQuota": "50"}, "ramQuota"),
    ({"name": "q", "ramQuota": "x"}, "ramQuota"),
    ({"name": "q", "ramQuota": "100", "evictionPolicy": "nru"}, "evictionPolicy"),
    ({"name": "q", "ramQuota": "100", "replicaNumber": "4"}, "replicaNumber"),
    ({"name": "q", "ramQuota": "100", "maxTTL": "-5"}, "maxTTL"),
    ({"name": "q", "ramQuota": "100", "compressionMode": "max"}, "compressionMode"),
    ({"name": "q", "ramQuota": "100", "conflictResolutionType": "x"}, "conflictResolutionType"),
    ({"name": "q", "ramQuota": "100", "durabilityMinLevel": "all"}, "durabilityMinLevel"),
    ({"name": "q", "ramQuota": "100", "numVBuckets": "100"}, "numVBuckets"),
    ({"name": "q", "ramQuota": "100", "bucketType": "memcached"}, "bucketType"),
])
def test_create_errors_as_couchbase_answers_them(node, form, field):
    status, body = rest(node, "POST", "/pools/default/buckets", form)
    assert status == 400, body
    assert field in json.loads(body)["errors"]
    assert "q" not in {d["name"] for d in get_json(node, "/pools/default/buckets")}


def test_edit_changes_what_couchbase_lets_change(node):
    status, _ = rest(node, "POST", "/pools/default/buckets/small",
                     {"compressionMode": "off", "ramQuota": "200"})
    assert status == 200
    doc = get_json(node, "/pools/default/buckets/small")
    assert doc["compressionMode"] == "off" and doc["quota"]["ram"] == 200 * 1024 * 1024
    for form, field in (({"conflictResolutionType": "lww"}, "conflictResolutionType"),
                        ({"numVBuckets": "1024"}, "numVBuckets"),
                        ({"maxTTL": "x"}, "maxTTL")):
        status, body = rest(node, "POST", "/pools/default/buckets/small", form)
        assert status == 400 and field in json.loads(body)["errors"], body
    assert rest(node, "POST", "/pools/default/buckets/nosuch", {"maxTTL": "1"})[0] == 404
    # the first bucket's eviction and quota are the node's options
    status, body = rest(node, "POST", "/pools/default/buckets/default",
                        {"evictionPolicy": "fullEviction"})
    assert status == 400 and "evictionPolicy" in json.loads(body)["errors"]


def test_changing_buckets_needs_the_admin_role(node):
    reader = ("rd", "rd-pw-4242")
    r = run_cli("node", "user", "add", reader[0], "--role", "reader", "--data",
                str(node.data_dir), env_extra={"DCPTOOL_PASSWORD": reader[1]})
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 10
    while rest(node, "GET", "/pools/default/buckets", auth=reader)[0] != 200:
        assert time.monotonic() < deadline, "the node did not read the new user"
        time.sleep(0.1)
    status, body = rest(node, "POST", "/pools/default/buckets",
                        {"name": "x", "ramQuota": "100"}, auth=reader)
    assert status == 403, body
    assert rest(node, "POST", "/pools/default/buckets/small", {"maxTTL": "1"},
                auth=reader)[0] == 403
    assert rest(node, "DELETE", "/pools/default/buckets/small", auth=reader)[0] == 403
    assert "small" in {d["name"] for d in get_json(node, "/pools/default/buckets")}


def test_select_bucket_keeps_documents_in_their_bucket(node):
    c = Client(node.host, node.port, vbuckets=VBS).setup(bucket="")
    assert c.select_bucket("nosuch").status == Status.KEY_ENOENT
    for name in ("default", "evicted", "capped"):
        assert c.select_bucket(name).status == Status.SUCCESS
        assert c.set(b"only-" + name.encode(), name.encode()).status == Status.SUCCESS
        assert c.set(b"shared", name.encode()).status == Status.SUCCESS
    s = client(node, "small", 64)
    assert s.set(b"shared", b"small").status == Status.SUCCESS
    for name in ("default", "evicted", "capped"):
        assert c.select_bucket(name).status == Status.SUCCESS
        assert c.get(b"shared").value == name.encode()
        for other in ("default", "evicted", "capped"):
            f = c.get(b"only-" + other.encode())
            assert (f.status == Status.SUCCESS) == (other == name), (name, other)
    assert s.get(b"shared").value == b"small"
    policies = {}
    for name in ("default", "evicted"):
        assert c.select_bucket(name).status == Status.SUCCESS
        policies[name] = c.stats()["ep_item_eviction_policy"]
    assert policies == {"default": "value_only", "evicted": "full_eviction"}
    cfg = json.loads(s.call(Opcode.GET_CLUSTER_CONFIG).value)
    assert cfg["name"] == "small" and len(cfg["vBucketServerMap"]["vBucketMap"]) == 64
    c.close()
    s.close()


def test_dcp_stream_sees_only_its_bucket(node):
    w = client(node, "evicted")
    keys = {b"dcp-%d" % i for i in range(20)}
    for k in keys:
        assert w.set(k, b"v").status == Status.SUCCESS
    d = client(node, "default")
    assert d.set(b"dcp-other", b"v").status == Status.SUCCESS
    seqnos = w.stats("vbucket-seqno")
    dcp = DcpClient(node.host, node.port, vbuckets=VBS).setup(bucket="evicted")
    assert dcp.open("only-evicted").status == Status.SUCCESS
    streams = 0
    for vb in range(VBS):
        high = int(seqnos[f"vb_{vb}:high_seqno"])
        if high:
            assert dcp.stream_req(vb, end=high).status == Status.SUCCESS
            streams += 1
    dcp.drain(streams=streams)
    seen = {bytes(m.key) for lg in dcp.logs.values() for m in lg.items}
    assert keys <= seen and b"dcp-other" not in seen
    assert all(k.startswith(b"dcp-") or k.startswith(b"only-") or k == b"shared" for k in seen)
    for c in (w, d, dcp):
        c.close()


def test_bucket_max_ttl_applies_to_documents_without_expiry(node):
    c = client(node, "capped")
    now = time.time()
    assert c.set(b"no-expiry", b"v").status == Status.SUCCESS
    assert c.set(b"far", b"v", expiry=int(now) + 86400).status == Status.SUCCESS
    assert c.set(b"near", b"v", expiry=60).status == Status.SUCCESS
    exp = {}
    for k in (b"no-expiry", b"far", b"near"):
        f = c.call(Opcode.GET_META, key=k, vbucket=c.vb(k))
        assert f.status == Status.SUCCESS, f
        exp[k] = struct.unpack(">IIIQ", bytes(f.extras)[:20])[2]
    assert now + 3590 <= exp[b"no-expiry"] <= now + 3610
    assert now + 3590 <= exp[b"far"] <= now + 3610
    assert now + 50 <= exp[b"near"] <= now + 70
    d = client(node, "default")
    assert d.set(b"no-expiry", b"v").status == Status.SUCCESS
    f = d.call(Opcode.GET_META, key=b"no-expiry", vbucket=d.vb(b"no-expiry"))
    assert struct.unpack(">IIIQ", bytes(f.extras)[:20])[2] == 0
    c.close()
    d.close()


def test_drop_and_recreate_gives_a_new_uuid_and_no_old_documents(node):
    create(node, "scratch", ramQuota="100")
    uuid = get_json(node, "/pools/default/buckets/scratch")["uuid"]
    c = client(node, "scratch")
    assert c.set(b"old", b"v").status == Status.SUCCESS
    bucket_dir = node.data_dir / "buckets" / "scratch"
    assert (bucket_dir / "data.sqlite3").exists()
    assert rest(node, "DELETE", "/pools/default/buckets/scratch")[0] == 200
    assert not bucket_dir.exists()
    assert rest(node, "GET", "/pools/default/buckets/scratch")[0] == 404
    assert rest(node, "DELETE", "/pools/default/buckets/scratch")[0] == 404
    assert rest(node, "DELETE", "/pools/default/buckets/default")[0] == 400
    # the connection that selected the dropped bucket was closed
    with pytest.raises((ConnectionError, OSError, EOFError, AssertionError)):
        c.get(b"old")
    c.close()
    create(node, "scratch", ramQuota="100")
    assert get_json(node, "/pools/default/buckets/scratch")["uuid"] != uuid
    c = client(node, "scratch")
    assert c.get(b"old").status == Status.KEY_ENOENT
    c.close()


def test_restart_keeps_every_bucket(tmp_path):
    with NodeProcess(tmp_path / "node", vbuckets=VBS) as n:
        create(n, "second", ramQuota="100", evictionPolicy="fullEviction", maxTTL="600")
        create(n, "third", ramQuota="100", numVBuckets="64")
        before = {d["name"]: d for d in get_json(n, "/pools/default/buckets")}
        for name, vbs in (("default", VBS), ("second", VBS), ("third", 64)):
            c = client(n, name, vbs)
            assert c.set(b"k", name.encode()).status == Status.SUCCESS
            c.close()
        # a new eviction policy restarts the bucket: its connections close, its data stays
        c = client(n, "third", 64)
        assert c.stats()["ep_item_eviction_policy"] == "value_only"
        status, _ = rest(n, "POST", "/pools/default/buckets/third",
                         {"evictionPolicy": "fullEviction"})
        assert status == 200
        with pytest.raises((ConnectionError, OSError, EOFError, AssertionError)):
            c.get(b"k")
        c.close()
        c = client(n, "third", 64)
        assert c.stats()["ep_item_eviction_policy"] == "full_eviction"
        assert c.get(b"k").value == b"third"
        c.close()
        assert get_json(n, "/pools/default/buckets/third")["uuid"] == before["third"]["uuid"]
        n.restart()
        after = {d["name"]: d for d in get_json(n, "/pools/default/buckets")}
        assert list(after) == ["default", "second", "third"]
        for name, vbs in (("default", VBS), ("second", VBS), ("third", 64)):
            assert after[name]["uuid"] == before[name]["uuid"]
            c = client(n, name, vbs)
            assert c.get(b"k").value == name.encode()
            c.close()
        assert after["second"]["evictionPolicy"] == "fullEviction"
        assert after["second"]["maxTTL"] == 600 and after["third"]["numVBuckets"] == 64
        # the eviction policy edited before the restart is still the bucket's
        c = client(n, "third", 64)
        assert c.stats()["ep_item_eviction_policy"] == "full_eviction"
        c.close()


def test_one_bucket_data_directory_opens_unchanged(tmp_path):
    data = tmp_path / "node"
    with NodeProcess(data, vbuckets=VBS) as n:
        c = client(n, "default")
        assert c.set(b"kept", b"v").status == Status.SUCCESS
        c.close()
        uuid = get_json(n, "/pools/default/buckets/default")["uuid"]
    # a directory as a one-bucket node left it: its data in DIR, no registry
    (data / "buckets.json").unlink()
    assert (data / "data.sqlite3").exists() and not (data / "buckets").exists()
    with NodeProcess(data, vbuckets=VBS) as n:
        docs = get_json(n, "/pools/default/buckets")
        assert [d["name"] for d in docs] == ["default"] and docs[0]["uuid"] == uuid
        c = client(n, "default")
        assert c.get(b"kept").value == b"v"
        c.close()
