"""Scopes and collections on the node's data side, against real node processes: the REST
endpoints (shapes, errors, roles), KV on legacy and collections connections (doc keys,
LEB128 checks, UNKNOWN_COLLECTION with the manifest uid, max TTL), GET_COLLECTIONS_MANIFEST /
GET_COLLECTION_ID / GET_SCOPE_ID, dropped collections (invisible at once, purged by
compaction), the manifest across restarts and the storage format 1 -> 2 migration."""
from __future__ import annotations

import json
import sqlite3
import struct
import time

import pytest

from client.nodeutil import run_cli
from restutil import rest_request
from dcptool.protocol import vbucket_of
from dcptool.protocol.collections import doc_key, encode_leb128
from dcptool.protocol.constants import Feature, Opcode, Status

from .mcbputil import DEFAULT_FEATURES, connect

VBS = 4
ADMIN = ("Administrator", "password")
SCOPER = ("scoper", "sc-pw-5151")
READER = ("rd", "rd-pw-4242")
COLL_FEATURES = DEFAULT_FEATURES + (Feature.COLLECTIONS,)


# -- helpers ------------------------------------------------------------------------------


def rest(node, method: str, path: str, form: dict | None = None, auth=ADMIN):
    """(status, JSON body or text) of a REST call."""
    status, body = rest_request(node, method, path, form, auth=auth, timeout=10)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


SCOPES = "/pools/default/buckets/default/scopes"


def create_scope(node, name, auth=ADMIN):
    return rest(node, "POST", SCOPES, {"name": name}, auth)


def create_collection(node, scope, name, max_ttl=None, auth=ADMIN):
    form = {"name": name}
    if max_ttl is not None:
        form["maxTTL"] = str(max_ttl)
    return rest(node, "POST", f"{SCOPES}/{scope}/collections", form, auth)


def add_user(data_dir, user: str, password: str, role: str) -> None:
    r = run_cli("node", "user", "add", user, "--role", role, "--data", str(data_dir),
                env_extra={"DCPTOOL_PASSWORD": password})
    assert r.returncode == 0, r.stderr


def cconnect(node):
    """A connection that negotiated Collections."""
    c = connect(node, features=COLL_FEATURES)
    return c


def ckey(cid: int, key: bytes) -> bytes:
    return doc_key(cid, key)


def cset(c, cid: int, key: bytes, value: bytes, *, expiry: int = 0, opcode=Opcode.SET):
    return c.call(opcode, key=ckey(cid, key), value=value, extras=struct.pack(">II", 0, expiry),
                  vbucket=vbucket_of(key, VBS))


def cget(c, cid: int, key: bytes, opcode=Opcode.GET):
    return c.call(opcode, key=ckey(cid, key), vbucket=vbucket_of(key, VBS))


def lget(c, key: bytes):
    return c.call(Opcode.GET, key=key, vbucket=vbucket_of(key, VBS))


def manifest_of(node) -> dict:
    status, doc = rest(node, "GET", SCOPES)
    assert status == 200, doc
    return doc


def cid_of(node, scope: str, coll: str) -> int:
    for s in manifest_of(node)["scopes"]:
        if s["name"] == scope:
            for c in s["collections"]:
                if c["name"] == coll:
                    return int(c["uid"], 16)
    raise KeyError(f"{scope}.{coll}")


@pytest.fixture
def node(node_factory):
    n = node_factory("n", start=False, vbuckets=VBS)
    n.data_dir.mkdir(parents=True)
    add_user(n.data_dir, *SCOPER, "scope_admin")
    add_user(n.data_dir, *READER, "reader")
    return n.start()


# -- REST ---------------------------------------------------------------------------------


