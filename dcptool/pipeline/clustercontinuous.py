"""`dcptool backup --continuous` of a cluster archive: every bucket, one checkpoint loop.

One process, one SparkContext, one `ContinuousBackup` (continuous.py) per bucket, each
checkpointing into its bucket archive ARCHIVE/buckets/NAME exactly as a continuous backup of
that one bucket does: the same plan, rollbacks, resume of a partial backup, commit, idle
checkpoints, watermark renewal, its own status file (for `info` and point-in-time reads)
and its own rotation. At every `checkpoint` interval a round checkpoints each bucket in
turn (by name), then

- commits the cluster's record of the round (`runs/RUN-ID.json`, as a cluster backup
  run's: each bucket's newest backup, its settings, scopes and collections, the users
  and groups) when any bucket's newest backup or the recorded metadata changed; the
  record it wrote before is deleted then (it named checkpoints the rotations fold away),
  as is, at the start, the newest run when an earlier continuous backup wrote it (and it
  names no bucket this one leaves out), so
  `runs/` keeps one record of a continuous backup, its newest: a restore of the newest
  run restores the last round; a batch cluster backup's runs are never touched. Settings
  come from the bucket listing each round reads; scopes, collections, users and groups
  are read again at most every METADATA_REFRESH seconds and at every rotation;
- then rotates the buckets whose segment is due (after the record named their newest
  checkpoint: the merged backup ends with it, so the record resolves to it);
- rewrites ARCHIVE/continuous.json (the run, and each bucket's last checkpoint and lag:
  what `dcptool info` shows).

A bucket whose checkpoint fails (its archive locked, the node unreachable, a bucket named
with -b missing) is one line and a retry with its own backoff; the others go on. The
buckets are those a cluster backup takes (the user may back them up, the selection leaves
them in); without a selection naming buckets the listing is read every round, so a
bucket created on the node while the run goes is picked up (its first checkpoint a full
backup) and one dropped is reported once and left (its backups kept) as a cluster backup
does; one dropped and created again starts a new full backup in its archive.

Why rounds and not a Structured Streaming query as a bucket's continuous backup runs
(continuous.py): a micro-batch is the offset range of one source with a fixed set of
options, and it returns to Spark only when its range is committed. The rounds are per
bucket: each bucket fails, backs off and retries on its own while the others commit, and
the set of buckets (each its own archive) changes while the run goes. In one query a
bucket that fails would hold up every other bucket's checkpoints until it commits (or
its range would be dropped from a batch Spark then counts as done), and the source would
have to list the node's buckets over REST in its runner process each trigger. So the
cluster loop stays a loop on the same SparkContext; each bucket's checkpoint is the same
`ContinuousBackup.checkpoint` (the same run_backup, writers and commit, the archive the
only truth) that a bucket's micro-batch runs.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from typing import Any, Callable

from dcptool.archive import storage
from dcptool.archive.format import iso_time, utc_now
from dcptool.errors import DcptoolError

from .continuous import (
    BACKOFF_FIRST, BACKOFF_MAX, ContinuousBackup, ContinuousOptions, ItemRate, check_alone,
    one_line, status_path,
)

#: scopes, collections, users and groups are read again at most this often (and at rotations)
METADATA_REFRESH = 60.0


def _bucket_failure(exc: BaseException) -> bool:
    """Whether `exc` is one bucket's failure (retried) rather than the run's (a bug)."""
    return isinstance(exc, (DcptoolError, OSError, ConnectionError, TimeoutError, EOFError))


@dataclasses.dataclass
class _Bucket:
    name: str
    cb: ContinuousBackup
    due: float = 0.0
    backoff: float = 0.0
    streak: int = 0
    lag: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"seconds": None, "items": None})
    last: dict[str, Any] | None = None
    failed_last: str | None = None


class ClusterContinuous:
    """The loop over a cluster archive's buckets; `run()` returns the run's summary."""

    def __init__(self, opts: Any, location: str, o: ContinuousOptions, *,
                 passphrase: Any = None, new_passphrase: str | None = None,
                 buckets: list[str] | None = None, bucket_config: bool = True,
                 users: bool = True, rest_port: int | None = None, spark: Any = None,
                 master: str | None = None,
                 on_buckets: Callable[[list[str]], None] | None = None):
        from .clusterbackup import data_names, named_buckets

        self.opts, self.o = opts, o
        self.location = location
        self.passphrase, self.new_passphrase = passphrase, new_passphrase
        self.include = data_names(o.backup.get("include_data"))
        self.exclude = data_names(o.backup.get("exclude_data"))
        self.named = named_buckets(buckets, self.include)
        self.bucket_config, self.users = bucket_config, users
        self.rest_port = rest_port
        self.spark, self.master = spark, master
        self.on_buckets = on_buckets
        self.started = time.time()
        self.started_iso = iso_time(utc_now())
        self.buckets: dict[str, _Bucket] = {}
        self.dropped: list[str] = []
        self.left_out: list[str] = []
        self.rounds = 0
        self.cluster: Any = None
        self.rest: Any = None
        self.listed: dict[str, dict[str, Any]] = {}
        self.meta: dict[str, Any] = {"scopes": {}, "rbac": None}
        self.meta_read = 0.0
        #: the run record this continuous backup wrote last (replaced by the next one)
        self.run_id: str | None = None
        self.run_named: dict[str, Any] | None = None
        self.rate = ItemRate()

    # -- buckets -----------------------------------------------------------------------

    def notice(self, msg: str) -> None:
        if self.o.notice is not None:
            self.o.notice(msg)

    def _child_options(self, name: str) -> ContinuousOptions:
        from .clusterbackup import names_of_bucket

        backup = {k: v for k, v in self.o.backup.items()
                  if k not in ("include_data", "exclude_data", "passphrase")}
        backup["include_data"] = names_of_bucket(self.include, name)
        backup["exclude_data"] = names_of_bucket(self.exclude, name)
        backup["passphrase"] = self.cluster.passphrase
        return ContinuousOptions(checkpoint=self.o.checkpoint, rotate=self.o.rotate,
                                 rotate_size=self.o.rotate_size, stop=self.o.stop,
                                 notice=lambda msg, n=name: self.notice(f"bucket {n}: {msg}"),
                                 backup=backup)

    def _add(self, name: str) -> None:
        check_alone(self.cluster.bucket_path(name))
        cb = ContinuousBackup(dataclasses.replace(self.opts, bucket=name),
                              self.cluster.bucket_path(name), self._child_options(name),
                              spark=self.spark, master=self.master)
        cb.rotate_inline = False
        cb.settle_segment()
        self.buckets[name] = _Bucket(name, cb)
        if name in self.dropped:
            self.dropped.remove(name)

    def _list(self) -> dict[str, dict[str, Any]] | None:
        """The node's buckets as the selection leaves them in (None: the node cannot be
        asked now; each bucket's checkpoint says what is wrong)."""
        from .clusterbackup import node_buckets, selected

        try:
            listed = node_buckets(self.rest)
        except DcptoolError:
            if not self.buckets:
                raise
            return None
        self.listed = listed
        if self.named:  # named buckets are checkpointed (and retried) whatever the listing
            return {n: listed.get(n, {}) for n in self.named if n not in self.exclude}
        return selected(self.opts, listed, None, self.exclude)

    def _refresh(self, first: bool = False) -> bool:
        """Pick up the buckets new on the node and let go of the dropped ones (as a cluster
        backup does), at the start and then every round; whether the set changed."""
        from .clusterbackup import left_out_for_privileges, selected

        if first and self.named:  # a named bucket the node lacks: one line, no work
            selected(self.opts, self._list_raw(), self.named, self.exclude)
        want = self._list()
        if want is None:
            return False
        changed = False
        if not self.named:
            for name in sorted(set(self.buckets) - set(want)):
                b = self.buckets.pop(name)
                b.cb.write_status("stopped", b.lag)
                self.dropped.append(name)
                changed = True
                self.notice(f"bucket {name} is no longer on {self.opts.address}: its "
                            "backups are kept, its checkpoints stop (it is backed up again "
                            "if it comes back)")
            if first:
                for name in self.cluster.bucket_names():
                    if name not in want:
                        self.dropped.append(name)
                        self.notice(f"bucket {name} is in the archive but not on "
                                    f"{self.opts.address}: its backups are kept")
        new = {n: d for n, d in want.items()
               if n not in self.buckets and n not in self.left_out}
        if new and (first or not self.named):
            # before any data moves: a bucket the user may not back up is left out (named:
            # refused in one line)
            self.left_out += left_out_for_privileges(
                self.opts, new, named=bool(self.named),
                watermark=self.o.backup.get("watermark", True), tell=self.notice)
        for name in sorted(new):
            if not first:
                self.notice(f"bucket {name} is new on {self.opts.address}: backed up from "
                            "now on")
            self._add(name)
            changed = True
        if first and not self.buckets:
            from dcptool.errors import UsageError

            raise UsageError(f"{self.opts.address} has no bucket {self.opts.username} may "
                             "back up" + (" that the selection leaves in"
                                          if self.exclude else ""))
        if changed and self.on_buckets is not None:
            self.on_buckets(sorted(self.buckets))
        return changed

    def _list_raw(self) -> dict[str, Any]:
        from .clusterbackup import node_buckets

        return node_buckets(self.rest)

    # -- the cluster's record and status -----------------------------------------------

    def _metadata(self, force: bool) -> None:
        """Scopes and collections of each bucket, users and groups: read again when due."""
        from .clusterbackup import read_rbac, read_scopes

        if not force and time.monotonic() - self.meta_read < METADATA_REFRESH:
            return
        if self.bucket_config:
            for name in self.buckets:
                if name in self.listed:
                    self.meta["scopes"][name] = read_scopes(self.rest, name)
        if self.users:
            self.meta["rbac"] = read_rbac(self.opts, self.rest)
        self.meta_read = time.monotonic()

    def _record(self) -> dict[str, Any] | None:
        """The run record of the archive as it is now (None: no bucket has a backup)."""
        from .clusterbackup import rbac_fields, settings_of

        record: dict[str, Any] = {"time": iso_time(utc_now()), "node": self.opts.address,
                                  "buckets": {},
                                  "continuous": {"since": self.started_iso,
                                                 "pid": os.getpid(),
                                                 "host": socket.gethostname()}}
        for name, b in sorted(self.buckets.items()):
            a = b.cb.archive_or_none()
            latest = a.latest_id() if a is not None else None
            if latest is None:
                continue
            doc = self.listed.get(name) or {}
            entry: dict[str, Any] = {"backup": latest, "uuid": doc.get("uuid"),
                                     "status": a.manifest(latest).get("type", "incremental")}
            if self.bucket_config and doc:
                entry["settings"] = settings_of(doc)
                if self.meta["scopes"].get(name) is not None:
                    entry["scopes"] = self.meta["scopes"][name]
            record["buckets"][name] = entry
        if not record["buckets"]:
            return None
        for name in self.dropped:
            record["buckets"].setdefault(name, {"status": "dropped"})
        if self.meta["rbac"] is not None:
            record.update(rbac_fields(self.meta["rbac"]))
        return record

    def _commit_record(self) -> None:
        """Write the round's run record when it differs from the last one, then delete
        that one; a lock held by another writer (a cluster backup, a prune) is one line
        and the next round tries again."""
        from dcptool.archive.clusterruns import delete_run
        from dcptool.archive.errors import ArchiveLockedError

        record = self._record()
        if record is None:
            return
        same = {k: v for k, v in record.items() if k != "time"}
        if same == self.run_named:
            return
        try:
            with self.cluster.lock("continuous backup"):
                run_id = self.cluster.new_run_id()
                self.cluster.write_run(run_id, record)
                if self.run_id is not None and self.run_id in self.cluster.run_ids():
                    delete_run(self.cluster, self.run_id)
        except ArchiveLockedError as exc:
            self.notice(f"the run record waits: {one_line(exc)}")
            return
        self.run_id, self.run_named = run_id, same

    def _previous_run(self) -> None:
        """The run record an earlier continuous backup of the archive wrote last, when it
        is the archive's newest run: this run replaces it (a later cluster backup's run,
        or an older one, is left alone)."""
        ids = self.cluster.run_ids()
        if not ids:
            return
        try:
            newest = self.cluster.run(ids[-1])
        except DcptoolError:
            return
        from dcptool.archive.clusterruns import named_backups

        # (not one naming a bucket this run leaves out: -b of one bucket keeps it)
        if (isinstance(newest.get("continuous"), dict)
                and set(named_backups(newest)) <= set(self.buckets)):
            self.run_id = ids[-1]

    def write_status(self, state: str) -> None:
        lags = {n: b.lag for n, b in self.buckets.items()}
        secs = [v["seconds"] for v in lags.values() if v.get("seconds") is not None]
        items = [v["items"] for v in lags.values()]
        last_ok = [b.cb.last_ok for b in self.buckets.values() if b.cb.last_ok]
        times = [b.last["time"] for b in self.buckets.values() if b.last]
        doc = {
            "state": state, "pid": os.getpid(), "host": socket.gethostname(),
            "since": self.started_iso, "updated": iso_time(utc_now()),
            "updated_epoch": time.time(), "checkpoint_seconds": self.o.checkpoint,
            "rotate_seconds": self.o.rotate, "rotate_bytes": self.o.rotate_size,
            "last_checkpoint": max(times) if times else None,
            "last_checkpoint_epoch": min(last_ok) if last_ok else None,
            "lag_seconds": max(secs) if secs else None,
            "items_behind": (None if any(i is None for i in items) else sum(items)),
            "failing": next((f"bucket {n}: {b.cb.failing}" for n, b in
                             sorted(self.buckets.items()) if b.cb.failing), None),
            "run": self.run_id, "dropped": list(self.dropped),
            "buckets": {n: {"last_checkpoint": (b.last or {}).get("time"),
                            "last_checkpoint_epoch": b.cb.last_ok,
                            "last_backup": b.cb.last_backup,
                            "lag_seconds": b.lag.get("seconds"),
                            "items_behind": b.lag.get("items"),
                            "failing": b.cb.failing}
                        for n, b in sorted(self.buckets.items())},
        }
        try:
            storage.atomic_write_bytes(status_path(self.cluster.path),
                                       json.dumps(doc).encode(), durable=False, mode=0o600)
        except (OSError, DcptoolError):
            pass

    # -- the loop ----------------------------------------------------------------------

    def _checkpoint(self, b: _Bucket, last: bool) -> dict[str, Any]:
        from .backup import AnotherBucketError

        try:
            return b.cb.checkpoint(last=last)
        except AnotherBucketError:
            b.cb.notice("dropped and created again since its last backup: a new full "
                        "backup of it")
            b.cb.o.backup["full"] = True
            try:
                return b.cb.checkpoint(last=last)
            finally:
                b.cb.o.backup.pop("full", None)

    def _round(self, stopping: bool, began: float) -> dict[str, dict[str, Any]]:
        """Checkpoint each bucket that is due (every one when `stopping`)."""
        done: dict[str, dict[str, Any]] = {}
        for name in sorted(self.buckets):
            b = self.buckets[name]
            if not stopping and b.due > time.monotonic() + 0.05:
                continue
            try:
                rec = self._checkpoint(b, stopping)
            except BaseException as exc:  # noqa: BLE001 - sorted below
                if not _bucket_failure(exc):
                    raise
                b.backoff = min(BACKOFF_MAX, max(BACKOFF_FIRST, b.backoff * 2))
                b.streak += 1
                b.lag = b.cb.failed(exc)
                if stopping:
                    b.failed_last = one_line(exc)
                    b.cb.notice(f"the last checkpoint failed: {one_line(exc)} (what it "
                                "wrote is kept; the next backup resumes it)")
                    continue
                b.cb.notice(f"checkpoint failed: {one_line(exc)}; retrying in "
                            f"{b.backoff:.0f} s (the lag grows, nothing is lost)")
                if self.o.on_retry is not None:
                    self.o.on_retry({"bucket": name, "error": b.cb.failing,
                                     "attempt": b.streak, "retry_in": b.backoff,
                                     "time": iso_time(utc_now()), "lag": {name: b.lag}})
                b.due = time.monotonic() + b.backoff
                continue
            if b.streak:
                b.cb.notice(f"checkpoint committed again after {b.streak} failed "
                            f"attempt{'s' if b.streak > 1 else ''}")
            b.backoff, b.streak = 0.0, 0
            b.cb.failing = None
            b.lag = rec["lag"][name]
            b.last = rec
            b.due = began + self.o.checkpoint
            done[name] = rec
        return done

    def _rotate(self, done: dict[str, dict[str, Any]]) -> bool:
        """Rotate the buckets whose segment is due; whether any did."""
        rotated = False
        for name in sorted(done):
            b = self.buckets.get(name)
            if b is None:
                continue
            try:
                r = b.cb.rotate()
            except BaseException as exc:  # noqa: BLE001 - the checkpoints are committed
                if not _bucket_failure(exc):
                    raise
                b.cb.notice(f"rotation failed: {one_line(exc)}; the next checkpoint "
                            "tries again")
                continue
            if r is not None:
                done[name]["rotated"] = r
                done[name]["segment_backups"] = 0
                done[name]["segment_bytes"] = 0
                rotated = True
        return rotated

    def _event(self, done: dict[str, dict[str, Any]], seconds: float) -> dict[str, Any]:
        items = sum(b.cb.items for b in self.buckets.values())
        rate = self.rate(items, time.time())
        per = {}
        for name, rec in sorted(done.items()):
            per[name] = {k: rec.get(k) for k in (
                "backup_id", "type", "items", "rollbacks", "files", "resumed", "rotated",
                "items_per_second", "segment_backups", "segment_bytes")}
        return {"checkpoint": self.rounds, "time": iso_time(utc_now()),
                "seconds": round(seconds, 3),
                "lag": {n: b.lag for n, b in sorted(self.buckets.items())},
                "buckets": per, "items_per_second": rate, "run": self.run_id,
                "failing": {n: b.cb.failing for n, b in sorted(self.buckets.items())
                            if b.cb.failing},
                "totals": self.totals()}

    def totals(self) -> dict[str, Any]:
        kids = [b.cb for b in self.buckets.values()]
        hours = max(time.time() - self.started, 1e-9) / 3600
        files = sum(c.files for c in kids)
        backups = sum(c.backups for c in kids)
        return {"checkpoints": self.rounds, "backups": backups,
                "idle": sum(c.idle for c in kids),
                "failures": sum(c.failures for c in kids),
                "rotations": sum(len(c.rotations) for c in kids),
                "items": sum(c.items for c in kids), "files": files,
                "files_per_hour": round(files / hours, 1),
                "backups_per_hour": round(backups / hours, 1),
                "seconds": round(time.time() - self.started, 3)}

    def run(self) -> dict[str, Any]:
        from dcptool.client.rest import rest_client_for

        from .clusterbackup import open_or_create

        o = self.o
        check_alone(self.location)
        self.cluster, _created = open_or_create(self.location, passphrase=self.passphrase,
                                                new_passphrase=self.new_passphrase)
        check_alone(self.cluster.path)
        if self.spark is None:
            from .runtime import get_context

            self.spark = get_context(self.master)
        self.rest = rest_client_for(self.opts, self.rest_port)
        self._refresh(first=True)
        self._previous_run()
        self._metadata(force=True)
        self.write_status("running")
        end = None if o.stop_after is None else time.monotonic() + o.stop_after
        try:
            while True:
                stopping = o.stop.is_set()
                if not stopping:
                    due = min((b.due for b in self.buckets.values()),
                              default=time.monotonic() + o.checkpoint)
                    o.stop.wait(max(0.0, (due if end is None else min(due, end))
                                    - time.monotonic()))
                    stopping = o.stop.is_set() or (end is not None
                                                   and time.monotonic() >= end)
                began = time.monotonic()
                try:
                    changed = self._refresh()
                except DcptoolError as exc:  # the buckets' checkpoints go on
                    self.notice(f"the node's buckets could not be listed: {one_line(exc)}")
                    changed = False
                done = self._round(stopping, began)
                if done:
                    self.rounds += 1
                rotating = any(b.cb.segment and b.cb.segment_began is not None
                               and (time.time() - b.cb.segment_began >= o.rotate
                                    or b.cb.segment_bytes >= o.rotate_size)
                               for n, b in self.buckets.items() if n in done)
                if done or changed or stopping:
                    try:
                        self._metadata(force=changed or rotating)
                        self._commit_record()
                    except DcptoolError as exc:
                        self.notice(f"the run record waits: {one_line(exc)}")
                if done and self._rotate(done):
                    self.write_status("running")
                self.write_status("running")
                if done and o.on_checkpoint is not None:
                    o.on_checkpoint(self._event(done, time.monotonic() - began))
                if stopping or (o.max_checkpoints is not None
                                and self.rounds >= o.max_checkpoints):
                    break
        except BaseException:
            self.write_status("stopped")
            for b in self.buckets.values():
                b.cb.write_status("stopped", b.lag)
            raise
        for b in self.buckets.values():
            b.cb.write_status("stopped", b.lag)
        self.write_status("stopped")
        failed = {n: b.failed_last for n, b in sorted(self.buckets.items()) if b.failed_last}
        if failed:
            name, why = next(iter(failed.items()))
            more = len(failed) - 1
            raise DcptoolError(
                f"the last checkpoint of bucket {name} failed: {why}"
                + (f" (and of {more} more bucket{'s' * (more > 1)})" if more else ""),
                hint="the other buckets' last checkpoints are committed; what the failed "
                     "one wrote is kept, the next backup of the archive resumes it")
        return self.summary()

    def summary(self) -> dict[str, Any]:
        return {"archive": str(self.cluster.path), "run": self.run_id,
                "buckets": {n: {"last_checkpoint": (b.last or {}).get("time"),
                                "last_backup": b.cb.last_backup,
                                "rotations": b.cb.rotations}
                            for n, b in sorted(self.buckets.items())},
                "dropped": list(self.dropped), "left_out": list(self.left_out),
                "totals": self.totals()}


def run_cluster_continuous(opts: Any, location: str, o: ContinuousOptions, **kw: Any
                           ) -> dict[str, Any]:
    """Run a continuous backup of every bucket of the node `opts` (or those `buckets`
    names) into the cluster archive at `location` until `o.stop` is set; the summary.
    `kw`: ClusterContinuous's keywords."""
    return ClusterContinuous(opts, location, o, **kw).run()
