"""DCP and collections against real node processes over TCP: legacy streams, collection-aware
streams (unfiltered, by collections, by scope), system events, seqno-advanced, stream ids,
FilterEmpty, dropped collections and per-collection high seqnos."""
from __future__ import annotations

import base64
import json
import struct
import time
import urllib.parse
import urllib.request

import pytest

from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_END_COLLECTION,
    SystemEvent,
    doc_key,
    split_doc_key,
)
from dcptool.protocol.constants import SEQNO_MAX, Feature, Opcode, Status, StreamEndReason
from dcptool.protocol.messages import (
    DcpDeletion,
    DcpMutation,
    DcpSeqnoAdvanced,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpStreamReq,
    DcpSystemEvent,
)

from .dcputil import DcpClient
from .mcbputil import DEFAULT_FEATURES, connect, wait_persisted

COLL_FEATURES = DEFAULT_FEATURES + (Feature.COLLECTIONS,)
VB = 0


# -- helpers -------------------------------------------------------------------------------


def rest(node, method: str, path: str, form: dict | None = None):
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{node.rest_port}{path}", data=data,
                                 method=method)
    token = base64.b64encode(f"{node.username}:{node.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    if data is not None:
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
    with urllib.request.urlopen(req, timeout=10) as rsp:
        body = rsp.read()
    return json.loads(body) if body else None


def buckets_path(node) -> str:
    return f"/pools/default/buckets/{node.bucket}/scopes"


def create_scope(node, name):
    rest(node, "POST", buckets_path(node), {"name": name})


def create_collection(node, scope, name) -> int:
    rest(node, "POST", f"{buckets_path(node)}/{scope}/collections", {"name": name})
    return collection_id(node, scope, name)


def drop_collection(node, scope, name):
    rest(node, "DELETE", f"{buckets_path(node)}/{scope}/collections/{name}")


def manifest(node) -> dict:
    return rest(node, "GET", buckets_path(node))


def collection_id(node, scope, name) -> int:
    for s in manifest(node)["scopes"]:
        if s["name"] == scope:
            for c in s["collections"]:
                if c["name"] == name:
                    return int(c["uid"], 16)
    raise KeyError(f"{scope}.{name}")


def scope_id(node, scope) -> int:
    return next(int(s["uid"], 16) for s in manifest(node)["scopes"] if s["name"] == scope)


def dcp(node, name: str, *, collections: bool = True) -> DcpClient:
    c = DcpClient(node.host, node.port, vbuckets=node.vbuckets)
    c.setup(features=COLL_FEATURES if collections else DEFAULT_FEATURES)
    f = c.open(name)
    assert f.status == Status.SUCCESS, f
    return c


def request(c: DcpClient, *, value: bytes = b"", opaque: int = 0x77, start: int = 0,
            end: int = SEQNO_MAX, vb: int = VB):
    return c.call_msg(DcpStreamReq(vbucket=vb, opaque=opaque, start_seqno=start, end_seqno=end,
                                   snap_start_seqno=start, snap_end_seqno=start, value=value))


def collect(c: DcpClient, *, ends: int = 1, timeout: float = 20.0) -> list:
    """Every producer message (decoded) until `ends` STREAM_ENDs arrived."""
    out = []
    deadline = time.monotonic() + timeout
    while sum(isinstance(m, DcpStreamEnd) for m in out) < ends:
        out.append(c.next_message(timeout=max(0.1, deadline - time.monotonic())))
    return out


def collect_until(c: DcpClient, pred, timeout: float = 20.0) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while not out or not pred(out[-1]):
        out.append(c.next_message(timeout=max(0.1, deadline - time.monotonic())))
    return out


def content(msgs) -> list:
    """(kind, seqno, what) of the items and events of a stream, in arrival order."""
    out = []
    for m in msgs:
        if isinstance(m, (DcpMutation, DcpDeletion)):
            out.append(("doc", m.by_seqno, bytes(m.key)))
        elif isinstance(m, DcpSystemEvent):
            ev = SystemEvent.decode(m.by_seqno, m.event, m.version, m.key, m.value)
            out.append(("event", m.by_seqno, (ev.event, ev.collection_id
                                               if ev.collection_id is not None else ev.scope_id)))
    return out


def check_markers(msgs) -> None:
    """Every item and event lies inside the marker before it; seqnos strictly increase."""
    current = None
    last = -1
    for m in msgs:
        if isinstance(m, DcpSnapshotMarker):
            current = m
        elif isinstance(m, (DcpMutation, DcpDeletion, DcpSystemEvent)):
            assert current is not None
            assert current.start_seqno <= m.by_seqno <= current.end_seqno, (m, current)
            assert m.by_seqno > last
            last = m.by_seqno


def kv(node, *, collections: bool = True):
    return connect(node, features=COLL_FEATURES if collections else DEFAULT_FEATURES)


def high(node, vb: int = VB) -> int:
    with kv(node) as c:
        return int(c.stats(f"vbucket-seqno {vb}")[f"vb_{vb}:high_seqno"])


@pytest.fixture
def cnode(node_factory):
    """A node with scope s1 (c1, c2) and s2 (c3) and two documents in each collection and the
    default one, all in vbucket 0; `ids` maps names to collection ids."""
    node = node_factory(vbuckets=4)
    create_scope(node, "s1")
    create_scope(node, "s2")
    ids = {"_default": 0}
    for scope, name in (("s1", "c1"), ("s1", "c2"), ("s2", "c3")):
        ids[name] = create_collection(node, scope, name)
    with kv(node) as c:
        for name in ("_default", "c1", "c2", "c3"):
            for k in (b"a", b"b"):
                f = c.set(doc_key(ids[name], k), b'{"v":1}', datatype=1, vbucket=VB)
                assert f.status == Status.SUCCESS, f
    node.ids = ids
    return node


def restart_for_disk(node) -> None:
    """Persist everything and restart: streams then read from disk backfills."""
    with kv(node) as c:
        wait_persisted(c)
    node.restart()


# -- legacy connections --------------------------------------------------------------------


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_legacy_stream_sees_only_default_documents_without_prefix(cnode, source):
    with kv(cnode, collections=False) as c:
        assert c.set(b"plain", b"1", vbucket=VB).status == Status.SUCCESS
    if source == "disk":
        restart_for_disk(cnode)
    with dcp(cnode, "legacy", collections=False) as c:
        assert request(c, end=high(cnode)).status == Status.SUCCESS
        msgs = collect(c)
    check_markers(msgs)
    assert [x[2] for x in content(msgs)] == [b"a", b"b", b"plain"]
    assert not any(isinstance(m, (DcpSystemEvent, DcpSeqnoAdvanced)) for m in msgs)
    assert msgs[-1].reason == StreamEndReason.OK


def test_legacy_stream_request_with_a_value_is_einval(cnode):
    with dcp(cnode, "legacy-value", collections=False) as c:
        assert request(c, value=b'{"collections":["0"]}').status == Status.EINVAL


# -- collection-aware streams --------------------------------------------------------------


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_unfiltered_stream_sees_doc_keys_and_system_events_in_seqno_order(cnode, source):
    ids = cnode.ids
    if source == "disk":
        restart_for_disk(cnode)
    top = high(cnode)
    with dcp(cnode, "all") as c:
        assert request(c, end=top).status == Status.SUCCESS
        msgs = collect(c)
    check_markers(msgs)
    got = content(msgs)
    assert [s for _k, s, _w in got] == list(range(1, top + 1))  # nothing hidden, in order
    events = [w for k, _s, w in got if k == "event"]
    assert events == [(EVENT_CREATE_SCOPE, scope_id(cnode, "s1")),
                      (EVENT_CREATE_SCOPE, scope_id(cnode, "s2")),
                      (EVENT_BEGIN_COLLECTION, ids["c1"]), (EVENT_BEGIN_COLLECTION, ids["c2"]),
                      (EVENT_BEGIN_COLLECTION, ids["c3"])]
    docs = [w for k, _s, w in got if k == "doc"]
    assert docs == [doc_key(ids[n], k) for n in ("_default", "c1", "c2", "c3")
                    for k in (b"a", b"b")]
    assert not any(isinstance(m, DcpSeqnoAdvanced) for m in msgs)


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_stream_filtered_by_collections(cnode, source):
    ids = cnode.ids
    if source == "disk":
        restart_for_disk(cnode)
    value = json.dumps({"collections": [format(ids["c1"], "x"), format(ids["c3"], "x")]})
    with dcp(cnode, "by-collections") as c:
        assert request(c, value=value.encode(), end=high(cnode)).status == Status.SUCCESS
        msgs = collect(c)
    check_markers(msgs)
    got = [w for _k, _s, w in content(msgs)]
    assert got == [(EVENT_BEGIN_COLLECTION, ids["c1"]), (EVENT_BEGIN_COLLECTION, ids["c3"]),
                   doc_key(ids["c1"], b"a"), doc_key(ids["c1"], b"b"),
                   doc_key(ids["c3"], b"a"), doc_key(ids["c3"], b"b")]
    assert msgs[-1].reason == StreamEndReason.OK


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_stream_filtered_by_scope(cnode, source):
    ids = cnode.ids
    if source == "disk":
        restart_for_disk(cnode)
    s1 = scope_id(cnode, "s1")
    with dcp(cnode, "by-scope") as c:
        assert request(c, value=b'{"scope":"%x"}' % s1).status == Status.SUCCESS
        got = content(collect_until(c, lambda m: isinstance(m, DcpMutation)
                                    and m.key == doc_key(ids["c2"], b"b")))
        # a collection created in the scope later joins the stream; one elsewhere does not
        c4 = create_collection(cnode, "s1", "c4")
        create_collection(cnode, "s2", "c5")
        with kv(cnode) as k:
            assert k.set(doc_key(c4, b"new"), b"1", vbucket=VB).status == Status.SUCCESS
        got += content(collect_until(c, lambda m: isinstance(m, DcpMutation)))
    assert [w for _k, _s, w in got] == [
        (EVENT_CREATE_SCOPE, s1), (EVENT_BEGIN_COLLECTION, ids["c1"]),
        (EVENT_BEGIN_COLLECTION, ids["c2"]),
        doc_key(ids["c1"], b"a"), doc_key(ids["c1"], b"b"),
        doc_key(ids["c2"], b"a"), doc_key(ids["c2"], b"b"),
        (EVENT_BEGIN_COLLECTION, c4), doc_key(c4, b"new")]


def test_seqno_advanced_when_the_filter_hides_the_end_of_a_disk_snapshot(cnode):
    ids = cnode.ids
    with kv(cnode) as c:  # the last seqno is in a collection the stream does not want
        assert c.set(doc_key(ids["c2"], b"last"), b"1", vbucket=VB).status == Status.SUCCESS
    restart_for_disk(cnode)
    top = high(cnode)
    with dcp(cnode, "advanced") as c:
        assert request(c, value=b'{"collections":["%x"]}' % ids["c1"], end=top).status == 0
        msgs = collect(c)
    kinds = [type(m).__name__ for m in msgs]
    assert kinds == ["DcpSnapshotMarker", "DcpSystemEvent", "DcpMutation", "DcpMutation",
                     "DcpSeqnoAdvanced", "DcpStreamEnd"]
    marker, adv = msgs[0], msgs[4]
    assert marker.end_seqno == top and msgs[3].by_seqno < top
    assert adv.by_seqno == top and adv.opaque == 0x77


def test_memory_snapshot_markers_end_at_the_last_item_sent(cnode):
    ids = cnode.ids
    with dcp(cnode, "mem-filtered") as c:
        assert request(c, value=b'{"collections":["%x"]}' % ids["c1"]).status == 0
        msgs = collect_until(c, lambda m: isinstance(m, DcpMutation)
                             and m.key == doc_key(ids["c1"], b"b"))
        with kv(cnode) as k:  # a snapshot with nothing for this stream, then one with
            assert k.set(doc_key(ids["c2"], b"x"), b"1", vbucket=VB).status == 0
            assert k.set(doc_key(ids["c1"], b"y"), b"1", vbucket=VB).status == 0
        msgs += collect_until(c, lambda m: isinstance(m, DcpMutation))
    check_markers(msgs)
    markers = [m for m in msgs if isinstance(m, DcpSnapshotMarker)]
    items = [m for m in msgs if isinstance(m, (DcpMutation, DcpSystemEvent))]
    assert markers[0].end_seqno == items[2].by_seqno  # c1's b, not the higher c2/c3 seqnos
    assert markers[-1].end_seqno == items[-1].by_seqno
    assert not any(isinstance(m, DcpSeqnoAdvanced) for m in msgs)
    assert [split_doc_key(m.key)[1] for m in items if isinstance(m, DcpMutation)] == \
        [b"a", b"b", b"y"]


# -- stream ids ------------------------------------------------------------------------------


def test_two_stream_ids_on_one_vbucket(cnode):
    ids = cnode.ids
    with dcp(cnode, "sids") as c:
        assert c.control("enable_stream_id", "true").status == Status.SUCCESS
        # with stream ids on, a request must name its sid
        assert request(c, value=b'{"collections":["%x"]}' % ids["c1"]).status == \
            Status.DCP_STREAM_ID_INVALID
        assert request(c, opaque=1, value=b'{"sid":1,"collections":["%x"]}' % ids["c1"]).status == 0
        assert request(c, opaque=2, value=b'{"sid":2,"collections":["%x"]}' % ids["c2"]).status == 0
        # the same sid twice on the vbucket: the stream exists
        assert request(c, opaque=3, value=b'{"sid":2}').status == Status.KEY_EEXISTS
        msgs = []
        while sum(isinstance(m, DcpMutation) for m in msgs) < 4:
            msgs.append(c.next_message(timeout=10))
        for m in msgs:
            assert m.stream_id == m.opaque  # every message carries its stream's id
        by_sid = {sid: [split_doc_key(m.key)[0] for m in msgs
                        if isinstance(m, DcpMutation) and m.stream_id == sid] for sid in (1, 2)}
        assert by_sid == {1: [ids["c1"]] * 2, 2: [ids["c2"]] * 2}
        # CLOSE_STREAM by sid: stream 1 goes, stream 2 goes on
        f = c.call(Opcode.DCP_CLOSE_STREAM, vbucket=VB, framing=b"\x22\x00\x01", magic=0x08)
        assert f.status == Status.SUCCESS
        with kv(cnode) as k:
            assert k.set(doc_key(ids["c1"], b"z"), b"1", vbucket=VB).status == 0
            assert k.set(doc_key(ids["c2"], b"z"), b"1", vbucket=VB).status == 0
        more = collect_until(c, lambda m: isinstance(m, DcpMutation))
        assert {m.stream_id for m in more} == {2}
        assert more[-1].key == doc_key(ids["c2"], b"z")


# -- drops -----------------------------------------------------------------------------------


def test_filter_empty_after_the_filtered_collection_is_dropped(cnode):
    ids = cnode.ids
    with dcp(cnode, "filter-empty") as c:
        assert request(c, value=b'{"collections":["%x"]}' % ids["c1"]).status == 0
        collect_until(c, lambda m: isinstance(m, DcpMutation) and m.key.endswith(b"b"))
        drop_collection(cnode, "s1", "c1")
        msgs = collect(c)
    got = content(msgs)
    assert got == [("event", got[0][1], (EVENT_END_COLLECTION, ids["c1"]))]
    assert msgs[-1].reason == StreamEndReason.FILTER_EMPTY


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_documents_of_a_dropped_collection_are_not_streamed(cnode, source):
    ids = cnode.ids
    drop_collection(cnode, "s1", "c2")
    if source == "disk":
        restart_for_disk(cnode)
    with dcp(cnode, "after-drop") as c:
        assert request(c, end=high(cnode)).status == 0
        msgs = collect(c)
    check_markers(msgs)
    got = content(msgs)
    assert not [w for k, _s, w in got if k == "doc" and split_doc_key(w)[0] == ids["c2"]]
    assert (EVENT_END_COLLECTION, ids["c2"]) in [w for k, _s, w in got if k == "event"]
    assert [w for k, _s, w in got if k == "doc" and split_doc_key(w)[0] == ids["c1"]]
    with dcp(cnode, "after-drop-filtered") as c:  # it no longer exists for a filter
        f = request(c, value=b'{"collections":["%x"]}' % ids["c2"])
        assert f.status == Status.UNKNOWN_COLLECTION
        assert "manifest_uid" in json.loads(f.value)


# -- GET_ALL_VB_SEQNOS -------------------------------------------------------------------------


def _seqnos(c, extras=b""):
    f = c.call(Opcode.GET_ALL_VB_SEQNOS, extras=extras)
    return f.status, dict(struct.iter_unpack(">HQ", f.value)) if f.status == 0 else f.value


@pytest.mark.parametrize("source", ["memory", "disk"])
def test_get_all_vb_seqnos_per_collection(cnode, source):
    ids = cnode.ids
    if source == "disk":
        restart_for_disk(cnode)
    with dcp(cnode, "seqnos") as d:
        assert request(d, end=high(cnode)).status == 0
        got = content(collect(d))
    last = {}
    for kind, seqno, what in got:
        cid = split_doc_key(what)[0] if kind == "doc" else what[1] if what[0] == 0 else None
        if cid is not None:
            last[cid] = seqno
    top = high(cnode)
    with kv(cnode) as c:
        # vbucket 1 holds no documents: a collection's high seqno there is its creation's
        # (events s1, s2, c1, c2, c3 at seqnos 1-5), the default collection's 0
        in_vb1 = {"_default": 0, "c1": 3, "c2": 4, "c3": 5}
        for name in ("_default", "c1", "c2", "c3"):
            status, seqnos = _seqnos(c, struct.pack(">II", 1, ids[name]))
            assert status == 0 and seqnos[VB] == last[ids[name]], name
            assert set(seqnos) == {0, 1, 2, 3} and seqnos[1] == in_vb1[name], name
        status, seqnos = _seqnos(c)
        assert seqnos[VB] == top
        status, body = _seqnos(c, struct.pack(">II", 1, 0x7F))
        assert status == Status.UNKNOWN_COLLECTION and "manifest_uid" in json.loads(body)
    with kv(cnode, collections=False) as c:
        # a client without collections: the default collection's high seqno; no filter
        status, seqnos = _seqnos(c)
        assert status == 0 and seqnos[VB] == last[0] < top
        assert _seqnos(c, struct.pack(">II", 1, 0))[0] == Status.EINVAL


# -- refused requests ------------------------------------------------------------------------


def test_bad_filters_are_refused_and_the_node_keeps_serving(cnode):
    ids = cnode.ids
    with dcp(cnode, "bad") as c:
        for bad in (b"{not json", b"{}", b'{"collections":"8"}', b'["8"]',
                    b'{"collections":["8"],"scope":"8"}'):
            assert request(c, value=bad).status == Status.EINVAL, bad
        assert request(c, value=b'{"scope":"7f"}').status == Status.UNKNOWN_SCOPE
        ahead = int(manifest(cnode)["uid"], 16) + 1
        assert request(c, value=b'{"uid":"%x"}' % ahead).status == 0x8B
        # the same connection still streams
        assert request(c, value=b'{"collections":["%x"],"extra":1}' % ids["c3"],
                       end=high(cnode)).status == 0
        assert [w for _k, _s, w in content(collect(c))] == [
            (EVENT_BEGIN_COLLECTION, ids["c3"]), doc_key(ids["c3"], b"a"),
            doc_key(ids["c3"], b"b")]
    with kv(cnode) as c:
        assert c.get(doc_key(ids["c3"], b"a"), vbucket=VB).status == Status.SUCCESS
