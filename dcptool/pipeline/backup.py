"""The backup job: stream every vbucket to a snapshot boundary into a new archive backup.

The driver reads the node's seqnos and failover logs, decides where each vbucket starts
(seqno 0 for a full backup, the last committed backup's end position for an incremental
one, the last complete snapshot of a killed attempt when resuming), and runs one Spark
task per group of vbuckets. Each task opens its own DCP connection, writes its own files
and returns one small summary per vbucket; the driver checks them and commits the
manifest. Nothing is committed unless every vbucket completed.

On a member of a cluster of nodes the seqnos and failover logs come from each vbucket's
active node (as the cluster map says), and each task streams its vbuckets from their
active nodes, following the map when a node goes away (`ClusterConsumer`).

After each commit the driver registers the archive's end positions as a high watermark
on the node (name `dcptool-backup:ARCHIVE-DIR-NAME`, instance the archive's uuid), so the
node's tombstone purger keeps the deletions the next incremental backup still needs
(on a cluster: on each active node, for its own vbuckets). A node without the extension (a real Couchbase Server) gets one notice; the backup is
not failed for it.

Collections: every task's connection negotiates Collections (keys are doc keys; a node
without collections gets them prefixed 0x00 by the client), system events are recorded in
seqno order, the node's manifest when the backup begins goes into the backup's manifest,
and `--include-data` / `--exclude-data` become a stream filter (see backupdata.py) so only
the data selected is streamed; incremental backups keep the selection of their chain.
"""
from __future__ import annotations

import gc
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dcptool.archive import Archive, FULL, INCREMENTAL, storage
from dcptool.archive.info import dir_size
from dcptool.archive.format import BACKUPS_DIR, sync_filesystem
from dcptool.client.events import (
    DELETION,
    EV_CAS,
    EV_DATATYPE,
    EV_END_REASON,
    EV_END_RETRYING,
    EV_EXPIRY,
    EV_KEY,
    EV_KIND,
    EV_OPEN_FAILOVER_LOG,
    EV_OPEN_POSITION,
    EV_REV_SEQNO,
    EV_SEQNO,
    EV_SNAP_END,
    EV_SNAP_FLAGS,
    EV_SNAP_START,
    EV_SYSTEM_EVENT,
    EV_VALUE,
    EV_VBUCKET,
    EXPIRATION,
    MUTATION,
    ROLLBACK,
    SNAPSHOT as EV_SNAPSHOT,
    STREAM_END,
    STREAM_OPEN,
    SYSTEM_EVENT,
)
from dcptool.client.position import Position
from dcptool.client.vbspec import check_vbuckets
from dcptool.client.session import VALUE_COUNTERS, SessionConfig
from dcptool.errors import DcptoolError, Interrupted, UsageError, was_interrupted
from dcptool.faults import fault_point
from dcptool.protocol.constants import StreamEndReason
from dcptool.runlog import RunLog

from dcptool.protocol.collections import Manifest

from . import progress
from .backupdata import (
    chain_selection,
    client_filter,
    dropped_since,
    selection_json,
    stream_filter,
)
from .datafilter import selection
from .nodeinfo import bucket_uuid, cluster_state, node_opts
from .plans import BackupTask, VBucketPlan, VBucketSummary
from .runtime import (check_executors_see, check_master, context_of, default_parallelism,
                      engine_available, get_task_context, plan_groups, run_tasks)
from .tasks import reporting_failures, task_failure


@dataclass
class BackupResult:
    backup_id: str
    type: str
    resumed: bool
    vbuckets: int
    mutations: int = 0
    deletions: int = 0
    expirations: int = 0
    rollbacks: int = 0
    bytes: int = 0
    value_bytes: int = 0
    seconds: float = 0.0
    spark_seconds: float = 0.0
    #: items this run streamed (a resumed run: not those of the partial backup it kept)
    items_streamed: int = 0
    #: bytes the committed backup's directory takes on disk (what `dcptool info` shows)
    size_on_disk: int = 0
    kept_vbuckets: int = 0
    #: vbuckets of an incremental backup with nothing new since its parent (no files)
    unchanged_vbuckets: int = 0
    system_events: int = 0
    #: the data selection ({"include": [...], "exclude": [...]}, None: all) and how many
    #: collections the node had when the backup began (None: no collections)
    data: dict[str, list[str]] | None = None
    collections: int | None = None
    rollback_details: list[dict] = field(default_factory=list)
    log: str | None = None
    #: the high watermark registration: name, instance, registered (bool), vbuckets,
    #: expires_at, and `note` when it could not be made (None with --no-watermark)
    watermark: dict[str, Any] | None = None

    @property
    def items(self) -> int:
        return self.mutations + self.deletions + self.expirations

    def as_dict(self) -> dict[str, Any]:
        return {
            "backup_id": self.backup_id, "type": self.type, "resumed": self.resumed,
            "vbuckets": self.vbuckets, "mutations": self.mutations, "deletions": self.deletions,
            "expirations": self.expirations, "rollbacks": self.rollbacks, "bytes": self.bytes,
            "value_bytes": self.value_bytes, "size_on_disk": self.size_on_disk,
            "seconds": round(self.seconds, 3),
            "spark_startup_seconds": round(self.spark_seconds, 3),
            "items_streamed": self.items_streamed,
            # of the streaming: Spark's start-up is spark_startup_seconds, apart
            "items_per_second": (round(self.items_streamed / (self.seconds - self.spark_seconds), 1)
                                 if self.seconds > self.spark_seconds else None),
            "kept_vbuckets": self.kept_vbuckets,
            "unchanged_vbuckets": self.unchanged_vbuckets,
            "system_events": self.system_events,
            "data": self.data, "collections": self.collections,
            "rollback_details": self.rollback_details,
            "log": self.log, "watermark": self.watermark,
        }


#: how long a backup's watermark holds the purger back unless the next backup renews it
DEFAULT_WATERMARK_TTL = 7 * 86400.0
WATERMARK_PREFIX = "dcptool-backup:"


