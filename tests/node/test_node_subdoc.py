"""Sub-document commands end to end against a real node process: the framing, the
per-path and multi-path statuses, xattrs, virtual xattrs, macros and doc flags, as
kv_engine answers them (dcptool.node.commands.subdoc)."""
from __future__ import annotations

import itertools
import json
import struct

import crc32c
import pytest

from dcptool.protocol.constants import Datatype, Opcode, Status

from .mcbputil import Client, connect

_n = itertools.count()
MKDIR_P, XATTR, EXPAND = 0x01, 0x04, 0x10
MKDOC, ADD, ACCESS_DELETED = 0x01, 0x02, 0x04


def key() -> bytes:
    return b"subdoc-%d" % next(_n)


@pytest.fixture(scope="module")
def c(shared_node):
    client = connect(shared_node)
    yield client
    client.close()


def single(c: Client, op, k, path: bytes, value: bytes = b"", *, flags=0, doc_flags=None,
           expiry=None, cas=0):
    extras = struct.pack(">HB", len(path), flags)
    if expiry is not None:
        extras += struct.pack(">I", expiry)
    if doc_flags is not None:
        extras += bytes([doc_flags])
    return c.call(op, key=k, extras=extras, value=path + value, cas=cas, vbucket=c.vb(k))


def lookup_in(c: Client, k, specs, *, doc_flags=None):
    body = b"".join(struct.pack(">BBH", op, fl, len(p)) + p for op, fl, p in specs)
    extras = b"" if doc_flags is None else bytes([doc_flags])
    f = c.call(Opcode.SUBDOC_MULTI_LOOKUP, key=k, extras=extras, value=body, vbucket=c.vb(k))
    results, p = [], 0
    if f.status in (Status.SUCCESS, Status.SUBDOC_MULTI_PATH_FAILURE,
                    Status.SUBDOC_SUCCESS_DELETED, Status.SUBDOC_MULTI_PATH_FAILURE_DELETED):
        while p < len(f.value):
            st, n = struct.unpack_from(">HI", f.value, p)
            results.append((st, bytes(f.value[p + 6:p + 6 + n])))
            p += 6 + n
    return f, results


def mutate_in(c: Client, k, specs, *, doc_flags=None, expiry=None, cas=0):
    body = b"".join(struct.pack(">BBHI", op, fl, len(p), len(v)) + p + v
                    for op, fl, p, v in specs)
    extras = b"" if expiry is None else struct.pack(">I", expiry)
    if doc_flags is not None:
        extras += bytes([doc_flags])
    return c.call(Opcode.SUBDOC_MULTI_MUTATION, key=k, extras=extras, value=body, cas=cas,
                  vbucket=c.vb(k))


def put(c: Client, k, doc) -> int:
    f = c.set(k, json.dumps(doc).encode(), datatype=Datatype.JSON)
    assert f.status == Status.SUCCESS
    return f.cas


def body(c: Client, k):
    return json.loads(c.get(k).value)


# -- single path ------------------------------------------------------------------------


def test_single_path_lookups(c):
    k = key()
    put(c, k, {"a": {"b": [1, 2, 3]}, "s": "x"})
    f = single(c, Opcode.SUBDOC_GET, k, b"a.b[-1]")
    assert (f.status, f.value) == (Status.SUCCESS, b"3")
    assert single(c, Opcode.SUBDOC_EXISTS, k, b"a.b").status == Status.SUCCESS
    assert single(c, Opcode.SUBDOC_EXISTS, k, b"a.c").status == Status.SUBDOC_PATH_ENOENT
    assert single(c, Opcode.SUBDOC_GET_COUNT, k, b"a.b").value == b"3"
    assert single(c, Opcode.SUBDOC_GET, k, b"s.t").status == Status.SUBDOC_PATH_MISMATCH
    assert single(c, Opcode.SUBDOC_GET, k, b"a..b").status == Status.SUBDOC_PATH_EINVAL
    assert single(c, Opcode.SUBDOC_GET, k, b"").status == Status.EINVAL
    assert single(c, Opcode.SUBDOC_GET, key(), b"a").status == Status.KEY_ENOENT


