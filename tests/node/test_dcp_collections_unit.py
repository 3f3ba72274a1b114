"""The DCP producer's collections pieces in-process: the stream filter (dcptool.node.dcpfilter)
over a real Bucket's vbuckets, and the per-collection high seqnos a VBucket keeps."""
from __future__ import annotations

import pytest

from dcptool.protocol import wire as w
from dcptool.protocol import decode_frame, decode_message
from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_DROP_SCOPE,
    EVENT_END_COLLECTION,
    StreamFilter,
    SystemEvent,
    doc_key,
)
from dcptool.protocol.constants import Status
from dcptool.protocol.messages import DcpSeqnoAdvanced, DcpSystemEvent
from dcptool.node.bucket import Bucket
from dcptool.node.dcpfilter import (
    STATUS_MANIFEST_AHEAD,
    DcpFilter,
    FilterRefused,
    parse_request_value,
)
from dcptool.node.item import ITEM_SYSTEM
from dcptool.node.sysevent import event_of


@pytest.fixture
def bucket(tmp_path):
    (tmp_path / "node").mkdir()
    b = Bucket(tmp_path / "node", num_vbuckets=2, flush_interval=3600)
    b.warm_up()
    yield b
    b.stop(clean=True)


def _store(vb, cid, key, value=b"{}"):
    r = vb.store(doc_key(cid, key), value, 0, 0, 1)
    assert r.status == Status.SUCCESS
    return r.item


def _queued(vb):
    return list(vb.checkpoints.iter_items())


def _setup(bucket):
    """scope s1 (c1, c2), scope s2 (c3); documents in each and in the default collection."""
    bucket.create_scope("s1")
    _m, c1 = bucket.create_collection("s1", "c1")
    _m, c2 = bucket.create_collection("s1", "c2")
    bucket.create_scope("s2")
    _m, c3 = bucket.create_collection("s2", "c3")
    vb = bucket.vbuckets[0]
    for cid in (0, c1.uid, c2.uid, c3.uid):
        _store(vb, cid, b"a")
        _store(vb, cid, b"b")
    return vb, c1.uid, c2.uid, c3.uid


def _kinds(items):
    out = []
    for it in items:
        if it.op == ITEM_SYSTEM:
            ev = event_of(it)
            out.append(("event", ev.event, ev.collection_id if ev.collection_id is not None
                        else ev.scope_id))
        else:
            out.append(("doc", it.key))
    return out


def test_legacy_filter_lets_only_default_documents_through(bucket):
    vb, c1, _c2, _c3 = _setup(bucket)
    filt = DcpFilter.legacy_filter(bucket.manifest)
    got = filt.filter_items(_queued(vb), bucket.collections)
    assert _kinds(got) == [("doc", b"\x00a"), ("doc", b"\x00b")]


def test_passthrough_filter_keeps_everything_in_seqno_order(bucket):
    vb, *_ = _setup(bucket)
    items = _queued(vb)
    filt = DcpFilter.from_request(StreamFilter(), bucket.manifest)
    got = filt.filter_items(items, bucket.collections)
    assert got == items
    assert [i.seqno for i in got] == sorted(i.seqno for i in got)
    assert sum(1 for i in got if i.op == ITEM_SYSTEM) == 5


def test_collections_filter_admits_its_documents_and_events(bucket):
    vb, c1, c2, c3 = _setup(bucket)
    filt = DcpFilter.from_request(StreamFilter(collections=frozenset({c1, c3})), bucket.manifest)
    got = _kinds(filt.filter_items(_queued(vb), bucket.collections))
    assert got == [("event", EVENT_BEGIN_COLLECTION, c1),
                   ("event", EVENT_BEGIN_COLLECTION, c3),
                   ("doc", doc_key(c1, b"a")), ("doc", doc_key(c1, b"b")),
                   ("doc", doc_key(c3, b"a")), ("doc", doc_key(c3, b"b"))]