def archive_watermark(archive: Archive | str | os.PathLike[str]
                      ) -> tuple[str, str, dict[int, int], dict[str, Any]]:
    """(name, instance, {vbucket: seqno}, meta) of the watermark that stands for an archive.

    The name comes from the archive's directory name, the instance is the archive's uuid
    (two archives of the same name are two rows), the seqnos are the end positions of the
    newest committed backup's chain: what an incremental backup would start from.
    """
    archive = Archive.opened(archive)
    name = (WATERMARK_PREFIX + archive.path.absolute().name)[:200]
    latest = archive.latest_id()
    seqnos = ({vb: int(p.seqno) for vb, p in archive.end_positions(latest).items()}
              if latest is not None else {})
    meta = {"archive": str(archive.path.absolute()), "backup": latest,
            "host": socket.gethostname()}
    return name, archive.uuid, seqnos, meta


def register_archive_watermark(opts, archive: Archive, *, ttl: float = DEFAULT_WATERMARK_TTL,
                               notice: Callable[[str], None] | None = None,
                               vbuckets: list[int] | None = None) -> dict[str, Any]:
    """Register `archive`'s watermark on the node `opts`; never raises for the node's sake.

    Returns {name, instance, registered, vbuckets, expires_at, note}; `note` says why
    nothing was registered (no support on the node, a failure).
    """
    from dcptool.client.watermark import WatermarkReporter

    name, instance, seqnos, meta = archive_watermark(archive)
    if vbuckets is not None:  # a cluster's node: only the vbuckets active there
        seqnos = {vb: s for vb, s in seqnos.items() if vb in set(vbuckets)}
    notes: list[str] = []

    def tell(msg: str) -> None:
        notes.append(msg)
        if notice is not None:
            notice(msg)

    reporter = WatermarkReporter(opts.connect, name, instance, ttl=ttl, meta=meta, notice=tell)
    try:
        answer = reporter.report(seqnos, force=True)
    finally:
        reporter.close()
    return {"name": name, "instance": instance, "registered": answer is not None,
            "vbuckets": len(seqnos), "expires_at": (answer or {}).get("expires_at"),
            "behind_purge_seqno": (answer or {}).get("behind_purge_seqno") or {},
            "note": "; ".join(notes) or None}


def node_manifest(opts) -> Manifest | None:
    """The bucket's collections manifest (None: the node has no collections: it refused
    HELLO Collections or does not know GET_COLLECTIONS_MANIFEST)."""
    from dcptool.client.ops import get_collections_manifest

    with opts.connect(collections=True) as conn:
        if not conn.collections:
            return None
        return get_collections_manifest(conn, missing_ok=True)


def backup_consumer_config(name: str, **kw: Any) -> SessionConfig:
    """The DCP session a backup task opens (also used by `benchmarks/` for its replay)."""
    # copy_values=True: values as bytes slices of the received chunk are cheaper to keep
    # and pack than memoryviews: 674k against 467k items/s on the 1M replay of
    # docs/performance.md ("backup task" / "memoryview values" rows)
    # collections: keys are doc keys whatever the node (see dcptool.client.session)
    # include_xattrs: a document's extended attributes are part of it (sub-document
    # mutations, SDK transactions); the archive keeps the value as DCP sends it, the xattr
    # section in front (docs/archive-format.md)
    return SessionConfig(name=name, **{"consistent": True, "max_rollbacks": 16,
                                       "copy_values": True, "collections": True,
                                       "include_xattrs": True, **kw})


def backup_task(task: BackupTask) -> list[VBucketSummary]:
    """Stream one group of vbuckets into the backup's files; one summary per vbucket.

    Runs on a Spark executor (or in the driver for tests): it needs only the task, whose
    opened archive carries the data key of an encrypted archive.
    """
    plan: dict[int, VBucketPlan] = {p.vbucket: p for p in task.plans}
    writers, starts, packer = _open_writers(task, plan)
    summaries: list[VBucketSummary] = []
    rollbacks: list[dict[str, int]] = []
    opened: dict[int, Position] = dict(starts)  # the position each stream was last requested from
    # for the run log: when each vbucket's stream first opened, how often it (re)opened and
    # how often the node ended it early and it was asked again; `base`: the items a resumed
    # vbucket's files held already (what this run streams is counted apart from them)
    run: dict[int, dict[str, Any]] = {vb: {"opens": 0, "retries": 0, "first_open": None,
                                           "base": _items(writers[vb])}
                                      for vb in plan}
    report = TaskProgress(writers[next(iter(plan))].dir, task.session.rsplit(":", 1)[-1],
                          writers, plan, starts, {vb: r["base"] for vb, r in run.items()}) \
        if plan else None
    on_rollback = _rollback_handler(task, writers, opened, rollbacks)
    t_task = time.monotonic()
    consumer = _task_consumer(task, on_rollback)
    try:
        consumer.add_streams({vb: (starts[vb], plan[vb].end) for vb in plan})
        pending = write_events(consumer, writers, plan, opened, run, summaries, t_task,
                               admit=task.client_filter, report=report)
        if report is not None:
            report.write()
        if pending:
            raise DcptoolError(f"vbuckets {sorted(pending)[:8]} ended without a complete stream")
        # the data and done files of every vbucket of this task are durable before the driver
        # hears of them (a done file that a crash tore is caught on resume: it is checked
        # against the files' sizes and SHA-256)
        if packer is not None:
            packer.flush()
        sync_filesystem(task.archive.path)
        # values the node sent snappy-compressed (stored decompressed), for the run log
        compressed = {k: getattr(consumer.session, k, 0) for k in VALUE_COUNTERS}
    except BaseException:
        for w in writers.values():
            if not w.closed:
                w.abort()
        raise
    finally:
        consumer.close()
    for s in summaries:
        s.entry.setdefault("task_rollbacks", [r for r in rollbacks if r["vbucket"] == s.vbucket])
    if summaries and compressed["values_decompressed"]:
        summaries[0].run["snappy"] = compressed  # the task's, once
    return summaries


