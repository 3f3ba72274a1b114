"""Prove an archive sound, or say exactly what is wrong with it and where.

Checks, for every committed backup: the manifest is well-formed and belongs to this archive;
every listed file exists with its size and SHA-256; no unlisted data file sits beside them;
every record decodes and has the layout of its type; each file starts with the header of the
vbucket, backup and segment it is listed for; within each vbucket seqnos increase, items lie
inside their snapshot marker's range, a rollback record follows nothing above its seqno,
the stream and end records match the manifest's start and end positions, and the counts
match; each backup's parent is committed and each vbucket starts where the chain before it
ended (or a rollback record says why not).

Partial backups are reported as notes, not problems: a killed backup is a normal state.
Nothing here raises on bad data; every finding is a Problem naming a file.
"""
from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .archive import REMOVING, Archive
from .chain import effective_parents
from . import crypto, storage
from .errors import CorruptFileError
from .format import (
    ARCHIVE_JSON,
    BACKUP_ID_RE,
    BACKUP_JSON,
    BATCH_RE,
    DATA_RE,
    PACK_RE,
    REC_DELETION,
    DONE_RE,
    END,
    REC_EXPIRATION,
    COLLECTIONS_VERSION,
    FORMAT_NAME,
    FORMAT_VERSION,
    FULL,
    HEADER,
    LOCK_FILE,
    MANIFEST_JSON,
    REC_MUTATION,
    REC_SYSTEM_EVENT,
    RECORD_ARITY,
    RECORD_NAMES,
    ROLLBACK,
    SNAPSHOT,
    STREAM,
    ArchivePosition,
    entry_location,
    read_json,
)
from dcptool.protocol.collections import EVENT_NAMES, CollectionsError, split_doc_key

from .frames import iter_frame_batches
from .info import dir_size
from .lock import ArchiveLock
from .manifest import check_manifest
from .recovery import file_digest


@dataclass
class Problem:
    path: str
    message: str
    backup: str | None = None
    vbucket: int | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "backup": self.backup, "vbucket": self.vbucket,
                "message": self.message}


@dataclass
class VerifyReport:
    archive: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    backups_checked: int = 0
    partial_backups: int = 0
    files_checked: int = 0
    bytes_checked: int = 0
    records_checked: int = 0
    #: the bytes of the committed backups' files, as `info` gives a backup's size
    size_on_disk: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "archive": self.archive, "ok": self.ok,
            "backups_checked": self.backups_checked, "partial_backups": self.partial_backups,
            "files_checked": self.files_checked, "bytes_checked": self.bytes_checked,
            "size_on_disk": self.size_on_disk,
            "records_checked": self.records_checked,
            "problems": [p.to_json() for p in self.problems], "notes": self.notes,
        }


_INT = int


def _uint(v: Any) -> bool:
    return type(v) is _INT and 0 <= v < 1 << 64


def _shape_error(rec: Any) -> str | None:
    """Why a record does not have the layout of its type, None when it does."""
    if not isinstance(rec, tuple) or not rec:
        return f"record is a {type(rec).__name__}, not an array"
    t = rec[0]
    if type(t) is not int or t not in RECORD_ARITY:
        return f"unknown record type {t!r}"
    if len(rec) != RECORD_ARITY[t]:
        return (f"{RECORD_NAMES[t]} record has {len(rec)} fields, expected "
                f"{RECORD_ARITY[t]}")
    if t == REC_MUTATION:
        ok = all(_uint(x) for x in rec[1:7]) and type(rec[7]) is bytes \
            and type(rec[8]) is bytes and (rec[9] is None or type(rec[9]) is bytes)
    elif t == REC_DELETION or t == REC_EXPIRATION:
        ok = _uint(rec[1]) and _uint(rec[2]) and _uint(rec[3]) and type(rec[4]) is bytes \
            and _uint(rec[5]) and _uint(rec[6]) and type(rec[7]) is bytes
    elif t == SNAPSHOT:
        ok = _uint(rec[1]) and _uint(rec[2]) and _uint(rec[3])
    elif t == STREAM:
        ok = all(_uint(x) for x in rec[1:5]) and isinstance(rec[5], tuple) and all(
            isinstance(e, tuple) and len(e) == 2 and _uint(e[0]) and _uint(e[1]) for e in rec[5])
    elif t == ROLLBACK:
        ok = _uint(rec[1]) and _uint(rec[2])
    elif t == END:
        ok = all(_uint(x) for x in rec[1:5])
    elif t == REC_SYSTEM_EVENT:
        ok = all(_uint(x) for x in rec[1:5]) and (rec[5] is None or _uint(rec[5])) \
            and type(rec[6]) is str and _uint(rec[7])
    else:  # HEADER
        ok = type(rec[1]) is str and _uint(rec[2]) and _uint(rec[3]) and type(rec[4]) is str \
            and _uint(rec[5])
    return None if ok else f"{RECORD_NAMES[t]} record has a field of the wrong type"