def test_rest_create_list_drop_with_couchbase_shapes(node):
    doc = manifest_of(node)
    assert doc == {"uid": "0", "scopes": [
        {"name": "_default", "uid": "0", "collections": [{"name": "_default", "uid": "0"}]}]}
    assert create_scope(node, "inventory") == (200, {"uid": "1"})
    assert create_collection(node, "inventory", "airline") == (200, {"uid": "2"})
    assert create_collection(node, "inventory", "hotel", max_ttl=60) == (200, {"uid": "3"})
    doc = manifest_of(node)
    assert doc["uid"] == "3"
    inv = [s for s in doc["scopes"] if s["name"] == "inventory"][0]
    assert inv["uid"] == "8"
    assert inv["collections"] == [{"name": "airline", "uid": "9"},
                                  {"name": "hotel", "uid": "a", "maxTTL": 60}]
    # errors as Couchbase Server answers them
    assert create_scope(node, "inventory") == (
        400, {"errors": {"_": 'Scope with name "inventory" already exists'}})
    assert create_collection(node, "inventory", "airline") == (
        400, {"errors": {"_": 'Collection with name "airline" in scope "inventory" already '
                              'exists'}})
    assert create_collection(node, "nope", "x") == (
        404, {"errors": {"_": 'Scope with name "nope" is not found'}})
    assert create_scope(node, "_bad") == (
        400, {"errors": {"name": "First character must not be _ or %"}})
    assert create_scope(node, "sp ace")[0] == 400
    assert create_scope(node, "sp ace")[1]["errors"]["name"].startswith("Can only contain")
    assert rest(node, "POST", SCOPES, {})[1] == {"errors": {"name": "The value must be supplied"}}
    assert create_collection(node, "inventory", "t", max_ttl="soon")[0] == 400
    assert rest(node, "DELETE", f"{SCOPES}/inventory/collections/nope") == (
        404, {"errors": {"_": 'Collection with name "nope" in scope "inventory" is not found'}})
    assert rest(node, "DELETE", f"{SCOPES}/_default") == (
        400, {"errors": {"_": "Deleting _default scope is not allowed"}})
    assert rest(node, "DELETE", f"{SCOPES}/nope")[0] == 404
    assert rest(node, "GET", "/pools/default/buckets/other/scopes")[0] == 404
    # drops
    assert rest(node, "DELETE", f"{SCOPES}/inventory/collections/airline") == (200, {"uid": "4"})
    # a scope drop drops its collections first: one manifest change
    assert rest(node, "DELETE", f"{SCOPES}/inventory") == (200, {"uid": "5"})
    assert [s["name"] for s in manifest_of(node)["scopes"]] == ["_default"]
    # ids are never reused: the same name again gets a new id
    assert create_scope(node, "inventory") == (200, {"uid": "6"})
    assert [s["uid"] for s in manifest_of(node)["scopes"]] == ["0", "b"]


def test_rest_role_checks(node):
    status, body = create_scope(node, "s1", auth=READER)
    assert status == 403
    assert body == {"message": "Forbidden. User needs the following permissions",
                    "permissions": ["cluster.bucket[default].collections!write"]}
    assert create_collection(node, "_default", "c", auth=READER)[0] == 403
    assert rest(node, "DELETE", f"{SCOPES}/_default/collections/_default", auth=READER)[0] == 403
    # a reader may list them; the scope admin may change them
    assert rest(node, "GET", SCOPES, auth=READER)[0] == 200
    assert create_scope(node, "s1", auth=SCOPER) == (200, {"uid": "1"})
    assert create_collection(node, "s1", "c1", auth=SCOPER) == (200, {"uid": "2"})
    assert rest(node, "GET", SCOPES, auth=("Administrator", "wrong"))[0] == 401


def test_rest_collection_limit(node):
    from dcptool.protocol import collections as pc

    assert pc.MAX_COLLECTIONS == 1000
    # the default collection and 999 more fill the bucket
    for i in range(999):
        status, _ = create_collection(node, "_default", f"c{i}")
        assert status == 200, i
    assert create_collection(node, "_default", "one-too-many") == (
        429, {"errors": {"_": "Maximum number of collections has been reached for the bucket"}})


# -- KV -----------------------------------------------------------------------------------


