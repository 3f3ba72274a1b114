"""Writing one vbucket's data in one backup: records packed into a reused buffer, compressed
into a zstd frame each time the buffer passes the block size, and written to segment files.

The writer is built from plain values (archive path, backup id, vbucket, positions) so a
Spark task on an executor can make one without any of the driver's objects; `close` returns
a plain JSON-able summary dict and also writes it, atomically, as `vb-NNNN.done.json`.

Hot path: `mutation()` and friends do one tuple build, one `Packer.pack`, one buffer append,
two counter updates and a length check; everything else happens once per frame (~1 MiB).
"""
from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections import Counter
from operator import itemgetter
from . import crypto, storage
from typing import Any, Collection, Iterable, Sequence

import msgpack
import zstandard

from dcptool.faults import fault_point

from .block import ITEM_COST, ROW, BlockBuilder, block_compressor, compress_sections, decode_block
from .errors import ArchiveError, CorruptFileError
from .format import (
    BACKUP_JSON,
    BACKUPS_DIR,
    DEFAULT_BLOCK_BUDGET,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_LEVEL,
    DEFAULT_SEGMENT_BYTES,
    REC_DELETION,
    END,
    REC_EXPIRATION,
    FILE_MODE,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEADER,
    MANIFEST_JSON,
    MIN_BLOCK_SIZE,
    REC_MUTATION,
    REC_SYSTEM_EVENT,
    ROLLBACK,
    SNAPSHOT,
    STREAM,
    ArchivePosition,
    atomic_write_json,
    coerce_failover_log,
    data_file_name,
    done_file_name,
    fsync_dir,
    read_json,
    sealed_name,
)
from .recovery import LOOK, check_done, scan_vbucket, truncate_to_cut, vbucket_files

SUMMARY_VERSION = 1
_MUTATIONS = b"\x03" * 256  # record type bytes of a run of mutations
_DCP_MUTATION = 0x57  # the kind of a DCP client mutation event (its opcode)
#: what the open writers of this process hold in blocks not yet written, together (in
#: BlockBuilder.size() units), as last accounted by each; each writer's share is in a cell
#: of its own, taken back when it flushes, closes or is collected
_HELD = [0]
_HELD_LOCK = threading.Lock()
#: single-record calls account their block each time it grew by this much
_ACCOUNT_STEP = 16 << 10


def _release_cell(cell: list[int]) -> None:
    with _HELD_LOCK:
        _HELD[0] -= cell[0]
        cell[0] = 0


def buffered_bytes() -> int:
    """The uncompressed bytes all open writers of this process buffer in blocks now."""
    return _HELD[0]

_local = threading.local()


def shared_compressor(level: int) -> zstandard.ZstdCompressor:
    """One zstd compressor per thread and level, shared by every writer of that thread.

    `compress()` is one-shot (each frame starts from a reset context), so sharing is safe
    within a thread; it keeps one context's tables warm in the CPU cache and in memory,
    instead of one per vbucket writer.
    """
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = block_compressor(level)
    return cctx


def load_backup_intent(archive: Any, backup_id: str) -> dict[str, Any]:
    """The backup.json of a backup that is still being written (raises if it is committed)."""
    archive_path = archive.path
    bdir = archive_path / BACKUPS_DIR / backup_id
    if (bdir / MANIFEST_JSON).exists():
        raise ArchiveError(f"backup {backup_id} in {archive_path} is committed; its files are "
                           "immutable")
    try:
        intent = read_json(bdir / BACKUP_JSON, archive.key)
    except FileNotFoundError:
        raise ArchiveError(f"no backup {backup_id} is being written in {archive_path} "
                           f"({bdir / BACKUP_JSON} is missing)") from None
    except (OSError, ValueError) as exc:
        raise CorruptFileError(bdir / BACKUP_JSON, f"unreadable: {exc}") from None
    if not isinstance(intent, dict) or intent.get("id") != backup_id:
        raise CorruptFileError(bdir / BACKUP_JSON, "does not describe this backup")
    return intent


