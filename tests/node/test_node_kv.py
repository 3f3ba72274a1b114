"""End to end: a real node process, talked to over TCP: logins, KV, meta, stats, cluster map."""
from __future__ import annotations

import json
import struct
import time

import pytest

from dcptool.protocol import decode_message
from dcptool.protocol.constants import Datatype, Feature, MetaOption, Opcode, Status
from dcptool.protocol.messages import DelWithMeta, GetMeta, SetWithMeta

from .mcbputil import Client, connect

GET_META = struct.Struct(">IIIQ")


def meta_of(c: Client, key: bytes):
    f = c.call_msg(GetMeta(key=key, vbucket=c.vb(key), opaque=c.next_opaque(), version=2))
    if f.status:
        return f.status, None
    deleted, flags, exp, rev = GET_META.unpack_from(f.extras)
    return f.status, {"deleted": deleted, "flags": flags, "expiry": exp, "rev": rev,
                      "cas": f.cas, "datatype": f.extras[20]}


# -- logins ------------------------------------------------------------------------------


@pytest.mark.parametrize("mech", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_login_succeeds_and_server_signature_verifies(shared_node, mech):
    with Client(shared_node.host, shared_node.port) as c:
        f = c.auth_scram("Administrator", "password", mech)
        assert f.status == Status.SUCCESS
        assert f.value.startswith(b"v=")
        assert c.select_bucket().status == Status.SUCCESS


def test_plain_login_succeeds(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        assert c.auth_plain("Administrator", "password").status == Status.SUCCESS


@pytest.mark.parametrize("mech", ["PLAIN", "SCRAM-SHA512"])
def test_wrong_password_fails_with_auth_error(shared_node, mech):
    with Client(shared_node.host, shared_node.port) as c:
        if mech == "PLAIN":
            f = c.auth_plain("Administrator", "not-the-password")
        else:
            f = c.auth_scram("Administrator", "not-the-password", mech)
        assert f.status == Status.AUTH_ERROR
        # unknown users fail the same way
        assert c.auth_plain("nobody", "password").status == Status.AUTH_ERROR
        # and the connection may try again
        assert c.auth_plain("Administrator", "password").status == Status.SUCCESS


def test_sasl_list_mechs(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        f = c.call(Opcode.SASL_LIST_MECHS)
        assert f.value.split() == [b"SCRAM-SHA512", b"SCRAM-SHA256", b"SCRAM-SHA1", b"PLAIN"]


def test_before_login_only_session_commands_are_allowed(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        assert c.call(Opcode.VERSION).value[:1].isdigit()
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
        c.hello(Feature.XERROR)
        assert c.call(Opcode.GET_ERROR_MAP, value=b"\x00\x01").status == Status.SUCCESS
        assert c.set(b"k", b"v").status == Status.EACCESS
        assert c.call(Opcode.SELECT_BUCKET, key=b"default").status == Status.EACCESS
    # without XERROR the node disconnects instead of answering EACCESS
    with Client(shared_node.host, shared_node.port) as c:
        c.request(Opcode.GET, key=b"k")
        with pytest.raises(ConnectionError):
            c.recv(timeout=5)


def test_select_unknown_bucket_is_key_enoent(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        c.hello(Feature.XERROR)
        c.auth_plain("Administrator", "password")
        assert c.select_bucket("nope").status == Status.KEY_ENOENT
        # no bucket selected yet: KV commands get NO_BUCKET
        assert c.set(b"k", b"v").status == Status.NO_BUCKET
        assert c.select_bucket("default").status == Status.SUCCESS


# -- HELLO, error map, unknown commands ---------------------------------------------------------


def test_hello_echoes_what_the_node_implements(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        asked = [Feature.TCP_NODELAY, Feature.MUTATION_SEQNO, Feature.XATTR, Feature.XERROR,
                 Feature.SELECT_BUCKET, Feature.JSON, Feature.SNAPPY, Feature.COLLECTIONS,
                 Feature.DUPLEX, Feature.TRACING, 0x7777]
        got = c.hello(*asked)
        assert got == sorted([Feature.TCP_NODELAY, Feature.MUTATION_SEQNO, Feature.XATTR,
                              Feature.XERROR, Feature.SELECT_BUCKET, Feature.JSON,
                              Feature.SNAPPY, Feature.COLLECTIONS, Feature.DUPLEX])
        # ClustermapChangeNotification without Duplex is an invalid combination
        f = c.call(Opcode.HELLO, key=b"x", value=struct.pack(">H", 0x0D))
        assert f.status == Status.EINVAL


@pytest.mark.parametrize("version", [1, 2])
def test_error_map_is_valid_json(shared_node, version):
    with Client(shared_node.host, shared_node.port) as c:
        f = c.call(Opcode.GET_ERROR_MAP, value=struct.pack(">H", version))
        assert f.status == Status.SUCCESS
        doc = json.loads(f.value)
        assert doc["version"] == version and doc["revision"] >= 1
        for code in ("0", "1", "2", "7", "20", "23", "81"):
            assert {"name", "desc", "attrs"} <= set(doc["errors"][code])


def test_unknown_opcode_gets_unknown_command(shared_node):
    with connect(shared_node) as c:
        for op in (0x45, 0xDA, 0xFD):
            assert c.call(op).status == Status.UNKNOWN_COMMAND
        assert c.call(Opcode.NOOP).status == Status.SUCCESS


# -- SET / GET / DELETE ---------------------------------------------------------------------------


def test_set_get_delete_with_cas(shared_node):
    with connect(shared_node) as c:
        f = c.set(b"doc-1", b'{"a": 1}', flags=0x01020304)
        assert f.status == Status.SUCCESS and f.cas
        cas1 = f.cas
        g = c.get(b"doc-1")
        assert (g.status, g.value, g.cas) == (Status.SUCCESS, b'{"a": 1}', cas1)
        assert struct.unpack(">I", g.extras)[0] == 0x01020304
        assert g.datatype == Datatype.JSON
        # a wrong CAS is refused, the right one accepted
        assert c.set(b"doc-1", b"x", cas=cas1 + 1).status == Status.KEY_EEXISTS
        f2 = c.set(b"doc-1", b"two", cas=cas1)
        assert f2.status == Status.SUCCESS and f2.cas > cas1
        assert c.delete(b"doc-1", cas=cas1).status == Status.KEY_EEXISTS
        d = c.delete(b"doc-1", cas=f2.cas)
        assert d.status == Status.SUCCESS and d.cas > f2.cas
        assert c.get(b"doc-1").status == Status.KEY_ENOENT
        assert c.delete(b"doc-1").status == Status.KEY_ENOENT
        # CAS on a missing key
        assert c.set(b"doc-1", b"x", cas=12345).status == Status.KEY_ENOENT


def test_add_and_replace(shared_node):
    with connect(shared_node) as c:
        assert c.set(b"ar", b"1", opcode=Opcode.REPLACE).status == Status.KEY_ENOENT
        assert c.set(b"ar", b"1", opcode=Opcode.ADD).status == Status.SUCCESS
        assert c.set(b"ar", b"2", opcode=Opcode.ADD).status == Status.KEY_EEXISTS
        assert c.set(b"ar", b"3", opcode=Opcode.REPLACE).status == Status.SUCCESS
        assert c.get(b"ar").value == b"3"


def test_quiet_commands_answer_only_failures(shared_node):
    with connect(shared_node) as c:
        ext = struct.pack(">II", 0, 0)
        c.request(Opcode.SETQ, key=b"q1", value=b"v", extras=ext, vbucket=c.vb(b"q1"))
        c.request(Opcode.ADDQ, key=b"q1", value=b"v", extras=ext, vbucket=c.vb(b"q1"))
        c.request(Opcode.GETQ, key=b"missing", vbucket=c.vb(b"missing"))
        f = c.call(Opcode.NOOP)
        assert f.status == Status.SUCCESS
        (add_failure,) = list(c.backlog)
        assert (add_failure.opcode, add_failure.status) == (Opcode.ADDQ, Status.KEY_EEXISTS)


def test_mutation_seqno_extras_and_strictly_increasing_seqnos(shared_node):
    with connect(shared_node) as c:
        keys = [b"seq-%d" % i for i in range(200)]
        last = {}
        uuids = {}
        for round_ in range(3):
            for k in keys:
                f = c.set(k, b"v%d" % round_)
                assert f.status == Status.SUCCESS and len(f.extras) == 16
                uuid, seqno = struct.unpack(">QQ", f.extras)
                vb = c.vb(k)
                assert seqno > last.get(vb, 0), "seqnos strictly increase per vbucket"
                last[vb] = seqno
                assert uuids.setdefault(vb, uuid) == uuid and uuid != 0
        stats = c.stats("vbucket-seqno")
        for vb, s in last.items():
            assert int(stats[f"vb_{vb}:high_seqno"]) == s
            assert int(stats[f"vb_{vb}:uuid"]) == uuids[vb]
    with connect(shared_node, features=(Feature.XERROR,)) as c:
        f = c.set(b"seq-0", b"v")
        assert f.extras == b"", "no MutationSeqno negotiated, no extras"


def test_revision_seqnos_increase_per_key(shared_node):
    with connect(shared_node) as c:
        revs = []
        for i in range(5):
            c.set(b"rev-key", b"v%d" % i)
            revs.append(meta_of(c, b"rev-key")[1]["rev"])
        c.delete(b"rev-key")
        st, m = meta_of(c, b"rev-key")
        assert m["deleted"] == 1
        revs.append(m["rev"])
        c.set(b"rev-key", b"back")
        revs.append(meta_of(c, b"rev-key")[1]["rev"])
        assert revs == sorted(revs) and len(set(revs)) == len(revs)
        assert revs[0] >= 1


def test_expiry_relative_absolute_and_pager(node_factory):
    node = node_factory(extra_args=("--expiry-pager-interval", "0.2"))
    with connect(node) as c:
        now = int(time.time())
        assert c.set(b"ttl-rel", b"v", expiry=1).status == Status.SUCCESS
        assert c.set(b"ttl-abs", b"v", expiry=now + 1).status == Status.SUCCESS
        assert c.set(b"ttl-past", b"v", expiry=now - 100).status == Status.SUCCESS
        assert c.set(b"ttl-none", b"v").status == Status.SUCCESS
        assert c.get(b"ttl-past").status == Status.KEY_ENOENT, "expired at once (lazy)"
        assert c.get(b"ttl-rel").status == Status.SUCCESS
        _, m = meta_of(c, b"ttl-abs")
        assert m["expiry"] == now + 1
        vb = c.vb(b"ttl-rel")
        before = int(c.stats("vbucket-seqno")[f"vb_{vb}:high_seqno"])
        time.sleep(2.5)
        # the pager turned it into a tombstone with a new seqno, without anyone reading it
        after = int(c.stats("vbucket-seqno")[f"vb_{vb}:high_seqno"])
        assert after == before + 1
        assert int(c.stats("")["ep_expired_pager"]) >= 2
        assert c.get(b"ttl-rel").status == Status.KEY_ENOENT
        assert c.get(b"ttl-abs").status == Status.KEY_ENOENT
        assert c.get(b"ttl-none").status == Status.SUCCESS
        st, m = meta_of(c, b"ttl-rel")
        assert st == Status.SUCCESS and m["deleted"] == 1
        # an expired key can be added again
        assert c.set(b"ttl-rel", b"again", opcode=Opcode.ADD).status == Status.SUCCESS


# -- SET_WITH_META / DEL_WITH_META --------------------------------------------------------------


def with_meta(c: Client, key: bytes, rev: int, cas: int, *, value=None, options=None,
              deletion=False, flags=0, expiry=0):
    cls = DelWithMeta if deletion else SetWithMeta
    if value is None:
        value = b"" if deletion else b"v"
    msg = cls(key=key, value=value, flags=flags, expiry=expiry, rev_seqno=rev, meta_cas=cas,
              options=options, vbucket=c.vb(key), opaque=c.next_opaque())
    return c.call_msg(msg)


def test_set_with_meta_conflict_resolution(shared_node):
    with connect(shared_node) as c:
        k = b"xdcr-1"
        assert with_meta(c, k, rev=10, cas=5000).status == Status.SUCCESS
        _, m = meta_of(c, k)
        assert (m["rev"], m["cas"]) == (10, 5000)
        # incoming higher revision wins, even with a lower CAS
        assert with_meta(c, k, rev=11, cas=10, value=b"newer").status == Status.SUCCESS
        assert c.get(k).value == b"newer"
        # lower revision loses with KEY_EEXISTS
        assert with_meta(c, k, rev=9, cas=99999, value=b"older").status == Status.KEY_EEXISTS
        # equal revision: CAS decides
        assert with_meta(c, k, rev=11, cas=9, value=b"x").status == Status.KEY_EEXISTS
        assert with_meta(c, k, rev=11, cas=11, value=b"cas-wins").status == Status.SUCCESS
        # identical metadata loses
        assert with_meta(c, k, rev=11, cas=11, value=b"same").status == Status.KEY_EEXISTS
        assert c.get(k).value == b"cas-wins"
        # FORCE overrides conflict resolution
        f = with_meta(c, k, rev=1, cas=1, value=b"forced", options=MetaOption.FORCE_WITH_META_OP)
        assert f.status == Status.SUCCESS
        assert c.get(k).value == b"forced"
        _, m = meta_of(c, k)
        assert (m["rev"], m["cas"]) == (1, 1)
        # SKIP_CONFLICT_RESOLUTION + REGENERATE_CAS gives a fresh CAS
        f = with_meta(c, k, rev=1, cas=1, value=b"regen",
                      options=MetaOption.SKIP_CONFLICT_RESOLUTION | MetaOption.REGENERATE_CAS)
        assert f.status == Status.SUCCESS and f.cas > 1
        # REGENERATE_CAS alone is invalid, as is LWW's force-accept
        assert with_meta(c, k, rev=50, cas=5, options=MetaOption.REGENERATE_CAS).status == Status.EINVAL
        assert with_meta(c, k, rev=50, cas=5,
                         options=MetaOption.FORCE_ACCEPT_WITH_META_OPS).status == Status.EINVAL


def test_del_with_meta_and_tombstone_conflicts(shared_node):
    with connect(shared_node) as c:
        k = b"xdcr-del"
        assert with_meta(c, k, rev=5, cas=100).status == Status.SUCCESS
        # deletions compare (rev, cas) and lose ties
        assert with_meta(c, k, rev=5, cas=100, deletion=True).status == Status.KEY_EEXISTS
        assert with_meta(c, k, rev=4, cas=900, deletion=True).status == Status.KEY_EEXISTS
        f = with_meta(c, k, rev=6, cas=101, deletion=True, expiry=1_700_000_000)
        assert f.status == Status.SUCCESS
        st, m = meta_of(c, k)
        assert (m["deleted"], m["rev"], m["cas"], m["expiry"]) == (1, 6, 101, 1_700_000_000)
        assert c.get(k).status == Status.KEY_ENOENT
        # a deletion may not carry a body
        assert with_meta(c, k, rev=9, cas=900, deletion=True, value=b"body").status == Status.EINVAL
        # a mutation must beat the tombstone too
        assert with_meta(c, k, rev=6, cas=100).status == Status.KEY_EEXISTS
        assert with_meta(c, k, rev=7, cas=1).status == Status.SUCCESS
        assert c.get(k).status == Status.SUCCESS


def test_with_meta_cas_is_kept_and_later_local_cas_is_above_it(shared_node):
    with connect(shared_node) as c:
        far = (time.time_ns() + 3600 * 10**9) & ~0xFFFF
        assert with_meta(c, b"clock", rev=1, cas=far).status == Status.SUCCESS
        f = c.set(b"clock", b"local")
        assert f.cas > far, "the hybrid logical clock moves past a CAS it has seen"


# -- vbuckets, cluster map, stats --------------------------------------------------------------


def test_not_my_vbucket_for_absent_and_non_active_vbuckets(node_factory):
    node = node_factory(vbuckets=4)
    with connect(node) as c:
        f = c.set(b"k", b"v", vbucket=9)
        assert f.status == Status.NOT_MY_VBUCKET
        assert json.loads(f.value)["vBucketServerMap"]["hashAlgorithm"] == "CRC"
        assert c.call(Opcode.SET_VBUCKET, extras=b"\x02", vbucket=1).status == Status.SUCCESS
        assert c.set(b"k", b"v", vbucket=1).status == Status.NOT_MY_VBUCKET
        assert c.get(b"k", vbucket=1).status == Status.NOT_MY_VBUCKET
        assert c.set(b"k", b"v", vbucket=0).status == Status.SUCCESS
        entries = decode_message(c.call(Opcode.GET_ALL_VB_SEQNOS)).entries
        assert [vb for vb, _ in entries] == [0, 1, 2, 3]
        active = decode_message(c.call(Opcode.GET_ALL_VB_SEQNOS, extras=b"\x00\x00\x00\x01"))
        assert [vb for vb, _ in active.entries] == [0, 2, 3]
        replica = decode_message(c.call(Opcode.GET_ALL_VB_SEQNOS, extras=b"\x00\x00\x00\x02"))
        assert [vb for vb, _ in replica.entries] == [1]
        assert dict(entries)[0] == 1
        assert c.call(Opcode.GET_VBUCKET, vbucket=1).value == b"\x00\x00\x00\x02"
        # back to active: a new history branch
        log_before = decode_message(c.call(Opcode.GET_FAILOVER_LOG, vbucket=1)).entries
        c.call(Opcode.SET_VBUCKET, extras=b"\x01", vbucket=1)
        log_after = decode_message(c.call(Opcode.GET_FAILOVER_LOG, vbucket=1)).entries
        assert len(log_after) == len(log_before) + 1 and log_after[1:] == log_before
        cfg = json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)
        assert cfg["vBucketServerMap"]["vBucketMap"] == [[0], [0], [0], [0]]


def test_cluster_config_is_a_single_node_map(shared_node):
    with connect(shared_node) as c:
        f = c.call(Opcode.GET_CLUSTER_CONFIG)
        assert f.status == Status.SUCCESS and f.datatype == Datatype.JSON
        cfg = json.loads(f.value)
        assert cfg["rev"] >= 1 and cfg["name"] == "default"
        ne = cfg["nodesExt"][0]
        assert ne["thisNode"] is True and ne["services"]["kv"] == shared_node.port
        m = cfg["vBucketServerMap"]
        assert m["hashAlgorithm"] == "CRC" and m["numReplicas"] == 0
        assert m["serverList"] == [f"127.0.0.1:{shared_node.port}"]
        assert len(m["vBucketMap"]) == 16 and all(e == [0] for e in m["vBucketMap"])
        assert cfg["nodes"][0]["ports"]["direct"] == shared_node.port


def test_failover_log_and_stat_groups(shared_node):
    with connect(shared_node) as c:
        log = decode_message(c.call(Opcode.GET_FAILOVER_LOG, vbucket=3)).entries
        assert len(log) >= 1 and log[0][0] != 0 and log[0][0] < 2**48
        fo = c.stats("failovers")
        assert int(fo["vb_3:num_entries"]) == len(log)
        assert int(fo["vb_3:0:id"]) == log[0][0] and int(fo["vb_3:0:seq"]) == log[0][1]
        one = c.stats("failovers 3")
        assert set(k.split(":")[0] for k in one) == {"vb_3"}
        seq = c.stats("vbucket-seqno")
        for name in ("uuid", "high_seqno", "abs_high_seqno", "last_persisted_seqno", "purge_seqno"):
            assert f"vb_15:{name}" in seq
        default = c.stats()
        for name in ("pid", "uptime", "curr_items", "curr_connections", "ep_checkpoint_memory"):
            assert name in default
        assert c.stats("vbucket")["vb_0"] == "active"
        assert "ep_dcp_count" in c.stats("dcp")
        f = c.call(Opcode.STAT, key=b"no-such-group")
        assert f.status == Status.KEY_ENOENT
        assert c.call(Opcode.GET_FAILOVER_LOG, vbucket=99).status == Status.NOT_MY_VBUCKET