def _open_writers(task: BackupTask, plan: dict[int, VBucketPlan]
                  ) -> tuple[dict[int, Any], dict[int, Position], Any]:
    """(a writer per vbucket, where each stream starts, the packer or None): a resumed
    vbucket starts where the killed attempt's files end."""
    from dcptool.archive import VBucketWriter
    from dcptool.archive.packing import Packer
    from dcptool.archive.recovery import done_summaries, vbucket_files
    from dcptool.archive.writer import load_backup_intent

    archive = task.archive
    backup_id = task.backup_id
    bdir = archive.path / BACKUPS_DIR / backup_id
    intent = load_backup_intent(archive, backup_id)
    try:  # each vbucket's files are this task's alone: one listing serves every writer
        listing = frozenset(storage.listdir(bdir))
        by_vb = vbucket_files("", listing)
    except FileNotFoundError:
        listing, by_vb = None, None
    # on object storage the vbuckets' small last segments go into shared packs and their
    # summaries into done batches: a few objects instead of two per vbucket (packing.py)
    packer = None
    dones: dict[int, Any] = {}
    if storage.store_of(archive.path).packs:
        packer = Packer(bdir, key=archive.key)
        if listing is not None and any(p.resume for p in plan.values()):
            dones = done_summaries(bdir, listing, key=archive.key)
    writers: dict[int, Any] = {}
    starts: dict[int, Position] = {}
    for vb, p in plan.items():
        start = p.start
        # sync=False: no fsync per segment and done file (~3 per vbucket, 10-20 ms each on
        # the development machine); one sync_filesystem below before the summaries go back
        w = VBucketWriter(archive, backup_id, vb, start.to_archive(), p.failover_log,
                          resume=p.resume, sync=False, intent=intent, listing=listing,
                          files=None if by_vb is None else by_vb.get(vb, []), packer=packer,
                          **({"known_summary": dones.get(vb)} if packer is not None else {}))
        if p.resume:  # the writer found where the killed attempt's files end
            start = Position.from_archive(w.position, w.failover_log)
        writers[vb] = w
        starts[vb] = start
    return writers, starts, packer


def _rollback_handler(task: BackupTask, writers: dict[int, Any], opened: dict[int, Position],
                      rollbacks: list[dict[str, int]]) -> Callable[[Any], Position]:
    def on_rollback(info):
        # roll back to the latest snapshot end at or below the node's seqno that the chain
        # (or this session) holds; the writer records it so restores skip the dead branch
        vb = info.vbucket
        chain_pt = task.archive.rollback_point(vb, info.rollback_seqno, upto=task.parent)
        seen = [s for s in info.before.snapshot_ends if s <= info.rollback_seqno]
        target = max([chain_pt.seqno, *seen])
        after = info.before.moved_to(target)
        writers[vb].rollback(after.seqno, after.uuid)
        opened[vb] = after
        rollbacks.append({"vbucket": vb, "node_seqno": info.rollback_seqno, "seqno": after.seqno,
                          "uuid": after.uuid})
        return after

    return on_rollback


def _task_consumer(task: BackupTask, on_rollback: Callable[[Any], Position]) -> Any:
    """The task's DCP consumer: on a member of a cluster each vbucket from its active
    node, following the map; else one node, reconnecting on a lost connection."""
    opts = task.opts
    config = backup_consumer_config(task.session, stream_filter=task.stream_filter)
    if task.cluster:
        from dcptool.client.topology import ClusterConsumer, ClusterView

        return ClusterConsumer(opts, config, ClusterView(0, (), ()), on_rollback=on_rollback)
    from dcptool.client.consumer import ResumingConsumer

    return ResumingConsumer(lambda: opts.consumer(config, on_rollback=on_rollback))


def _items(writer) -> int:
    """Mutations, deletions and expirations a vbucket writer holds (its files' so far)."""
    c = writer.counts()
    return c["mutations"] + c["deletions"] + c["expirations"]


#: a backup task's progress file in the backup's directory: `.progress-N.tmp` (the commit
#: removes `.*.tmp` files, so a committed backup never lists it)
PROGRESS_PREFIX = ".progress-"


class TaskProgress(progress.TaskReporter):
    """How far one backup task is, for the driver's progress bar, per item: the task's
    progress file (see pipeline/progress.py: TaskReporter) in the backup's directory,
    which every executor writes to already. The task writes it first after its first
    batch of events or vbucket end, then at most every `interval` seconds, and once at its
    end; the driver polls those files (`poll_task_progress`).

    The file holds `items` (streamed by this run), `work` and `work_total`: per vbucket
    the seqnos from its plan's start to its end, done as items arrive (capped at the
    vbucket's span; all of it once the vbucket closes), so a bar over `work` advances with
    every item and ends full although deduplication makes items fewer than seqnos.
    """

    def __init__(self, backup_dir, name: str, writers: dict[int, Any],
                 plan: dict[int, VBucketPlan], starts: dict[int, Position],
                 base: dict[int, int], interval: float = progress.DEFAULT_INTERVAL):
        super().__init__(storage.location(backup_dir) / f"{PROGRESS_PREFIX}{name}.tmp",
                         interval)
        self.writers = writers
        self.base = base
        # (span of the plan, seqnos a resumed vbucket's files already covered)
        self.spans = {vb: (max(0, int(p.end) - int(p.start.seqno)),
                           max(0, int(starts[vb].seqno) - int(p.start.seqno)))
                      for vb, p in plan.items()}

    def state(self) -> dict[str, int]:
        items = work = total = closed = 0
        for vb, w in self.writers.items():
            span, pre = self.spans[vb]
            n = _items(w) - self.base[vb]
            items += n
            total += span
            work += span if w.closed else min(span, pre + n)
            closed += w.closed
        return {"items": items, "work": work, "work_total": total, "vbuckets_closed": closed}


def poll_task_progress(backup_dir) -> dict[str, int]:
    """The sum of every task's progress file in `backup_dir` (see TaskProgress)."""
    return progress.poll_files(backup_dir, PROGRESS_PREFIX,
                               ("items", "work", "work_total", "vbuckets_closed"))