class VBucketWriter:
    """Writes the records of one vbucket for one backup.

    `start` is where this backup's stream for the vbucket begins (the parent's end position,
    or seqno 0 for a full backup); `failover_log` is the one the node returned (newest first).

    `resume=False` (a new attempt, e.g. a retried Spark task) deletes whatever files this
    vbucket already has in the backup and starts over; nothing of other vbuckets is touched.
    `resume=True` keeps the valid prefix of a killed attempt (see recovery.py) and continues
    after it: the caller must stream from `writer.position`.
    """

    def __init__(self, archive: Any, backup_id: str, vbucket: int,
                 start: Any, failover_log: Iterable[Any] | None = (), *,
                 resume: bool = False, level: int | None = None,
                 block_size: int | None = None, segment_bytes: int | None = None,
                 sync: bool = True, block_budget: int | None = None,
                 intent: dict[str, Any] | None = None, listing: Collection[str] | None = None,
                 files: list[tuple[int, str]] | None = None, packer: Any = None,
                 known_summary: Any = LOOK):
        self.archive_path = archive.path
        #: the archive's data key (None: a plain archive): every file is sealed under it
        self.key = archive.key
        self.backup_id = backup_id
        #: fsync each segment and the done file as they close (False: the caller runs
        #: sync_filesystem once, after closing all its writers, before it reports them done)
        self._sync = bool(sync)
        self.vbucket = int(vbucket)
        self.dir = self.archive_path / BACKUPS_DIR / backup_id
        # a task that opens hundreds of writers reads backup.json and lists the backup's
        # directory once for all of them (`intent`; `listing`: the names in it at its start,
        # `files`: this vbucket's data files among them, as vbucket_files finds them)
        if intent is None:
            intent = load_backup_intent(archive, backup_id)
        comp = intent.get("compression", {})
        self.level = int(level if level is not None else comp.get("level", DEFAULT_LEVEL))
        #: a block is written out once its content reaches this (BlockBuilder.size())
        self._block = int(block_size or comp.get("block_size", DEFAULT_BLOCK_SIZE))
        #: the uncompressed bytes all open writers of this process buffer together: with
        #: many vbuckets open at once (a task streams hundreds, interleaved), once their
        #: blocks hold more than the budget, a writer that has appended a run writes its
        #: block out (if it holds MIN_BLOCK_SIZE at least), so memory stays at the budget
        #: however large the vbuckets grow, and blocks stay as large as it allows
        self._budget = int(block_budget or DEFAULT_BLOCK_BUDGET)
        self._held = [0]  # this writer's part of _HELD
        weakref.finalize(self, _release_cell, self._held)
        self._segment_bytes = int(segment_bytes or comp.get("segment_bytes", DEFAULT_SEGMENT_BYTES))
        self._cctx = shared_compressor(self.level)
        self._pack = msgpack.Packer(use_bin_type=True).pack
        #: format version of this backup's files: 3 (columnar blocks, doc keys, system
        #: events) unless backup.json says 1 (the record layout kept for tests of the
        #: readers; keys are written as given)
        self.version = int(intent.get("version", FORMAT_VERSION))
        if self.version not in (1, FORMAT_VERSION):
            raise ArchiveError(f"backup {backup_id} has format version {self.version}; this "
                               f"dcptool writes versions 1 and {FORMAT_VERSION}")
        self._blk = BlockBuilder()
        self.start = ArchivePosition.coerce(start)
        self.failover_log = coerce_failover_log(failover_log)
        # counters: records of each kind, value bytes; "other" = header/stream/rollback/end;
        # _nx: system events (format 3)
        self._nm = self._nd = self._ne = self._ns = self._no = self._nx = 0
        self._nb = 0  # records packed by write() whose types are not counted yet
        self._vbytes = 0
        self._flushed = 0  # records already in written frames
        self._seg_records = 0  # records in the current segment's written frames
        self._roll = False  # the current segment is full: the next frame starts a new one
        self._files: list[dict[str, Any]] = []  # closed segments
        self._out: storage.NewFile | None = None
        self._sealer: crypto.FrameSealer | None = None
        self._segment = -1
        self._fsize = 0
        self._sha = hashlib.sha256()
        self.rollbacks: list[dict[str, int]] = []
        self.closed = False
        self.summary: dict[str, Any] | None = None
        #: a packing.Packer: the last segment goes into its pack (when small) and the
        #: summary into its next done batch, instead of a file each
        self._packer = packer

        if files is None:
            files = vbucket_files(self.dir, listing).get(self.vbucket, [])
        done = self.dir / done_file_name(self.vbucket)
        if resume:
            summary, _why = check_done(self.dir, backup_id, self.vbucket, files,
                                       summary=known_summary, key=self.key)
            if summary is not None:
                raise ArchiveError(f"vbucket {self.vbucket} of backup {backup_id} is already "
                                   "complete", hint="use its summary from the recovery instead")
            self._unlink(done)
            scan = scan_vbucket(self.dir, backup_id, self.vbucket, files, key=self.key)
            if scan.cut is None or scan.start is None:
                self._unlink_all(files)
                self.position = self.start
                self._open_segment(0)
                self._stream_record(self.start, self.failover_log)
            else:
                self._adopt(scan, files)
                self.start = scan.start
                if not self.failover_log:
                    self.failover_log = scan.failover_log
                self._open_segment(self._segment + 1)
                self._stream_record(self.position, self.failover_log)
        else:
            if listing is None or done.name in listing:
                self._unlink(done)
            self._unlink_all(files)
            self.position = self.start
            self._open_segment(0)
            self._stream_record(self.start, self.failover_log)

    def _account(self) -> None:
        """Count this writer's block in the process's total; write it out when the total
        is over the budget and the block is not small."""
        size = self._blk.size()
        cell = self._held
        with _HELD_LOCK:
            _HELD[0] += size - cell[0]
            cell[0] = size
            over = _HELD[0] > self._budget
        if over and size >= MIN_BLOCK_SIZE:
            self._flush()

    def _uncount(self) -> None:
        _release_cell(self._held)

    def _grew(self, blk: BlockBuilder) -> None:
        """After a single record: write the block out when it is full, else count it in the
        process's total each time it grew by _ACCOUNT_STEP."""
        size = blk.size()
        if size >= self._block:
            self._flush()
        elif size - self._held[0] >= _ACCOUNT_STEP:
            self._account()

    # -- hot path ------------------------------------------------------------------------------

    def marker(self, start: int, end: int, flags: int = 0) -> None:
        """A snapshot marker: the items that follow have seqnos in start..end."""
        blk = self._blk
        blk.others.append((2, start, end, flags))  # SNAPSHOT (a literal: no global lookup)
        blk.kinds.append(2)
        self._ns += 1
        self._grew(blk)

    def mutation(self, seqno: int, rev_seqno: int, cas: int, flags: int, expiry: int,
                 datatype: int, key: bytes, value: bytes, xattrs: bytes | None = None) -> None:
        blk = self._blk
        blk.add((3, seqno, rev_seqno, cas, flags, expiry, datatype, key, value, xattrs))
        self._nm += 1
        self._vbytes += len(value)
        self._grew(blk)

    def deletion(self, seqno: int, rev_seqno: int, cas: int, key: bytes, delete_time: int = 0,
                 datatype: int = 0, value: bytes = b"") -> None:
        blk = self._blk
        blk.add((4, seqno, rev_seqno, cas, key, delete_time, datatype, value))  # REC_DELETION
        self._nd += 1
        self._vbytes += len(value)
        self._grew(blk)

    def expiration(self, seqno: int, rev_seqno: int, cas: int, key: bytes, delete_time: int = 0,
                   datatype: int = 0, value: bytes = b"") -> None:
        blk = self._blk
        blk.add((5, seqno, rev_seqno, cas, key, delete_time, datatype, value))  # REC_EXPIRATION
        self._ne += 1
        self._vbytes += len(value)
        self._grew(blk)

    def system_event(self, event: Any) -> None:
        """A DCP system event (a `dcptool.protocol.collections.SystemEvent`, or anything with
        its fields): a scope or collection created or dropped, at its seqno inside the
        current snapshot, in seqno order with the items."""
        if self.version < 3:
            raise ArchiveError(f"format version {self.version} has no system event records")
        blk = self._blk
        blk.others.append((8, event.seqno, event.event, event.manifest_uid, event.scope_id,
                           event.collection_id, event.name or "", event.max_ttl or 0))
        blk.kinds.append(8)  # REC_SYSTEM_EVENT
        self._nx += 1
        self._grew(blk)

    def mutation_events(self, events: Sequence[tuple], lo: int = 0, hi: int | None = None) -> None:
        """Append the DCP client's mutation events `events[lo:hi]` (all of this vbucket):
        `(kind, vbucket, seqno, rev_seqno, cas, flags, expiry, datatype, key, value)`, the
        key bytes, the value bytes or a memoryview. Same records as one `mutation()` call
        per event; each event becomes the block's row as it is (one list extend), the
        counting is done per batch."""
        if hi is None:
            hi = len(events)
        if hi > lo and self._append_run(events, lo, hi, events[lo][0], events[lo][1]) != hi:
            raise ValueError("mutation_events takes the events of one vbucket's mutations only")

    def mutation_run(self, events: Sequence[tuple], lo: int, hi: int | None = None) -> int:
        """Append the run of this vbucket's DCP mutation events that starts at `events[lo]`
        (as `mutation_events`) and return the index where it ends: `hi`, or the first event
        before it that is not a mutation of this vbucket."""
        return self._append_run(events, lo, len(events) if hi is None else hi, _DCP_MUTATION,
                                self.vbucket)

    def _append_run(self, events: Sequence[tuple], lo: int, hi: int, kind: int, vb: int) -> int:
        if hi > lo and len(events[lo]) != ROW:
            raise ValueError(f"a mutation event has {ROW} fields, not {len(events[lo])}")
        if hi > lo and type(events[lo][9]) is not bytes:
            # views of a receive buffer: copied, as the block keeps values until it is encoded
            n = 0
            while lo + n < hi and events[lo + n][0] == kind and events[lo + n][1] == vb:
                n += 1
            copied = [e[:9] + (bytes(e[9]),) for e in events[lo:lo + n]]
            return lo + self._append_run(copied, 0, n, kind, vb)
        blk = self._blk
        # the run: this vbucket's mutations from `lo`; each event's fields are the block's
        # row as they are (BlockBuilder.rows: one extend each)
        rows = blk.rows
        base = len(rows)
        rext = rows.extend
        stop = max(lo, hi)
        for i in range(lo, hi):
            e = events[i]
            if e[1] != vb or e[0] != kind:
                stop = i
                break
            rext(e)
        n = stop - lo
        if n:
            vbytes = sum(map(len, rows[base + 9::ROW]))  # the run's values
            if blk.size() + vbytes < self._block:
                # the whole run fits in the block (the usual case: one check per run)
                blk.kinds += _MUTATIONS[:n] if n <= 256 else b"\x03" * n
                blk.vbytes += vbytes
                self._nm += n
                self._vbytes += vbytes
            else:
                # the block fills up inside the run: item by item, flushing at the limit
                del rows[base:]
                self._fill(events, lo, stop)
        self._account()
        return stop

    def _fill(self, events: Sequence[tuple], lo: int, hi: int) -> None:
        """Append the mutation events `events[lo:hi]` (of this vbucket), writing the block
        out each time it is full."""
        blk = self._blk
        vbytes = 0
        done = lo
        while done < hi:
            # room: what the block takes before it is full, the items counted as in size()
            room = self._block - blk.size() - (1 - done) * ITEM_COST
            rext = blk.rows.extend
            bv = 0
            i = done
            for i in range(done, hi):
                e = events[i]
                rext(e)
                bv += len(e[9])
                if bv + i * ITEM_COST >= room:
                    break
            i += 1
            blk.kinds += _MUTATIONS[:i - done] if i - done <= 256 else b"\x03" * (i - done)
            blk.vbytes += bv
            vbytes += bv
            self._nm += i - done
            done = i
            if blk.size() >= self._block:
                self._flush()
                blk = self._blk
        self._vbytes += vbytes

    def write(self, records: Sequence[tuple]) -> None:
        """Append a list of plain record tuples (snapshot markers and items, in the format's
        layout, first element the record type): one pack and one append per record, with
        the counting done in bulk. Faster than one method call per record."""
        if not isinstance(records, (list, tuple)):
            records = list(records)
        types = Counter(map(itemgetter(0), records))
        bad = set(types) - {SNAPSHOT, REC_MUTATION, REC_DELETION, REC_EXPIRATION,
                            REC_SYSTEM_EVENT}
        if bad or (types[REC_SYSTEM_EVENT] and self.version < 3):
            raise ValueError(f"write() takes snapshot markers, items and (format 3) system "
                             f"events, not record types {sorted(bad, key=repr) or [8]}")
        block = self._block
        blk = self._blk
        add = blk.add
        last = 0
        i = 0
        for i, rec in enumerate(records, 1):
            add(rec)
            if blk.size() >= block:
                self._nb += i - last  # packed, not yet classified (keeps frame counts right)
                last = i
                self._flush()
                blk = self._blk
                add = blk.add
        self._account()
        self._nb -= last  # every record of the batch is counted by type below
        self._nm += types[REC_MUTATION]
        self._nd += types[REC_DELETION]
        self._ne += types[REC_EXPIRATION]
        self._ns += types[SNAPSHOT]
        self._nx += types[REC_SYSTEM_EVENT]
        if len(types) == 1 and REC_MUTATION in types:
            self._vbytes += sum(map(len, map(itemgetter(8), records)))
        else:
            self._vbytes += sum(len(r[8]) if r[0] == REC_MUTATION else len(r[7])
                                for r in records
                                if r[0] != SNAPSHOT and r[0] != REC_SYSTEM_EVENT)

    def add_packed(self, data: bytes, *, mutations: int = 0, deletions: int = 0,
                   expirations: int = 0, snapshots: int = 0, value_bytes: int = 0) -> None:
        """Append records the caller already packed with msgpack (whole snapshot-marker and
        item records only, in the format's layout). The counts are taken from the records
        (the keyword arguments are accepted for compatibility and checked)."""
        unpacker = msgpack.Unpacker(use_list=False, raw=False)
        unpacker.feed(data)
        records = list(unpacker)
        before = (self._nm, self._nd, self._ne, self._ns, self._vbytes)
        self.write(records)
        got = (self._nm - before[0], self._nd - before[1], self._ne - before[2],
               self._ns - before[3], self._vbytes - before[4])
        if any((mutations, deletions, expirations, snapshots, value_bytes)) and \
                got != (mutations, deletions, expirations, snapshots, value_bytes):
            raise ValueError(f"add_packed: the records hold {got} (mutations, deletions, "
                             "expirations, snapshots, value bytes), not the counts given")

    # -- frames and segments ----------------------------------------------------------------

    def _records(self) -> int:
        return self._nm + self._nd + self._ne + self._ns + self._no + self._nx + self._nb

    def _flush(self) -> None:
        if self._roll:
            self._roll = False
            self._close_segment(self._sync)
            self._open_segment(self._segment + 1)
        blk = self._blk
        if self._held[0]:
            _release_cell(self._held)
        if not len(blk):
            return
        if self.version >= 2:
            frame = compress_sections(self._cctx, blk.sections())
        else:  # version 1: msgpack records one after the other
            pack = self._pack
            frame = self._cctx.compress(b"".join(
                [pack(r) for r in decode_block(b"".join(blk.sections()))]))
        self._blk = BlockBuilder()
        if self._sealer is not None:
            frame = self._sealer.seal(frame, self._fsize)
        fault_point("frame", fd=self._out.fd, data=frame)  # DCPTOOL_FAULT: kill-mid-file, enospc
        self._out.write(frame)
        self._sha.update(frame)
        self._fsize += len(frame)
        total = self._records()
        self._seg_records += total - self._flushed
        self._flushed = total
        if self._fsize >= self._segment_bytes:
            self._roll = True  # the next frame goes to a new segment

    def _open_segment(self, segment: int) -> None:
        """Create the next data file; its header record goes first in the buffer."""
        self._segment = segment
        path = self.dir / data_file_name(self.vbucket, segment)
        self._sealer = crypto.frame_sealer(self.key, sealed_name(path))  # None: plain
        self._out = storage.write_new(path, FILE_MODE, hold=self._packer is not None)
        self._fsize = 0
        self._sha = hashlib.sha256()
        self._seg_records = 0
        self._blk.insert_first((HEADER, FORMAT_NAME, self.version, self.vbucket,
                                self.backup_id, segment))
        self._no += 1

    def _close_segment(self, sync: bool = True, last: bool = False) -> None:
        """Finish the current segment (its frames must already be flushed); the `last` one
        goes into the packer's pack when it is still small enough to be held."""
        if self._out is None:
            return
        out, self._out = self._out, None
        entry = {"name": data_file_name(self.vbucket, self._segment),
                 "size": self._fsize, "sha256": self._sha.hexdigest(),
                 "records": self._seg_records}
        data = out.take() if last and self._packer is not None else None
        if data is not None:
            self._packer.add(entry, data)
        else:
            out.close(sync)
        self._files.append(entry)

    def _stream_record(self, pos: ArchivePosition, failover_log: list[list[int]]) -> None:
        self._blk.add((STREAM, pos.uuid, pos.seqno, pos.snap_start, pos.snap_end,
                       tuple(tuple(e) for e in failover_log)))
        self._no += 1

    def _adopt(self, scan: Any, files: list[tuple[int, str]]) -> None:
        """Take a scan's valid prefix as this writer's state (truncating the files to it)."""
        self._files = truncate_to_cut(self.dir, scan, level=self.level, key=self.key)
        c = scan.counts
        self._nm, self._nd, self._ne, self._ns = (c["mutations"], c["deletions"],
                                                  c["expirations"], c["snapshots"])
        self._nx = c.get("system_events", 0)
        self._no = c["records"] - self._nm - self._nd - self._ne - self._ns - self._nx
        self._vbytes = scan.value_bytes
        self._flushed = c["records"]
        self._roll = False
        self.rollbacks = list(scan.rollbacks)
        self.position = scan.position
        self._segment = scan.files[scan.cut.seg_pos][0]

    def _unlink(self, path: Any) -> None:
        storage.unlink(path)

    def _unlink_all(self, files: list[tuple[int, str]]) -> None:
        for _seg, name in files:
            self._unlink(self.dir / name)
        if files:
            fsync_dir(self.dir)

    def _cut_back(self, seqno: int) -> None:
        """Make the data end on the boundary at `seqno` (dropping anything after it), or just
        after the stream start when `seqno` is below it; continue in a new segment."""
        if self._nm + self._nd + self._ne + self._ns + self._nx == 0:
            return  # nothing but headers and stream/rollback records so far
        self._flush()
        self._close_segment()
        files = vbucket_files(self.dir).get(self.vbucket, [])
        try:
            scan = scan_vbucket(self.dir, self.backup_id, self.vbucket, files, rollback_to=seqno,
                                key=self.key)
        except ValueError as exc:
            self._open_segment(self._segment + 1)
            raise ArchiveError(str(exc), hint="roll back to the end of a snapshot") from None
        if scan.problem:
            raise CorruptFileError(self.dir, f"vbucket {self.vbucket}: {scan.problem}")
        self._adopt(scan, files)
        self._open_segment(self._segment + 1)

    # -- boundaries ------------------------------------------------------------------------------

    def rollback(self, seqno: int, vbucket_uuid: int) -> None:
        """Record that the vbucket rolled back to `seqno` (a snapshot end the chain holds).

        Records this backup already wrote above `seqno` are removed first (this backup is not
        committed, so its files may still change), so in every archive a rollback record is
        preceded only by records at or below its seqno. Earlier backups are never touched:
        their records above `seqno` are dead for restores from here on.
        """
        self._check_open()
        self._cut_back(seqno)
        self._blk.add((ROLLBACK, seqno, vbucket_uuid))
        self._no += 1
        self.rollbacks.append({"seqno": seqno, "vbucket_uuid": vbucket_uuid})
        self.position = ArchivePosition.at(vbucket_uuid, seqno)

    def stream(self, position: Any, failover_log: Iterable[Any] | None = None) -> None:
        """Record that the stream (re)started at `position` (after a rollback or a reconnect),
        with the failover log the node returned. Data above the position is dropped first.

        `position` must be where the data stands when the stream opens: every item written
        after this call must have a higher seqno (verify reports a stream record followed by
        lower seqnos)."""
        self._check_open()
        pos = ArchivePosition.coerce(position)
        self._cut_back(pos.seqno)
        if failover_log is not None:
            self.failover_log = coerce_failover_log(failover_log)
        self._stream_record(pos, self.failover_log)
        self.position = pos

    # -- finishing ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ArchiveError(f"vbucket {self.vbucket} writer of backup {self.backup_id} "
                               "is closed")

    def counts(self) -> dict[str, int]:
        out = {"mutations": self._nm, "deletions": self._nd, "expirations": self._ne,
               "snapshots": self._ns, "rollbacks": len(self.rollbacks),
               "records": self._records()}
        if self.version >= 3:
            out["system_events"] = self._nx
        return out

    def close(self, end: Any) -> dict[str, Any]:
        """Finish the vbucket at `end` (a snapshot boundary): write the end record, fsync the
        files, write the done file atomically, and return the summary dict. (With
        sync=False, no fsyncs: the caller syncs the filesystem before it reports the
        vbucket done.)"""
        self._check_open()
        end_pos = ArchivePosition.coerce(end)
        self._blk.add((END, end_pos.uuid, end_pos.seqno, end_pos.snap_start,
                       end_pos.snap_end))
        self._no += 1
        self._flush()
        self._close_segment(self._sync, last=True)
        self.closed = True
        self._uncount()
        files = self._files
        summary = {
            "summary_version": SUMMARY_VERSION,
            "vbucket": self.vbucket,
            "backup": self.backup_id,
            "start": self.start.to_json(),
            "end": end_pos.to_json(),
            "failover_log": self.failover_log,
            "counts": self.counts(),
            "bytes": {"values": self._vbytes, "files": sum(f["size"] for f in files)},
            "files": files,
            "rollbacks": self.rollbacks,
        }
        if self._packer is not None:
            self._packer.done(summary)
        else:
            atomic_write_json(self.dir / done_file_name(self.vbucket), summary, key=self.key,
                              durable=self._sync)
        self.summary = summary
        self.position = end_pos
        return summary

    def abort(self) -> None:
        """Stop without finishing: what was flushed stays as a partial vbucket."""
        if self.closed:
            return
        self.closed = True
        self._uncount()
        if self._out is not None:
            try:
                self._flush()
            except (OSError, ArchiveError):
                pass
            if not storage.store_of(self.dir).partial_visible:
                # an object is complete or absent: a segment cut short is not uploaded
                # (its vbucket restarts after the last segment that was)
                out, self._out = self._out, None
                out.abort()
            else:
                self._close_segment(sync=False)

    def __enter__(self) -> "VBucketWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self.closed:
            self.abort()