def test_legacy_client_sees_only_the_default_collection(node):
    create_scope(node, "s")
    create_collection(node, "s", "c")
    cid = cid_of(node, "s", "c")
    with cconnect(node) as c, connect(node) as legacy:
        assert cset(c, cid, b"k", b"named").status == Status.SUCCESS
        # the named collection's "k" is invisible to a legacy GET of "k"
        assert lget(legacy, b"k").status == Status.KEY_ENOENT
        assert legacy.set(b"k", b"default").status == Status.SUCCESS
        assert lget(legacy, b"k").value == b"default"
        # two distinct documents
        assert cget(c, cid, b"k").value == b"named"
        assert cget(c, 0, b"k").value == b"default"
        # GETK answers the key as each client sent it
        f = legacy.call(Opcode.GETK, key=b"k", vbucket=vbucket_of(b"k", VBS))
        assert f.key == b"k"
        f = cget(c, cid, b"k", opcode=Opcode.GETK)
        assert f.key == ckey(cid, b"k")
        # deleting the default "k" leaves the named one
        assert legacy.delete(b"k").status == Status.SUCCESS
        assert cget(c, cid, b"k").value == b"named"


def test_collections_connection_all_kv_commands(node):
    create_scope(node, "s")
    create_collection(node, "s", "c")
    cid = cid_of(node, "s", "c")
    with cconnect(node) as c:
        vb = vbucket_of(b"doc", VBS)
        k = ckey(cid, b"doc")
        assert cset(c, cid, b"doc", b"v1", opcode=Opcode.ADD).status == Status.SUCCESS
        assert cset(c, cid, b"doc", b"v2", opcode=Opcode.ADD).status == Status.KEY_EEXISTS
        assert cset(c, cid, b"doc", b"v3", opcode=Opcode.REPLACE).status == Status.SUCCESS
        assert c.call(Opcode.APPEND, key=k, value=b"+a", vbucket=vb).status == Status.SUCCESS
        assert c.call(Opcode.PREPEND, key=k, value=b"p+", vbucket=vb).status == Status.SUCCESS
        assert cget(c, cid, b"doc").value == b"p+v3+a"
        f = c.call(Opcode.GET_META, key=k, vbucket=vb)
        assert f.status == Status.SUCCESS
        deleted, _flags, _exp, rev = struct.unpack(">IIIQ", f.extras[:20])
        assert deleted == 0 and rev == 4
        # SET_WITH_META into the collection, then DEL_WITH_META
        k2 = ckey(cid, b"meta")
        vb2 = vbucket_of(b"meta", VBS)
        ext = struct.pack(">IIQQ", 7, 0, 10, 0x1234)
        assert c.call(Opcode.SET_WITH_META, key=k2, value=b"mv", extras=ext,
                      vbucket=vb2).status == Status.SUCCESS
        assert cget(c, cid, b"meta").value == b"mv"
        ext = struct.pack(">IIQQ", 0, 0, 11, 0x1235)
        assert c.call(Opcode.DEL_WITH_META, key=k2, extras=ext,
                      vbucket=vb2).status == Status.SUCCESS
        assert cget(c, cid, b"meta").status == Status.KEY_ENOENT
        # quiet forms: a quiet GET of a missing key answers nothing before the NOOP
        c.request(Opcode.GETQ, key=ckey(cid, b"none"), vbucket=vbucket_of(b"none", VBS))
        c.request(Opcode.SETQ, key=ckey(cid, b"q"), value=b"qv",
                  extras=struct.pack(">II", 0, 0), vbucket=vbucket_of(b"q", VBS))
        assert c.call(Opcode.NOOP).opcode == Opcode.NOOP
        assert cget(c, cid, b"q").value == b"qv"
        assert c.call(Opcode.DELETE, key=k, vbucket=vb).status == Status.SUCCESS
        assert cget(c, cid, b"doc").status == Status.KEY_ENOENT


def test_pipelined_sets_into_a_collection_take_the_fast_path_and_land_there(node):
    create_scope(node, "s")
    create_collection(node, "s", "c")
    cid = cid_of(node, "s", "c")
    with cconnect(node) as c, connect(node) as legacy:
        docs = [(ckey(cid, b"bulk-%03d" % i), b"v%d" % i, vbucket_of(b"bulk-%03d" % i, VBS))
                for i in range(300)]
        c.set_many(docs)
        legacy.set_many([(b"bulk-%03d" % i, b"d%d" % i) for i in range(300)])
        for i in (0, 150, 299):
            assert cget(c, cid, b"bulk-%03d" % i).value == b"v%d" % i
            assert lget(legacy, b"bulk-%03d" % i).value == b"d%d" % i
        st = c.stats()
        assert int(st["curr_items"]) == 600