def test_scope_filter_admits_its_scope_and_collections_created_later(bucket):
    vb, c1, c2, c3 = _setup(bucket)
    sid = bucket.manifest.scope("s1").uid
    filt = DcpFilter.from_request(StreamFilter(scope=sid), bucket.manifest)
    _m, c4 = bucket.create_collection("s1", "c4")
    _store(vb, c4.uid, b"x")
    _store(vb, c3, b"y")
    got = _kinds(filt.filter_items(_queued(vb), bucket.collections))
    assert got == [("event", EVENT_CREATE_SCOPE, sid),
                   ("event", EVENT_BEGIN_COLLECTION, c1),
                   ("event", EVENT_BEGIN_COLLECTION, c2),
                   ("doc", doc_key(c1, b"a")), ("doc", doc_key(c1, b"b")),
                   ("doc", doc_key(c2, b"a")), ("doc", doc_key(c2, b"b")),
                   ("event", EVENT_BEGIN_COLLECTION, c4.uid),
                   ("doc", doc_key(c4.uid, b"x"))]
    assert c4.uid in filt.cids


def test_drop_empties_the_filter_and_hides_the_dropped_documents(bucket):
    vb, c1, c2, c3 = _setup(bucket)
    filt = DcpFilter.from_request(StreamFilter(collections=frozenset({c1})), bucket.manifest)
    bucket.drop_collection("s1", "c1")
    assert c1 in bucket.dropped
    got = _kinds(filt.filter_items(_queued(vb), bucket.collections))
    # the creation is overwritten by the drop in the open checkpoint (one key); the
    # documents of the dropped collection are never sent
    assert got == [("event", EVENT_END_COLLECTION, c1)]
    assert filt.empty


def test_scope_drop_ends_a_scope_filter(bucket):
    vb, c1, c2, c3 = _setup(bucket)
    sid = bucket.manifest.scope("s2").uid
    filt = DcpFilter.from_request(StreamFilter(scope=sid), bucket.manifest)
    bucket.drop_scope("s2")
    got = _kinds(filt.filter_items(_queued(vb), bucket.collections))
    assert got == [("event", EVENT_END_COLLECTION, c3), ("event", EVENT_DROP_SCOPE, sid)]
    assert filt.empty


def test_rows_are_filtered_like_items(bucket):
    vb, c1, c2, c3 = _setup(bucket)
    items = _queued(vb)
    rows = [(it.seqno, it.key, it.rev, it.cas, it.flags, it.expiry, it.datatype, it.op,
             it.delete_time, it.value) for it in items]
    a = DcpFilter.from_request(StreamFilter(collections=frozenset({c2})), bucket.manifest)
    b = DcpFilter.from_request(StreamFilter(collections=frozenset({c2})), bucket.manifest)
    assert [r[0] for r in a.filter_rows(rows, bucket.collections)] == \
        [i.seqno for i in b.filter_items(items, bucket.collections)]


def test_request_values_kv_engine_refuses(bucket):
    _setup(bucket)
    m = bucket.manifest
    for bad in (b"{", b"[]", b"{}", b'{"unknown": 1}', b'{"collections": "8"}',
                b'{"collections": ["8"], "scope": "8"}', b'{"uid": 5}', b'{"sid": 0}'):
        with pytest.raises(FilterRefused) as e:
            parse_request_value(bad)
        assert e.value.status == Status.EINVAL, bad
    # unknown keys next to known ones are ignored
    assert parse_request_value(b'{"collections": ["0"], "extra": true}').collections == {0}
    with pytest.raises(FilterRefused) as e:
        DcpFilter.from_request(parse_request_value(b'{"collections": ["7f"]}'), m)
    assert e.value.status == Status.UNKNOWN_COLLECTION
    with pytest.raises(FilterRefused) as e:
        DcpFilter.from_request(parse_request_value(b'{"scope": "7f"}'), m)
    assert e.value.status == Status.UNKNOWN_SCOPE
    ahead = format(m.uid + 1, "x").encode()
    with pytest.raises(FilterRefused) as e:
        DcpFilter.from_request(parse_request_value(b'{"uid": "' + ahead + b'"}'), m)
    assert e.value.status == STATUS_MANIFEST_AHEAD == 0x8B
    same = format(m.uid, "x").encode()
    assert DcpFilter.from_request(parse_request_value(b'{"uid": "' + same + b'"}'), m).passthrough


