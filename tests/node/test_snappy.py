"""Snappy (HELLO 0x0a, datatype bit 0x02) on a real node: negotiation, every write path,
the decompressed storage form, DCP with and without force_value_compression."""
from __future__ import annotations

import json
import os
import struct

import cramjam
import pytest

from dcptool.protocol.constants import DcpOpenFlag, Feature, MetaOption, Opcode, Status
from dcptool.protocol.frame import Frame
from dcptool.protocol.messages import DcpDeletion, DcpMutation, GetMeta

from .dcputil import DcpClient, high_seqno
from .mcbputil import DEFAULT_FEATURES, Client, connect, wait_persisted

SNAPPY_FEATURES = DEFAULT_FEATURES + (Feature.SNAPPY,)
JSON, SNAPPY, XATTR = 0x01, 0x02, 0x04
MAX_VALUE = 20 * 1024 * 1024
STORE_EXTRAS = struct.Struct(">II")
META_EXTRAS = struct.Struct(">IIQQ")
GET_META = struct.Struct(">IIIQ")


def compress(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def decompress(data: bytes) -> bytes:
    return bytes(cramjam.snappy.decompress_raw(data))


def route(i: int) -> dict:
    """A travel-sample-like route document: varied fields, a week of flights."""
    airlines = ["AF", "KL", "BA", "LH", "UA", "DL"]
    airports = ["CDG", "AMS", "LHR", "FRA", "SFO", "ATL", "JFK", "MUC"]
    return {
        "type": "route", "id": 10000 + i, "airline": airlines[i % 6],
        "airlineid": f"airline_{137 + i % 6}",
        "sourceairport": airports[i % 8], "destinationairport": airports[(i * 3 + 1) % 8],
        "stops": i % 2, "equipment": ["320 319", "738 73H", "777 744"][i % 3],
        "distance": round(412.7 + 97.3 * i, 3),
        "schedule": [{"day": d, "utc": f"{(7 * i + 5 * d) % 24:02d}:{(13 * d + i) % 60:02d}:00",
                      "flight": f"{airlines[i % 6]}{100 + 7 * i + d}"} for d in range(7)],
    }


def doc(i: int) -> bytes:
    return json.dumps(route(i), separators=(",", ":")).encode()


def xattr_value(body: bytes, pairs: dict[bytes, bytes]) -> bytes:
    blob = b"".join(struct.pack(">I", len(k) + len(v) + 2) + k + b"\x00" + v + b"\x00"
                    for k, v in pairs.items())
    return struct.pack(">I", len(blob)) + blob + body


def sync_xattr(i: int) -> bytes:
    """A revision-history system xattr, as a sync gateway would keep it."""
    revs = [{"rev": f"{n}-{(i * 7919 + n * 104729) % 16**8:08x}", "time": 1700000000 + 60 * n}
            for n in range(1, 9)]
    return json.dumps({"rev": revs[-1]["rev"], "history": revs, "channels": ["public"]},
                      separators=(",", ":")).encode()


def snappy_client(node) -> Client:
    c = Client(node.host, node.port, vbuckets=node.vbuckets)
    return c.setup(features=SNAPPY_FEATURES)


def get_meta(c: Client, key: bytes):
    f = c.call_msg(GetMeta(key=key, vbucket=c.vb(key), opaque=c.next_opaque(), version=2))
    if f.status:
        return f.status, None
    deleted, flags, expiry, rev = GET_META.unpack_from(f.extras)
    return f.status, {"deleted": deleted, "flags": flags, "expiry": expiry, "rev": rev,
                      "datatype": f.extras[20]}


def quiet_call(c: Client, opcode: int, **kw) -> Frame | None:
    """A quiet request followed by a NOOP: the error response, or None when only the NOOP
    answered."""
    c.request(opcode, **kw)
    noop = c.request(Opcode.NOOP)
    f = c.recv()
    if f.opcode == Opcode.NOOP and f.opaque == noop:
        return None
    assert c.recv().opaque == noop
    return f


def with_meta(c: Client, opcode: int, key: bytes, value: bytes, *, datatype: int, rev: int = 5,
              cas: int = 0x1234_5678_9ABC, flags: int = 0, expiry: int = 0, options=None):
    extras = META_EXTRAS.pack(flags, expiry, rev, cas)
    if options is not None:
        extras += struct.pack(">I", options)
    kw = dict(key=key, value=value, extras=extras, datatype=datatype, vbucket=c.vb(key))
    if opcode in (Opcode.SETQ_WITH_META, Opcode.ADDQ_WITH_META, Opcode.DELQ_WITH_META):
        return quiet_call(c, opcode, **kw)
    return c.call(opcode, **kw)


# -- negotiation ---------------------------------------------------------------------------------


def test_hello_acknowledges_what_the_transfer_tools_ask_for(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        got = c.hello(Feature.XATTR, Feature.XERROR, Feature.SNAPPY, Feature.JSON)
        assert got == sorted([Feature.XATTR, Feature.XERROR, Feature.SNAPPY, Feature.JSON])


# -- write paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize("opcode", [Opcode.SET, Opcode.SETQ, Opcode.ADD, Opcode.ADDQ,
                                    Opcode.REPLACE, Opcode.REPLACEQ])