MALFORMED = [
    b"\x80",                       # cut off
    b"\x80\x80\x80\x80\x80\x00k",  # longer than 5 bytes
    b"\x81\x00k",                  # non-canonical encoding of 1
    b"\x88\x80\x00k",              # non-canonical encoding of 8
    b"\x09",                       # no logical key
    b"\x01k", b"\x07k",            # reserved ids
    b"\x00" + b"x" * 251,          # default logical key above 250
    b"\x09" + b"x" * 247,          # another collection's logical key above 246
]


def test_malformed_prefixes_are_einval_and_the_node_keeps_serving(node):
    create_scope(node, "s")
    create_collection(node, "s", "c")   # id 9
    with cconnect(node) as c:
        for key in MALFORMED:
            for op in (Opcode.GET, Opcode.SET, Opcode.SETQ, Opcode.DELETE, Opcode.GET_META):
                extras = struct.pack(">II", 0, 0) if op in (Opcode.SET, Opcode.SETQ) else b""
                f = c.call(op, key=key, extras=extras,
                           value=b"v" if op in (Opcode.SET, Opcode.SETQ) else b"")
                assert f.status == Status.EINVAL, (op, key)
            # the connection and the node go on
            assert cset(c, 0, b"still", b"here").status == Status.SUCCESS
            assert cget(c, 0, b"still").value == b"here"


def test_unknown_collection_answers_0x88_with_the_manifest_uid(node):
    create_scope(node, "s")
    create_collection(node, "s", "c")
    with cconnect(node) as c:
        for op in (Opcode.GET, Opcode.SET, Opcode.DELETE, Opcode.GET_META, Opcode.APPEND):
            extras = struct.pack(">II", 0, 0) if op == Opcode.SET else b""
            f = c.call(op, key=ckey(0x20, b"k"), extras=extras,
                       value=b"v" if op in (Opcode.SET, Opcode.APPEND) else b"")
            assert f.status == Status.UNKNOWN_COLLECTION, op
            assert json.loads(f.value) == {"manifest_uid": "2"}
        # a two-byte id the node never gave out
        f = c.call(Opcode.GET, key=ckey(0x555, b"k"))
        assert f.status == Status.UNKNOWN_COLLECTION
        assert json.loads(f.value)["manifest_uid"] == "2"
        # SET_WITH_META too (the restore path)
        f = c.call(Opcode.SET_WITH_META, key=ckey(0x20, b"k"), value=b"v",
                   extras=struct.pack(">IIQQ", 0, 0, 1, 1))
        assert f.status == Status.UNKNOWN_COLLECTION


def test_collection_max_ttl_caps_expiry(node):
    create_scope(node, "s")
    create_collection(node, "s", "short", max_ttl=100)
    cid = cid_of(node, "s", "short")
    with cconnect(node) as c:
        now = int(time.time())
        cset(c, cid, b"none", b"v")                 # no expiry -> now + 100
        cset(c, cid, b"long", b"v", expiry=5000)    # 5000 s -> now + 100
        cset(c, cid, b"short", b"v", expiry=10)     # shorter than maxTTL: kept
        cset(c, 0, b"free", b"v")                   # the default collection: none
        exp = {}
        for k, cc in ((b"none", cid), (b"long", cid), (b"short", cid), (b"free", 0)):
            f = c.call(Opcode.GET_META, key=ckey(cc, k), vbucket=vbucket_of(k, VBS))
            exp[k] = struct.unpack(">IIIQ", f.extras[:20])[2]
        assert now + 99 <= exp[b"none"] <= now + 102
        assert now + 99 <= exp[b"long"] <= now + 102
        assert now + 9 <= exp[b"short"] <= now + 12
        assert exp[b"free"] == 0