class _VBucketCheck:
    """Walks one vbucket's records of one backup, across its segment files."""

    def __init__(self, backup_id: str, entry: dict[str, Any], version: int = FORMAT_VERSION):
        self.backup_id = backup_id
        self.version = version  # the manifest's: every header record must name it
        self.vb = entry["vbucket"]
        self.entry = entry
        self.counts = {"mutations": 0, "deletions": 0, "expirations": 0, "snapshots": 0,
                       "rollbacks": 0, "records": 0}
        if version >= COLLECTIONS_VERSION:
            self.counts["system_events"] = 0
        #: format 3 keys carry their collection id: each must start with a valid prefix
        self.doc_keys = version >= COLLECTIONS_VERSION
        self.value_bytes = 0
        self.rollbacks: list[dict[str, int]] = []
        self.first_stream: ArchivePosition | None = None
        self.end: ArchivePosition | None = None
        self.snap: tuple[int, int] | None = None
        self.last = -1        # seqnos of later items must be above this
        self.top = -1         # highest item seqno so far
        self.marker_end = -1
        self.seen_stream = False

    def record(self, rec: tuple, segment: int, first_in_file: bool) -> str | None:
        """Check one record; returns a problem description or None."""
        self.counts["records"] += 1
        why = _shape_error(rec)
        if why:
            return why
        t = rec[0]
        if first_in_file:
            if t != HEADER:
                return "does not start with a header record"
            if rec[1] != FORMAT_NAME or rec[2] != self.version:
                return f"header names format {rec[1]!r} version {rec[2]!r}"
            if rec[3] != self.vb or rec[4] != self.backup_id or rec[5] != segment:
                return (f"holds segment {rec[5]} of vbucket {rec[3]} of backup {rec[4]}, not "
                        f"segment {segment} of vbucket {self.vb} of backup {self.backup_id} "
                        "(file swapped or misplaced)")
            return None
        if self.end is not None:
            return f"{RECORD_NAMES[t]} record after the end record"
        if t == HEADER:
            return "header record in the middle of the file"
        if not self.seen_stream and t != STREAM:
            return f"{RECORD_NAMES[t]} record before the first stream record"
        if t == REC_MUTATION or t == REC_DELETION or t == REC_EXPIRATION:
            seqno = rec[1]
            if self.snap is None:
                return f"item at seqno {seqno} outside any snapshot"
            if not self.snap[0] <= seqno <= self.snap[1]:
                return (f"item seqno {seqno} lies outside its snapshot "
                        f"{self.snap[0]}..{self.snap[1]}")
            if seqno <= self.last:
                return f"item seqno {seqno} does not increase (after {self.last})"
            self.last = self.top = seqno
            if t == REC_MUTATION:
                self.counts["mutations"] += 1
                self.value_bytes += len(rec[8])
                key = rec[7]
            else:
                self.counts["deletions" if t == REC_DELETION else "expirations"] += 1
                self.value_bytes += len(rec[7])
                key = rec[4]
            if self.doc_keys and (len(key) < 2 or key[0] >= 0x80):  # else a 1-byte prefix + key
                try:
                    if len(split_doc_key(key)[1]) == 0:
                        raise CollectionsError("nothing after the collection id")
                except CollectionsError as exc:
                    return f"item at seqno {seqno} has a key that is not a doc key: {exc}"
        elif t == REC_SYSTEM_EVENT:
            seqno = rec[1]
            if not self.doc_keys:
                return f"system event record in a format {self.version} file"
            if self.snap is None:
                return f"system event at seqno {seqno} outside any snapshot"
            if not self.snap[0] <= seqno <= self.snap[1]:
                return (f"system event seqno {seqno} lies outside its snapshot "
                        f"{self.snap[0]}..{self.snap[1]}")
            if seqno <= self.last:
                return f"system event seqno {seqno} does not increase (after {self.last})"
            if rec[2] not in EVENT_NAMES:
                return f"system event at seqno {seqno} has unknown event id {rec[2]}"
            self.last = self.top = seqno
            self.counts["system_events"] += 1
        elif t == SNAPSHOT:
            start, end = rec[1], rec[2]
            if start > end:
                return f"snapshot marker start {start} is above its end {end}"
            if end < self.marker_end:
                return (f"snapshot marker {start}..{end} ends before the previous one "
                        f"({self.marker_end})")
            self.snap = (start, end)
            self.marker_end = end
            self.counts["snapshots"] += 1
        elif t == STREAM:
            pos = ArchivePosition(rec[1], rec[2], rec[3], rec[4])
            if pos.seqno < self.top:
                return (f"stream restarts at seqno {pos.seqno} below items already written "
                        f"(up to {self.top})")
            if self.first_stream is None:
                self.first_stream = pos
            self.seen_stream = True
            self.snap = None
            self.last = pos.seqno
            self.marker_end = min(self.marker_end, pos.seqno)
        elif t == ROLLBACK:
            s = rec[1]
            if s < self.top:
                return (f"rollback record to seqno {s} follows items above it (up to "
                        f"{self.top}) in the same backup")
            self.rollbacks.append({"seqno": s, "vbucket_uuid": rec[2]})
            self.counts["rollbacks"] += 1
            self.snap = None
            self.last = s
            self.marker_end = min(self.marker_end, s)
        elif t == END:
            pos = ArchivePosition(rec[1], rec[2], rec[3], rec[4])
            if pos.seqno < self.top:
                return f"end position seqno {pos.seqno} is below the last item ({self.top})"
            self.end = pos
        return None

    def mutations(self, run: list[tuple]) -> bool:
        """Check a run of records that all claim to be mutations at once, column by
        column (what `record` checks of each, in a few C-level passes); False when any of
        them may have a problem (then `record` is to check them one by one, to name it).
        Counts them when they are sound."""
        snap = self.snap
        if snap is None or not self.seen_stream or self.end is not None:
            return False
        if set(map(type, run)) != _TUPLE_ONLY or set(map(len, run)) != _TEN:
            return False
        cols = list(zip(*run))
        if set(map(type, cols[0])) != _INT_ONLY:
            return False
        for c in cols[1:7]:
            if set(map(type, c)) != _INT_ONLY or min(c) < 0 or max(c) >= _U64:
                return False
        keys, values, xattrs = cols[7], cols[8], cols[9]
        if set(map(type, keys)) != _BYTES_ONLY or set(map(type, values)) != _BYTES_ONLY \
                or not set(map(type, xattrs)) <= _XATTR_TYPES:
            return False
        seqnos = cols[1]
        if seqnos[0] <= self.last or seqnos[0] < snap[0] or seqnos[-1] > snap[1] \
                or not all(map(_LT, seqnos, seqnos[1:])):
            return False
        if self.doc_keys and (min(map(len, keys)) < 2 or max(map(_FIRST, keys)) >= 0x80):
            return False  # (long collection ids: checked one by one)
        self.last = self.top = seqnos[-1]
        self.counts["records"] += len(run)
        self.counts["mutations"] += len(run)
        self.value_bytes += sum(map(len, values))
        return True

    def finish(self) -> list[str]:
        """Problems found once all records were read."""
        out = []
        e = self.entry
        if self.end is None:
            out.append("the last file has no end record (data incomplete)")
        elif self.end != ArchivePosition.coerce(e["end"]):
            out.append(f"end record {self.end.to_json()} differs from the manifest's end "
                       f"{e['end']}")
        if self.first_stream is not None and self.first_stream != ArchivePosition.coerce(e["start"]):
            out.append(f"first stream record {self.first_stream.to_json()} differs from the "
                       f"manifest's start {e['start']}")
        for k, v in self.counts.items():
            if e["counts"].get(k) != v:
                out.append(f"holds {v} {k} but the manifest says {e['counts'].get(k)}")
        if e["bytes"]["values"] != self.value_bytes:
            out.append(f"holds {self.value_bytes} value bytes but the manifest says "
                       f"{e['bytes']['values']}")
        if self.rollbacks != e["rollbacks"]:
            out.append("rollback records differ from the manifest's rollbacks")
        return out