def test_lookup_on_a_document_that_is_not_json(c):
    k = key()
    assert c.set(k, b"plain text").status == Status.SUCCESS
    assert single(c, Opcode.SUBDOC_GET, k, b"a").status == Status.SUBDOC_DOC_NOT_JSON


def test_single_path_mutations_are_new_versions(c):
    k = key()
    cas0 = put(c, k, {"list": [1], "n": 1})
    f = single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"x.y", b'"z"', flags=MKDIR_P)
    assert f.status == Status.SUCCESS and f.cas != cas0 and len(f.extras) == 16
    single(c, Opcode.SUBDOC_ARRAY_PUSH_LAST, k, b"list", b"2")
    single(c, Opcode.SUBDOC_ARRAY_PUSH_FIRST, k, b"list", b"0")
    single(c, Opcode.SUBDOC_ARRAY_INSERT, k, b"list[1]", b'"i"')
    single(c, Opcode.SUBDOC_ARRAY_ADD_UNIQUE, k, b"list", b"9")
    assert single(c, Opcode.SUBDOC_ARRAY_ADD_UNIQUE, k, b"list",
                  b"9").status == Status.SUBDOC_PATH_EEXISTS
    f = single(c, Opcode.SUBDOC_COUNTER, k, b"n", b"41")
    assert (f.status, f.value) == (Status.SUCCESS, b"42")
    single(c, Opcode.SUBDOC_REPLACE, k, b"x.y", b"[true]")
    single(c, Opcode.SUBDOC_DICT_ADD, k, b"added", b"null")
    assert single(c, Opcode.SUBDOC_DICT_ADD, k, b"added",
                  b"1").status == Status.SUBDOC_PATH_EEXISTS
    single(c, Opcode.SUBDOC_DELETE, k, b"added")
    assert body(c, k) == {"list": [0, "i", 1, 2, 9], "n": 42, "x": {"y": [True]}}
    g = c.get(k)
    assert g.datatype & Datatype.JSON


def test_mutation_errors_store_nothing(c):
    k = key()
    cas = put(c, k, {"a": 1})
    for path, value, status in ((b"a.b", b"1", Status.SUBDOC_PATH_MISMATCH),
                                (b"b.c", b"1", Status.SUBDOC_PATH_ENOENT),
                                (b"b", b"{nope", Status.SUBDOC_VALUE_CANTINSERT)):
        f = single(c, Opcode.SUBDOC_DICT_UPSERT, k, path, value)
        assert f.status == status, path
    assert single(c, Opcode.SUBDOC_COUNTER, k, b"a", b"0").status == Status.SUBDOC_DELTA_ERANGE
    assert c.get(k).cas == cas
    # a stale CAS, a missing document
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"b", b"1",
                  cas=cas + 1).status == Status.KEY_EEXISTS
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, key(), b"b", b"1").status == Status.KEY_ENOENT


def test_doc_flags_mkdoc_and_add(c):
    k = key()
    f = single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"a.b", b"1", doc_flags=MKDOC)
    assert f.status == Status.SUCCESS
    assert body(c, k) == {"a": {"b": 1}}
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"c", b"1",
                  doc_flags=ADD).status == Status.KEY_EEXISTS
    k2 = key()
    assert single(c, Opcode.SUBDOC_ARRAY_PUSH_LAST, k2, b"", b"1, 2",
                  doc_flags=ADD).status == Status.SUCCESS
    assert body(c, k2) == [1, 2]
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, key(), b"c", b"1",
                  doc_flags=MKDOC | ADD).status == Status.EINVAL


def test_expiry_in_the_extras(c):
    k = key()
    put(c, k, {"a": 1})
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"b", b"2",
                  expiry=3600).status == Status.SUCCESS
    f = lookup_in(c, k, [(Opcode.SUBDOC_GET, XATTR, b"$document.exptime")])[1]
    assert f[0][0] == Status.SUCCESS and int(f[0][1]) > 0


# -- multi path -------------------------------------------------------------------------


