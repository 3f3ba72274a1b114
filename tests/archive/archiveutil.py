"""Helpers shared by the archive tests: write vbuckets from short event lists."""
from __future__ import annotations

from typing import Any, Iterable

import zstandard

from dcptool.archive import Archive, ArchivePosition
from dcptool.archive.frames import scan_frames

W = 0xA1A1_0000_0000_0001  # vbucket uuids for history branches, as in seed 004
X = 0xB2B2_0000_0000_0002
Y = 0xC3C3_0000_0000_0003


def doc(seqno: int, key: bytes, value: bytes | None = None, *, cas: int | None = None) -> tuple:
    """A mutation record tuple as the archive stores it."""
    return (3, seqno, 1, cas if cas is not None else 1_700_000_000_000_000_000 + seqno, 0, 0, 1,
            key, value if value is not None else b'{"v":%d}' % seqno, None)


def write_events(w, events: Iterable[tuple]) -> None:
    """Feed events to a VBucketWriter:
    ("snap", start, end) | ("mut", seqno, key[, value]) | ("del", seqno, key) |
    ("exp", seqno, key) | ("rollback", seqno, uuid) | ("stream", ArchivePosition, flog)."""
    for ev in events:
        kind = ev[0]
        if kind == "snap":
            w.marker(ev[1], ev[2], 0)
        elif kind == "mut":
            value = ev[3] if len(ev) > 3 else b'{"v":%d}' % ev[1]
            w.mutation(ev[1], 1, 1_700_000_000_000_000_000 + ev[1], 0, 0, 1, ev[2], value)
        elif kind == "del":
            w.deletion(ev[1], 2, 1_700_000_000_000_000_000 + ev[1], ev[2], 1234)
        elif kind == "exp":
            w.expiration(ev[1], 2, 1_700_000_000_000_000_000 + ev[1], ev[2], 1234)
        elif kind == "rollback":
            w.rollback(ev[1], ev[2])
        elif kind == "stream":
            w.stream(ev[1], ev[2])
        else:
            raise ValueError(kind)


def mutations(first: int, last: int, *, per_snapshot: int = 100, prefix: bytes = b"doc-",
              keyfn=None) -> list[tuple]:
    """Snapshot markers and one mutation per seqno from first..last."""
    out: list[tuple] = []
    s = first
    while s <= last:
        end = min(last, s + per_snapshot - 1)
        out.append(("snap", s, end))
        for q in range(s, end + 1):
            key = keyfn(q) if keyfn else prefix + str(q).encode()
            out.append(("mut", q, key))
        s = end + 1
    return out


def backup(archive: Archive, btype: str, vbuckets: dict[int, dict[str, Any]], **kw) -> dict:
    """Write and commit one backup. vbuckets: {vb: {"start": ArchivePosition, "end": ArchivePosition,
    "events": [...], "flog": [...]}}. Returns the manifest."""
    bw = archive.begin_backup(btype, **kw)
    sums = []
    for vb, spec in vbuckets.items():
        w = bw.vbucket(vb, spec["start"], spec.get("flog", [(spec["start"].uuid, 0)]))
        write_events(w, spec["events"])
        sums.append(w.close(spec["end"]))
    return bw.commit(sums)


def seed_004_archive(path) -> tuple[Archive, dict, dict]:
    """Seed 004's numbers: vbucket 0 gets 1000 mutations on history W and is backed up;
    the node then failed over to a replica that had only 900 of them (new uuid X from 900);
    the next backup records a rollback to 900 and then the new branch's 901..960.

    Keys: seqno s writes key doc-s, except that on the dead branch seqnos 951..1000 update
    doc-1..doc-50, and on the new branch 901..960 write key new-s.
    """
    archive = Archive.create(path, bucket="default", vbuckets=4)

    def dead_key(s: int) -> bytes:
        return b"doc-%d" % (s - 950) if s > 950 else b"doc-%d" % s

    full = backup(archive, "full", {0: {
        "start": ArchivePosition.at(W, 0), "end": ArchivePosition.at(W, 1000),
        "events": mutations(1, 1000, keyfn=dead_key), "flog": [(W, 0)]}})
    inc = backup(archive, "incremental", {0: {
        "start": ArchivePosition.at(W, 1000), "end": ArchivePosition.at(X, 960), "flog": [(X, 900), (W, 0)],
        "events": [("rollback", 900, W), ("stream", ArchivePosition.at(W, 900), [(X, 900), (W, 0)])]
        + mutations(901, 960, per_snapshot=20, prefix=b"new-")}})
    return archive, full, inc


def flip_position(data: bytes, f, *, content_changes: bool) -> int:
    """A byte whose low bit, flipped, changes what its frame decodes to (or not): some bits of a
    compressed block (a match offset into a run of equal bytes) decode to the same content."""
    with open(f, "rb") as fh:
        frames = list(scan_frames(fh, str(f)))
    off, frame = next((o, fr) for o, fr in frames if o <= len(data) // 2 < o + len(fr))
    want = zstandard.ZstdDecompressor().decompress(frame)
    for pos in [*range(off + len(frame) // 2, len(data)), *range(0, off + len(frame) // 2)]:
        o, fr = next((o, fr) for o, fr in frames if o <= pos < o + len(fr))
        changed = bytearray(fr)
        changed[pos - o] ^= 0x01
        try:
            same = zstandard.ZstdDecompressor().decompress(bytes(changed)) == \
                (want if o == off else zstandard.ZstdDecompressor().decompress(fr))
        except zstandard.ZstdError:
            same = False
        if same != content_changes:
            return pos
    raise AssertionError("no byte of that kind in this file")