_INT_ONLY = {int}
_BYTES_ONLY = {bytes}
_XATTR_TYPES = {bytes, type(None)}
_U64 = 1 << 64
_LT = operator.lt
_FIRST = operator.itemgetter(0)
_TUPLE_ONLY = {tuple}
_TEN = {10}
#: runs of mutations shorter than this are checked record by record
_RUN = 8


def _runs(batch: list, check: _VBucketCheck, first: bool):
    """The records of `batch` to check one by one, with None in place of each run of
    mutations `check.mutations` found sound (checked and counted at once)."""
    try:
        kinds = list(map(_FIRST, batch)) if set(map(type, batch)) == _TUPLE_ONLY else None
    except IndexError:  # an empty record
        kinds = None
    if kinds is None:
        kinds = [r[0] if type(r) is tuple and r else None for r in batch]
    i, n = (1 if first else 0), len(batch)
    if first and n:
        yield batch[0]
    while i < n:
        if kinds[i] == REC_MUTATION:
            j = i + 1
            while j < n and kinds[j] == REC_MUTATION:
                j += 1
            if j - i >= _RUN and check.mutations(batch[i:j]):
                yield None
                i = j
                continue
            yield from batch[i:j]
            i = j
        else:
            yield batch[i]
            i += 1


def _check_vbucket_records(bdir: Path, backup_id: str, entry: dict[str, Any],
                           report: VerifyReport, version: int = FORMAT_VERSION,
                           missing: set[str] = frozenset(),  # type: ignore[assignment]
                           key: Any = None, keep: list | None = None) -> None:
    """Every record of one vbucket of one backup against its manifest entry. `keep`: a
    list the batches read are appended to (as the reader gives them with doc keys: for a
    format 3 file, as read)."""
    vb = entry["vbucket"]
    check = _VBucketCheck(backup_id, entry, version)
    for segment, f in enumerate(entry["files"]):
        path = entry_location(bdir, f)
        if f["name"] in missing:
            return  # already reported by the file check
        n_before = check.counts["records"]
        first = True
        try:
            for batch in iter_frame_batches(path, validate=False, doc_keys=False, key=key):
                for rec in _runs(batch, check, first):
                    if rec is None:  # a run of mutations checked at once
                        first = False
                        continue
                    why = check.record(rec, segment, first)
                    first = False
                    if why:
                        # records are numbered from 0 within the file (the header is 0)
                        idx = check.counts["records"] - n_before - 1
                        report.problems.append(Problem(str(path), f"record {idx}: {why}",
                                                       backup_id, vb))
                        return
                report.records_checked += len(batch)
                if keep is not None:
                    keep.append(batch)
        except CorruptFileError as exc:
            report.problems.append(Problem(str(path), exc.reason if exc.offset is None
                                           else f"at byte {exc.offset}: {exc.reason}",
                                           backup_id, vb))
            return
        if first:
            report.problems.append(Problem(str(path), "holds no records", backup_id, vb))
            return
        got = check.counts["records"] - n_before
        if got != f["records"]:
            report.problems.append(Problem(str(path), f"holds {got} records but the manifest "
                                           f"says {f['records']}", backup_id, vb))
    for why in check.finish():
        report.problems.append(Problem(str(entry_location(bdir, entry["files"][-1])),
                                       f"vbucket {vb}: {why}", backup_id, vb))