def test_compressed_json_round_trips_through_set_add_replace(shared_node, opcode):
    original = doc(int(opcode))
    packed = compress(original)
    assert len(packed) < len(original)
    key = b"snappy-store-%02x" % opcode
    with snappy_client(shared_node) as c, connect(shared_node) as plain:
        if opcode in (Opcode.REPLACE, Opcode.REPLACEQ):
            assert plain.set(key, b"old").status == Status.SUCCESS
        kw = dict(key=key, value=packed, extras=STORE_EXTRAS.pack(0xBEEF, 0), datatype=SNAPPY,
                  vbucket=c.vb(key))
        if opcode in (Opcode.SETQ, Opcode.ADDQ, Opcode.REPLACEQ):
            assert quiet_call(c, opcode, **kw) is None
        else:
            assert c.call(opcode, **kw).status == Status.SUCCESS
        # stored decompressed: neither connection gets the bit back, both get the document
        for reader in (plain, c):
            f = reader.get(key)
            assert f.status == Status.SUCCESS
            assert f.value == original
            assert f.datatype == JSON, "JSON detected on the decompressed body, no SNAPPY bit"
            assert struct.unpack(">I", f.extras) == (0xBEEF,)
        assert get_meta(plain, key)[1]["datatype"] == JSON


@pytest.mark.parametrize("opcode", [Opcode.APPEND, Opcode.APPENDQ, Opcode.PREPEND,
                                    Opcode.PREPENDQ])
def test_compressed_append_and_prepend(shared_node, opcode):
    full = doc(40 + int(opcode))
    cut = len(full) // 3
    head, tail = full[:cut], full[cut:]
    appending = opcode in (Opcode.APPEND, Opcode.APPENDQ)
    stored, added = (head, tail) if appending else (tail, head)
    packed = compress(added)
    assert len(packed) < len(added)
    key = b"snappy-ap-%02x" % opcode
    expiry = 2_000_000_000
    with snappy_client(shared_node) as c, connect(shared_node) as plain:
        assert plain.set(key, stored, flags=0x0A0B, expiry=expiry).status == Status.SUCCESS
        assert plain.get(key).datatype == 0, "a JSON fragment is not JSON"
        kw = dict(key=key, value=packed, datatype=SNAPPY, vbucket=c.vb(key))
        if opcode in (Opcode.APPENDQ, Opcode.PREPENDQ):
            assert quiet_call(c, opcode, **kw) is None
        else:
            f = c.call(opcode, **kw)
            assert f.status == Status.SUCCESS and f.cas
        f = plain.get(key)
        assert f.value == full
        assert f.datatype == JSON, "the whole document is JSON again"
        status, meta = get_meta(plain, key)
        assert meta["flags"] == 0x0A0B and meta["expiry"] == expiry and meta["rev"] == 2


