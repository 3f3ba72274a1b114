"""Collections in the client: the sans-I/O session (doc keys whatever the node accepted,
system events, seqno-advanced positions, filters in stream requests, FilterEmpty), and the
session and GET_COLLECTIONS_MANIFEST against a real node process over TCP."""
from __future__ import annotations

import pytest

from dcptool.client import (
    MUTATION, SEQNO_ADVANCED, STREAM_END, SYSTEM_EVENT, DcpConsumer, DcpSession, Position,
    SessionConfig, StreamError, get_collections_manifest,
)
from dcptool.client.events import EV_KEY, EV_SYSTEM_EVENT
from dcptool.client.options import ConnOptions
from dcptool.client.rest import RestClient
from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION, EVENT_CREATE_SCOPE, EVENT_END_COLLECTION, Manifest, StreamFilter,
    SystemEvent, doc_key,
)
from dcptool.protocol.constants import StreamEndReason
from dcptool.protocol.messages import (
    DcpDeletion, DcpSeqnoAdvanced, DcpStreamEnd, DcpSystemEvent, Set,
)

from .test_session import W, accept, handshake, marker, mutation

# -- sans-I/O --------------------------------------------------------------------------


def _open(config: SessionConfig, collections: bool, vb: int = 2, **kw):
    s = DcpSession(config, collections=collections)
    s.add_stream(vb, Position(), **kw)
    req = handshake(s)[vb]
    assert s.feed(accept(req))[0][0] != STREAM_END
    return s, req


def test_a_node_that_refused_collections_gets_its_keys_prefixed():
    s, req = _open(SessionConfig(collections=True), collections=False)
    evs = s.feed(marker(2, req.opaque, 1, 2) + mutation(2, req.opaque, 1, key=b"plain")
                 + DcpDeletion(vbucket=2, opaque=req.opaque, by_seqno=2, rev_seqno=2,
                               key=b"gone", delete_time=5).encode())
    assert [e[EV_KEY] for e in evs if e[0] in (MUTATION, 0x58)] == [b"\x00plain", b"\x00gone"]
    # typed events too
    s, req = _open(SessionConfig(collections=True, typed=True), collections=False)
    evs = s.feed(marker(2, req.opaque, 1, 1) + mutation(2, req.opaque, 1, key=b"k"))
    assert evs[-1][2].key == b"\x00k"
    # a session that did not ask for collections keeps the keys as they came
    s, req = _open(SessionConfig(), collections=False)
    evs = s.feed(marker(2, req.opaque, 1, 1) + mutation(2, req.opaque, 1, key=b"k"))
    assert evs[-1][EV_KEY] == b"k"


def test_keys_of_a_collections_connection_pass_unchanged_and_system_events_come_out():
    s, req = _open(SessionConfig(collections=True), collections=True)
    key, value, version = SystemEvent(1, EVENT_BEGIN_COLLECTION, 2, 8, 9, "hotels", 30).encode()
    evs = s.feed(marker(2, req.opaque, 1, 2)
                 + DcpSystemEvent(vbucket=2, opaque=req.opaque, by_seqno=1,
                                  event=EVENT_BEGIN_COLLECTION, version=version, key=key,
                                  value=value).encode()
                 + mutation(2, req.opaque, 2, key=doc_key(9, b"h1")))
    assert evs[1] == (SYSTEM_EVENT, 2, SystemEvent(1, EVENT_BEGIN_COLLECTION, 2, 8, 9,
                                                   "hotels", 30))
    assert evs[2][EV_KEY] == b"\x09h1"
    assert s.position(2).seqno == 2


def test_seqno_advanced_ends_the_snapshot_a_resume_starts_from():
    s, req = _open(SessionConfig(collections=True), collections=True)
    evs = s.feed(marker(2, req.opaque, 1, 10) + mutation(2, req.opaque, 4, key=b"\x08k")
                 + DcpSeqnoAdvanced(vbucket=2, opaque=req.opaque, by_seqno=10).encode())
    assert evs[-1] == (SEQNO_ADVANCED, 2, 10)
    pos = s.position(2)
    assert (pos.seqno, pos.snap_start, pos.snap_end) == (10, 10, 10)
    # an advance past the snapshot (outside any) is a snapshot end of its own
    s.feed(DcpSeqnoAdvanced(vbucket=2, opaque=req.opaque, by_seqno=15).encode())
    pos = s.position(2)
    assert (pos.seqno, pos.snap_start, pos.snap_end) == (15, 15, 15)
    assert 10 in pos.snapshot_ends and 15 in pos.snapshot_ends


def test_filters_go_in_the_stream_request_and_filter_empty_ends_the_stream():
    f = StreamFilter(collections=frozenset({8, 10}))
    s, req = _open(SessionConfig(collections=True), collections=True, filter=f)
    assert StreamFilter.parse(req.value) == f
    evs = s.feed(DcpStreamEnd(vbucket=2, opaque=req.opaque,
                              reason=StreamEndReason.FILTER_EMPTY).encode())
    assert evs == [(STREAM_END, 2, int(StreamEndReason.FILTER_EMPTY), False)]
    assert s.done and s.take_error() is None
    # the config's filter applies to every stream without one of its own
    s, req = _open(SessionConfig(collections=True, stream_filter=StreamFilter(scope=8)),
                   collections=True)
    assert StreamFilter.parse(req.value) == StreamFilter(scope=8)
    # a node without collections: no value at all; the default collection alone is fine
    s, req = _open(SessionConfig(collections=True, stream_filter=f), collections=False,
                   filter=StreamFilter(collections=frozenset({0})))
    assert req.value == b""
    # a pass-through filter sends no value (a node answers "{}" with EINVAL)
    s, req = _open(SessionConfig(collections=True), collections=True, filter=StreamFilter())
    assert req.value == b""
    s = DcpSession(SessionConfig(collections=True), collections=False)
    with pytest.raises(StreamError, match="did not accept Collections"):
        s.add_stream(1, Position(), filter=f)