def _summary_problem(summary: Any, entries: dict[int, dict[str, Any]]) -> str | None:
    """Why a done summary does not say what the manifest's entry of its vbucket says (None
    when it does): the manifest was made of the summaries, so a summary that differs was
    changed."""
    if not isinstance(summary, dict) or not isinstance(summary.get("vbucket"), int):
        return "is not a vbucket summary"
    entry = entries.get(summary["vbucket"])
    if entry is None:
        return f"summarises vbucket {summary['vbucket']}, which the manifest does not list"
    # (the driver may add fields to the entry: the summary's own must be the entry's)
    if any(k not in entry or entry[k] != v for k, v in summary.items()):
        return f"differs from the manifest's entry of vbucket {summary['vbucket']}"
    return None


def _check_done(bdir: Path, name: str, backup_id: str, entries: dict[int, dict[str, Any]],
                sealed: bool, report: VerifyReport, key: Any = None) -> None:
    """A done file or done batch (and, sealed, backup.json): readable, authentic when
    sealed, and saying what the manifest says."""
    try:
        doc = read_json(bdir / name, key)
    except crypto.TamperedError as exc:
        report.problems.append(Problem(str(bdir / name), str(exc), backup_id))
        return
    except OSError as exc:
        report.problems.append(Problem(str(bdir / name), f"cannot read: {exc}", backup_id))
        return
    except ValueError as exc:
        why = "the file was tampered with" if sealed else "the file's content changed"
        report.problems.append(Problem(str(bdir / name), f"not valid JSON ({why}): {exc}",
                                       backup_id))
        return
    if name == BACKUP_JSON:
        return
    if BATCH_RE.match(name):
        summaries = doc.get("vbuckets") if isinstance(doc, dict) else None
        if not isinstance(summaries, list):
            report.problems.append(Problem(str(bdir / name), "is not a done batch", backup_id))
            return
    else:
        summaries = [doc]
        m = DONE_RE.match(name)
        if isinstance(doc, dict) and m and doc.get("vbucket") != int(m.group(1)):
            report.problems.append(Problem(str(bdir / name), f"names vbucket "
                                           f"{doc.get('vbucket')!r}, not {int(m.group(1))}",
                                           backup_id))
            return
    for s in summaries:
        why = _summary_problem(s, entries)
        if why:
            vb = s.get("vbucket") if isinstance(s, dict) else None
            report.problems.append(Problem(str(bdir / name), why, backup_id,
                                           vb if isinstance(vb, int) else None))
            return


