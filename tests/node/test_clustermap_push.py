"""Cluster maps as SDKs expect them, against real node processes: the global configuration
without a bucket (GCCCP), and the map pushed to connections that asked for it with HELLO
DUPLEX + CLUSTERMAP_CHANGE_NOTIFICATION (full) or _BRIEF (the revision only)."""
from __future__ import annotations

import json
import struct

from dcptool.protocol.constants import Feature, Opcode, Status

from .mcbputil import Client, connect

BASE = (Feature.XERROR, Feature.JSON, Feature.SELECT_BUCKET)


def test_get_cluster_config_without_a_bucket_is_the_global_config(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        c.setup(bucket="", features=BASE)
        f = c.call(Opcode.GET_CLUSTER_CONFIG)
        assert f.status == Status.SUCCESS
        cfg = json.loads(f.value)
        assert "vBucketServerMap" not in cfg and "name" not in cfg
        assert cfg["revEpoch"] == 1 and cfg["rev"] >= 1
        assert cfg["nodesExt"][0]["services"]["kv"] == shared_node.port
        assert cfg["nodesExt"][0]["thisNode"] is True
        assert c.select_bucket().status == Status.SUCCESS
        bucket = json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)
        assert (bucket["revEpoch"], bucket["rev"]) == (cfg["revEpoch"], cfg["rev"])


def test_notification_needs_duplex(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        f = c.call(Opcode.HELLO, key=b"t",
                   value=struct.pack(">H", Feature.CLUSTERMAP_CHANGE_NOTIFICATION))
        assert f.status == Status.EINVAL


def _notification(c: Client):
    f = c.recv(timeout=10)
    assert (f.magic, f.opcode) == (0x82, 0x01), f
    epoch, rev = struct.unpack(">QQ", f.extras)
    return f, epoch, rev


def test_a_changed_map_is_pushed_full_and_brief(node_factory):
    node = node_factory(vbuckets=4)
    full = connect(node, features=BASE + (Feature.DUPLEX, Feature.CLUSTERMAP_CHANGE_NOTIFICATION))
    brief = connect(node, features=BASE + (Feature.DUPLEX,
                                           Feature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF))
    plain = connect(node, features=BASE)
    before = json.loads(plain.call(Opcode.GET_CLUSTER_CONFIG).value)["rev"]
    # another connection changes a vbucket's state: the map clients see changed
    assert plain.call(Opcode.SET_VBUCKET, extras=b"\x02",
                      vbucket=1).status == Status.SUCCESS
    f, epoch, rev = _notification(full)
    assert epoch == 1 and rev > before and f.key == b"default"
    cfg = json.loads(f.value)
    assert cfg["rev"] == rev and cfg["vBucketServerMap"]["vBucketMap"][1] == [-1]
    full.send(struct.pack(">BBHBBHIIQ", 0x83, 0x01, 0, 0, 0, 0, 0, f.opaque, 0))  # the answer
    f, epoch, rev2 = _notification(brief)
    assert rev2 == rev and f.value == b"" and f.key == b"default"
    # the node still serves the answering connection; the other got nothing pushed
    assert full.call(Opcode.NOOP).status == Status.SUCCESS
    assert plain.call(Opcode.NOOP).status == Status.SUCCESS and not plain.backlog
    # each revision once: back to active is the next one
    plain.call(Opcode.SET_VBUCKET, extras=b"\x01", vbucket=1)
    assert _notification(full)[2] > rev
    for c in (full, brief, plain):
        c.close()