def test_manifest_and_id_commands(node):
    create_scope(node, "app")
    create_collection(node, "app", "users")
    with cconnect(node) as c:
        f = c.call(Opcode.GET_COLLECTIONS_MANIFEST)
        assert f.status == Status.SUCCESS
        assert json.loads(f.value) == manifest_of(node)
        # GET_COLLECTION_ID: path in the value (or the key)
        f = c.call(Opcode.GET_COLLECTION_ID, value=b"app.users")
        assert f.status == Status.SUCCESS
        assert struct.unpack(">QI", f.extras) == (2, 9)
        f = c.call(Opcode.GET_COLLECTION_ID, key=b"app.users")
        assert struct.unpack(">QI", f.extras) == (2, 9)
        assert struct.unpack(">QI", c.call(Opcode.GET_COLLECTION_ID, value=b".").extras) == (2, 0)
        assert struct.unpack(">QI", c.call(Opcode.GET_COLLECTION_ID,
                                           value=b"_default._default").extras) == (2, 0)
        f = c.call(Opcode.GET_COLLECTION_ID, value=b"app.nope")
        assert f.status == Status.UNKNOWN_COLLECTION
        assert json.loads(f.value) == {"manifest_uid": "2"}
        f = c.call(Opcode.GET_COLLECTION_ID, value=b"nope.users")
        assert f.status == Status.UNKNOWN_SCOPE
        assert json.loads(f.value) == {"manifest_uid": "2"}
        for bad in (b"app", b"a.b.c", b"app.b d", b"_x.users"):
            assert c.call(Opcode.GET_COLLECTION_ID, value=bad).status == Status.EINVAL, bad
        assert c.call(Opcode.GET_COLLECTION_ID, key=b"app.users",
                      value=b"app.users").status == Status.EINVAL
        # GET_SCOPE_ID
        assert struct.unpack(">QI", c.call(Opcode.GET_SCOPE_ID, value=b"app").extras) == (2, 8)
        assert struct.unpack(">QI", c.call(Opcode.GET_SCOPE_ID,
                                           value=b"app.users").extras) == (2, 8)
        assert struct.unpack(">QI", c.call(Opcode.GET_SCOPE_ID, value=b"").extras) == (2, 0)
        assert c.call(Opcode.GET_SCOPE_ID, value=b"nope").status == Status.UNKNOWN_SCOPE
        assert c.call(Opcode.GET_SCOPE_ID, value=b"a.b.c").status == Status.EINVAL


# -- dropped collections, compaction, restarts --------------------------------------------


def test_dropped_collection_is_invisible_at_once_and_purged_by_compaction(node):
    create_scope(node, "s")
    create_collection(node, "s", "gone")
    create_collection(node, "s", "kept")
    gone, kept = cid_of(node, "s", "gone"), cid_of(node, "s", "kept")
    with cconnect(node) as c, connect(node) as legacy:
        for i in range(20):
            assert cset(c, gone, b"g%d" % i, b"x").status == Status.SUCCESS
            assert cset(c, kept, b"k%d" % i, b"y").status == Status.SUCCESS
        legacy.set_many([(b"d%d" % i, b"z") for i in range(20)])
        assert int(c.stats()["curr_items"]) == 60
        assert rest(node, "DELETE", f"{SCOPES}/s/collections/gone")[0] == 200
        # at once: GET answers UNKNOWN_COLLECTION, counts exclude the documents
        f = cget(c, gone, b"g1")
        assert f.status == Status.UNKNOWN_COLLECTION
        assert json.loads(f.value) == {"manifest_uid": "4"}
        assert cset(c, gone, b"g1", b"again").status == Status.UNKNOWN_COLLECTION
        assert int(c.stats()["curr_items"]) == 40
        assert cget(c, kept, b"k1").value == b"y"
        assert lget(legacy, b"d1").value == b"z"
        from .mcbputil import wait_persisted
        wait_persisted(c)
    db_path = node.data_dir / "data.sqlite3"

    def rows_of(cid):
        lo = encode_leb128(cid)
        hi = lo[:-1] + bytes([lo[-1] + 1])
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
            return db.execute("SELECT count(*) FROM items WHERE key >= ? AND key < ?",
                              (lo, hi)).fetchone()[0]
    assert rows_of(gone) == 20
    with connect(node) as c:
        summaries = []
        for vb in range(VBS):
            f = c.call(Opcode.COMPACT_DB, vbucket=vb, extras=b"\x00" * 24)
            assert f.status == Status.SUCCESS
            summaries.append(json.loads(f.value))
        assert sum(s["dropped_collection_items_purged"] for s in summaries) == 20
        assert int(c.stats()["curr_items"]) == 40
    assert rows_of(gone) == 0
    assert rows_of(kept) == 20
    # system events are never purged as tombstones
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        assert db.execute("SELECT count(*) FROM items WHERE op = 3").fetchone()[0] > 0

    # the purged id leaves the persisted `dropped` list (written by the flusher, after the
    # compaction's answer: wait for it)
    def dropped_on_disk():
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
            return json.loads(dict(db.execute("SELECT name, value FROM meta").fetchall())
                              ["dropped"])
    deadline = time.monotonic() + 10
    while dropped_on_disk() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dropped_on_disk() == []


