"""Partial backups: which vbuckets finished, and where the others can restart.

A vbucket of a partial backup is *complete* when its summary exists (`vb-NNNN.done.json`, or
the newest done batch of a packed backup that names it: see packing.py) and every file it
lists still has the recorded size and SHA-256. Otherwise its data files are scanned frame
by frame: every complete zstd frame is read, a torn or corrupt frame ends the scan, and the
*valid prefix* is everything up to the last snapshot boundary seen (a stream start, a rollback
record, or a snapshot whose last item or successor marker was read). The restart position is
that boundary.

Keeping the prefix (done by `truncate_to_cut`, used when a writer resumes) truncates the data
file holding the boundary at the start of the frame that contains it, re-appends the part of
that frame before the boundary as a fresh frame, and deletes later segments. So at most one
frame (~1 MiB) is rewritten, whatever the size of the data kept.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterable


from . import crypto, storage
from .block import block_compressor, compress_sections
from .errors import ArchiveError, CorruptFileError
from .format import (
    BATCH_RE,
    DATA_RE,
    DONE_RE,
    REC_DELETION,
    END,
    REC_EXPIRATION,
    HEADER,
    REC_MUTATION,
    REC_SYSTEM_EVENT,
    ROLLBACK,
    SNAPSHOT,
    STREAM,
    FORMAT_NAME,
    ArchivePosition,
    done_file_name,
    entry_location,
    listed_size,
    fsync_dir,
    read_json,
    sealed_name,
    uuid_for_seqno,
)
from .frames import (
    TornFrame,
    content_prefix,
    decompress_frame,
    frame_records_with_ends,
    record_ok,
    scan_stored_frames,
)


#: check_done's default: look for the vbucket's summary in the directory
LOOK = object()


def done_summaries(backup_dir: Any, names: Iterable[str] | None = None, *, key: Any = None
                   ) -> dict[int, dict[str, Any]]:
    """The done summaries in a backup directory, {vbucket: summary}: the vbuckets' done
    files, then the done batches oldest first (a newer batch's summary of a vbucket replaces
    an older one). Unreadable files are passed over (their vbuckets are then not complete)."""
    backup_dir = storage.location(backup_dir)
    if names is None:
        try:
            names = storage.listdir(backup_dir)
        except FileNotFoundError:
            return {}
    out: dict[int, dict[str, Any]] = {}
    ordered = sorted(names)
    for name in ordered:
        m = DONE_RE.match(name)
        if m:
            try:
                s = read_json(backup_dir / name, key)
                if isinstance(s, dict) and s.get("vbucket") == int(m.group(1)):
                    out[s["vbucket"]] = s
            except (OSError, ValueError, KeyError, TypeError, ArchiveError):
                pass
    for name in ordered:
        if BATCH_RE.match(name):
            for s in batch_summaries(backup_dir / name, key):
                out[s["vbucket"]] = s
    return out


def batch_summaries(path: Any, key: Any = None) -> list[dict[str, Any]]:
    """The summaries of one done batch ([] when it is unreadable or malformed)."""
    try:
        doc = read_json(path, key)
        return [s for s in doc["vbuckets"] if isinstance(s, dict)
                and isinstance(s.get("vbucket"), int)]
    except (OSError, ValueError, KeyError, TypeError, ArchiveError):
        return []


def file_digest(path: Any) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with storage.open_read(storage.location(path)) as f:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


def vbucket_files(backup_dir: str | os.PathLike[str],
                  names: Iterable[str] | None = None) -> dict[int, list[tuple[int, str]]]:
    """Data files in a backup directory: {vbucket: [(segment, name), ...] sorted by segment}
    (of `names`, the directory's as listed earlier, when given)."""
    out: dict[int, list[tuple[int, str]]] = {}
    if names is None:
        try:
            names = storage.listdir(storage.location(backup_dir))
        except FileNotFoundError:
            return out
    for name in names:
        m = DATA_RE.match(name)
        if m:
            out.setdefault(int(m.group(1)), []).append((int(m.group(2)), name))
    for segs in out.values():
        segs.sort()
    return out


@dataclass
class Cut:
    """A record boundary in a vbucket's data: keep segments before `seg_pos` whole, and in
    segment `seg_pos` everything before `frame_offset` plus the first `keep_bytes`
    uncompressed bytes of the frame at `frame_offset` (all of it when keep_bytes == content);
    in a version 2 block, whose records have no byte offsets, both count records."""

    seg_pos: int
    frame_offset: int
    frame_len: int
    keep_bytes: int
    content_len: int


@dataclass
class VBucketScan:
    """What a scan of one vbucket's data found (see module docstring)."""

    vbucket: int
    files: list[tuple[int, str]]
    start: ArchivePosition | None = None          # position of the first stream record
    failover_log: list[list[int]] = field(default_factory=list)  # of the latest stream record
    position: ArchivePosition | None = None       # restart position: the last boundary kept
    cut: Cut | None = None                 # None: nothing worth keeping
    counts: dict[str, int] = field(default_factory=dict)  # counts of the kept prefix
    value_bytes: int = 0
    rollbacks: list[dict[str, int]] = field(default_factory=list)
    segment_records: list[int] = field(default_factory=list)  # records kept per segment
    max_seqno: int = 0                     # highest item seqno kept
    problem: str | None = None             # why the scan stopped before the end of the data
    records_scanned: int = 0


_ZERO_COUNTS = ("mutations", "deletions", "expirations", "snapshots", "rollbacks", "records")


class _Stop(Exception):
    pass


def scan_vbucket(backup_dir: str | os.PathLike[str], backup_id: str, vbucket: int,
                 files: list[tuple[int, str]] | None = None, *,
                 rollback_to: int | None = None, key: Any = None) -> VBucketScan:
    """Read a vbucket's data files of one backup and find the valid prefix.

    With `rollback_to=S`, the prefix instead ends at the boundary at seqno S (or just after
    the first stream record when S is below where this backup's stream started); a ValueError
    says when S is not a snapshot boundary of the data.
    """
    backup_dir = storage.location(backup_dir)
    if files is None:
        files = vbucket_files(backup_dir).get(vbucket, [])
    scan = VBucketScan(vbucket=vbucket, files=list(files))
    state = _PrefixScan(scan, backup_id, rollback_to, key)
    expected_seg = 0
    try:
        for seg_pos, (segment, name) in enumerate(files):
            if segment != expected_seg:
                raise _Stop(f"segment {expected_seg:03d} is missing")
            expected_seg += 1
            state.read_segment(backup_dir, seg_pos, segment, name)
    except _Stop as stop:
        scan.problem = str(stop)
    if rollback_to is not None and scan.start is not None and rollback_to >= scan.start.seqno \
            and not state.found_rollback_point:
        raise ValueError(f"seqno {rollback_to} is not a snapshot boundary of vbucket "
                         f"{vbucket}'s data in this backup")
    return scan


class _PrefixScan:
    """One `scan_vbucket` pass: what the records read so far add up to, checked record by
    record against the layout (docs/archive-format.md); at each snapshot boundary the sums
    are copied into the `VBucketScan` as its valid prefix (`_mark`). A record that breaks
    the layout raises `_Stop` naming it, and the scan ends there."""

    def __init__(self, scan: VBucketScan, backup_id: str, rollback_to: int | None,
                 key: Any = None) -> None:
        self.scan = scan
        #: the archive's data key (None: a plain archive)
        self.key = key
        self.backup_id = backup_id
        self.rollback_to = rollback_to
        self.counts = dict.fromkeys(_ZERO_COUNTS, 0)
        self.counts["system_events"] = 0
        self.per_seg: list[int] = []
        self.rollbacks: list[dict[str, int]] = []
        self.vbytes = 0
        self.max_seqno = 0
        self.uuid = 0  # uuid of the latest stream record (fallback when the failover log is empty)
        self.flog: list[list[int]] = []
        self.snap: tuple[int, int] | None = None  # open snapshot (start, end)
        self.last_seqno = -1
        self.prev_end: Cut | None = None  # boundary just after the previous record
        self.found_rollback_point = False

    # -- the prefix kept

    def _mark(self, at: Cut | None, pos: ArchivePosition) -> None:
        scan = self.scan
        scan.cut = at
        scan.position = pos
        scan.counts = dict(self.counts)
        scan.value_bytes = self.vbytes
        scan.rollbacks = list(self.rollbacks)
        scan.segment_records = list(self.per_seg)
        scan.max_seqno = self.max_seqno
        scan.failover_log = [list(e) for e in self.flog]

    def _boundary(self, at: Cut | None, seqno: int) -> None:
        rollback_to = self.rollback_to
        pos = ArchivePosition.at(uuid_for_seqno(self.flog, seqno, self.uuid), seqno)
        if rollback_to is None:
            self._mark(at, pos)
        elif seqno <= rollback_to:
            self._mark(at, pos)
            self.found_rollback_point = seqno == rollback_to

    # -- reading

    def read_segment(self, backup_dir: Any, seg_pos: int, segment: int, name: str) -> None:
        """Every complete frame of one data file; a torn or unreadable one is a `_Stop`."""
        path = str(backup_dir / name)
        self.per_seg.append(0)
        try:
            f = storage.open_read(backup_dir / name)
        except OSError as exc:
            raise _Stop(f"{name}: cannot read: {exc.strerror}") from None
        with f:
            try:
                self._read_frames(f, path, seg_pos, segment, name)
            except TornFrame as torn:
                raise _Stop(f"{name}: torn zstd frame at byte {torn.args[0]} "
                            "(ignored)") from None
            except CorruptFileError as exc:
                raise _Stop(str(exc)) from None
            except OSError as exc:
                raise _Stop(f"{name}: cannot read: {exc.strerror}") from None

    def _read_frames(self, f: Any, path: str, seg_pos: int, segment: int, name: str) -> None:
        first = True
        item = self._item
        # the per-record bookkeeping in locals, written back however the file ends
        here, scanned = self.prev_end, 0
        try:
            for offset, stored, frame in scan_stored_frames(f, path, key=self.key):
                content = decompress_frame(frame, path, offset)
                recs = frame_records_with_ends(content, path, offset)
                clen = recs[-1][1] if recs else 0
                for rec, end in recs:
                    before, here = here, Cut(seg_pos, offset, stored, end, clen)
                    scanned += 1
                    if not record_ok(rec):
                        raise _Stop(f"{name}: malformed record in the frame at byte {offset}")
                    rtype = rec[0]
                    if first:
                        first = False
                        self._header(rec, name, segment)
                    elif rtype in (REC_MUTATION, REC_DELETION, REC_EXPIRATION):
                        item(rec, here, name)
                    elif rtype == REC_SYSTEM_EVENT:
                        self._system_event(rec, here, name)
                    elif rtype == SNAPSHOT:
                        self._snapshot(rec, before, name)
                    elif rtype == STREAM:
                        self._stream(rec, here, name)
                    elif rtype == ROLLBACK:
                        self._rollback(rec, here, before)
                    elif rtype == END:
                        self._end(rec, before)
                    else:  # a header in the middle of a file
                        raise _Stop(f"{name}: header record in the middle of the file")
        finally:
            self.prev_end = here
            self.scan.records_scanned += scanned

    # -- one record of each kind

    def _counted(self) -> None:
        self.counts["records"] += 1
        self.per_seg[-1] += 1

    def _header(self, rec: tuple, name: str, segment: int) -> None:
        if rec[0] != HEADER or rec[1] != FORMAT_NAME or rec[3] != self.scan.vbucket \
                or rec[4] != self.backup_id or rec[5] != segment:
            raise _Stop(f"{name}: does not start with this file's header")
        self._counted()

    def _in_snapshot(self, seqno: int, name: str, what: str) -> None:
        """Check that `seqno` lies in the open snapshot, above the previous one."""
        snap = self.snap
        if snap is None or not (snap[0] <= seqno <= snap[1]) or seqno <= self.last_seqno:
            raise _Stop(f"{name}: {what} {seqno} outside its snapshot")
        self.last_seqno = seqno
        self.max_seqno = seqno

    def _item(self, rec: tuple, here: Cut, name: str) -> None:
        # _in_snapshot written out: this runs once per item
        seqno = rec[1]
        snap = self.snap
        if snap is None or not (snap[0] <= seqno <= snap[1]) or seqno <= self.last_seqno:
            raise _Stop(f"{name}: item seqno {seqno} outside its snapshot")
        self.last_seqno = seqno
        self.max_seqno = seqno
        rtype = rec[0]
        counts = self.counts
        if rtype == REC_MUTATION:
            counts["mutations"] += 1
            self.vbytes += len(rec[8])
        else:
            counts["deletions" if rtype == REC_DELETION else "expirations"] += 1
            self.vbytes += len(rec[7])
        counts["records"] += 1
        self.per_seg[-1] += 1
        if seqno == snap[1]:
            self.snap = None
            self._boundary(here, seqno)

    def _system_event(self, rec: tuple, here: Cut, name: str) -> None:
        # a seqno of the stream like an item's (format 3)
        seqno = rec[1]
        self._in_snapshot(seqno, name, "system event seqno")
        self.counts["system_events"] += 1
        self._counted()
        if seqno == self.snap[1]:
            self.snap = None
            self._boundary(here, seqno)

    def _snapshot(self, rec: tuple, before: Cut | None, name: str) -> None:
        start, end_s = rec[1], rec[2]
        if self.snap is not None:
            self._boundary(before, self.snap[1])  # the previous snapshot is complete
        if start > end_s:
            raise _Stop(f"{name}: snapshot marker {start}..{end_s}")
        self.snap = (start, end_s)
        self.counts["snapshots"] += 1
        self._counted()

    def _stream(self, rec: tuple, here: Cut, name: str) -> None:
        if self.snap is not None:
            raise _Stop(f"{name}: stream record inside a snapshot")
        pos = ArchivePosition(rec[1], rec[2], rec[3], rec[4])
        self.uuid = pos.uuid
        self.flog = [list(e) for e in rec[5]]
        self.last_seqno = pos.seqno
        self._counted()
        scan = self.scan
        if scan.start is None:
            scan.start = pos
            scan.failover_log = [list(e) for e in self.flog]
            if self.rollback_to is not None:
                # even a rollback below this backup's start keeps the header and the first
                # stream record
                self._mark(here, pos)
                self.found_rollback_point = pos.seqno == self.rollback_to
                return
        self._boundary(here, pos.seqno)

    def _rollback(self, rec: tuple, here: Cut, before: Cut | None) -> None:
        if self.snap is not None:
            self._boundary(before, self.snap[1])
            self.snap = None
        seqno, ruuid = rec[1], rec[2]
        self.rollbacks.append({"seqno": seqno, "vbucket_uuid": ruuid})
        self.counts["rollbacks"] += 1
        self._counted()
        self.last_seqno = seqno
        self.uuid = ruuid
        self._boundary(here, seqno)

    def _end(self, rec: tuple, before: Cut | None) -> None:
        # the vbucket closed here; keep everything before END, restart at it
        self.snap = None
        self.uuid = rec[1]
        self._boundary(before, rec[2])


def truncate_to_cut(backup_dir: str | os.PathLike[str], scan: VBucketScan, *,
                    level: int, key: Any = None) -> list[dict[str, Any]]:
    """Make the vbucket's files hold exactly the scan's valid prefix.

    Returns the file entries ({name, size, sha256, records}) of the segments kept, in order.
    With no cut at all, every data file of the vbucket is deleted.
    """
    backup_dir = storage.location(backup_dir)
    cut = scan.cut
    keep_upto = -1 if cut is None else cut.seg_pos
    for seg_pos, (_segment, name) in enumerate(scan.files):
        if seg_pos > keep_upto:
            storage.unlink(backup_dir / name)
    entries: list[dict[str, Any]] = []
    if cut is None:
        fsync_dir(backup_dir)
        return entries
    name = scan.files[cut.seg_pos][1]
    path = backup_dir / name
    if cut.keep_bytes == cut.content_len:
        if storage.stat_size(path) != cut.frame_offset + cut.frame_len:
            storage.replace_prefix_bytes(path, cut.frame_offset + cut.frame_len, b"")
    else:
        frame = storage.read_range(path, cut.frame_offset, cut.frame_len)
        sealer = crypto.frame_sealer(key, sealed_name(path))
        if sealer is not None:  # the frame was opened by the scan: it is genuine
            frame = crypto.FrameOpener(key, sealed_name(path)).open(frame[8:], cut.frame_offset)
        content = decompress_frame(frame, str(path), cut.frame_offset)
        tail = compress_sections(block_compressor(level),
                                 content_prefix(content, cut.keep_bytes, str(path),
                                                cut.frame_offset))
        if sealer is not None:  # sealed anew under a fresh subkey of its own
            tail = sealer.seal(tail, cut.frame_offset)
        storage.replace_prefix_bytes(path, cut.frame_offset, tail)
    fsync_dir(backup_dir)
    for seg_pos in range(cut.seg_pos + 1):
        seg_name = scan.files[seg_pos][1]
        size, digest = file_digest(backup_dir / seg_name)
        entries.append({"name": seg_name, "size": size, "sha256": digest,
                        "records": scan.segment_records[seg_pos]})
    return entries


# ---------------------------------------------------------------------------------------------


@dataclass
class VBucketRecovery:
    """The state of one vbucket in a partial backup."""

    vbucket: int
    complete: bool
    summary: dict[str, Any] | None = None  # the done summary when complete
    position: ArchivePosition | None = None       # where an incomplete vbucket restarts (None: unknown
                                           # or no valid data; restart from the planned start)
    start: ArchivePosition | None = None
    failover_log: list[list[int]] = field(default_factory=list)
    records_kept: int = 0
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "vbucket": self.vbucket,
            "complete": self.complete,
            "position": None if self.position is None else self.position.to_json(),
            "start": None if self.start is None else self.start.to_json(),
            "failover_log": self.failover_log,
            "records_kept": self.records_kept,
            "problem": self.problem,
            "summary": self.summary,
        }