def _check_entry_files(bdir: Path, backup_id: str, entry: dict[str, Any],
                       report: VerifyReport, missing: set[str], key: Any = None) -> None:
    """Size and SHA-256 of one vbucket's listed files (members of packs too); the names of
    the missing ones go into `missing`."""
    vb = entry["vbucket"]
    sealed = key is not None
    for f in entry["files"]:
        path = entry_location(bdir, f)
        try:
            size, digest = file_digest(path)
        except FileNotFoundError:
            report.problems.append(Problem(str(path), "listed in the manifest but missing",
                                           backup_id, vb))
            missing.add(f["name"])
            continue
        except OSError as exc:
            report.problems.append(Problem(str(path), f"cannot read: {exc.strerror}",
                                           backup_id, vb))
            continue
        report.files_checked += 1
        report.bytes_checked += size
        if size != f["size"]:
            report.problems.append(Problem(
                str(path), f"size is {size} bytes, the manifest says {f['size']} "
                           f"({'truncated' if size < f['size'] else 'grown'})", backup_id, vb))
        elif digest != f["sha256"]:
            why = "the file was tampered with" if sealed else "the file's content changed"
            report.problems.append(Problem(str(path), "SHA-256 does not match the manifest "
                                           f"({why})", backup_id, vb))


def _check_listing(bdir: Path, backup_id: str, manifest: dict[str, Any],
                   report: VerifyReport, vbuckets: Any = None, key: Any = None) -> None:
    """What a backup directory holds besides the listed files: no unlisted data file, and
    the done files (of the vbuckets in `vbuckets`; None: all) agree with the manifest."""
    sealed = key is not None
    entries = {e["vbucket"]: e for e in manifest["vbuckets"]}
    listed = {f.get("pack") or f["name"] for e in manifest["vbuckets"] for f in e["files"]}
    try:
        names = sorted(storage.listdir(bdir))
    except OSError:
        names = []
    known = {MANIFEST_JSON, BACKUP_JSON}
    for name in names:
        done = DONE_RE.match(name)
        if done and vbuckets is not None and int(done.group(1)) not in vbuckets:
            continue
        if (sealed and name == BACKUP_JSON) or done or BATCH_RE.match(name):
            # read by no reader of a committed backup, but written with the manifest (and
            # sealed like the rest in an encrypted archive): checked
            _check_done(bdir, name, backup_id, entries, sealed, report, key)
        if name in listed or name in known or DONE_RE.match(name) or BATCH_RE.match(name):
            continue
        if DATA_RE.match(name) or PACK_RE.match(name):
            report.problems.append(Problem(str(bdir / name), "data file not listed in the "
                                           "manifest", backup_id))
        else:
            report.notes.append(f"{bdir / name}: unexpected file (ignored)")