# -- against a node --------------------------------------------------------------------


def _opts(node) -> ConnOptions:
    return ConnOptions(node.host, node.port, node.username, node.password, node.bucket)


@pytest.fixture
def cnode(node_factory):
    """A node with scope inventory (hotels, routes), a document in each collection and two
    in the default one, all in vbucket 0."""
    node = node_factory(vbuckets=4)
    rest = RestClient(node.host, node.rest_port, username=node.username,
                      password=node.password, bucket=node.bucket)
    rest.create_scope("inventory")
    rest.create_collection("inventory", "hotels")
    rest.create_collection("inventory", "routes", max_ttl=60)
    node.man = rest.manifest()
    node.rest = rest
    ids = {c.name: c.uid for s in node.man.scopes for c in s.collections}
    node.ids = ids
    with _opts(node).connect(collections=True) as c:
        assert c.collections
        for cid, key in ((0, b"d1"), (0, b"d2"), (ids["hotels"], b"h1"), (ids["routes"], b"r1")):
            rsp = c.request(Set(key=doc_key(cid, key), value=b'{"v":1}', datatype=1, vbucket=0))
            assert rsp.status == 0, rsp
    return node


def _drain(consumer) -> list:
    out = []
    for events in consumer.batches(tick=1.0):
        out += events
    return out


def test_manifest_and_collections_session_against_the_node(cnode):
    opts = _opts(cnode)
    with opts.connect(collections=True) as conn:
        m = get_collections_manifest(conn)
    assert isinstance(m, Manifest) and m == cnode.man
    assert m.collection("inventory", "routes").max_ttl == 60
    config = SessionConfig(name="t-coll", collections=True)
    with opts.consumer(config) as c:
        assert c.conn.collections and c.session.collections
        c.add_stream(0, Position(), end_seqno=7)
        evs = _drain(c)
    events = [e[EV_SYSTEM_EVENT] for e in evs if e[0] == SYSTEM_EVENT]
    assert [(e.event, e.name) for e in events] == [
        (EVENT_CREATE_SCOPE, "inventory"), (EVENT_BEGIN_COLLECTION, "hotels"),
        (EVENT_BEGIN_COLLECTION, "routes")]
    assert events[2].max_ttl == 60
    keys = [e[EV_KEY] for e in evs if e[0] == MUTATION]
    assert keys == [b"\x00d1", b"\x00d2", doc_key(cnode.ids["hotels"], b"h1"),
                    doc_key(cnode.ids["routes"], b"r1")]
    # a session that did not ask for collections sees the default collection's plain keys
    with opts.consumer(SessionConfig(name="t-legacy")) as c:
        assert not c.conn.collections
        c.add_stream(0, Position(), end_seqno=7)
        evs = _drain(c)
    assert [e[EV_KEY] for e in evs if e[0] == MUTATION] == [b"d1", b"d2"]
    assert not any(e[0] == SYSTEM_EVENT for e in evs)


def test_filtered_stream_and_filter_empty_against_the_node(cnode):
    opts = _opts(cnode)
    hotels = cnode.ids["hotels"]
    config = SessionConfig(name="t-filter", collections=True,
                           stream_filter=StreamFilter(collections=frozenset({hotels})))
    with opts.consumer(config) as c:
        c.add_stream(0, Position(), end_seqno=7)
        evs = _drain(c)
        pos = c.position(0)
    assert [e[EV_KEY] for e in evs if e[0] == MUTATION] == [doc_key(hotels, b"h1")]
    assert [e[EV_SYSTEM_EVENT].name for e in evs if e[0] == SYSTEM_EVENT] == ["hotels"]
    # the node's memory snapshot ended at the last document sent (routes' at 7 is hidden):
    # the position is that snapshot's end, a resume asks again for what the filter hides
    assert (pos.seqno, pos.snap_start, pos.snap_end) == (6, 6, 6)
    # the filtered collection dropped while streaming: its drop event, then FilterEmpty
    with opts.consumer(config) as c:
        c.add_stream(0, pos)
        cnode.rest.drop_collection("inventory", "hotels")
        evs = _drain(c)
    assert [(e[EV_SYSTEM_EVENT].event, e[EV_SYSTEM_EVENT].collection_id)
            for e in evs if e[0] == SYSTEM_EVENT] == [(EVENT_END_COLLECTION, hotels)]
    assert evs[-1] == (STREAM_END, 0, int(StreamEndReason.FILTER_EMPTY), False)


def test_a_consumer_on_a_node_connection_without_collections_prefixes_keys(node_factory):
    """A node that never saw Collections in HELLO (a connection made without asking):
    the session asked for doc keys still gets them, prefixed by itself."""
    node = node_factory(vbuckets=4)
    opts = _opts(node)
    with opts.connect() as conn:
        assert conn.request(Set(key=b"plain", value=b"1", vbucket=0)).status == 0
    conn = opts.connect()  # no HELLO Collections: as a node without collections answers
    c = DcpConsumer(conn, SessionConfig(name="t-pre", collections=True))
    try:
        c.start()
        c.add_stream(0, Position(), end_seqno=1)
        evs = _drain(c)
    finally:
        c.close()
    assert [e[EV_KEY] for e in evs if e[0] == MUTATION] == [b"\x00plain"]