def check_done(backup_dir: str | os.PathLike[str], backup_id: str, vbucket: int,
               files: list[tuple[int, str]] | None = None, *, rehash: bool = True,
               summary: Any = LOOK, sizes: dict[str, int] | None = None, key: Any = None
               ) -> tuple[dict[str, Any] | None, str | None]:
    """(summary, None) when the vbucket's summary exists and matches its files on disk,
    else (None, reason) — reason None when there simply is no summary. `summary`: the one
    done_summaries found (None: there is none), else it is looked for; `sizes`: the
    directory's {name: size}, for sizes without a request each (rehash=False)."""
    backup_dir = storage.location(backup_dir)
    done = backup_dir / done_file_name(vbucket)
    label = f"vbucket {vbucket}'s summary"
    if summary is LOOK:
        if done.exists():
            label = done.name
            try:
                summary = read_json(done, key)
            except (OSError, ValueError) as exc:
                return None, f"{done.name} is unreadable: {exc}"
        else:
            summary = done_summaries(backup_dir, key=key).get(vbucket)
    if summary is None:
        return None, None
    try:
        listed = summary["files"]
        if summary["vbucket"] != vbucket or summary["backup"] != backup_id:
            return None, f"{label} belongs to another vbucket or backup"
        names = [e["name"] for e in listed if "pack" not in e]
    except (KeyError, TypeError) as exc:
        return None, f"{label} is unreadable: {exc}"
    if files is None:
        files = vbucket_files(backup_dir).get(vbucket, [])
    on_disk = [name for _seg, name in files]
    if on_disk != names:
        return None, f"{label} lists {names} but the directory holds {on_disk}"
    for entry in listed:
        try:
            path = entry_location(backup_dir, entry)
            if rehash:
                size, digest = file_digest(path)
            elif sizes is not None:
                size, digest = listed_size(entry, sizes) or 0, entry["sha256"]
            else:
                size, digest = storage.stat_size(path), entry["sha256"]
        except FileNotFoundError:
            return None, f"{entry.get('name')}: missing"
        except OSError as exc:
            return None, f"{entry.get('name')}: cannot read: {exc.strerror}"
        except (KeyError, TypeError, ValueError) as exc:
            return None, f"{label} is malformed: {exc}"
        if size != entry["size"]:
            return None, f"{entry['name']}: size {size} but {entry['size']} was recorded"
        if digest != entry["sha256"]:
            return None, f"{entry['name']}: SHA-256 does not match the recorded one"
    return summary, None