def _check_files(bdir: Path, backup_id: str, manifest: dict[str, Any],
                 report: VerifyReport, vbuckets: Any = None, key: Any = None) -> set[str]:
    """Size and SHA-256 of every listed file (members of packs too), of the vbuckets in
    `vbuckets` (None: all); the done files agree with the manifest; returns the names of
    the files that are missing."""
    missing: set[str] = set()
    for entry in manifest["vbuckets"]:
        if vbuckets is None or entry["vbucket"] in vbuckets:
            _check_entry_files(bdir, backup_id, entry, report, missing, key)
    _check_listing(bdir, backup_id, manifest, report, vbuckets, key)
    return missing


def _check_backup(bdir: Any, backup_id: str, manifest: dict[str, Any], report: VerifyReport,
                  records: bool, vbuckets: Any = None, key: Any = None) -> None:
    """One committed backup's files (size, SHA-256, nothing unlisted, done files that agree
    with the manifest) and, with `records`, every record of every vbucket (of those in
    `vbuckets`; None: all) against the manifest."""
    with storage.pack_cache():  # a pack is read once for its members (on S3)
        missing = _check_files(bdir, backup_id, manifest, report, vbuckets, key)
        if records:
            # files that failed the checksum are decoded too: it tells where they went bad
            for entry in manifest["vbuckets"]:
                if vbuckets is None or entry["vbucket"] in vbuckets:
                    _check_vbucket_records(bdir, backup_id, entry, report,
                                           manifest.get("version", FORMAT_VERSION), missing,
                                           key)


def _continuity(archive: Archive, manifests: dict[str, dict[str, Any]],
                broken: set[str], report: VerifyReport) -> None:
    ends_after: dict[str, dict[int, ArchivePosition]] = {}
    parents = effective_parents(manifests)
    for bid in sorted(manifests):
        m = manifests[bid]
        mpath = str(archive.backup_dir(bid) / MANIFEST_JSON)
        parent = parents[bid]
        if m["type"] == FULL:
            prev: dict[int, ArchivePosition] | None = {}
        elif parent in broken:
            report.problems.append(Problem(mpath, f"parent backup {parent} is itself broken; "
                                           "this backup cannot be restored", bid))
            prev = None
        elif parent not in manifests:
            state = "partial" if archive.backup_dir(parent).is_dir() else "missing"
            report.problems.append(Problem(mpath, f"parent backup {parent} is {state}", bid))
            prev = None
        else:
            prev = ends_after.get(parent)
        ends: dict[int, ArchivePosition] = dict(prev or {})
        for e in m["vbuckets"]:
            vb = e["vbucket"]
            start = ArchivePosition.coerce(e["start"])
            if prev is not None:
                rb = e["rollbacks"]
                if m["type"] == FULL:
                    if start.seqno != 0 and not rb:
                        report.problems.append(Problem(
                            mpath, f"vbucket {vb}: a full backup starts at seqno {start.seqno}, "
                                   "not 0", bid, vb))
                elif vb in prev:
                    p = prev[vb]
                    if (start.uuid, start.seqno) != (p.uuid, p.seqno):
                        if not (rb and rb[0]["seqno"] <= p.seqno):
                            report.problems.append(Problem(
                                mpath, f"vbucket {vb}: starts at uuid {start.uuid} seqno "
                                       f"{start.seqno} but the chain before it ended at uuid "
                                       f"{p.uuid} seqno {p.seqno}, with no rollback recorded",
                                bid, vb))
                elif start.seqno != 0 and not rb:
                    report.problems.append(Problem(
                        mpath, f"vbucket {vb}: starts at seqno {start.seqno} but no earlier "
                               "backup of the chain holds it", bid, vb))
            ends[vb] = ArchivePosition.coerce(e["end"])
        if prev is None:
            broken.add(bid)
        ends_after[bid] = ends