def test_append_prepend_semantics(node_factory):
    node = node_factory(vbuckets=1)
    with connect(node) as c:
        # a missing key is NOT_STORED, extras or an XATTR value are EINVAL
        assert c.call(Opcode.APPEND, key=b"none", value=b"x").status == Status.NOT_STORED
        assert c.call(Opcode.PREPENDQ, key=b"none", value=b"x").status == Status.NOT_STORED
        assert c.set(b"k", b"middle").status == Status.SUCCESS
        assert c.call(Opcode.APPEND, key=b"k", value=b"x",
                      extras=b"\0" * 8).status == Status.EINVAL
        assert c.call(Opcode.APPEND, key=b"k", value=xattr_value(b"x", {b"a": b"1"}),
                      datatype=XATTR).status == Status.EINVAL
        # the CAS must match when given
        cas = c.get(b"k").cas
        assert c.call(Opcode.APPEND, key=b"k", value=b"!", cas=cas + 1).status == Status.KEY_EEXISTS
        assert c.call(Opcode.APPEND, key=b"k", value=b"-end", cas=cas).status == Status.SUCCESS
        assert c.call(Opcode.PREPEND, key=b"k", value=b"start-").status == Status.SUCCESS
        assert c.get(b"k").value == b"start-middle-end"
        # a document's xattrs stay in front of the body
        sync = sync_xattr(1)
        assert c.set(b"x", xattr_value(b'{"a":', {b"_sync": sync}),
                     datatype=XATTR).status == Status.SUCCESS
        assert c.call(Opcode.APPEND, key=b"x", value=b"1}").status == Status.SUCCESS
        assert c.call(Opcode.PREPEND, key=b"x", value=b" ").status == Status.SUCCESS
        f = c.get(b"x")
        assert f.value == b' {"a":1}' and f.datatype == JSON
        assert get_meta(c, b"x")[1]["datatype"] == XATTR | JSON
        items = _stream_all(node, flags=0x1 | DcpOpenFlag.INCLUDE_XATTRS)
        assert items[b"x"].value == xattr_value(b' {"a":1}', {b"_sync": sync})


@pytest.mark.parametrize("opcode", [Opcode.SET_WITH_META, Opcode.SETQ_WITH_META,
                                    Opcode.ADD_WITH_META, Opcode.ADDQ_WITH_META])
def test_compressed_set_and_add_with_meta(shared_node, opcode):
    original = doc(80 + int(opcode))
    key = b"snappy-meta-%02x" % opcode
    with snappy_client(shared_node) as c:
        res = with_meta(c, opcode, key, compress(original), datatype=SNAPPY | JSON, rev=7,
                        flags=0x77)
        if opcode in (Opcode.SETQ_WITH_META, Opcode.ADDQ_WITH_META):
            assert res is None
        else:
            assert res.status == Status.SUCCESS
        f = c.get(key)
        assert f.value == original and f.datatype == JSON
        meta = get_meta(c, key)[1]
        assert meta == {"deleted": 0, "flags": 0x77, "expiry": 0, "rev": 7, "datatype": JSON}


@pytest.mark.parametrize("opcode", [Opcode.DEL_WITH_META, Opcode.DELQ_WITH_META])
def test_compressed_xattrs_of_a_deletion_with_meta(node_factory, opcode):
    node = node_factory(vbuckets=1)
    body = doc(3)
    sync = sync_xattr(3)
    with snappy_client(node) as c:
        # a document whose whole value (xattrs and body) is compressed
        whole = xattr_value(body, {b"_sync": sync})
        res = with_meta(c, Opcode.SET_WITH_META, b"d", compress(whole),
                        datatype=SNAPPY | XATTR | JSON, rev=3)
        assert res.status == Status.SUCCESS
        f = c.get(b"d")
        assert f.value == body and f.datatype == JSON
        # its deletion keeps a (compressed) system xattr
        tomb = xattr_value(b"", {b"_sync": sync})
        res = with_meta(c, opcode, b"d", compress(tomb), datatype=SNAPPY | XATTR, rev=4,
                        cas=0x2234_5678_9ABC)
        if opcode == Opcode.DELQ_WITH_META:
            assert res is None, res
        else:
            assert res.status == Status.SUCCESS
        assert c.get(b"d").status == Status.KEY_ENOENT
        meta = get_meta(c, b"d")[1]
        assert meta["deleted"] == 1 and meta["rev"] == 4 and meta["datatype"] == XATTR
    items = _stream_all(node, flags=0x1 | DcpOpenFlag.INCLUDE_XATTRS)
    assert isinstance(items[b"d"], DcpDeletion)
    assert items[b"d"].value == tomb and items[b"d"].datatype == XATTR