def write_events(consumer, writers: dict[int, Any], plan: dict[int, VBucketPlan],
                 opened: dict[int, Position], run: dict[int, dict[str, Any]],
                 summaries: list[VBucketSummary], t_task: float,
                 tick: float = 1.0, admit=None, report=None) -> set[int]:
    """Drain `consumer`'s events into the vbuckets' writers until every stream ended.

    The hot path of a backup task (and what `benchmarks/` measures on a replayed stream):
    records go to the writer of their vbucket; each vbucket that ends with OK is closed and
    its summary (with the run statistics) appended to `summaries`.
    Returns the vbuckets of `plan` that did not end. `admit` (a backupdata.ClientFilter,
    rare) keeps only the selected collections' records and events of each batch.
    `report` (a TaskProgress) is called after each batch and as each vbucket ends (it
    writes at most every interval; the task writes it once more at its end).

    The cyclic garbage collector is paused while it runs: the loop makes a tuple per
    record and no reference cycles, and the collector's passes over each batch's events
    while they are alive took ~7 % of the task's time (docs/performance.md).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _write_events(consumer, writers, plan, opened, run, summaries, t_task, tick,
                             admit, report)
    finally:
        if was_enabled:
            gc.enable()


def _write_events(consumer, writers: dict[int, Any], plan: dict[int, VBucketPlan],
                  opened: dict[int, Position], run: dict[int, dict[str, Any]],
                  summaries: list[VBucketSummary], t_task: float, tick: float, admit,
                  report) -> set[int]:
    pending = set(plan)
    for events in consumer.batches(tick=tick):
        if admit is not None:
            events = admit.filter(events)
        n = len(events)
        fault_point("events", n)
        i = 0
        while i < n:
            ev = events[i]
            kind = ev[EV_KIND]
            if kind == MUTATION:
                # a run of mutations of one vbucket (a snapshot's worth, usually) in one call
                i = writers[ev[EV_VBUCKET]].mutation_run(events, i, n)
                continue
            i += 1
            if kind == EV_SNAPSHOT:
                writers[ev[EV_VBUCKET]].marker(ev[EV_SNAP_START], ev[EV_SNAP_END],
                                               ev[EV_SNAP_FLAGS])
            elif kind == DELETION:  # EV_EXPIRY holds the delete time
                writers[ev[EV_VBUCKET]].deletion(ev[EV_SEQNO], ev[EV_REV_SEQNO], ev[EV_CAS],
                                                 ev[EV_KEY], ev[EV_EXPIRY], ev[EV_DATATYPE],
                                                 ev[EV_VALUE])
            elif kind == EXPIRATION:
                writers[ev[EV_VBUCKET]].expiration(ev[EV_SEQNO], ev[EV_REV_SEQNO], ev[EV_CAS],
                                                   ev[EV_KEY], ev[EV_EXPIRY], ev[EV_DATATYPE],
                                                   ev[EV_VALUE])
            elif kind == SYSTEM_EVENT:  # (after the records' kinds: rare)
                writers[ev[EV_VBUCKET]].system_event(ev[EV_SYSTEM_EVENT])
            elif kind == STREAM_OPEN:
                vb = ev[EV_VBUCKET]
                r = run[vb]
                r["opens"] += 1
                if r["first_open"] is None:
                    r["first_open"] = time.monotonic()
                writers[vb].stream((ev[EV_OPEN_POSITION] if len(ev) > EV_OPEN_POSITION
                                    else opened[vb]).to_archive(), ev[EV_OPEN_FAILOVER_LOG])
            elif kind == STREAM_END:
                vb, reason, retrying = ev[EV_VBUCKET], ev[EV_END_REASON], ev[EV_END_RETRYING]
                if reason == StreamEndReason.OK or reason == StreamEndReason.FILTER_EMPTY:
                    # FilterEmpty: every collection the filter asked for was dropped (the
                    # drop events are written); the vbucket ends where the stream stood,
                    # inside its snapshot if need be (a stream request may start there)
                    pos = consumer.position(vb) if reason == StreamEndReason.OK else \
                        consumer.position(vb, consistent=False)
                    entry = writers[vb].close(pos.to_archive())
                    r = run[vb]
                    c = entry["counts"]
                    summaries.append(VBucketSummary(entry, {
                        "opens": r["opens"], "retries": r["retries"],
                        "streamed": c["mutations"] + c["deletions"] + c["expirations"]
                        - r.get("base", 0),
                        "resumed": plan[vb].resume,
                        "seconds": round(time.monotonic() - (r["first_open"] or t_task), 3)}))
                    pending.discard(vb)
                    if report is not None:
                        report()  # throttled: a task may end hundreds of vbuckets a second
                    fault_point("vbucket-closed", len(summaries),
                                flush=report.write if report is not None else None)
                elif retrying:
                    run[vb]["retries"] += 1
                else:
                    raise DcptoolError(f"vbucket {vb}: the node ended the stream "
                                       f"({StreamEndReason(reason).name if reason in StreamEndReason._value2member_map_ else reason})")
            elif kind == ROLLBACK:
                pass  # recorded by on_rollback
        if report is not None:
            report()
    return pending


def _progress_watch(progress, backup_dir, base: dict[str, Any],
                    callback: Callable[[dict[str, Any]], None], stop: threading.Event,
                    interval: float = 0.25) -> None:
    """Poll the backup's progress every `interval` seconds: vbuckets done from their done
    files, items and work from the tasks' progress files (see TaskProgress)."""
    remote = storage.store_of(backup_dir).packs
    while not stop.wait(interval):
        tasks = poll_task_progress(backup_dir)
        if remote:  # one listing and a file per task, not a read of every done file
            done = base["vbuckets_done"] + tasks["vbuckets_closed"]
        else:
            done, _items_done, _bytes = progress.poll()
        callback({**base, "vbuckets_done": done, "items": tasks["items"],
                  "work": min(tasks["work"], base["work_total"])})


@dataclass(frozen=True)
class BackupOptions:
    """What a backup does (the CLI's options): `full` (a new full backup), Spark
    (`partitions`, `master`, `spark`), the zstd `level`, `purge_partial`, the `vbuckets`
    (None: all), the data selection (`include_data`/`exclude_data`, lists of names), the
    watermark (`watermark`: register it after the commit; `watermark_ttl` seconds),
    `passphrase` (a new archive is created encrypted under it; an existing one given by
    its location is unlocked with it), and the callbacks:
    `progress` (a dict per change of phase or count), `on_plan` (the plan, once) and
    `notice` (a line for the user, e.g. that the node has no watermark support)."""

    full: bool = False
    partitions: int | None = None
    master: str | None = None
    level: int = 3
    purge_partial: bool = False
    vbuckets: list[int] | None = None
    progress: Callable[[dict[str, Any]], None] | None = None
    on_plan: Callable[[dict], None] | None = None
    spark: Any = None
    watermark: bool = True
    watermark_ttl: float = DEFAULT_WATERMARK_TTL
    notice: Callable[[str], None] | None = None
    include_data: list[str] | None = None
    exclude_data: list[str] | None = None
    passphrase: str | None = None
    #: more fields for the manifest's `extra` (a continuous backup's checkpoint_interval,
    #: covers_from)
    extra: dict[str, Any] | None = None
    #: {vb: seqno}: stream the named vbuckets no further than this (a continuous backup's
    #: micro-batch end offset); the node's high seqno where it is lower, as for any vbucket
    #: not named. The node finishing a snapshot past it is what it is with the high seqno
    #: read before the stream: the archive records the open snapshot, the next backup
    #: resumes inside it.
    end_seqnos: dict[int, int] | None = None


