"""Build small format 3 archives with scopes, collections and system events through the
archive writer API (what a collections backup writes), for the restore and view tests.

The scenario (every vbucket gets every system event, as on a node):

backup 1 (full, manifest M1: scope s1 with c1 (id 9) and c2 (id 10, maxTTL 60)):
  seqnos 1-3: create-scope s1, create-collection c1, create-collection c2
  then, per vbucket, the documents of DOCS1 that hash to it (default, s1.c1, s1.c2)
backup 2 (incremental, manifest M1):
  drop-collection c1 (id 9), create-collection c1 again (id 11), then DOCS2 (s1.c1 new id,
  and an update of a default document)
"""
from __future__ import annotations

from dcptool.archive import Archive, ArchivePosition
from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_END_COLLECTION,
    Manifest,
    doc_key,
)
from dcptool.protocol.vbucket import vbucket_of

W = 0xABCDEF
VBS = 4
BUCKET = "b"

M0 = Manifest()
M1a, _s1 = M0.create_scope("s1")
M1b, _, _c1 = M1a.create_collection("s1", "c1")
M1, _, _c2 = M1b.create_collection("s1", "c2", max_ttl=60)
S1, C1, C2 = _s1.uid, _c1.uid, _c2.uid  # 8, 9, 10
M2a, _, _ = M1.drop_collection("s1", "c1")
M2, _, _c1b = M2a.create_collection("s1", "c1")
C1B = _c1b.uid  # 11

#: (collection id, key) -> value, flags
DOCS1 = {(0, f"d{i}".encode()): (f'{{"d":{i}}}'.encode(), 1) for i in range(6)}
DOCS1.update({(C1, f"a{i}".encode()): (f'{{"a":{i}}}'.encode(), 2) for i in range(6)})
DOCS1.update({(C2, f"b{i}".encode()): (f'{{"b":{i}}}'.encode(), 3) for i in range(6)})
DOCS2 = {(C1B, f"a{i}".encode()): (f'{{"a2":{i}}}'.encode(), 4) for i in range(3)}
DOCS2[(0, b"d0")] = (b'{"d":"updated"}', 5)


def _by_vb(docs):
    out: dict[int, list] = {vb: [] for vb in range(VBS)}
    for (cid, key), v in sorted(docs.items()):
        out[vbucket_of(key, VBS)].append((cid, key, v))
    return out


def build(path) -> tuple[Archive, list[str], dict]:
    """The scenario's archive; returns (archive, [backup ids], {vb: {doc key: (seqno, cas,
    rev, value, flags)} as written})."""
    a = Archive.create(path, bucket=BUCKET, vbuckets=VBS)
    written: dict[int, dict[bytes, tuple]] = {vb: {} for vb in range(VBS)}
    ends: dict[int, int] = {}
    ids = []
    # backup 1
    bw = a.begin_backup("full", collections=M1.to_json())
    sums = []
    for vb, docs in _by_vb(DOCS1).items():
        w = bw.vbucket(vb, ArchivePosition.at(W, 0), [(W, 0)])
        end = 3 + len(docs)
        w.marker(1, end, 2)
        w.write([(8, 1, EVENT_CREATE_SCOPE, 1, S1, None, "s1", 0),
                 (8, 2, EVENT_BEGIN_COLLECTION, 2, S1, C1, "c1", 0),
                 (8, 3, EVENT_BEGIN_COLLECTION, 3, S1, C2, "c2", 60)])
        recs = []
        for i, (cid, key, (value, flags)) in enumerate(docs):
            seqno = 4 + i
            dk = doc_key(cid, key)
            cas = 1000 * seqno + vb
            recs.append((3, seqno, 1, cas, flags, 0, 1, dk, value, None))
            written[vb][dk] = (seqno, cas, 1, value, flags)
        w.write(recs)
        sums.append(w.close(ArchivePosition.at(W, end)))
        ends[vb] = end
    ids.append(bw.commit(sums)["id"])
    # backup 2: c1 dropped and created again
    bw = a.begin_backup("incremental", collections=M1.to_json())
    sums = []
    for vb, docs in _by_vb(DOCS2).items():
        start = ends[vb]
        w = bw.vbucket(vb, ArchivePosition.at(W, start), [(W, 0)])
        end = start + 2 + len(docs)
        w.marker(start + 1, end, 2)
        w.write([(8, start + 1, EVENT_END_COLLECTION, 4, S1, C1, "", 0),
                 (8, start + 2, EVENT_BEGIN_COLLECTION, 5, S1, C1B, "c1", 0)])
        recs = []
        for i, (cid, key, (value, flags)) in enumerate(docs):
            seqno = start + 3 + i
            dk = doc_key(cid, key)
            cas = 1000 * seqno + vb
            recs.append((3, seqno, 2, cas, flags, 0, 1, dk, value, None))
            written[vb][dk] = (seqno, cas, 2, value, flags)
        w.write(recs)
        sums.append(w.close(ArchivePosition.at(W, end)))
    ids.append(bw.commit(sums)["id"])
    return a, ids, written


def expected(latest: bool) -> dict[tuple[int, bytes], tuple[bytes, int]]:
    """{(collection id, key): (value, flags)} a restore of the latest (or the first)
    backup writes."""
    if not latest:
        return dict(DOCS1)
    out = {k: v for k, v in DOCS1.items() if k[0] != C1}
    out.update(DOCS2)
    return out