def verify_archive(archive: Archive | str | os.PathLike[str], *,
                   records: bool = True) -> VerifyReport:
    """Check the whole archive (see module docstring): an opened one, or the one at a
    path (opened here). Raises NotAnArchiveError only when the path is not an archive at
    all; everything else ends up in the report."""
    if not isinstance(archive, Archive):
        archive = Archive.open(archive)
    report = VerifyReport(str(archive.path))
    holder = ArchiveLock(archive.path, "verify").holder()
    if holder is not None:
        report.notes.append(f"{archive.path / LOCK_FILE}: archive is locked by pid "
                            f"{holder.get('pid')} on {holder.get('host')} "
                            f"({holder.get('purpose')}); a backup may be running")
    if archive.key is not None:
        for kpath, why in crypto.check_key_files(archive.path, archive.key):
            report.problems.append(Problem(kpath, why))
    if not isinstance(archive.meta.get("vbuckets"), int) or archive.meta["vbuckets"] < 1:
        report.problems.append(Problem(str(archive.path / ARCHIVE_JSON),
                                       "vbucket count is invalid"))
    try:
        entries = sorted(storage.listdir(archive.backups_dir))
    except OSError as exc:
        report.problems.append(Problem(str(archive.backups_dir), f"cannot list: {exc.strerror}"))
        return report
    manifests: dict[str, dict[str, Any]] = {}
    broken: set[str] = set()
    for name in entries:
        bdir = archive.backups_dir / name
        if not BACKUP_ID_RE.match(name) or not bdir.is_dir():
            report.notes.append(f"{bdir}: not a backup directory (ignored)")
            continue
        mpath = bdir / MANIFEST_JSON
        if not mpath.exists():
            if (bdir / REMOVING).is_file():
                report.notes.append(f"{bdir}: left by an interrupted removal; the next merge, "
                                    "remove or prune deletes it")
                continue
            report.partial_backups += 1
            report.notes.append(f"{bdir}: partial backup (no manifest); resume it with the next "
                                "backup or discard it with --purge-partial")
            continue
        report.backups_checked += 1
        report.size_on_disk += dir_size(bdir)
        try:
            doc = read_json(mpath, archive.key)
        except (OSError, ValueError) as exc:
            report.problems.append(Problem(str(mpath), f"unreadable: {exc}", name))
            broken.add(name)
            report.notes.append(_damaged_note(archive, name))
            continue
        probs = check_manifest(doc, name, archive.meta)
        if probs:
            for p in probs:
                report.problems.append(Problem(str(mpath), p, name))
            broken.add(name)
            report.notes.append(_damaged_note(archive, name))
            continue
        manifests[name] = doc
        _check_backup(bdir, name, doc, report, records, key=archive.key)
    _continuity(archive, manifests, broken, report)
    return report


def _damaged_note(archive: Archive, backup_id: str) -> str:
    return (f"backup {backup_id}: its manifest is damaged; 'dcptool remove {archive.path} "
            f"--backup {backup_id}' takes that backup out and touches nothing else")


def verify_backup_dir(bdir: str | os.PathLike[str], manifest: dict[str, Any], *,
                      records: bool = True, key: Any = None) -> VerifyReport:
    """Check one committed backup directory on its own: each listed file's size and
    SHA-256, no unlisted data file, and (with `records`) every record, the invariants and
    the counts against `manifest`. No chain checks (parent, continuity). Used to prove a
    backup sound before it is put into an archive (merge)."""
    bdir = storage.location(bdir)
    report = VerifyReport(str(bdir))
    report.backups_checked = 1
    name = manifest["id"]
    _check_backup(bdir, name, manifest, report, records, key=key)
    return report


def verify_chain(archive: Archive, chain: list[Any], vbuckets: Any = None, *,
                 records: bool = True) -> VerifyReport:
    """What `verify_archive` checks, for the backups of `chain` (`Archive.chain`: what a
    restore reads) and the vbuckets in `vbuckets` (None: all): each manifest, each listed
    file's size and SHA-256, no unlisted data file, the done files (and, sealed, backup.json)
    against the manifest, with `records` every record, and that each vbucket starts where the
    chain before it ended. The archive's key files are checked as `verify` does."""
    return _checked_chain(archive, chain, vbuckets, lambda b, report, wanted: _check_backup(
        b.dir, b.id, b.manifest, report, records, wanted, key=archive.key))


