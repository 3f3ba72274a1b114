"""The manifest of a committed backup and the checks that it is well-formed."""
from __future__ import annotations

import bisect

from typing import Any

from .format import (
    BACKUP_ID_RE,
    COLLECTIONS_VERSION,
    BACKUP_TYPES,
    DATA_RE,
    PACK_RE,
    FORMAT_VERSION,
    FULL,
    INCREMENTAL,
    MANIFEST_FORMAT,
)

_COUNT_KEYS = ("mutations", "deletions", "expirations", "snapshots", "rollbacks", "records")
_POS_KEYS = ("uuid", "seqno", "snap_start", "snap_end")
_SHA_HEX = set("0123456789abcdef")


_U64 = 1 << 64


def _is_uint(v: Any) -> bool:
    return type(v) is int and 0 <= v < _U64  # not a bool, nor another int subclass


def _check_position(p: Any, what: str, out: list[str]) -> None:
    if not isinstance(p, dict) or any(not _is_uint(p.get(k)) for k in _POS_KEYS):
        out.append(f"{what} is not a position {{uuid, seqno, snap_start, snap_end}}")


def check_summary(s: Any, backup_id: str | None, vbucket_count: int | None) -> list[str]:
    """Problems with one vbucket summary (the done file / manifest entry), [] when sound."""
    out: list[str] = []
    if not isinstance(s, dict):
        return ["vbucket entry is not an object"]
    vb = s.get("vbucket")
    if not _is_uint(vb) or (vbucket_count is not None and vb >= vbucket_count):
        out.append(f"vbucket number {vb!r} is out of range")
        return out
    what = f"vbucket {vb}"
    if backup_id is not None and s.get("backup") != backup_id:
        out.append(f"{what}: belongs to backup {s.get('backup')!r}")
    _check_position(s.get("start"), f"{what}: start", out)
    _check_position(s.get("end"), f"{what}: end", out)
    flog = s.get("failover_log")
    if not isinstance(flog, list) or any(
            not isinstance(e, list) or len(e) != 2 or not all(_is_uint(x) for x in e)
            for e in flog):
        out.append(f"{what}: failover_log is not a list of [uuid, seqno]")
    counts = s.get("counts")
    if not isinstance(counts, dict) or any(not _is_uint(counts.get(k)) for k in _COUNT_KEYS):
        out.append(f"{what}: counts are incomplete")
    nbytes = s.get("bytes")
    if not isinstance(nbytes, dict) or not _is_uint(nbytes.get("values")) \
            or not _is_uint(nbytes.get("files")):
        out.append(f"{what}: bytes are incomplete")
    files = s.get("files")
    if not isinstance(files, list) or not files:
        out.append(f"{what}: no files listed")
    else:
        for i, f in enumerate(files):
            if not isinstance(f, dict):
                out.append(f"{what}: file entry {i} is not an object")
                continue
            name = f.get("name")
            m = DATA_RE.match(name) if isinstance(name, str) else None
            if not m or int(m.group(1)) != vb or int(m.group(2)) != i:
                out.append(f"{what}: file entry {i} has name {name!r}, expected segment {i:03d} "
                           f"of vbucket {vb}")
            if "pack" in f and (not isinstance(f["pack"], str) or not PACK_RE.match(f["pack"])
                                or not _is_uint(f.get("offset"))):
                out.append(f"{what}: file {name}: pack or offset is malformed")
            if not _is_uint(f.get("size")) or not _is_uint(f.get("records")):
                out.append(f"{what}: file {name}: size or records missing")
            sha = f.get("sha256")
            if not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _SHA_HEX:
                out.append(f"{what}: file {name}: sha256 is not 64 hex digits")
        if isinstance(nbytes, dict) and not out:
            if sum(f["size"] for f in files) != nbytes.get("files"):
                out.append(f"{what}: bytes.files is not the sum of the file sizes")
        if isinstance(counts, dict) and not out:
            if sum(f["records"] for f in files) != counts.get("records"):
                out.append(f"{what}: counts.records is not the sum of the files' records")
    rbs = s.get("rollbacks")
    if not isinstance(rbs, list) or any(
            not isinstance(r, dict) or not _is_uint(r.get("seqno"))
            or not _is_uint(r.get("vbucket_uuid")) for r in rbs):
        out.append(f"{what}: rollbacks is not a list of {{seqno, vbucket_uuid}}")
    elif isinstance(counts, dict) and counts.get("rollbacks") != len(rbs):
        out.append(f"{what}: counts.rollbacks does not match the rollbacks listed")
    return out


def _overlaps(ranges: list[list[int]], listed: list[int]) -> bool:
    """Whether a [first, last] range holds one of the sorted vbuckets `listed`: a binary
    search per range (every range against every vbucket took a million steps for a manifest
    of 1,024 vbuckets)."""
    for lo, hi in ranges:
        i = bisect.bisect_left(listed, lo)
        if i < len(listed) and listed[i] <= hi:
            return True
    return False