def test_multi_lookup_partial_failure(c):
    k = key()
    put(c, k, {"from": "mnunberg", "to": "couchbase", "subject": "Subdoc"})
    f, res = lookup_in(c, k, [(Opcode.SUBDOC_GET, 0, b"from"), (Opcode.SUBDOC_GET, 0, b"cc"),
                              (Opcode.SUBDOC_EXISTS, 0, b"subject"), (0x00, 0, b"")])
    assert f.status == Status.SUBDOC_MULTI_PATH_FAILURE
    assert res[0] == (Status.SUCCESS, b'"mnunberg"')
    assert res[1] == (Status.SUBDOC_PATH_ENOENT, b"")
    assert res[2] == (Status.SUCCESS, b"")
    assert res[3][0] == Status.SUCCESS and json.loads(res[3][1])["to"] == "couchbase"
    f, res = lookup_in(c, k, [(Opcode.SUBDOC_GET, 0, b"to")])
    assert f.status == Status.SUCCESS


def test_multi_lookup_limits_and_order(c):
    k = key()
    put(c, k, {"a": 1})
    f, _ = lookup_in(c, k, [(Opcode.SUBDOC_GET, 0, b"a")] * 17)
    assert f.status == Status.SUBDOC_INVALID_COMBO
    f, _ = lookup_in(c, k, [(Opcode.SUBDOC_GET, 0, b"a"), (Opcode.SUBDOC_GET, XATTR, b"x")])
    assert f.status == Status.SUBDOC_INVALID_XATTR_ORDER
    f, _ = lookup_in(c, k, [(Opcode.SUBDOC_DICT_ADD, 0, b"a")])
    assert f.status == Status.SUBDOC_INVALID_COMBO


def test_multi_mutation_is_all_or_nothing(c):
    k = key()
    cas = put(c, k, {"n": 1, "l": []})
    f = mutate_in(c, k, [(Opcode.SUBDOC_COUNTER, 0, b"n", b"1"),
                         (Opcode.SUBDOC_DICT_UPSERT, 0, b"missing.x", b"1")])
    assert f.status == Status.SUBDOC_MULTI_PATH_FAILURE
    assert struct.unpack(">BH", f.value) == (1, Status.SUBDOC_PATH_ENOENT)
    assert c.get(k).cas == cas and body(c, k)["n"] == 1
    f = mutate_in(c, k, [(Opcode.SUBDOC_ARRAY_ADD_UNIQUE, MKDIR_P, b"locs", b'"1.2.3.4"'),
                         (Opcode.SUBDOC_COUNTER, MKDIR_P, b"logins", b"1"),
                         (Opcode.SUBDOC_DICT_UPSERT, 0, b"state", b'"in"'),
                         (Opcode.SUBDOC_COUNTER, 0, b"n", b"5")])
    assert f.status == Status.SUCCESS
    results, p = [], 0
    while p < len(f.value):
        i, st, n = struct.unpack_from(">BHI", f.value, p)
        results.append((i, st, bytes(f.value[p + 7:p + 7 + n])))
        p += 7 + n
    assert results == [(1, 0, b"1"), (3, 0, b"6")]
    assert body(c, k) == {"n": 6, "l": [], "locs": ["1.2.3.4"], "logins": 1, "state": "in"}


def test_whole_document_set_and_delete_in_a_multi_mutation(c):
    k = key()
    f = mutate_in(c, k, [(Opcode.SUBDOC_DICT_UPSERT, XATTR, b"meta", b'{"v":1}'),
                         (0x01, 0, b"", b'{"whole": true}')], doc_flags=MKDOC)
    assert f.status == Status.SUCCESS
    assert body(c, k) == {"whole": True}
    f = mutate_in(c, k, [(0x04, 0, b"", b"")])
    assert f.status == Status.SUCCESS
    assert c.get(k).status == Status.KEY_ENOENT


# -- xattrs -----------------------------------------------------------------------------


def test_xattrs_live_beside_the_body(c):
    k = key()
    put(c, k, {"a": 1})
    f = single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"txn.id", b'"abc"', flags=XATTR | MKDIR_P)
    assert f.status == Status.SUCCESS
    assert body(c, k) == {"a": 1}                    # a plain GET shows the body only
    f, res = lookup_in(c, k, [(Opcode.SUBDOC_GET, XATTR, b"txn"),
                              (Opcode.SUBDOC_GET, XATTR, b"$XTOC"),
                              (Opcode.SUBDOC_GET, 0, b"a")])
    assert f.status == Status.SUCCESS
    assert [json.loads(v) for _, v in res] == [{"id": "abc"}, ["txn"], 1]
    # the node stores one value with the xattr section in front (datatype XATTR)
    meta = c.call(Opcode.GET_META, key=k, vbucket=c.vb(k), extras=b"\x02")
    assert meta.extras[20] & Datatype.XATTR
    assert single(c, Opcode.SUBDOC_DELETE, k, b"txn", flags=XATTR).status == Status.SUCCESS
    assert lookup_in(c, k, [(Opcode.SUBDOC_GET, XATTR, b"$XTOC")])[1] == [(0, b"[]")]