# -- refusals ------------------------------------------------------------------------------------


def _bad_values() -> list:
    good = compress(doc(1))
    return [
        pytest.param(b"\x10" + b"\xff" * 20, Status.EINVAL, id="garbage"),
        pytest.param(good[:len(good) // 2], Status.EINVAL, id="truncated"),
        pytest.param(good + b"\x00\x01", Status.EINVAL, id="trailing-bytes"),
        pytest.param(b"", Status.EINVAL, id="empty"),
        pytest.param(b"\x80\x80\x80\x0b" + b"\x00" * 8, Status.E2BIG, id="declares-23MiB"),
        pytest.param(compress(b"x" * (MAX_VALUE + 1)), Status.E2BIG, id="inflates-too-big"),
    ]


@pytest.mark.parametrize("value,status", _bad_values())
def test_an_invalid_snappy_value_is_refused_on_every_write_path(shared_node, value, status):
    with snappy_client(shared_node) as c:
        key = b"bad-snappy"
        assert c.set(key, b'{"kept": true}').status == Status.SUCCESS
        before = get_meta(c, key)[1]
        vb = c.vb(key)
        answers = {
            "SET": c.call(Opcode.SET, key=key, value=value, extras=STORE_EXTRAS.pack(0, 0),
                          datatype=SNAPPY, vbucket=vb),
            "SETQ": quiet_call(c, Opcode.SETQ, key=key, value=value,
                               extras=STORE_EXTRAS.pack(0, 0), datatype=SNAPPY, vbucket=vb),
            "APPEND": c.call(Opcode.APPEND, key=key, value=value, datatype=SNAPPY, vbucket=vb),
            "PREPENDQ": quiet_call(c, Opcode.PREPENDQ, key=key, value=value, datatype=SNAPPY,
                                   vbucket=vb),
            "SET_WITH_META": with_meta(c, Opcode.SET_WITH_META, key, value, datatype=SNAPPY,
                                       rev=99, options=MetaOption.SKIP_CONFLICT_RESOLUTION),
            "DEL_WITH_META": with_meta(c, Opcode.DEL_WITH_META, key, value,
                                       datatype=SNAPPY | XATTR, rev=99,
                                       options=MetaOption.SKIP_CONFLICT_RESOLUTION),
        }
        for name, f in answers.items():
            assert f is not None and f.status == status, name
        # nothing was stored, and this connection and others go on
        f = c.get(key)
        assert f.value == b'{"kept": true}'
        assert get_meta(c, key)[1] == before
    with connect(shared_node) as other:
        assert other.set(b"after-bad", b"v").status == Status.SUCCESS
        assert other.get(b"after-bad").value == b"v"


def test_compressed_xattrs_are_checked_after_decompression(shared_node):
    with snappy_client(shared_node) as c:
        broken = struct.pack(">I", 40) + b"not an xattr section at all" + b"." * 13 + b"{}"
        f = c.set(b"bad-x", compress(broken), datatype=SNAPPY | XATTR)
        assert f.status == Status.XATTR_EINVAL
        good = xattr_value(doc(5), {b"_sync": sync_xattr(5)})
        assert c.set(b"good-x", compress(good),
                     datatype=SNAPPY | XATTR | JSON).status == Status.SUCCESS
        f = c.get(b"good-x")
        assert f.value == doc(5) and f.datatype == JSON
        assert get_meta(c, b"good-x")[1]["datatype"] == XATTR | JSON


def test_the_snappy_bit_without_negotiating_snappy_is_einval(shared_node):
    original = doc(9)
    packed = compress(original)
    with connect(shared_node) as c:  # XATTR, JSON, ... but not Snappy
        key = b"unnegotiated"
        assert c.set(key, packed, datatype=SNAPPY).status == Status.EINVAL
        assert c.set(key, packed, datatype=SNAPPY, opcode=Opcode.ADD).status == Status.EINVAL
        assert c.call(Opcode.APPEND, key=key, value=packed, datatype=SNAPPY,
                      vbucket=c.vb(key)).status == Status.EINVAL
        assert with_meta(c, Opcode.SET_WITH_META, key, packed,
                         datatype=SNAPPY).status == Status.EINVAL
        assert with_meta(c, Opcode.DEL_WITH_META, key, compress(xattr_value(b"", {b"a": b"1"})),
                         datatype=SNAPPY | XATTR).status == Status.EINVAL
        assert c.get(key).status == Status.KEY_ENOENT
        assert get_meta(c, key)[0] == Status.KEY_ENOENT
        # the same value uncompressed is fine
        assert c.set(key, original).status == Status.SUCCESS


# -- DCP -------------------------------------------------------------------------------------------


def _dcp(node, name: str, *, snappy: bool, flags: int = 0x1) -> DcpClient:
    c = DcpClient(node.host, node.port, vbuckets=node.vbuckets)
    c.setup(features=SNAPPY_FEATURES if snappy else DEFAULT_FEATURES)
    assert c.open(name, flags).status == Status.SUCCESS
    return c


def _stream_all(node, *, flags: int = 0x1, name: str = "snappy-reader") -> dict:
    with connect(node) as kv:
        end = high_seqno(kv, 0)
    with _dcp(node, name, snappy=False, flags=flags) as c:
        assert c.control("enable_noop", "true").status == Status.SUCCESS
        assert c.stream_req(0, end=end).status == Status.SUCCESS
        c.drain()
        return {i.key: i for i in c.log(0).items}


def _load(node, n: int = 20) -> dict[bytes, bytes]:
    docs = {b"route_%d" % i: doc(i) for i in range(n)}
    with snappy_client(node) as c:
        for key, value in docs.items():
            assert c.set(key, compress(value), datatype=SNAPPY, vbucket=0).status == 0
    return docs


@pytest.mark.parametrize("snappy", [False, True], ids=["without-snappy", "snappy-not-forced"])
def test_dcp_never_sends_compressed_values_unless_forced(node_factory, snappy):
    node = node_factory(vbuckets=1)
    docs = _load(node)
    with _dcp(node, "plain", snappy=snappy) as c:
        assert c.stream_req(0, end=len(docs)).status == Status.SUCCESS
        c.drain()
        items = c.log(0).items
    assert {i.key: i.value for i in items} == docs
    assert all(i.datatype == JSON for i in items)


def test_force_value_compression_needs_snappy(shared_node):
    with _dcp(shared_node, "force-no-snappy", snappy=False) as c:
        assert c.control("force_value_compression", "true").status == Status.EINVAL
        assert c.control("force_value_compression", "false").status == Status.EINVAL
    with _dcp(shared_node, "force-snappy", snappy=True) as c:
        assert c.control("force_value_compression", "false").status == Status.SUCCESS
        assert c.control("force_value_compression", "true").status == Status.SUCCESS


def test_force_value_compression_sends_compressed_values(node_factory):
    node = node_factory(vbuckets=1)
    docs = _load(node, 30)                                     # seqnos 1..30, compressed in
    random_bytes = os.urandom(200)
    sync = sync_xattr(7)
    with connect(node) as kv:
        wait_persisted(kv)
    node.restart()  # what was written so far comes from disk, the rest from memory
    with snappy_client(node) as kv:
        assert kv.set(b"random", random_bytes, vbucket=0).status == 0          # 31
        assert kv.set(b"empty", b"", vbucket=0).status == 0                    # 32
        assert kv.set(b"withx", xattr_value(doc(99), {b"_sync": sync}),
                      datatype=XATTR | JSON, vbucket=0).status == 0            # 33
        assert with_meta(kv, Opcode.SET_WITH_META, b"tomb", doc(98), datatype=JSON,
                         rev=1).status == 0                                    # 34
        assert with_meta(kv, Opcode.DEL_WITH_META, b"tomb", xattr_value(b"", {b"_sync": sync}),
                         datatype=XATTR, rev=2, cas=0x2234_5678_9ABC).status == 0  # 35
        assert kv.set(b"late", compress(doc(50)), datatype=SNAPPY, vbucket=0).status == 0  # 36
        end = high_seqno(kv, 0)
    assert end == 36
    with _dcp(node, "forced", snappy=True, flags=0x1 | DcpOpenFlag.INCLUDE_XATTRS) as c:
        assert c.control("enable_noop", "true").status == Status.SUCCESS
        assert c.control("connection_buffer_size", "10000000").status == Status.SUCCESS
        assert c.control("force_value_compression", "true").status == Status.SUCCESS
        assert c.stream_req(0, end=end).status == Status.SUCCESS
        c.drain()
        items = {i.key: i for i in c.log(0).items}
        # flow control counted what went on the wire: the compressed sizes
        stats = c.stats("dcp")
        assert int(stats["eq_dcpq:forced:unacked_bytes"]) == c.received_bytes
    assert c.log(0).markers[0].flags & 0x02, "the first snapshot came from disk"
    docs[b"late"] = doc(50)
    for key, original in docs.items():
        m = items[key]
        assert isinstance(m, DcpMutation)
        assert m.datatype == JSON | SNAPPY, key
        assert len(m.value) < len(original)
        assert decompress(m.value) == original
    # a value that would grow when compressed goes as it is; an empty one too
    assert items[b"random"].datatype == 0 and items[b"random"].value == random_bytes
    assert items[b"empty"].datatype == 0 and items[b"empty"].value == b""
    # xattrs and body are compressed together
    withx = items[b"withx"]
    assert withx.datatype == XATTR | JSON | SNAPPY
    assert decompress(withx.value) == xattr_value(doc(99), {b"_sync": sync})
    # a deletion that carries xattrs carries them compressed
    tomb = items[b"tomb"]
    assert isinstance(tomb, DcpDeletion) and tomb.datatype == XATTR | SNAPPY
    assert decompress(tomb.value) == xattr_value(b"", {b"_sync": sync})


def test_force_value_compression_can_be_turned_off_again(node_factory):
    node = node_factory(vbuckets=1)
    docs = _load(node, 4)
    with _dcp(node, "toggle", snappy=True) as c:
        assert c.control("force_value_compression", "true").status == Status.SUCCESS
        assert c.control("force_value_compression", "false").status == Status.SUCCESS
        assert c.stream_req(0, end=4).status == Status.SUCCESS
        c.drain()
        assert [i.datatype for i in c.log(0).items] == [JSON] * 4
        assert [i.value for i in c.log(0).items] == list(docs.values())


# -- the replication consumer ----------------------------------------------------------------------


def test_a_replica_decompresses_what_its_source_sent_compressed():
    from dcptool.node.replication import _decompressed
    from dcptool.protocol.errors import ProtocolError

    plain = (0x57, 0, 1, 1, 0x1600, 0, 0, JSON, b"a", doc(1))
    assert _decompressed(plain) is plain
    packed = (0x57, 0, 2, 1, 0x1601, 7, 0, JSON | SNAPPY, b"b", memoryview(compress(doc(2))))
    assert _decompressed(packed) == (0x57, 0, 2, 1, 0x1601, 7, 0, JSON, b"b", doc(2))
    tomb = xattr_value(b"", {b"_sync": sync_xattr(3)})
    deleted = (0x58, 0, 3, 2, 0x1602, 0, 0, XATTR | SNAPPY, b"c", compress(tomb))
    assert _decompressed(deleted)[7:] == (XATTR, b"c", tomb)
    with pytest.raises(ProtocolError):
        _decompressed((0x57, 0, 4, 1, 0x1603, 0, 0, SNAPPY, b"d", b"\x10" + b"\xff" * 9))