def run_backup(opts: Any, archive: Archive | str | os.PathLike[str], *, full: bool = False,
               partitions: int | None = None, master: str | None = None, level: int = 3,
               purge_partial: bool = False, vbuckets: list[int] | None = None,
               progress: Callable[[dict[str, Any]], None] | None = None,
               on_plan: Callable[[dict], None] | None = None, spark: Any = None,
               watermark: bool = True, watermark_ttl: float = DEFAULT_WATERMARK_TTL,
               notice: Callable[[str], None] | None = None,
               include_data: list[str] | None = None, exclude_data: list[str] | None = None,
               passphrase: str | None = None,
               extra: dict[str, Any] | None = None,
               end_seqnos: dict[int, int] | None = None) -> BackupResult:
    """Run one backup of the node `opts` (ConnOptions) into `archive`: opened already (what
    a command passes), or where it is (opened, or created for the node's bucket). See
    BackupOptions for the rest. The run is logged to `ARCHIVE/logs/backup-*.log`.
    """
    o = BackupOptions(full, partitions, master, level, purge_partial, vbuckets, progress,
                      on_plan, spark, watermark, watermark_ttl, notice, include_data,
                      exclude_data, passphrase, extra, end_seqnos)
    with RunLog("backup") as rl:
        result = _run_backup(rl, opts, archive, o)
    result.log = str(rl.path) if rl.path else None
    return result


def _log_vbucket(rl: RunLog, s: dict[str, Any], run: dict[str, Any] | None) -> None:
    c, st, en = s["counts"], s["start"], s["end"]
    line = (f"vbucket {s['vbucket']}: seqno {st['seqno']} -> {en['seqno']} (uuid {en['uuid']:#x}), "
            f"{c['mutations']} mutations, {c['deletions']} deletions, {c['expirations']} "
            f"expirations, {c['snapshots']} snapshots, {s['bytes']['files']} bytes in "
            f"{len(s['files'])} files")
    if run is None:
        line += "; kept from the partial backup"
    else:
        if run.get("resumed"):
            line += "; resumed"
        line += (f"; stream opened {run['opens']}x, {run['retries']} retries, "
                 f"{run['seconds']:.3f} s")
    rl.info("%s", line)
    for r in s.get("rollbacks", []):
        rl.warning("vbucket %d: rollback to seqno %d (uuid %#x) recorded", s["vbucket"],
                   r["seqno"], r["vbucket_uuid"])
    for r in s.get("task_rollbacks", []):
        if r.get("node_seqno") != r.get("seqno"):
            rl.info("vbucket %d: the node asked for seqno %d; rolled back to the snapshot end "
                    "%d the archive holds", r["vbucket"], r["node_seqno"], r["seqno"])


def _log_compressed(rl: RunLog, opts, runs: dict[int, dict[str, Any] | None]) -> None:
    """How many values arrived snappy-compressed (all stored decompressed)."""
    got = {k: sum((r or {}).get("snappy", {}).get(k, 0) for r in runs.values())
           for k in VALUE_COUNTERS}
    if getattr(opts, "snappy", False) or got["values_decompressed"]:
        n, wire, plain = (got[k] for k in VALUE_COUNTERS)
        rl.info("snappy %s: %d values arrived compressed, %d bytes on the wire for %d bytes "
                "decompressed%s", "negotiated" if getattr(opts, "snappy", False) else
                "not asked for", n, wire, plain, f" ({wire / plain:.3f})" if plain else "")


@dataclass
class _NodeState:
    """What the driver learns of the node before it touches the archive: its vbucket
    count, high seqnos and failover logs (of the active vbuckets), the cluster's members
    ({node: vbuckets}, None for a single node), the bucket's collections manifest and uuid,
    and the data selection given."""

    count: int
    seqnos: dict[int, int]
    logs: dict[int, Any]
    members: dict[str, list[int]] | None
    manifest: Manifest | None
    uuid: str | None
    given: Any


def _tell(rl: RunLog, o: BackupOptions, msg: str) -> None:
    rl.warning("%s", msg)
    if o.notice is not None:
        o.notice(msg)


def _run_backup(rl: RunLog, opts: Any, archive_at: Archive | str | os.PathLike[str],
                o: BackupOptions) -> BackupResult:
    t0 = time.monotonic()
    where = archive_at.path if isinstance(archive_at, Archive) else storage.location(archive_at)
    archive_path = str(where.absolute())
    rl.info("backup of bucket %s on %s into %s (pid %d)", opts.bucket, opts.address,
            archive_path, os.getpid())
    if o.spark is None:
        check_master(o.master)  # an unreachable master fails before any partial backup exists
    node = _node_state(rl, opts, o)
    archive, created = Archive.for_backup(
        archive_at.at(where.absolute()) if isinstance(archive_at, Archive) else archive_path,
        bucket=opts.bucket,
        vbuckets=node.count, node=opts.address, node_uuid=node.uuid, passphrase=o.passphrase)
    if created:
        rl.info("created archive %s for bucket %s with %d vbuckets", archive_path, opts.bucket,
                node.count)
    archive = archive.at(where.absolute())  # the executors' working directory is not ours
    rl.attach(archive_path)
    writer, resumed, unchanged, filters = _begin_or_resume(rl, archive, opts, node, o)
    try:
        manifest, kept, streamed, spark_seconds, state = _stream_and_commit(
            rl, archive, opts, node, writer, resumed, unchanged, filters, o)
    except BaseException as exc:
        writer.abort()
        if isinstance(exc, KeyboardInterrupt) or was_interrupted():
            raise Interrupted(f"interrupted: partial backup {writer.id} is kept; the next "
                              "backup of this archive resumes it") from None
        raise
    result = _backup_result(archive, writer, resumed, manifest, kept, unchanged, streamed,
                            spark_seconds)
    if o.progress is not None:
        state.update(phase="done", items=streamed, work=state["work_total"],
                     vbuckets_done=len(manifest["vbuckets"]) + len(unchanged))
        o.progress(dict(state))
    result.seconds = time.monotonic() - t0
    rl.info("committed %s backup %s: %d vbuckets, %d mutations, %d deletions, %d expirations, "
            "%d rollbacks, %d bytes of data files (%d bytes on disk) in %.2f s; %d items "
            "streamed (%.0f items/s)", result.type, writer.id, result.vbuckets,
            result.mutations, result.deletions, result.expirations, result.rollbacks,
            result.bytes, result.size_on_disk, result.seconds, streamed,
            streamed / result.seconds if result.seconds else 0)
    if o.watermark:
        result.watermark = _register_watermark(rl, opts, archive, node.members, o)
    return result


