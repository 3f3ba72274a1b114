"""`dcptool backup --continuous`: checkpoint a bucket into its archive every few seconds.

It runs on Spark as the rest of the pipeline: a Structured Streaming query on the run's
SparkSession (local[*] by default, any --master) over the project's own DCP source,

    spark.readStream.format("dcptool-stream").option("positions", "true")
         .option("startOffset", <the archive's committed end positions>) ...
         .writeStream.foreachBatch(ContinuousBackup.batch)
         .trigger(processingTime=<--checkpoint>).start()

(`CheckpointQuery`). In positions mode a micro-batch streams no items: it is the offset
range the source planned (per vbucket: uuid, start seqno, end seqno), the node's high
seqnos at the trigger. The batch function turns it into one checkpoint: one incremental
backup (`run_backup`) with the batch backup's writers, done files, rollback handling and
commit (the manifest last), each vbucket streaming from where the ARCHIVE's newest
committed backup ended (not from Spark's start offset) up to the batch's end seqno. A
checkpoint is therefore a small committed incremental backup.

The archive is the only source of truth. The query's checkpointLocation is a private
temporary directory of the run, removed when it ends (one a killed run left is removed
by the next start, unread), and the query's initial offset is the archive's committed
end positions: a restart starts where the archive is, never where an old Spark
checkpoint was, and Spark's offsets can never disagree with the archive for longer than
a batch. A batch returns to Spark only once its range is committed (it retries until
then, or the run stops), so

- a change the node acknowledged before a trigger is durable in the archive once that
  micro-batch committed: the RPO is at most one interval plus a checkpoint's run;
- a kill -9 leaves at most one partial backup, which the next checkpoint (of the next
  start) resumes as any backup resumes a partial one: nothing is lost, nothing is
  streamed into the archive twice, since where each vbucket starts is the archive's
  committed end position and nothing else;
- when the node does not move Spark runs no micro-batch, and nothing is written.

The query starts in a thread of its own (Spark starts the source's Python planner and
runner processes: seconds on a small machine); until it ran its first micro-batch the
driver checkpoints at each interval as a batch does, so the first checkpoint does not wait
for it. The driver thread waits on the query and does what has no micro-batch,
serialised with the batch function by a lock: every interval without a batch it looks at
the node (an idle checkpoint: the status file, the watermark renewed every
WATERMARK_RENEW, rotation on age, a retry after a failure); a node that moved is left to
the next micro-batch (should none come for MOVED_TICKS looks, the driver checkpoints it
itself). On Ctrl-C or SIGTERM (or --stop-after) it lets a running batch finish, lets no
other begin, runs the last checkpoint itself (a trigger cannot be asked for early) with
the same run_backup, stops the query and exits 0. A query that dies (it should not: see
below) is started again from the archive.

Rotation: the checkpoints since the last rotation (the "segment") are folded into one
ordinary backup with the merge job (`run_merge`, crash safe: a merge killed midway is
finished or discarded by the next one) once the segment is `rotate` seconds old or
`rotate_size` bytes large. So the archive gains about one backup per rotation, however
short the interval.

Failures (the node restarting, a dropped connection, the archive lock held by another
writer, an object store that times out) are one line each through `notice`; the next
attempt waits with backoff (1 s doubling to 30 s, never longer than the interval asks
otherwise), the lag grows, nothing is lost. The query never sees them: the source
answers a node it cannot ask with the start offset (no batch), the batch function
retries inside the batch, the driver's idle look retries when no batch comes. Usage
errors (another bucket, a wrong data selection) stop the run.

While it runs, ARCHIVE/continuous.json (see docs/archive-format.md) says so: the
process, the last checkpoint, the lag. `dcptool info` reads it (`continuous_status`).
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from dcptool.archive import Archive, storage
from dcptool.archive.format import CONTINUOUS_JSON, iso_time, utc_now
from dcptool.archive.info import dir_size
from dcptool.errors import DcptoolError, UsageError
from dcptool.procs import pid_alive

#: the status file a running continuous backup rewrites at every checkpoint
STATUS_FILE = CONTINUOUS_JSON
DEFAULT_CHECKPOINT = 10.0
DEFAULT_ROTATE = 3600.0
DEFAULT_ROTATE_SIZE = 1 << 30
#: an idle run renews its watermark at least this often (a checkpoint with data renews it)
WATERMARK_RENEW = 60.0
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
#: how often (seconds, at most) the driver thread looks at the query and the stop request
TICK = 1.0
#: idle looks in a row that found the node moved and no micro-batch taking it before the
#: driver checkpoints itself
MOVED_TICKS = 3


@dataclass
class ContinuousOptions:
    """What `backup --continuous` does besides a backup's own options (`backup`: keyword
    arguments of run_backup: level, partitions, vbuckets, include_data, exclude_data,
    watermark, watermark_ttl, passphrase)."""

    checkpoint: float = DEFAULT_CHECKPOINT
    rotate: float = DEFAULT_ROTATE
    rotate_size: int = DEFAULT_ROTATE_SIZE
    #: set it to stop: the run commits a last checkpoint and returns
    stop: threading.Event = field(default_factory=threading.Event)
    #: one line for the user (a retry, a rotation)
    notice: Callable[[str], None] | None = None
    #: the record of each checkpoint (what --json prints)
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None
    #: the record of each failed attempt (error, attempt, retry_in, lag)
    on_retry: Callable[[dict[str, Any]], None] | None = None
    #: stop after this many checkpoints (None: until `stop`)
    max_checkpoints: int | None = None
    #: stop (with a last checkpoint) this many seconds after the start (None: never)
    stop_after: float | None = None
    backup: dict[str, Any] = field(default_factory=dict)


def status_path(archive_path: Any) -> Any:
    return storage.location(archive_path) / STATUS_FILE


def read_status(archive_path: Any) -> dict[str, Any] | None:
    try:
        data = storage.read_bytes(status_path(archive_path))
    except (OSError, DcptoolError):  # none, or the store cannot be read now
        return None
    try:
        st = json.loads(data)
    except ValueError:
        return None
    return st if isinstance(st, dict) else None


def continuous_status(archive_path: Any, now: float | None = None) -> dict[str, Any] | None:
    """What `dcptool info` shows of a continuous backup of the archive: None when none ever
    ran; else {running, pid, host, since, last_checkpoint, last_backup, lag_seconds,
    items_behind, failing (the last attempt's error while checkpoints fail, else None),
    checkpoint_seconds}. Running: the status says so, it was rewritten
    within three intervals (a minute at least) and, on this host, its process lives."""
    st = read_status(archive_path)
    if st is None:
        return None
    now = time.time() if now is None else now
    interval = float(st.get("checkpoint_seconds") or DEFAULT_CHECKPOINT)
    fresh = now - float(st.get("updated_epoch") or 0) <= max(60.0, 3 * interval + 30)
    alive = (pid_alive(int(st.get("pid") or 0)) if st.get("host") == socket.gethostname()
             else True)
    running = st.get("state") == "running" and alive and (fresh or st.get("host") ==
                                                          socket.gethostname())
    out = {"running": running, "pid": st.get("pid"), "host": st.get("host"),
           "since": st.get("since"), "last_checkpoint": st.get("last_checkpoint"),
           "last_backup": st.get("last_backup"), "lag_seconds": _lag_now(st, running, now),
           "items_behind": st.get("items_behind"), "failing": st.get("failing"),
           "checkpoint_seconds": interval}
    if isinstance(st.get("buckets"), dict):  # a cluster archive's: each bucket's
        out["buckets"] = {
            name: {"last_checkpoint": b.get("last_checkpoint"),
                   "last_backup": b.get("last_backup"),
                   "lag_seconds": _lag_now(b, running, now),
                   "items_behind": b.get("items_behind"), "failing": b.get("failing")}
            for name, b in sorted(st["buckets"].items()) if isinstance(b, dict)}
        out["dropped"] = st.get("dropped") or []
    return out


def _lag_now(st: dict[str, Any], running: bool, now: float) -> float | None:
    """The lag a status records, grown since: items were behind at the last checkpoint (or
    checkpoints fail), so they wait since it began at least."""
    lag = st.get("lag_seconds")
    if running and st.get("last_checkpoint_epoch") and (st.get("items_behind")
                                                        or st.get("failing")):
        lag = max(float(lag or 0), now - float(st["last_checkpoint_epoch"]))
    return None if lag is None else round(float(lag), 3)


def check_alone(archive_path: Any) -> None:
    """Refuse (ArchiveLockedError) to run beside another continuous backup of the archive
    (they would take turns at the lock, each checkpoint of one a wasted wait for the
    other)."""
    from dcptool.archive.errors import ArchiveLockedError

    where = storage.location(archive_path)
    try:
        if not (where / "archive.json").exists():
            return
    except (OSError, DcptoolError):
        return  # the first checkpoint says what is wrong with the store
    st = continuous_status(where)
    if st is not None and st["running"] and not (
            st["pid"] == os.getpid() and st["host"] == socket.gethostname()):
        raise ArchiveLockedError(
            f"a continuous backup of {where} is running already (pid {st['pid']} on "
            f"{st['host']}, last checkpoint {st['last_checkpoint'] or 'none yet'})",
            hint="stop it first (Ctrl-C or SIGTERM): 'dcptool info' shows it")


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, UsageError):
        return False
    return isinstance(exc, (DcptoolError, OSError, ConnectionError, TimeoutError, EOFError))


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class ItemRate:
    """Items per second from one checkpoint to the next: call it with the items so far and
    the time at each checkpoint (None the first time)."""

    def __init__(self) -> None:
        self._prev: tuple[int, float] | None = None

    def __call__(self, items: int, now: float) -> float | None:
        prev, self._prev = self._prev, (items, now)
        if prev is None or now <= prev[1]:
            return None
        return round((items - prev[0]) / (now - prev[1]), 1)


class ContinuousBackup:
    """A continuous backup of one bucket: `run()` drives the query and returns the run's
    totals (see `summary`); `checkpoint()` is one checkpoint (the cluster loop calls it
    per bucket)."""

    def __init__(self, opts: Any, archive_at: Any, o: ContinuousOptions, spark: Any = None,
                 master: str | None = None):
        self.opts, self.o = opts, o
        self.where = (archive_at.path if isinstance(archive_at, Archive)
                      else storage.location(archive_at))
        self.archive_at = archive_at
        self.spark, self.master = spark, master
        self.started = time.time()
        self.started_iso = iso_time(utc_now())
        self.checkpoints = 0
        self.backups = 0
        self.idle = 0
        self.failures = 0
        self.rotations: list[dict[str, Any]] = []
        self.items = 0
        self.files = 0
        self.last: dict[str, Any] | None = None
        self.last_ok: float | None = None  # epoch when the last successful checkpoint began
        #: epoch since which the checkpoints, without a failure, found the node unchanged
        #: or committed what changed (when the last one with data began, or the first idle
        #: one); None after a failure or before the first checkpoint
        self.unchanged_since: float | None = None
        self.idle_tail = False
        #: (the archive's newest backup, epoch): the last checkpoint, begun then, found the
        #: node as that backup left it (None when the last checkpoint wrote or failed)
        self.unchanged_through: tuple[str, float] | None = None
        self.last_watermark = 0.0
        self.anchor: str | None = None
        self.segment: list[str] = []
        self.segment_bytes = 0
        self.segment_began: float | None = None
        self.rate = ItemRate()
        self._opened: Archive | None = None
        self.last_backup: str | None = None
        self.failing: str | None = None
        #: rotate within checkpoint() (False: the caller calls rotate() when it suits it)
        self.rotate_inline = True

    # -- the archive -------------------------------------------------------------------

    def _archive(self) -> Archive | None:
        """The archive, opened once it exists (an encrypted one is unlocked once)."""
        if self._opened is None:
            if isinstance(self.archive_at, Archive):
                self._opened = self.archive_at.at(self.where.absolute())
            elif (self.where / "archive.json").exists():
                self._opened = Archive.open(self.where.absolute(),
                                            passphrase=self.o.backup.get("passphrase"))
        return self._opened

    def settle_segment(self) -> None:
        """The checkpoints since the last rotation, as the status file of an earlier run
        left them: the backups of the newest chain after its anchor."""
        a = self._archive()
        if a is None:
            return
        # a rotation killed after its merged backup was published: its originals go now
        from dcptool.archive.merging import finish_interrupted_merges

        from dcptool.archive.errors import ArchiveLockedError

        try:
            with a.lock("merge"):
                done = finish_interrupted_merges(a)
        except ArchiveLockedError as exc:  # the next rotation's merge finishes it
            self.notice(f"{one_line(exc)}; going on")
            done = []
        if done:
            self.notice(f"finished an interrupted rotation: removed {', '.join(done)}")
        st = read_status(self.where) or {}
        self.last_backup = st.get("last_backup")
        chain = a.chain_ids() if a.latest_id() else []
        anchor = st.get("anchor")
        if st.get("anchor_set") and (anchor is None or anchor in chain):
            self.anchor = anchor
            self.segment = chain[chain.index(anchor) + 1:] if anchor else list(chain)
        else:  # the backups made before continuous backup began are left as they are
            self.anchor = chain[-1] if chain else None
            self.segment = []
        self.segment_bytes = sum(dir_size(a.backup_dir(b)) for b in self.segment)
        self.segment_began = time.time() if self.segment else None

    # -- the status file ---------------------------------------------------------------

    def write_status(self, state: str, lag: dict[str, Any] | None = None) -> None:
        """Rewrite ARCHIVE/continuous.json; silently not when the store cannot be written
        now (the failed checkpoint said why already): it is a courtesy for `info`."""
        if self.archive_or_none() is None:
            return
        last = self.last or {}
        if last.get("backup_id"):
            self.last_backup = last["backup_id"]
        doc = {
            "state": state, "pid": os.getpid(), "host": socket.gethostname(),
            "since": self.started_iso, "updated": iso_time(utc_now()),
            "updated_epoch": time.time(), "checkpoint_seconds": self.o.checkpoint,
            "rotate_seconds": self.o.rotate, "rotate_bytes": self.o.rotate_size,
            "last_checkpoint": last.get("time"),
            "last_checkpoint_epoch": self.last_ok,
            "last_backup": self.last_backup,
            "lag_seconds": (lag or {}).get("seconds"), "items_behind": (lag or {}).get("items"),
            "anchor": self.anchor, "anchor_set": True, "segment": list(self.segment),
            "failing": self.failing,
            # the archive's window reaches this far while the node does not change (a
            # point-in-time read before it gets the newest backup's state)
            "unchanged_backup": self.unchanged_through[0] if self.unchanged_through else None,
            "unchanged_through": (iso_time(datetime.fromtimestamp(self.unchanged_through[1],
                                                                  timezone.utc))
                                  if self.unchanged_through else None),
        }
        try:
            storage.atomic_write_bytes(status_path(self.where), json.dumps(doc).encode(),
                                       durable=False, mode=0o600)
        except (OSError, DcptoolError):
            pass

    def archive_or_none(self) -> Archive | None:
        try:
            return self._archive()
        except (OSError, DcptoolError):
            return None

    def notice(self, msg: str) -> None:
        if self.o.notice is not None:
            self.o.notice(msg)

    # -- one checkpoint ----------------------------------------------------------------

    def _node(self) -> tuple[dict[int, int], dict[int, Any], Any]:
        from .nodeinfo import cluster_state

        _count, seqnos, logs, members = cluster_state(self.opts, self.o.backup.get("vbuckets"))
        return seqnos, logs, members

    def _behind(self, a: Archive | None, seqnos: dict[int, int]) -> int:
        ends = a.end_positions() if a is not None and a.latest_id() else {}
        return sum(max(0, int(s) - int(ends[vb].seqno if vb in ends else 0))
                   for vb, s in seqnos.items())

    def checkpoint(self, last: bool = False, *, end_seqnos: dict[int, int] | None = None,
                   micro_batch: int | None = None, idle_only: bool = False,
                   idle_record: bool = True) -> dict[str, Any] | None:
        """One checkpoint: a committed incremental backup of what is new (or nothing, when
        nothing is), the rotation when due, the status file; its record. The `last` one of
        a run commits a backup even when nothing is new, if the checkpoints since the
        newest backup found the node unchanged: an empty incremental whose covers_from
        records that stretch (else the archive's window would end at the newest backup).

        `end_seqnos`: a micro-batch's end offset, {vb: seqno}: each vbucket streams from
        the archive's committed end no further (`micro_batch`: the batch's id, in the
        record). `idle_only`: when the node has something new, write nothing and return
        None (a micro-batch takes it); `idle_record=False`: None for an idle checkpoint."""
        from .backup import bounded_seqnos, run_backup, unchanged_vbuckets

        t0 = time.time()
        m0 = time.monotonic()
        a = self._archive()
        seqnos, logs, members = self._node()
        bounds = self._bounds(a, end_seqnos) if end_seqnos else None
        if bounds:
            seqnos = bounded_seqnos(seqnos, bounds)
        latest = a.latest_id() if a is not None else None
        idle = (a is not None and latest is not None and not a.partial_ids()
                and unchanged_vbuckets(a, latest, seqnos, logs) >= set(seqnos))
        if idle and last and self.unchanged_since is not None and self.idle_tail:
            idle = False  # commit the idle stretch (an empty incremental backup)
        if (idle_only and not idle) or (idle and not idle_record):
            return None
        rec: dict[str, Any] = {"bucket": self.opts.bucket, "backup_id": None, "type": None,
                               "items": 0, "rollbacks": 0, "files": 0,
                               "micro_batch": micro_batch}
        backup_kw = dict(self.o.backup)
        if bounds:
            backup_kw["end_seqnos"] = bounds
        # for point-in-time reads: how far apart checkpoints are, and since when the
        # checkpoints before this one, without a failure, found the node unchanged (they
        # wrote no backup) or committed what changed: an idle stretch is no gap
        backup_kw["extra"] = {"checkpoint_interval": self.o.checkpoint}
        if self.unchanged_since is not None:
            backup_kw["extra"]["covers_from"] = iso_time(
                datetime.fromtimestamp(self.unchanged_since, timezone.utc))
        if not idle:
            if a is not None:  # the passphrase creates a new archive; this one is open
                backup_kw.pop("passphrase", None)
            result = run_backup(self.opts, a if a is not None else self.archive_at,
                                spark=self.spark, master=self.master, notice=self.notice,
                                on_plan=self._on_plan, **backup_kw)
            self.backups += 1
            self.last_watermark = time.monotonic() if result.watermark else self.last_watermark
            a = self._archive()
            files = len(storage.listdir(a.backup_dir(result.backup_id)))
            self.files += files
            self.items += result.items
            rec.update(backup_id=result.backup_id, type=result.type, items=result.items,
                       rollbacks=result.rollbacks, files=files, resumed=result.resumed)
            self.segment.append(result.backup_id)
            self.segment_bytes += result.size_on_disk
            if self.segment_began is None:
                self.segment_began = t0
        else:
            self.idle += 1
            if (self.o.backup.get("watermark", True)
                    and time.monotonic() - self.last_watermark >= WATERMARK_RENEW):
                self._renew_watermark(a, members)
        # a cluster's loop rotates after its run record named this checkpoint (rotate())
        rec["rotated"] = self._maybe_rotate(a) if self.rotate_inline else None
        # how far behind the node the archive is now
        try:
            now_seqnos, _logs, _m = self._node()
            behind = self._behind(self._archive(), now_seqnos)
        except Exception:  # noqa: BLE001 - the checkpoint committed; the lag is a figure
            behind = None
        self.checkpoints += 1
        self.last_ok = t0
        if not idle or self.unchanged_since is None:
            self.unchanged_since = t0
        # whether checkpoints found nothing new since the newest backup was committed
        self.idle_tail = idle
        self.unchanged_through = (latest, t0) if idle and latest else None
        done = time.time()
        rate = self.rate(self.items, done)
        lag = {"seconds": round(done - t0, 3) if behind else 0.0, "items": behind}
        rec.update({
            "checkpoint": self.checkpoints, "time": iso_time(utc_now()),
            "seconds": round(time.monotonic() - m0, 3),
            "lag": {self.opts.bucket: lag}, "items_per_second": rate,
            "segment_backups": len(self.segment), "segment_bytes": self.segment_bytes,
            "totals": self.totals(),
        })
        self.last = rec
        self.write_status("running", lag)
        return rec

    @staticmethod
    def _bounds(a: Archive | None, ends: dict[int, int]) -> dict[int, int]:
        """A micro-batch's end seqnos, none below where the archive's chain ended on the
        same history (the archive is the truth: what it holds is never asked for again)."""
        have = a.end_positions() if a is not None and a.latest_id() else {}
        return {vb: max(int(e), int(have[vb].seqno)) if vb in have else int(e)
                for vb, e in ends.items()}

    def _on_plan(self, plan: dict[str, Any]) -> None:
        if plan["resumed"]:
            self.notice(f"resuming partial backup {plan['backup_id']}: {plan['kept']} "
                        f"vbuckets kept, {plan['to_stream']} to stream")

    def _renew_watermark(self, a: Archive | None, members: Any) -> None:
        from .backup import register_archive_watermark, register_on_cluster

        if a is None or a.latest_id() is None:
            return
        ttl = self.o.backup.get("watermark_ttl")
        kw = {} if ttl is None else {"ttl": ttl}
        if members is None:
            register_archive_watermark(self.opts, a, notice=self.notice, **kw)
        else:
            from .backup import DEFAULT_WATERMARK_TTL

            register_on_cluster(self.opts, a, members, ttl or DEFAULT_WATERMARK_TTL,
                                 self.notice)
        self.last_watermark = time.monotonic()

    def rotate(self) -> dict[str, Any] | None:
        """The rotation, when due (see _maybe_rotate), outside a checkpoint."""
        return self._maybe_rotate(self._archive())

    def failed(self, exc: BaseException) -> dict[str, Any]:
        """A failed checkpoint attempt recorded (the status file says so); its lag: what
        is behind is unknown now, it waits since the last checkpoint began."""
        self.failures += 1
        lag = {"seconds": round(time.time() - (self.last_ok or self.started), 3),
               "items": None}
        self.failing = one_line(exc)
        self.unchanged_since = None
        self.write_status("running", lag)
        return lag

    def _maybe_rotate(self, a: Archive | None) -> dict[str, Any] | None:
        """Fold the segment into one backup when it is old or large enough."""
        from .merge import run_merge

        if a is None or len(self.segment) < 2 or self.segment_began is None:
            return None
        age = time.time() - self.segment_began
        if age < self.o.rotate and self.segment_bytes < self.o.rotate_size:
            return None
        chain = a.chain_ids()
        first = self.segment[0]
        if first not in chain:  # the chain changed under us (a prune, a merge): start anew
            self._settle_after_rotation(chain[-1] if chain else None)
            return None
        res = run_merge(a.path, first=first, last=chain[-1], spark=self.spark, history=True,
                        master=self.master, partitions=self.o.backup.get("partitions"))
        out = {"merged_id": res.merged_id, "type": res.type, "replaced": len(res.replaced),
               "size": res.size_after, "age_seconds": round(age, 1)}
        self.rotations.append(out)
        self.notice(f"rotated: {len(res.replaced)} checkpoints merged into backup "
                    f"{res.merged_id} ({res.type})")
        self._settle_after_rotation(res.merged_id)
        return out

    def _settle_after_rotation(self, anchor: str | None) -> None:
        self.anchor = anchor
        self.segment = []
        self.segment_bytes = 0
        self.segment_began = None
        self.write_status("running")

    # -- the loop ----------------------------------------------------------------------

    def totals(self) -> dict[str, Any]:
        hours = max(time.time() - self.started, 1e-9) / 3600
        return {"checkpoints": self.checkpoints, "backups": self.backups, "idle": self.idle,
                "failures": self.failures, "rotations": len(self.rotations),
                "items": self.items, "files": self.files,
                "files_per_hour": round(self.files / hours, 1),
                "backups_per_hour": round(self.backups / hours, 1),
                "seconds": round(time.time() - self.started, 3)}

    # -- the run: a Structured Streaming query whose micro-batches are the checkpoints --

    def run(self) -> dict[str, Any]:
        o = self.o
        check_alone(self.where)
        if self.spark is None:
            from .runtime import get_context

            self.spark = get_context(self.master)
        self.settle_segment()
        self._lock = threading.Lock()
        self._closing = False
        self._fatal: BaseException | None = None
        self._backoff = 0.0
        self._streak = 0
        # the driver's next checkpoint unless a micro-batch checkpoints first: at once (the
        # query takes seconds to start)
        self._due = time.monotonic()
        self._moved_ticks = 0
        self.write_status("running")
        end = None if o.stop_after is None else time.monotonic() + o.stop_after
        self.stream = CheckpointQuery(self)
        try:
            self.stream.start()  # in a thread of its own
            while True:
                if self._fatal is not None:
                    raise self._fatal
                if o.max_checkpoints is not None and self.checkpoints >= o.max_checkpoints:
                    self._close()
                    break
                now = time.monotonic()
                if o.stop.is_set() or (end is not None and now >= end):
                    self._close()
                    self._last_checkpoint()
                    break
                self.stream.check()  # a query that died is started again from the archive
                if now >= self._due:
                    self._tick()
                    continue
                wake = self._due if end is None else min(self._due, end)
                o.stop.wait(min(max(0.0, wake - now), TICK))
        except BaseException:
            self._closing = True
            self.write_status("stopped")
            raise
        finally:
            self.stream.stop()
        self.write_status("stopped", (self.last or {}).get("lag", {}).get(self.opts.bucket))
        return self.summary()

    def _tick(self) -> None:
        """The driver's checkpoint when no micro-batch ran for an interval. Until the query
        ran its first micro-batch (Spark starts the source's Python processes: seconds on a
        small machine) it is a checkpoint as a batch's, so the first one does not wait for
        them. Then (Spark runs no batch while the node's positions do not move) it is an
        idle checkpoint (status file, watermark renewal, rotation on age) or a retry after
        a failed attempt; a node that moved is left to the micro-batch the next trigger
        runs, and should the query not run one for MOVED_TICKS such looks in a row, the
        driver checkpoints itself (nothing waits on a query that does not see the node
        move)."""
        with self._lock:
            if self._closing or time.monotonic() < self._due:
                return  # a micro-batch ran meanwhile
            began = time.monotonic()
            up = self.stream.batches > 0
            force = not up or self._moved_ticks >= MOVED_TICKS
            try:
                rec = self.checkpoint(idle_only=not force)
            except BaseException as exc:  # noqa: BLE001 - sorted in _attempt_failed
                self._due = time.monotonic() + self._attempt_failed(exc)
                return
            self._due = began + self.o.checkpoint
            if rec is None:
                self._moved_ticks += 1
                return
            if up and force and rec["backup_id"]:
                self.notice("no micro-batch took the node's changes: the driver "
                            "checkpointed them")
            self._committed(rec)

    def batch(self, rows: Callable[[], list[Any]], batch_id: int) -> None:
        """A micro-batch of the query (foreachBatch): the checkpoint of its offset range,
        retried with backoff until it commits or the run stops (the query never sees a
        failure: its next batch would begin past a range the archive lacks)."""
        with self._lock:
            while not self._closing and self._fatal is None:
                try:
                    ends = {int(r["vbucket"]): int(r["end_seqno"]) for r in rows()}
                    rec = self.checkpoint(end_seqnos=ends, micro_batch=batch_id)
                    if rec.get("resumed"):
                        # a resumed partial backup keeps the vbuckets it completed where
                        # they ended then: a second pass brings them to the batch's end
                        self._committed(rec)
                        rec = self.checkpoint(end_seqnos=ends, micro_batch=batch_id,
                                              idle_record=False)
                        if rec is None:
                            break
                except BaseException as exc:  # noqa: BLE001 - sorted in _attempt_failed
                    wait = self._attempt_failed(exc)
                    if self._fatal is not None or self.o.stop.wait(wait):
                        break  # the run's last checkpoint (the driver's) takes it over
                    continue
                self._committed(rec)
                break
            self._due = time.monotonic() + self.o.checkpoint

    def _attempt_failed(self, exc: BaseException) -> float:
        """A failed checkpoint attempt: one line, the retry record, the backoff (seconds);
        a usage error (or a bug) stops the run."""
        if not _retryable(exc):
            self._fatal = exc
            return 0.0
        self._backoff = min(BACKOFF_MAX, max(BACKOFF_FIRST, self._backoff * 2))
        self._streak += 1
        self._moved_ticks = 0
        self.notice(f"checkpoint failed: {one_line(exc)}; retrying in "
                    f"{self._backoff:.0f} s (the lag grows, nothing is lost)")
        lag = self.failed(exc)
        if self.o.on_retry is not None:
            self.o.on_retry({"bucket": self.opts.bucket, "error": self.failing,
                             "attempt": self._streak, "retry_in": self._backoff,
                             "time": iso_time(utc_now()), "lag": {self.opts.bucket: lag}})
        return self._backoff

    def _committed(self, rec: dict[str, Any]) -> None:
        if self._streak:
            self.notice(f"checkpoint committed again after {self._streak} failed "
                        f"attempt{'s' if self._streak > 1 else ''}")
        self._backoff = 0.0
        self._streak = 0
        self._moved_ticks = 0
        self.failing = None
        if self.o.on_checkpoint is not None:
            self.o.on_checkpoint(rec)

    def _close(self) -> None:
        """No micro-batch checkpoints from now on (one running ends first); the query is
        stopped after the last checkpoint (its start may take a while yet)."""
        with self._lock:
            self._closing = True

    def _last_checkpoint(self) -> None:
        """The run's last checkpoint, once no micro-batch runs any more: what the node holds
        now (a trigger cannot be asked for before its time, so the driver runs it, with the
        same run_backup and commit); the query stops after it."""
        try:
            rec = self.checkpoint(last=True)
        except BaseException as exc:  # noqa: BLE001 - sorted below
            if not _retryable(exc):
                raise
            self.failures += 1
            raise DcptoolError(f"the last checkpoint failed: {one_line(exc)}",
                               hint="a partial backup is kept; the next backup of "
                                    "the archive resumes it") from None
        self._committed(rec)

    def summary(self) -> dict[str, Any]:
        return {"bucket": self.opts.bucket, "archive": str(self.where),
                "last_checkpoint": (self.last or {}).get("time"),
                "last_backup": (self.last or {}).get("backup_id"),
                "rotations": self.rotations, "totals": self.totals()}


#: the name of a run's private Spark checkpoint directory (in the temporary directory)
QUERY_DIR_PREFIX = "dcptool-continuous-"
#: a query that died is started again; this many times in a row without a micro-batch
#: between stops the run
MAX_RESTARTS = 5


class CheckpointQuery:
    """The Structured Streaming query of a continuous backup: `dcptool-stream` in positions
    mode (a micro-batch is the offset range the source planned, one row per vbucket),
    `foreachBatch(ContinuousBackup.batch)`, `trigger(processingTime=checkpoint)`.

    Its checkpointLocation is a private temporary directory of the run, removed when the
    run ends (and, at the next start, when a killed run left it): Spark's checkpoint is
    never read again, the query's initial offset is the archive's committed end positions.
    So the archive alone is the truth; Spark's offsets only say when to run a batch and
    how far it reaches."""

    def __init__(self, cb: ContinuousBackup):
        self.cb = cb
        self.session: Any = None
        self.query: Any = None
        self.location: str | None = None
        self.restarts = 0
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.closed = False
        #: micro-batches the run's queries ran; when the current query started
        self.batches = 0
        self.started = time.monotonic()

    def start(self) -> None:
        """Start the query in a thread of its own (the driver checkpoints meanwhile)."""
        self.error = None
        self.thread = threading.Thread(target=self._start, name="dcptool-query-start",
                                       daemon=True)
        self.thread.start()

    def _start(self) -> None:
        try:
            self._start_query()
        except BaseException as exc:  # noqa: BLE001 - check() reports it and starts again
            self.error = exc

    def _start_query(self) -> None:
        import tempfile
        from pathlib import Path

        from .dataframes import register
        from .runtime import get_spark
        from .streamsource import NAME, connection_options, offset_of

        cb = self.cb
        if self.session is None:
            self.session = get_spark(cb.master)
            register(self.session)
            remove_stale_query_dirs()
        if self.closed:
            return
        a = cb.archive_or_none()
        ends = a.end_positions() if a is not None and a.latest_id() else {}
        self.location = tempfile.mkdtemp(prefix=f"{QUERY_DIR_PREFIX}{os.getpid()}-")
        self.started = time.monotonic()
        reader = (self.session.readStream.format(NAME)
                  .option("positions", "true")
                  .options(**connection_options(cb.opts))
                  .option("startOffset", json.dumps(offset_of(ends))))
        if cb.o.backup.get("vbuckets"):
            from dcptool.client.vbspec import format_vbuckets

            reader = reader.option("vbuckets", format_vbuckets(cb.o.backup["vbuckets"]))
        ms = max(1, int(round(cb.o.checkpoint * 1000)))
        self.query = (reader.load().writeStream
                      .queryName(f"dcptool-continuous-{cb.opts.bucket}-{os.getpid()}")
                      .foreachBatch(self._batch)
                      .trigger(processingTime=f"{ms} milliseconds")
                      .option("checkpointLocation", Path(self.location).as_uri())
                      .start())

    def _batch(self, df: Any, batch_id: int) -> None:
        try:
            self.restarts = 0
            self.batches += 1
            self.cb.batch(lambda: [r.asDict() for r in df.collect()], int(batch_id))
        except BaseException as exc:  # noqa: BLE001 - the run stops with it, not the query
            self.cb._fatal = exc

    def check(self) -> None:
        """Start the query again when it died or could not start (from the archive, as at
        the start)."""
        if self.closed or self.thread is None or self.thread.is_alive():
            return
        q = self.query
        if q is not None and q.isActive:
            return
        exc = self.error
        if exc is None and q is not None:
            try:
                exc = q.exception()
            except Exception:  # noqa: BLE001 - the reason is a figure here
                exc = None
        why = one_line(exc) if exc is not None else "stopped"
        self.query = None
        self._drop()
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            raise DcptoolError(f"the streaming query of the checkpoints stopped: {why}")
        self.cb.notice(f"the streaming query stopped ({why}); starting it again from the "
                       "archive")
        self.start()

    def stop(self) -> None:
        self.closed = True
        if self.thread is not None:
            self.thread.join()  # a query being started: started, then stopped here
        q, self.query = self.query, None
        if q is not None:
            try:
                q.stop()
            except Exception:  # noqa: BLE001 - stopping: the JVM may be gone (Ctrl-C twice)
                pass
        self._drop()

    def _drop(self) -> None:
        import shutil

        if self.location is not None:
            shutil.rmtree(self.location, ignore_errors=True)
            self.location = None


def remove_stale_query_dirs() -> None:
    """The query directories of runs whose process is gone (a kill -9 leaves its own)."""
    import glob
    import shutil
    import tempfile

    for d in glob.glob(os.path.join(tempfile.gettempdir(), QUERY_DIR_PREFIX + "*")):
        pid = os.path.basename(d)[len(QUERY_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def run_continuous(opts: Any, archive: Any, o: ContinuousOptions, *, spark: Any = None,
                   master: str | None = None) -> dict[str, Any]:
    """Run a continuous backup of the node `opts` into `archive` until `o.stop` is set (or
    `o.max_checkpoints` checkpoints were made); the run's summary."""
    return ContinuousBackup(opts, archive, o, spark=spark, master=master).run()