def test_manifest_and_dropped_ids_survive_restart(node):
    create_scope(node, "s")
    create_collection(node, "s", "c", max_ttl=30)
    create_collection(node, "s", "d")
    cid = cid_of(node, "s", "c")
    dropped = cid_of(node, "s", "d")
    with cconnect(node) as c:
        assert cset(c, cid, b"k", b"v").status == Status.SUCCESS
        assert cset(c, dropped, b"k", b"w").status == Status.SUCCESS
    rest(node, "DELETE", f"{SCOPES}/s/collections/d")
    before = manifest_of(node)
    for stop in (node.stop, node.kill):   # clean, then unclean
        stop()
        node.start()
        assert manifest_of(node) == before
        with cconnect(node) as c:
            assert cget(c, cid, b"k").value == b"v"
            assert cget(c, dropped, b"k").status == Status.UNKNOWN_COLLECTION
            assert int(c.stats()["curr_items"]) == 1
    assert create_collection(node, "s", "e") == (200, {"uid": "5"})
    assert cid_of(node, "s", "e") == 0xB
    # the manifest goes to disk with the flusher, in order with the change's system events
    from .mcbputil import wait_persisted
    with connect(node) as c:
        wait_persisted(c)
    db = sqlite3.connect(f"file:{node.data_dir / 'data.sqlite3'}?mode=ro", uri=True)
    try:
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
    finally:
        db.close()
    assert json.loads(meta["dropped"]) == [dropped]
    assert json.loads(meta["manifest"])["next_id"] == "c"


def test_format_1_database_is_migrated_once(node_factory):
    """A database of format 1 (keys without a collection prefix, as nodes before
    collections wrote them) opens with every key in the default collection."""
    n = node_factory("old", vbuckets=VBS)
    with connect(n) as c:
        c.set_many([(b"doc-%02d" % i, b"v%d" % i) for i in range(30)])
        assert c.delete(b"doc-05").status == Status.SUCCESS
        from .mcbputil import wait_persisted
        wait_persisted(c)
    n.stop()
    path = n.data_dir / "data.sqlite3"
    # make it a format-1 database: the same schema, keys as format 1 stored them
    db = sqlite3.connect(path)
    with db:
        db.execute("DROP INDEX items_by_key")
        db.execute("UPDATE items SET key = substr(key, 2)")
        db.execute("CREATE UNIQUE INDEX items_by_key ON items (vb, key)")
        db.execute("UPDATE meta SET value = '1' WHERE name = 'format'")
        db.execute("DELETE FROM meta WHERE name IN ('manifest', 'dropped')")
    assert db.execute("SELECT count(*) FROM items WHERE substr(key, 1, 1) = X'00'"
                      ).fetchone()[0] == 0
    db.close()
    n.start()
    with connect(n) as legacy, cconnect(n) as c:
        for i in (0, 29):
            assert lget(legacy, b"doc-%02d" % i).value == b"v%d" % i
            assert cget(c, 0, b"doc-%02d" % i).value == b"v%d" % i
        assert lget(legacy, b"doc-05").status == Status.KEY_ENOENT
        assert int(c.stats()["curr_items"]) == 29
    n.stop()
    db = sqlite3.connect(path)
    try:
        meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
        keys = [k for (k,) in db.execute("SELECT key FROM items")]
    finally:
        db.close()
    assert meta["format"] == "2"
    assert len(keys) == 30 and all(k[:1] == b"\x00" for k in keys)
    # the second start does not prefix again
    n.start()
    with connect(n) as legacy:
        assert lget(legacy, b"doc-00").value == b"v0"