def _node_state(rl: RunLog, opts: Any, o: BackupOptions) -> _NodeState:
    """The node's vbuckets, collections and bucket uuid; the data selection checked
    against them before anything is written."""
    # on a cluster, seqnos and failover logs come from each vbucket's active node
    count, seqnos, logs, members = cluster_state(opts, o.vbuckets)
    if o.end_seqnos:
        seqnos = bounded_seqnos(seqnos, o.end_seqnos)
    check_vbuckets(o.vbuckets, count)  # vbuckets the bucket does not have: a usage error
    if members is not None:
        rl.info("cluster member: vbuckets stream from their active nodes (%s)",
                ", ".join(f"{n}: {len(v)}" for n, v in sorted(members.items())))
    if not seqnos:
        raise DcptoolError(f"{opts.address} holds no active vbuckets to back up")
    # the data selection is checked before anything is written
    given = selection(o.include_data, o.exclude_data, bucket=opts.bucket)
    node_man = node_manifest(opts)
    rl.info("collections: %s", "the node has none (keys of the default collection)"
            if node_man is None else f"manifest uid {node_man.uid:#x}, "
            f"{len(node_man.scopes)} scopes, {node_man.num_collections} collections")
    stream_filter(given, node_man, opts.bucket)  # names given must exist: checked up front
    node_uuid = bucket_uuid(opts)
    rl.info("bucket %s: uuid %s", opts.bucket, node_uuid or "(the node gives none)")
    return _NodeState(count, seqnos, logs, members, node_man, node_uuid, given)


def bounded_seqnos(seqnos: dict[int, int], ends: dict[int, int]) -> dict[int, int]:
    """The node's high seqnos, each no higher than its bound in `ends` (if any)."""
    return {vb: min(int(s), int(ends[vb])) if vb in ends else s for vb, s in seqnos.items()}


def _begin_or_resume(rl: RunLog, archive: Archive, opts: Any, node: _NodeState,
                     o: BackupOptions) -> tuple[Any, bool, set[int], tuple[Any, Any]]:
    """(the backup writer, resumed, the vbuckets unchanged since the parent, (stream
    filter, client filter)): the partial backup resumed, or a new full or incremental
    backup begun, once the bucket is known to be the archive's."""
    partial, notes, removed = archive.settle_partial(o.purge_partial)
    for msg in notes:
        _tell(rl, o, msg)
    if removed:
        rl.warning("discarded partial backups %s (--purge-partial)", ", ".join(removed))
    resumed = partial is not None
    if resumed:
        intent = partial.intent or {}
        _check_same_bucket(rl, archive, opts, node.uuid, node.logs, intent.get("bucket_uuid"),
                           partial.parent, partial=partial.id)
        sel = chain_selection(node.given, intent.get("data"), opts.bucket, full=False,
                              what=f"partial backup {partial.id}")
        parent_id = partial.parent
        btype = None
    else:
        btype, parent_id = _new_backup_type(rl, archive, opts, node, o)
        recorded = None if parent_id is None else archive.manifest(parent_id).get("data")
        sel = chain_selection(node.given, recorded, opts.bucket, full=btype == FULL)
    filters = _stream_filters(rl, archive, opts, parent_id, sel, node.given, node.manifest, o)
    if resumed:
        writer = archive.resume_backup()
        btype = writer.type
        unchanged = (unchanged_vbuckets(archive, writer.parent, node.seqnos, node.logs)
                     if btype == INCREMENTAL else set())
    else:
        unchanged = (unchanged_vbuckets(archive, parent_id, node.seqnos, node.logs)
                     if btype == INCREMENTAL else set())
        # vbuckets_planned: how many vbuckets the backup will hold, for `info` on a partial one
        writer = archive.begin_backup(
            btype, level=o.level,
            collections=node.manifest.to_json() if node.manifest else None,
            data=selection_json(sel), bucket_uuid=node.uuid,
            extra={"vbuckets_planned": len(node.seqnos) - len(unchanged)})
    return writer, resumed, unchanged, filters


def _new_backup_type(rl: RunLog, archive: Archive, opts: Any, node: _NodeState,
                     o: BackupOptions) -> tuple[str, str | None]:
    """(full or incremental, the parent) of a new backup: an incremental one only of the
    same bucket; a --full one of another bucket uuid is noted."""
    btype = FULL if (o.full or archive.latest_id() is None) else INCREMENTAL
    parent_id = None if btype == FULL else archive.latest_id()
    if parent_id is not None:
        _check_same_bucket(rl, archive, opts, node.uuid, node.logs,
                           archive.recorded_bucket_uuid(parent_id), parent_id)
    elif archive.latest_id() is not None and node.uuid is not None:
        held = archive.recorded_bucket_uuid(archive.latest_id())
        if held is not None and held != node.uuid:
            _tell(rl, o, f"--full: a new full backup of bucket '{opts.bucket}' (uuid "
                         f"{node.uuid}) in an archive whose newest backup "
                         f"{archive.latest_id()} is of bucket uuid {held}; the older backups "
                         "stay restorable")
    return btype, parent_id


def _stream_filters(rl: RunLog, archive: Archive, opts: Any, parent_id: str | None, sel: Any,
                    given: Any, node_man: Manifest | None,
                    o: BackupOptions) -> tuple[Any, Any]:
    """(the stream filter the node applies, the filter this side applies or None)."""
    previous = archive.manifest(parent_id).get("collections") if parent_id else None
    gone = dropped_since(sel, previous, node_man)
    cfilter = None
    if gone:
        # a node refuses a filter naming a dropped collection: stream everything, keep the
        # selection (and the drops) on this side, this once
        sfilter = None
        cfilter = client_filter(sel, previous, node_man, gone)
        _tell(rl, o, f"selected collections {', '.join(format(c, '#x') for c in sorted(gone))} "
                     "were dropped since the last backup: this backup streams every collection "
                     "and keeps the selected ones, to record the drops")
    else:
        # names given now must exist; a recorded selection's may have been dropped
        sfilter = stream_filter(sel, node_man, opts.bucket, check_names=sel is given)
    if sfilter is not None:
        rl.info("data selection %s: stream filter %s", selection_json(sel),
                sfilter.to_bytes().decode())
    return sfilter, cfilter