def _checked_chain(archive: Archive, chain: list[Any], vbuckets: Any,
                   check_backup: Any) -> VerifyReport:
    """The key files, each manifest, `check_backup(backup, report, wanted vbuckets or
    None)` for each backup whose manifest is sound, and the continuity of the vbuckets
    wanted: `verify_chain` and `verify_chain_shared`."""
    report = VerifyReport(str(archive.path))
    wanted = None if vbuckets is None else frozenset(vbuckets)
    if archive.key is not None:
        for kpath, why in crypto.check_key_files(archive.path, archive.key):
            report.problems.append(Problem(kpath, why))
    manifests: dict[str, dict[str, Any]] = {}
    broken: set[str] = set()
    for b in chain:
        report.backups_checked += 1
        probs = check_manifest(b.manifest, b.id, archive.meta)
        if probs:
            for p in probs:
                report.problems.append(Problem(str(b.dir / MANIFEST_JSON), p, b.id))
            broken.add(b.id)
            continue
        manifests[b.id] = b.manifest
        check_backup(b, report, wanted)
    if wanted is not None:  # continuity of the vbuckets restored only
        manifests = {bid: {**m, "vbuckets": [e for e in m["vbuckets"] if e["vbucket"] in wanted]}
                     for bid, m in manifests.items()}
    _continuity(archive, manifests, broken, report)
    return report


# -- the same check in two parts: what a restore task checks of its own vbuckets -----------------

#: the phases of one backup's checks in `verify_chain`'s order: listed files, then the
#: directory's listing (done files, unlisted files), then records
PHASE_FILES, PHASE_LISTING, PHASE_RECORDS = 0, 1, 2


def verify_chain_shared(archive: Archive, chain: list[Any], vbuckets: Any = None) -> VerifyReport:
    """`verify_chain` without its per-vbucket part (`verify_chain_vbuckets`: the listed
    files' sizes and SHA-256 and the records): the key files, each manifest, each backup
    directory's listing (no unlisted data file; the done files, and sealed backup.json,
    against the manifest) and the chain's continuity. Its problems, when there are any,
    may not be the first `verify_chain` would name: the caller then runs `verify_chain`."""
    return _checked_chain(archive, chain, vbuckets, lambda b, report, wanted: _check_listing(
        b.dir, b.id, b.manifest, report, wanted, key=archive.key))


def verify_chain_vbuckets(archive: Archive, chain: list[Any], vbuckets: Any, *,
                          keep: dict[tuple[str, int], list] | None = None,
                          keep_bytes: int = 0
                          ) -> tuple[VerifyReport, list[tuple[int, int, int]]]:
    """The per-vbucket part of `verify_chain` for the vbuckets in `vbuckets`, whose
    manifests `verify_chain_shared` found sound: each listed file's size and SHA-256, and
    every record. Returns the report and, for each of its problems, its place in
    `verify_chain`'s order, (backup's index in the chain, phase, entry's index in the
    manifest): sorted by it (stably), the problems of several such checks that share out
    the vbuckets come in the order one `verify_chain` gives them.

    `keep`: a dict that gets {(backup id, vbucket): the record batches read} of the
    vbuckets found sound (of format 3 backups: their records as a reader gives them), as
    long as their size in memory (estimated from the manifest: value bytes and
    KEPT_RECORD_BYTES a record) stays within `keep_bytes`, so that whoever reads them next
    need not decode them again."""
    report = VerifyReport(str(archive.path))
    kept = 0
    wanted = frozenset(vbuckets)
    places: list[tuple[int, int, int]] = []
    for bi, b in enumerate(chain):
        report.backups_checked += 1
        version = b.manifest.get("version", FORMAT_VERSION)
        with storage.pack_cache():
            for ei, entry in enumerate(b.manifest["vbuckets"]):
                if entry["vbucket"] not in wanted:
                    continue
                missing: set[str] = set()
                n = len(report.problems)
                _check_entry_files(b.dir, b.id, entry, report, missing, archive.key)
                places.extend((bi, PHASE_FILES, ei) for _ in range(len(report.problems) - n))
                n = len(report.problems)
                size = entry["bytes"]["values"] + KEPT_RECORD_BYTES * entry["counts"]["records"]
                batches = [] if (keep is not None and version >= COLLECTIONS_VERSION
                                 and kept + size <= keep_bytes) else None
                _check_vbucket_records(b.dir, b.id, entry, report, version, missing,
                                       archive.key, keep=batches)
                places.extend((bi, PHASE_RECORDS, ei) for _ in range(len(report.problems) - n))
                if batches is not None and len(report.problems) == n and keep is not None:
                    keep[(b.id, entry["vbucket"])] = batches
                    kept += size
    return report, places


#: the memory a decoded record takes besides its value (tuple, key, ints), for `keep_bytes`
KEPT_RECORD_BYTES = 256