def recover_vbucket(backup_dir: str | os.PathLike[str], backup_id: str, vbucket: int,
                    files: list[tuple[int, str]] | None = None, *, scan: bool = True,
                    rehash: bool = True, summary: Any = LOOK,
                    sizes: dict[str, int] | None = None, key: Any = None) -> VBucketRecovery:
    """Tell whether a vbucket of a partial backup completed and, if not, where it restarts.

    Read-only: nothing is changed on disk (a resuming VBucketWriter keeps the prefix).
    """
    if files is None:
        files = vbucket_files(backup_dir).get(vbucket, [])
    summary, problem = check_done(backup_dir, backup_id, vbucket, files, rehash=rehash,
                                  summary=summary, sizes=sizes, key=key)
    if summary is not None:
        return VBucketRecovery(vbucket, True, summary=summary,
                               position=ArchivePosition.coerce(summary["end"]),
                               start=ArchivePosition.coerce(summary["start"]),
                               failover_log=summary.get("failover_log", []),
                               records_kept=summary["counts"]["records"])
    rec = VBucketRecovery(vbucket, False, problem=problem)
    if not scan:
        return rec
    s = scan_vbucket(backup_dir, backup_id, vbucket, files, key=key)
    rec.position = s.position
    rec.start = s.start
    rec.failover_log = s.failover_log
    rec.records_kept = s.counts.get("records", 0)
    if s.problem:
        rec.problem = s.problem if rec.problem is None else f"{rec.problem}; {s.problem}"
    return rec


def recover_backup(backup_dir: str | os.PathLike[str], backup_id: str, *, scan: bool = True,
                   rehash: bool = True, key: Any = None) -> dict[int, VBucketRecovery]:
    """recover_vbucket for every vbucket that has data files or a done file in the directory."""
    backup_dir = storage.location(backup_dir)
    sizes = storage.list_sizes(backup_dir)
    files = vbucket_files(backup_dir, sizes)
    dones = done_summaries(backup_dir, sizes, key=key)
    vbs = set(files) | set(dones)
    for name in sizes:
        if DONE_RE.match(name):
            vbs.add(int(name[3:-10]))
    with storage.pack_cache():  # one read of each pack, not one per member
        # (a done file that did not read is looked at again, to say why)
        return {vb: recover_vbucket(backup_dir, backup_id, vb, files.get(vb, []), scan=scan,
                                    rehash=rehash, sizes=sizes, key=key,
                                    summary=dones[vb] if vb in dones else
                                    LOOK if done_file_name(vb) in sizes else None)
                for vb in sorted(vbs)}