def _stream_and_commit(rl: RunLog, archive: Archive, opts: Any, node: _NodeState, writer: Any,
                       resumed: bool, unchanged: set[int], filters: tuple[Any, Any],
                       o: BackupOptions) -> tuple[dict[str, Any], dict[int, Any], int, float,
                                                  dict[str, Any]]:
    """Plan the backup, stream its vbuckets as Spark tasks and commit it: (the manifest,
    the summaries kept from a partial backup, items streamed, Spark's start-up seconds,
    the progress state)."""
    seqnos, logs = node.seqnos, node.logs
    # where each vbucket starts is the archive's decision; the node adds where it ends
    bplan = writer.plan(seqnos)
    kept = bplan.kept
    # a vbucket with nothing new costs no file: the manifest lists it as unchanged
    unchanged.intersection_update({vb for vb in unchanged
                                   if vb in bplan.starts and not bplan.starts[vb].resume})
    plan: dict[int, VBucketPlan] = {
        vb: VBucketPlan(vb, Position.from_archive(st.position, st.failover_log), seqnos[vb],
                        tuple((int(u), int(q)) for u, q in logs.get(vb, ())), st.resume)
        for vb, st in bplan.starts.items() if vb not in unchanged}
    n_resumed = sum(1 for p in plan.values() if p.resume)
    rl.info("%s backup %s%s, parent %s: %d vbuckets, %d kept from the partial backup, "
            "%d unchanged since the parent, %d to stream (%d resumed)", writer.type, writer.id,
            " (resumed)" if resumed else "", writer.parent or "none", len(seqnos),
            len(kept), len(unchanged), len(plan), n_resumed)
    if o.on_plan is not None:
        o.on_plan({"backup_id": writer.id, "type": writer.type, "resumed": resumed,
                   "vbuckets": len(seqnos), "kept": len(kept), "to_stream": len(plan)})
    summaries: list[VBucketSummary] = [VBucketSummary(e) for e in kept.values()]
    spark_seconds = 0.0
    # what progress reports: the phase, vbuckets (done), items streamed, and the work
    # (seqnos) done out of work_total (see TaskProgress)
    state: dict[str, Any] = {
        "phase": "connecting to engine" if o.progress is not None and o.spark is None
                 and engine_available(o.master) else "starting Spark",
        "vbuckets": len(seqnos), "vbuckets_done": len(kept) + len(unchanged),
        "items": 0, "work": 0,
        "work_total": sum(max(0, int(p.end) - int(p.start.seqno)) for p in plan.values())}
    if plan:
        spark_seconds = _run_backup_tasks(rl, archive, opts, node, writer, resumed, plan,
                                          filters, state, summaries, o)
    streamed = sum((s.run or {}).get("streamed", 0) for s in summaries)
    if o.progress is not None:
        state.update(phase="committing", items=streamed, work=state["work_total"],
                     vbuckets_done=len(seqnos))
        o.progress(dict(state))
    runs = {s.vbucket: s.run for s in summaries}
    for s in sorted(summaries, key=lambda x: x.vbucket):
        _log_vbucket(rl, s.entry, s.run)
    _log_compressed(rl, opts, runs)
    manifest = writer.commit([s.entry for s in summaries],
                             extra={**(o.extra or {}), "node": opts.address,
                                    "resumed": resumed},
                             unchanged=unchanged)
    return manifest, kept, streamed, spark_seconds, state


def _run_backup_tasks(rl: RunLog, archive: Archive, opts: Any, node: _NodeState, writer: Any,
                      resumed: bool, plan: dict[int, VBucketPlan], filters: tuple[Any, Any],
                      state: dict[str, Any], summaries: list[VBucketSummary],
                      o: BackupOptions) -> float:
    """The Spark tasks of the backup, their summaries added to `summaries`; returns the
    seconds Spark took to start."""
    if o.progress is not None:
        o.progress(dict(state))
    ts = time.monotonic()
    spark = o.spark or get_task_context(o.master)  # RDD jobs: no session needed
    spark_seconds = time.monotonic() - ts
    n = o.partitions or 2 * default_parallelism(spark)
    groups = plan_groups(list(plan), n)
    rl.info("spark %s: %d tasks (started in %.1f s)", context_of(spark).master,
            len(groups), spark_seconds)
    try:
        check_executors_see(spark, str(archive.path), write=True,  # before streaming
                            key_travels=archive.key is not None)
    except DcptoolError:
        if not resumed:  # nothing streamed: the backup this run began goes again
            storage.remove_tree(archive.backup_dir(writer.id))
        raise
    sfilter, cfilter = filters
    tasks = [BackupTask(opts, archive, writer.id, writer.parent,
                        tuple(plan[vb] for vb in g), f"dcptool-backup:{writer.id}:{i}",
                        cluster=node.members is not None, stream_filter=sfilter,
                        client_filter=cfilter)
             for i, g in enumerate(groups)]
    stop = threading.Event()
    watcher = None
    if o.progress is not None:
        state["phase"] = "streaming"
        o.progress(dict(state))
        watcher = threading.Thread(target=_progress_watch,
                                   args=(writer.progress(), writer.dir,
                                         {**state}, o.progress, stop), daemon=True)
        watcher.start()
    try:
        results = run_tasks(spark, reporting_failures(backup_task), tasks)
    except Exception as exc:  # a task failed: keep the partial backup for a resume
        raise task_failure(exc, "backup task", "the partial backup is kept; rerun the "
                           "backup to resume it") from None
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(timeout=2)
    for r in results:
        summaries.extend(r)
    return spark_seconds