def test_per_collection_high_seqnos_on_commit_and_after_a_rebuild(bucket):
    vb, c1, c2, c3 = _setup(bucket)
    other = bucket.vbuckets[1]
    assert vb.collection_high(c1) == max(i.seqno for i in _queued(vb) if i.key[:1] == bytes([c1]))
    before = (vb.default_high, vb.other_high, dict(vb.coll_high))
    # 5 events (seqnos 1-5), then a and b in each collection: default 6-7, c3 last
    assert vb.default_high == 7 and vb.other_high == vb.high_seqno == 13
    # an untouched collection's high seqno is its creation's
    create_c2 = [i.seqno for i in _queued(other) if i.op == ITEM_SYSTEM
                 and event_of(i).collection_id == c2][0]
    assert other.collection_high(c2) == create_c2
    vb.rebuild_collection_seqnos()
    assert (vb.default_high, vb.other_high, vb.coll_high) == before
    bucket.drop_collection("s1", "c2")
    assert vb.collection_high(c2) is None
    vb.rebuild_collection_seqnos()
    assert vb.collection_high(c2) is None and vb.collection_high(c1) == before[2][c1]
    # a client without collections is told the default collection's high seqno
    assert vb.legacy_high() == vb.default_high < vb.high_seqno


def test_legacy_high_is_the_vbucket_high_seqno_without_collections(bucket):
    vb = bucket.vbuckets[1]
    _store(vb, 0, b"k")
    assert vb.other_high == 0 and vb.legacy_high() == vb.high_seqno == vb.default_high


def test_wire_builders_for_system_events_and_seqno_advanced():
    ev = SystemEvent(9, EVENT_BEGIN_COLLECTION, 3, 8, 9, "c1", 60)
    k, v, version = ev.encode()
    for sid in (None, 5):
        f, used = decode_frame(b"".join(w.system_event(4, 0x77, 9, ev.event, version, k, v, sid)))
        m = decode_message(f)
        assert isinstance(m, DcpSystemEvent) and m.stream_id == sid
        assert (m.vbucket, m.opaque, m.by_seqno, m.event, m.version) == (4, 0x77, 9, 0, 1)
        assert SystemEvent.decode(m.by_seqno, m.event, m.version, m.key, m.value) == ev
        data = w.seqno_advanced(4, 0x77, 123, sid)
        assert len(data) == w.SEQNO_ADVANCED_SIZE + (3 if sid else 0)
        m = decode_message(decode_frame(data)[0])
        assert isinstance(m, DcpSeqnoAdvanced) and m.by_seqno == 123 and m.stream_id == sid


def test_legacy_mutation_header_before_nru_makes_the_prefix_disappear():
    """The legacy send loops append the stored doc key after a header that stops before the
    extras' last byte (nru, 0): the bytes are those of a mutation of the key without its
    0x00 prefix."""
    dkey, val = doc_key(0, b"doc-1"), b'{"a":1}'
    head = w.MUTATION_BEFORE_NRU.pack(w.REQ, w.OP_DCP_MUTATION, len(dkey) - 1, 31, 1, 3,
                                      31 + len(dkey) - 1 + len(val), 9, 77, 5, 2, 0x01020304,
                                      0, 0, 0)
    assert head + dkey + val == b"".join(w.mutation(3, 9, b"doc-1", val, 1, 77, 5, 2,
                                                    0x01020304, 0))
    m = decode_message(decode_frame(head + dkey + val)[0])
    assert m.key == b"doc-1" and m.value == val and m.by_seqno == 5


def test_install_accounts_what_a_replica_applies(bucket):
    vb, c1, _c2, _c3 = _setup(bucket)
    rep = bucket.vbuckets[1]
    from dcptool.node.item import Item

    rep.install(Item(doc_key(c1, b"r"), b"v", 50, 1, 1, 0, 0, 0))
    rep.install(Item(doc_key(0, b"r"), b"v", 51, 1, 1, 0, 0, 0))
    assert rep.collection_high(c1) == 50 and rep.default_high == 51 and rep.other_high == 50


def test_documents_of_a_purged_collection_left_in_a_checkpoint_are_not_sent(bucket):
    """Compaction purges a dropped collection from disk and the hash table and takes it out
    of `Bucket.dropped`, while the open checkpoint may still hold its documents: streams
    check the manifest's live collections, not only `dropped`."""
    from dcptool.node.dcpfilter import ever_dropped

    vb, c1, c2, c3 = _setup(bucket)
    assert not ever_dropped(bucket.manifest)
    bucket.drop_collection("s1", "c2")
    assert ever_dropped(bucket.manifest)
    bucket.dropped.discard(c2)  # what compaction leaves once the collection is purged
    got = DcpFilter.from_request(StreamFilter(), bucket.manifest).filter_items(
        _queued(vb), bucket.collections)
    assert not [it for it in got if it.key[0] == c2]
    assert (("event", EVENT_END_COLLECTION, c2)) in _kinds(got)
