"""The pure collections parts: LEB128 doc keys, the manifest, system events, filters."""
from __future__ import annotations

import pytest

from dcptool.protocol.collections import (
    CollectionsError,
    Manifest,
    ManifestError,
    StreamFilter,
    SystemEvent,
    decode_leb128,
    doc_key,
    encode_leb128,
    split_doc_key,
)


@pytest.mark.parametrize("value,encoded", [
    (0, b"\x00"), (8, b"\x08"), (0x7F, b"\x7f"), (0x80, b"\x80\x01"), (0x3FFF, b"\xff\x7f"),
    (0x4000, b"\x80\x80\x01"), (0xFFFFFFFF, b"\xff\xff\xff\xff\x0f"),
])
def test_leb128_matches_the_kv_engine_table(value, encoded):
    assert encode_leb128(value) == encoded
    assert decode_leb128(encoded + b"key") == (value, len(encoded))
    assert split_doc_key(doc_key(value, b"key")) == (value, b"key")


@pytest.mark.parametrize("bad", [b"", b"\x80", b"\xff\xff\xff\xff\xff\x01", b"\xff\xff\xff\xff\x1f"])
def test_bad_prefixes_are_refused(bad):
    with pytest.raises(CollectionsError):
        decode_leb128(bad)


def test_manifest_changes_raise_the_uid_and_never_reuse_ids():
    m = Manifest()
    m, s = m.create_scope("inventory")
    m, _, c = m.create_collection("inventory", "hotels", max_ttl=60)
    assert (s.uid, c.uid, m.uid) == (8, 9, 2)
    m, _, dropped = m.drop_collection("inventory", "hotels")
    m, _, again = m.create_collection("inventory", "hotels")
    assert again.uid == 10 and again.uid != dropped.uid and m.uid == 4
    assert Manifest.from_json(m.to_bytes(internal=True)) == m
    public = m.to_json()
    assert public["uid"] == "4" and "next_id" not in public
    assert public["scopes"][1]["collections"] == [{"name": "hotels", "uid": "a"}]


@pytest.mark.parametrize("name", ["", "_x", "%x", "a.b", "a b", "x" * 252])
def test_bad_names_are_refused(name):
    with pytest.raises(ManifestError) as exc:
        Manifest().create_scope(name)
    assert exc.value.kind == "invalid"


def test_default_scope_cannot_be_dropped_and_duplicates_are_refused():
    with pytest.raises(ManifestError) as exc:
        Manifest().drop_scope("_default")
    assert exc.value.kind == "forbidden"
    m, _ = Manifest().create_scope("s")
    with pytest.raises(ManifestError) as exc:
        m.create_scope("s")
    assert exc.value.kind == "exists"


def test_system_event_matches_the_documented_bytes():
    # system_event.md's example: begin collection "mycollection", id 8, manifest 2, max_ttl
    ev = SystemEvent(4, 0, 2, 0, 8, "mycollection", 0x11940)
    key, value, version = ev.encode()
    assert (key, version) == (b"mycollection", 1)
    assert value == bytes.fromhex("0000000000000002" "00000000" "00000008" "00011940")
    assert SystemEvent.decode(4, 0, 1, key, value) == ev
    drop = SystemEvent(9, 1, 3, 0, 8)
    k, v, ver = drop.encode()
    assert k == b"" and len(v) == 16 and SystemEvent.decode(9, 1, ver, k, v) == drop
    with pytest.raises(CollectionsError):
        SystemEvent.decode(9, 1, 0, b"", b"\x00" * 15)


def test_stream_filter_round_trips_and_refuses_bad_values():
    f = StreamFilter(collections=frozenset({8, 0x1f}), uid=5, sid=3)
    assert StreamFilter.parse(f.to_bytes()) == f
    assert StreamFilter.parse(b"").passthrough
    assert StreamFilter.parse(b'{"scope":"8"}').admits(9, scope_of={9: 8})
    for bad in (b"[]", b'{"collections":[]}', b'{"collections":["8"],"scope":"8"}',
                b'{"scope":"zz"}', b'{"sid":0}', b"{"):
        with pytest.raises(CollectionsError):
            StreamFilter.parse(bad)
