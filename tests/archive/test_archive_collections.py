"""Archive format 3: doc keys and system event records; format 2 archives stay readable."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from archiveutil import W

from dcptool.archive import Archive, ArchivePosition, VBucketWriter
from dcptool.archive.block import decode_block, encode_records
from dcptool.archive.format import FORMAT_VERSION, REC_SYSTEM_EVENT
from dcptool.archive.info import describe_archive
from dcptool.archive.verify import verify_archive
from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_DROP_SCOPE,
    EVENT_END_COLLECTION,
    Manifest,
    SystemEvent,
    doc_key,
)

FIXTURE_V2 = Path(__file__).parent / "fixtures" / "archive-v2"  # written by the format 2 code


def _manifest() -> Manifest:
    m = Manifest()
    m, _ = m.create_scope("inventory")
    m, _, _ = m.create_collection("inventory", "hotels")
    m, _, _ = m.create_collection("inventory", "routes", max_ttl=60)
    return m


def _write_collections_backup(a: Archive, **kw) -> dict:
    """A full backup of vbucket 1: the scope and two collections created, documents in
    three collections, one collection dropped."""
    man = _manifest()
    bw = a.begin_backup("full", collections=man.to_json(), **kw)
    w = bw.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)])
    w.marker(1, 4, 2)
    w.system_event(SystemEvent(1, EVENT_CREATE_SCOPE, 1, 8, None, "inventory"))
    w.system_event(SystemEvent(2, EVENT_BEGIN_COLLECTION, 2, 8, 9, "hotels"))
    w.system_event(SystemEvent(3, EVENT_BEGIN_COLLECTION, 3, 8, 10, "routes", 60))
    w.mutation(4, 1, 104, 0, 0, 1, doc_key(0, b"plain"), b'{"d":0}')
    w.marker(5, 8, 1)
    w.mutation(5, 1, 105, 0, 0, 1, doc_key(9, b"h1"), b'{"h":1}')
    w.mutation(6, 1, 106, 0, 0, 1, doc_key(10, b"r1"), b'{"r":1}')
    w.deletion(7, 2, 107, doc_key(9, b"h1"), 1_700_000_000)
    w.system_event(SystemEvent(8, EVENT_END_COLLECTION, 4, 8, 10))
    s = w.close(ArchivePosition.at(W, 8))
    return bw.commit([s])


def test_system_events_and_doc_keys_round_trip_and_verify(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="travel", vbuckets=4)
    m = _write_collections_backup(a, data={"include": ["travel.inventory"], "exclude": []})
    assert m["version"] == FORMAT_VERSION == 3
    assert Manifest.from_json(m["collections"]) == _manifest()
    assert m["data"] == {"include": ["travel.inventory"], "exclude": []}
    e = m["vbuckets"][0]
    assert e["counts"]["system_events"] == 4 and e["counts"]["mutations"] == 3
    assert m["totals"]["system_events"] == 4
    recs = [r for r in a.backup(m["id"]).records(1) if r[0] not in (0, 1, 7)]
    assert recs == [
        (2, 1, 4, 2),
        (REC_SYSTEM_EVENT, 1, EVENT_CREATE_SCOPE, 1, 8, None, "inventory", 0),
        (REC_SYSTEM_EVENT, 2, EVENT_BEGIN_COLLECTION, 2, 8, 9, "hotels", 0),
        (REC_SYSTEM_EVENT, 3, EVENT_BEGIN_COLLECTION, 3, 8, 10, "routes", 60),
        (3, 4, 1, 104, 0, 0, 1, b"\x00plain", b'{"d":0}', None),
        (2, 5, 8, 1),
        (3, 5, 1, 105, 0, 0, 1, b"\x09h1", b'{"h":1}', None),
        (3, 6, 1, 106, 0, 0, 1, b"\x0ar1", b'{"r":1}', None),
        (4, 7, 2, 107, b"\x09h1", 1_700_000_000, 0, b""),
        (REC_SYSTEM_EVENT, 8, EVENT_END_COLLECTION, 4, 8, 10, "", 0),
    ]
    report = verify_archive(a.path)
    assert report.ok, report.problems
    info = describe_archive(a)
    assert info["backups"][0]["system_events"] == 4
    assert info["backups"][0]["data"] == m["data"]


def test_block_codec_keeps_system_events_in_order():
    recs = [(2, 1, 3, 0), (8, 1, EVENT_CREATE_SCOPE, 1, 8, None, "s", 0),
            (3, 2, 1, 5, 0, 0, 1, b"\x08k", b"v", None),
            (8, 3, EVENT_DROP_SCOPE, 2, 8, None, "", 0)]
    assert decode_block(b"".join(encode_records(recs))) == recs


def test_verify_reports_bad_doc_keys_and_misplaced_system_events(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=2)
    bw = a.begin_backup("full", collections=None)
    w0 = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    w0.marker(1, 2)
    w0.mutation(1, 1, 1, 0, 0, 1, b"\x80\x80\x80\x80\x80\x01k", b"v")  # LEB128 > 5 bytes
    w0.mutation(2, 1, 2, 0, 0, 1, b"\x00k", b"v")
    w1 = bw.vbucket(1, ArchivePosition.at(W, 0), [(W, 0)])
    w1.marker(1, 2)
    w1.mutation(2, 1, 2, 0, 0, 1, b"\x00k", b"v")
    w1.system_event(SystemEvent(2, EVENT_BEGIN_COLLECTION, 1, 0, 8, "c"))  # seqno repeats
    m = bw.commit([w0.close(ArchivePosition.at(W, 2)), w1.close(ArchivePosition.at(W, 2))])
    probs = [str(p) for p in verify_archive(a.path).problems]
    assert any("record 3: item at seqno 1 has a key that is not a doc key" in p for p in probs)
    assert any("record 4: system event seqno 2 does not increase (after 2)" in p
               for p in probs), probs
    assert m["collections"] is None


def test_a_partial_backup_with_system_events_resumes_after_them(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=1)
    bw = a.begin_backup("full", block_size=200, collections=_manifest().to_json())
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    for snap in range(10):
        s = snap * 4
        w.marker(s + 1, s + 4)
        w.system_event(SystemEvent(s + 1, EVENT_CREATE_SCOPE, s + 1, 8 + snap, None, f"s{snap}"))
        for q in range(s + 2, s + 5):
            w.mutation(q, 1, q, 0, 0, 1, doc_key(8 + snap, b"k%d" % q), b"value %d" % q)
    w.abort()  # killed: the frames written so far stay
    bw.abort()
    bw = a.resume_backup()
    assert json.loads((bw.dir / "backup.json").read_text())["collections"] == \
        _manifest().to_json()
    w = VBucketWriter(a, bw.id, 0, ArchivePosition.at(W, 0), [(W, 0)], resume=True)
    at = w.position.seqno
    assert 0 < at <= 40 and at % 4 == 0
    kept = w.counts()["system_events"]
    assert kept == at // 4
    w.marker(at + 1, at + 1)
    w.system_event(SystemEvent(at + 1, EVENT_DROP_SCOPE, 99, 8, None))
    m = bw.commit([w.close(ArchivePosition.at(W, at + 1))])
    assert m["vbuckets"][0]["counts"]["system_events"] == kept + 1
    assert Manifest.from_json(m["collections"]) == _manifest()  # kept from backup.json
    assert verify_archive(a.path).ok


def _copy_v2(tmp_path: Path) -> Path:
    dst = tmp_path / "archive-v2"
    shutil.copytree(FIXTURE_V2, dst)
    return dst


def test_format_2_archive_reads_with_doc_keys_and_verifies(tmp_path):
    path = _copy_v2(tmp_path)
    a = Archive.open(path)
    assert a.meta["version"] == 2
    report = verify_archive(path)
    assert report.ok, report.problems
    full, inc = a.committed_ids()
    assert [a.manifest(b)["version"] for b in (full, inc)] == [2, 2]
    assert "collections" not in a.manifest(full)
    recs = list(a.backup(full).records(1))
    assert recs[0] == (0, "dcptool-archive", 2, 1, full, 0)  # the header as stored
    keys = [r[7] if r[0] == 3 else r[4] for r in recs if r[0] in (3, 4, 5)]
    assert keys == [b"\x00key-1-1", b"\x00key-1-2", b"\x00key-1-3", b"\x00key-1-4",
                    b"\x00key-1-1", b"\x00key-1-2"]
    # vbucket 0 rolled back to 4 in the incremental: 5 and 6 of the full backup are dead
    state = a.resolve_vbucket(0)
    assert state[b"\x00key-0-3"][8] == b'{"n":"x"}'
    assert state[b"\x00key-0-4"][0] == 5  # expired
    assert state[b"\x00key-0-1"][8] == b'{"n":1}'
    assert state[b"\x00key-0-2"][0] == 3
    assert set(a.resolve_vbucket(1)) == {b"\x00key-1-%d" % i for i in range(1, 5)}


def test_format_3_backup_continues_a_format_2_chain(tmp_path):
    path = _copy_v2(tmp_path)
    a = Archive.open(path)
    end = a.end_positions()[1]
    bw = a.begin_backup("incremental", collections=_manifest().to_json())
    w = bw.vbucket(1, end, [(0x1111, 0)])
    w.marker(7, 9)
    w.system_event(SystemEvent(7, EVENT_CREATE_SCOPE, 1, 8, None, "inventory"))
    w.mutation(8, 5, 3008, 0, 0, 1, doc_key(0, b"key-1-3"), b'{"n":8}')
    w.mutation(9, 1, 3009, 0, 0, 1, doc_key(9, b"key-1-3"), b'{"n":9}')  # same name, other coll.
    m = bw.commit([w.close(ArchivePosition.at(0x1111, 9))])
    assert m["version"] == 3
    assert verify_archive(path).ok
    state = a.resolve_vbucket(1)
    assert state[b"\x00key-1-3"][8] == b'{"n":8}'
    assert state[b"\x09key-1-3"][8] == b'{"n":9}'
    assert state[b"\x00key-1-4"][8] == b'{"n":4}'  # from the format 2 full backup


def test_system_events_refused_in_a_version_1_backup(tmp_path):
    a = Archive.create(tmp_path / "arc", bucket="b", vbuckets=1)
    bw = a.begin_backup("full", version=1)
    w = bw.vbucket(0, ArchivePosition.at(W, 0), [(W, 0)])
    w.marker(1, 1)
    with pytest.raises(Exception, match="no system event records"):
        w.system_event(SystemEvent(1, EVENT_CREATE_SCOPE, 1, 8, None, "s"))
    w.abort()
    bw.abort()