def check_manifest(doc: Any, dir_name: str | None = None,
                   archive_meta: dict[str, Any] | None = None) -> list[str]:
    """Problems with a manifest document, [] when it is well-formed."""
    if not isinstance(doc, dict):
        return ["manifest is not a JSON object"]
    out: list[str] = []
    if doc.get("format") != MANIFEST_FORMAT:
        out.append(f"format is {doc.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    if doc.get("version") not in range(1, FORMAT_VERSION + 1) or type(doc.get("version")) is not int:
        out.append(f"version {doc.get('version')!r} is not supported (this dcptool reads "
                   f"1 to {FORMAT_VERSION})")
        return out
    bid = doc.get("id")
    if not isinstance(bid, str) or not BACKUP_ID_RE.match(bid):
        out.append(f"id {bid!r} is not a backup id")
    elif dir_name is not None and bid != dir_name:
        out.append(f"id {bid} does not match its directory {dir_name}")
    btype = doc.get("type")
    parent = doc.get("parent")
    if btype not in BACKUP_TYPES:
        out.append(f"type {btype!r} is neither full nor incremental")
    elif btype == FULL and parent is not None:
        out.append("a full backup has a parent")
    elif btype == INCREMENTAL and (not isinstance(parent, str) or not BACKUP_ID_RE.match(parent)):
        out.append("an incremental backup has no parent id")
    if isinstance(parent, str) and isinstance(bid, str) and parent >= bid:
        out.append(f"parent {parent} is not older than the backup")
    if archive_meta is not None and doc.get("archive") != archive_meta.get("uuid"):
        out.append("manifest belongs to another archive (archive uuid differs)")
    for k in ("started", "finished"):
        if not isinstance(doc.get(k), str):
            out.append(f"{k} time is missing")
    vbs = doc.get("vbuckets")
    count = archive_meta.get("vbuckets") if archive_meta else None
    if not isinstance(vbs, list):
        out.append("vbuckets is not a list")
        return out
    seen: set[int] = set()
    for s in vbs:
        probs = check_summary(s, bid if isinstance(bid, str) else None, count)
        out.extend(probs)
        if isinstance(s, dict) and _is_uint(s.get("vbucket")):
            if s["vbucket"] in seen:
                out.append(f"vbucket {s['vbucket']} is listed twice")
            seen.add(s["vbucket"])
    unchanged = doc.get("unchanged")
    if unchanged is not None:
        if not isinstance(unchanged, list) or any(
                not isinstance(r, list) or len(r) != 2 or not all(_is_uint(x) for x in r)
                or r[0] > r[1] or (count is not None and r[1] >= count) for r in unchanged):
            out.append("unchanged is not a list of [first, last] vbucket ranges")
        elif _overlaps(unchanged, sorted(seen)):
            out.append("a vbucket is both listed and unchanged")
    if doc["version"] >= COLLECTIONS_VERSION:
        out.extend(check_collections_fields(doc))
    if not out:
        totals = doc.get("totals")
        expect = totals_of(vbs)
        if totals != expect:
            out.append("totals do not match the vbucket entries")
    return out


def check_collections_fields(doc: dict[str, Any]) -> list[str]:
    """Problems with a format 3 manifest's `collections` (the node's manifest when the
    backup began, or null) and `data` ({"include": [...], "exclude": [...]}, when filtered)."""
    from dcptool.protocol.collections import CollectionsError, Manifest

    out: list[str] = []
    coll = doc.get("collections")
    if coll is not None:
        try:
            Manifest.from_json(coll)
        except CollectionsError as exc:
            out.append(f"collections is not a collections manifest: {exc}")
    data = doc.get("data")
    if data is not None:
        if not isinstance(data, dict) or set(data) - {"include", "exclude"} or any(
                not isinstance(v, list) or not all(isinstance(x, str) for x in v)
                for v in data.values()):
            out.append("data is not {\"include\": [names], \"exclude\": [names]}")
    return out


def totals_of(summaries: list[dict[str, Any]]) -> dict[str, int]:
    """The manifest's totals of its vbucket entries; `system_events` when the entries count
    them (format 3)."""
    t = {k: 0 for k in _COUNT_KEYS}
    t.update(vbuckets=len(summaries), files=0, value_bytes=0, file_bytes=0)
    if any("system_events" in s["counts"] for s in summaries):
        t["system_events"] = 0
    for s in summaries:
        if "system_events" in t:
            t["system_events"] += s["counts"].get("system_events", 0)
        for k in _COUNT_KEYS:
            t[k] += s["counts"][k]
        t["files"] += len(s["files"])
        t["value_bytes"] += s["bytes"]["values"]
        t["file_bytes"] += s["bytes"]["files"]
    return t