def test_virtual_document_attribute(c):
    k = key()
    put(c, k, {"a": 1})
    g = c.get(k)
    f, res = lookup_in(c, k, [(Opcode.SUBDOC_GET, XATTR, b"$document"),
                              (Opcode.SUBDOC_GET, XATTR, b"$document.exptime"),
                              (Opcode.SUBDOC_GET, XATTR, b"$nope")])
    assert f.status == Status.SUBDOC_MULTI_PATH_FAILURE
    d = json.loads(res[0][1])
    assert d["CAS"] == "0x%016x" % g.cas
    assert d["value_bytes"] == len(g.value)
    assert d["value_crc32c"] == "0x%08x" % crc32c.crc32c(g.value)
    assert d["deleted"] is False and res[1] == (0, b"0")
    assert res[2][0] == Status.SUBDOC_XATTR_UNKNOWN_VATTR
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"$document.x", b"1",
                  flags=XATTR).status == Status.SUBDOC_XATTR_CANT_MODIFY_VATTR


def test_macros_expand_to_the_new_version(c):
    k = key()
    put(c, k, {"a": 1})
    f = mutate_in(c, k, [(Opcode.SUBDOC_DICT_UPSERT, XATTR | MKDIR_P | EXPAND, b"m.cas",
                          b'"${Mutation.CAS}"'),
                         (Opcode.SUBDOC_DICT_UPSERT, XATTR | MKDIR_P | EXPAND, b"m.crc",
                          b'"${Mutation.value_crc32c}"'),
                         (Opcode.SUBDOC_DICT_UPSERT, XATTR | MKDIR_P | EXPAND, b"m.seqno",
                          b'"${Mutation.seqno}"')])
    assert f.status == Status.SUCCESS
    _uuid, seqno = struct.unpack(">QQ", f.extras)
    m = json.loads(lookup_in(c, k, [(Opcode.SUBDOC_GET, XATTR, b"m")])[1][0][1])
    assert m["cas"] == "0x" + f.cas.to_bytes(8, "little").hex()
    assert m["seqno"] == "0x" + seqno.to_bytes(8, "little").hex()
    assert m["crc"] == "0x%08x" % crc32c.crc32c(c.get(k).value)
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"m.x", b'"${Mutation.nope}"',
                  flags=XATTR | EXPAND).status == Status.SUBDOC_XATTR_UNKNOWN_MACRO
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"x", b'"${Mutation.CAS}"',
                  flags=EXPAND).status == Status.SUBDOC_XATTR_INVALID_FLAG_COMBO


def test_access_deleted_reads_a_tombstone(c):
    k = key()
    put(c, k, {"a": 1})
    assert c.delete(k).status == Status.SUCCESS
    f, _ = lookup_in(c, k, [(Opcode.SUBDOC_GET, XATTR, b"$document.deleted")])
    assert f.status == Status.KEY_ENOENT
    f, res = lookup_in(c, k, [(Opcode.SUBDOC_GET, XATTR, b"$document.deleted")],
                       doc_flags=ACCESS_DELETED)
    assert f.status == Status.SUBDOC_SUCCESS_DELETED and res == [(0, b"true")]


def test_a_locked_document_refuses_subdoc_mutations(c):
    k = key()
    put(c, k, {"a": 1})
    lock = c.call(Opcode.GET_LOCKED, key=k, vbucket=c.vb(k)).cas
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"b", b"1").status == Status.LOCKED
    assert single(c, Opcode.SUBDOC_DICT_UPSERT, k, b"b", b"1", cas=lock).status == Status.SUCCESS
    assert body(c, k) == {"a": 1, "b": 1}