def _backup_result(archive: Archive, writer: Any, resumed: bool, manifest: dict[str, Any],
                   kept: dict[int, Any], unchanged: set[int], streamed: int,
                   spark_seconds: float) -> BackupResult:
    """The result of a committed backup, from its manifest."""
    result = BackupResult(writer.id, writer.type, resumed,
                          len(manifest["vbuckets"]) + len(unchanged),
                          kept_vbuckets=len(kept), unchanged_vbuckets=len(unchanged),
                          spark_seconds=spark_seconds,
                          items_streamed=streamed,
                          size_on_disk=dir_size(archive.backup_dir(writer.id)),
                          data=manifest.get("data"),
                          collections=None if manifest.get("collections") is None else
                          Manifest.from_json(manifest["collections"]).num_collections)
    for e in manifest["vbuckets"]:
        result.system_events += e["counts"].get("system_events", 0)
        c = e["counts"]
        result.mutations += c["mutations"]
        result.deletions += c["deletions"]
        result.expirations += c["expirations"]
        result.rollbacks += c["rollbacks"]
        result.bytes += e["bytes"]["files"]
        result.value_bytes += e["bytes"]["values"]
        for r in e.get("rollbacks", []):
            result.rollback_details.append({"vbucket": e["vbucket"], **r})
    return result


def _register_watermark(rl: RunLog, opts: Any, archive: Archive,
                        members: dict[str, list[int]] | None,
                        o: BackupOptions) -> dict[str, Any]:
    """The archive's watermark registered on the node (on a cluster: on each active node
    for its own vbuckets)."""
    def tell(msg: str) -> None:
        _tell(rl, o, msg)

    if members is None:
        wm = register_archive_watermark(opts, archive, ttl=o.watermark_ttl, notice=tell)
    else:
        wm = register_on_cluster(opts, archive, members, o.watermark_ttl, tell)
    if wm["registered"]:
        rl.info("registered high watermark %s/%s for %d vbuckets (ttl %.0f s)",
                wm["name"], wm["instance"], wm["vbuckets"], o.watermark_ttl)
    return wm


def unchanged_vbuckets(archive: Archive, parent_id: str | None, seqnos: dict[int, int],
                       logs: dict[int, Any]) -> set[int]:
    """The vbuckets an incremental backup from `parent_id` has nothing to stream for: the
    chain ended at the node's high seqno, on a snapshot boundary, and the node's failover
    log is the one the chain recorded (no new history branch, no rollback to record)."""
    if parent_id is None:
        return set()
    ends = archive.end_positions(parent_id)
    recorded = archive.failover_logs(parent_id)
    out = set()
    for vb, high in seqnos.items():
        end = ends.get(vb)
        if end is None or int(end.seqno) != int(high) or int(end.snap_end) > int(end.seqno):
            continue
        mine = [(int(u), int(s)) for u, s in recorded.get(vb) or ()]
        theirs = [(int(u), int(s)) for u, s in logs.get(vb) or ()]
        if mine and mine == theirs:
            out.add(vb)
    return out


def shares_history(archive_logs: dict[int, list], node_logs: dict[int, Any]) -> bool | None:
    """Whether the node's vbuckets continue the archive's: True when a vbucket both know
    has a failover-log uuid in common (a vbucket uuid is a random 64-bit number, new for
    every history branch), False when none does, None when they share no vbucket."""
    common = [vb for vb in node_logs if archive_logs.get(vb)]
    if not common:
        return None
    for vb in common:
        theirs = {int(u) for u, _s in node_logs[vb] or ()}
        if any(int(u) in theirs for u, _s in archive_logs[vb]):
            return True
    return False


class AnotherBucketError(UsageError):
    """The node's bucket of the archive's name is another bucket (dropped and created
    again, another cluster's): an incremental backup cannot continue the archive."""


def _check_same_bucket(rl: RunLog, archive: Archive, opts, node_uuid: str | None,
                       node_logs: dict, recorded: str | None, parent_id: str | None, *,
                       partial: str | None = None) -> None:
    """Refuse (UsageError) to continue an archive's chain from another bucket: one that
    has another bucket uuid (deleted and created again, another cluster) and whose vbucket
    histories do not continue the archive's. An incremental backup of it would roll every
    vbucket back. A uuid that differs while the histories continue (the members of a
    cluster of reference nodes each give a uuid of their own) is the same data."""
    history = (shares_history(archive.failover_logs(parent_id), node_logs)
               if parent_id is not None else None)
    if recorded is not None and node_uuid is not None:
        if recorded == node_uuid:
            return
        if history is True:
            rl.info("bucket uuid %s differs from the %s the archive recorded, but the "
                     "node's vbuckets continue the archive's history: the same data",
                     node_uuid, recorded)
            return
    elif history is not False:  # nothing recorded to compare: the histories decide
        return
    held = f"uuid {recorded}" if recorded else "uuid not recorded"
    what = (f"partial backup {partial}" if partial else f"backup {parent_id}")
    serves = f"uuid {node_uuid}" if node_uuid else "no uuid given"
    why = "" if history is None else "; no vbucket continues the archive's history"
    if partial is not None:
        raise UsageError(
            f"archive {archive.path} holds bucket '{archive.bucket}' ({held}) as of {what}, "
            f"but {opts.address} serves bucket '{opts.bucket}' ({serves}): another "
            f"bucket{why}; the partial backup cannot be resumed from it",
            hint="--purge-partial discards the partial backup (then --full starts a new full "
                 "backup of this bucket in the same archive), or use another archive directory")
    raise AnotherBucketError(
        f"archive {archive.path} holds bucket '{archive.bucket}' ({held}) as of {what}, "
        f"but {opts.address} serves bucket '{opts.bucket}' ({serves}): another bucket{why}; "
        "an incremental backup cannot continue the archive",
        hint="add --full to start a new full backup of this bucket in the same archive on "
             "purpose, or use another archive directory")


def register_on_cluster(opts, archive: Archive, groups: dict[str, list[int]], ttl: float,
                         notice: Callable[[str], None]) -> dict[str, Any]:
    """The archive's watermark registered on each active node for its own vbuckets."""
    parts = [register_archive_watermark(node_opts(opts, node), archive,
                                        ttl=ttl, notice=notice, vbuckets=vbs)
             for node, vbs in sorted(groups.items())]
    first = parts[0]
    expiries = [p["expires_at"] for p in parts if p["expires_at"] is not None]
    behind: dict = {}
    for p in parts:
        behind.update(p["behind_purge_seqno"])
    return {"name": first["name"], "instance": first["instance"],
            "registered": all(p["registered"] for p in parts),
            "vbuckets": sum(p["vbuckets"] for p in parts),
            "expires_at": min(expiries) if expiries else None,
            "behind_purge_seqno": behind,
            "note": "; ".join(p["note"] for p in parts if p["note"]) or None,
            "nodes": sorted(groups)}
