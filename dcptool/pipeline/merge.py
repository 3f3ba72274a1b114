"""The merge job: fold a range of backups of one chain into one backup, as a Spark job.

The archive decides and checks everything (dcptool.archive.merging: the plan, the staging
directory, the commit and verification, the publication, the removal of the originals;
committed manifests are never edited). This module only schedules: it ships each group of
vbuckets' plans to a task, brings the summaries back and logs the run.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from typing import Any

from dcptool.archive import Archive
from dcptool.archive.format import entries_records
from dcptool.archive.info import dir_size
from dcptool.archive.merging import (
    MergeTarget,
    VBucketMergePlan,
    VBucketRunner,
    finish_interrupted_merges,
    merge_range,
    merge_vbuckets,
)
from dcptool.runlog import RunLog

from . import progress
from .runtime import (check_executors_see, default_parallelism, engine_available,
                      get_context, plan_groups, run_tasks)
from .tasks import reporting_failures, task_failure


@dataclass
class MergeResult:
    merged_id: str
    type: str
    parent: str | None
    replaced: list[str]
    relinked: list[str]
    vbuckets: int
    records_before: int = 0
    items_before: int = 0
    mutations: int = 0
    deletions: int = 0
    expirations: int = 0
    rollbacks: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    #: the bytes of the backups' files (what `info` shows), of the backups replaced and of
    #: the merged backup (bytes_before/bytes_after: of their data files only)
    size_before: int = 0
    size_after: int = 0
    seconds: float = 0.0
    finished_earlier: list[str] = field(default_factory=list)
    log: str | None = None

    @property
    def items_after(self) -> int:
        return self.mutations + self.deletions + self.expirations

    def as_dict(self) -> dict[str, Any]:
        return {
            "merged_id": self.merged_id, "type": self.type, "parent": self.parent,
            "replaced": self.replaced, "relinked": self.relinked, "vbuckets": self.vbuckets,
            "items_before": self.items_before, "items_after": self.items_after,
            "mutations": self.mutations, "deletions": self.deletions,
            "expirations": self.expirations, "rollbacks": self.rollbacks,
            "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
            "size_before": self.size_before, "size_after": self.size_after,
            "seconds": round(self.seconds, 3), "finished_earlier": self.finished_earlier,
            "log": self.log,
        }


@dataclass(frozen=True, slots=True)
class MergeTask:
    """One Spark task of a merge: where to write, and the plans of its vbuckets."""

    target: MergeTarget
    plans: tuple[VBucketMergePlan, ...]


def plan_records(plan: VBucketMergePlan) -> int:
    """The records a merged vbucket is made from (its parts' manifest counts): what the
    progress bar of a merge counts."""
    return entries_records(e for _bdir, e in plan.parts)


def merge_task(task: MergeTask) -> list[dict[str, Any]]:
    # no reference cycles are made here: pausing the cyclic collector saves its passes
    # over the millions of record tuples a resolution holds
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if not progress.counted():
            return merge_vbuckets(task.target, task.plans)
        return merge_vbuckets(task.target, task.plans,
                              lambda p: progress.add(plan_records(p)))
    finally:
        if was_enabled:
            gc.enable()


# -- the driver ----------------------------------------------------------------------------------


class SparkMerger:
    """A `VBucketRunner` that writes the merged vbuckets of `archive` as Spark tasks (the
    context is made on first use: a merge with no vbucket needs none). Before the first
    tasks, the executors are checked to reach the archive (see
    `runtime.check_executors_see`); `prepare()` makes that check before the archive
    changes when the tasks will run on a dcptool engine, whose executors have the
    environment (an object store's credentials) the engine was started with."""

    def __init__(self, rl: RunLog, archive: Archive, spark=None, master: str | None = None,
                 partitions: int | None = None) -> None:
        self.rl, self.archive, self.spark = rl, archive, spark
        self.master, self.partitions = master, partitions
        self._checked = None  # the context the check passed on

    def _context(self):
        sc = self.spark or get_context(self.master)  # RDD jobs: no session needed
        if self._checked is not sc:
            check_executors_see(sc, str(self.archive.path), write=True,
                                key_travels=self.archive.key is not None)
            self._checked = sc
        return sc

    def prepare(self) -> None:
        """The check, now, when the merges will run on an engine (attaching costs next to
        nothing; a Spark of the command's own is started, and checked, at first use)."""
        if self.spark is None and engine_available(self.master):
            self._context()

    def __call__(self, target: MergeTarget, plans: list[VBucketMergePlan]
                 ) -> list[dict[str, Any]]:
        sc = self._context()
        n = self.partitions or 2 * default_parallelism(sc)
        by_vb = {p.vbucket: p for p in plans}
        tasks = [MergeTask(target, tuple(by_vb[vb] for vb in g))
                 for g in plan_groups(sorted(by_vb), n)]
        try:
            results = run_tasks(sc, reporting_failures(merge_task), tasks,
                                total=sum(plan_records(p) for p in plans),
                                near=target.archive.path)
        except Exception as exc:
            raise task_failure(exc, "merge task",
                               "the archive is unchanged; the merge can be rerun") from None
        summaries: list[dict[str, Any]] = []
        for r in results:
            summaries.extend(r)
        for sm in summaries:
            c = sm["counts"]
            self.rl.info("vbucket %s: %d mutations, %d deletions, %d expirations, %d rollback "
                         "records, %d bytes", sm["vbucket"], c["mutations"], c["deletions"],
                         c["expirations"], c["rollbacks"], sm["bytes"]["files"])
        return summaries


def run_merge(archive_path: str | os.PathLike[str], **kwargs: Any) -> MergeResult:
    """Merge the backups `first`..`last` (default: the whole chain of the newest backup).

    Keyword arguments: first, last, partitions, master, level, spark, history (keep every
    version of the range, as a continuous backup's rotation does). The run is logged to
    `ARCHIVE/logs/merge-*.log`.
    """
    with RunLog("merge") as rl:
        result = _run_merge(rl, archive_path, **kwargs)
        rl.info("merged %d backups (%s) into %s (%s, parent %s) in %.2f s: %d items before, %d "
                "after (%d mutations, %d deletions, %d expirations, %d rollback records), %d -> %d "
                "bytes; re-linked %s", len(result.replaced), ", ".join(result.replaced),
                result.merged_id, result.type, result.parent, result.seconds, result.items_before,
                result.items_after, result.mutations, result.deletions, result.expirations,
                result.rollbacks, result.bytes_before, result.bytes_after,
                ", ".join(result.relinked) or "nothing")
    result.log = str(rl.path) if rl.path else None
    return result


def _run_merge(rl: RunLog, archive_path: str | os.PathLike[str], *, first: str | None = None,
               last: str | None = None, partitions: int | None = None,
               master: str | None = None, level: int | None = None, spark=None,
               history: bool = False) -> MergeResult:
    t0 = time.monotonic()
    archive = Archive.opened(archive_path)
    rl.attach(archive.path.absolute())
    rl.info("merge of %s (range %s..%s) (pid %d)", archive.path, first or "start of chain",
            last or "newest", os.getpid())
    lock = archive.lock("merge").acquire()
    try:
        done_before = finish_interrupted_merges(archive)
        # the backups' sizes before the merge removes the ones it replaces
        sizes = {b: dir_size(archive.backup_dir(b)) for b in archive.committed_ids()}
        merger = SparkMerger(rl, archive, spark, master, partitions)
        plan, manifest = merge_range(archive, first, last, level=level, history=history,
                                     run_vbuckets=merger,
                                     on_plan=lambda p: merger.prepare() if p.vbuckets else None)
        result = MergeResult(plan.merged_id, plan.type, plan.parent, list(plan.replaced), [],
                             len(plan.vbuckets), records_before=plan.records_before,
                             items_before=plan.items_before, bytes_before=plan.bytes_before,
                             finished_earlier=done_before)
        # the backups that named the last original as parent now continue from the merged
        # one (their manifests are unchanged: the merged manifest names what it replaces)
        result.relinked.extend(plan.children)
        t = manifest["totals"]
        result.mutations, result.deletions = t["mutations"], t["deletions"]
        result.expirations, result.rollbacks = t["expirations"], t["rollbacks"]
        result.bytes_after = t["file_bytes"]
        result.size_before = sum(sizes.get(b, 0) for b in plan.replaced)
        result.size_after = dir_size(archive.backup_dir(plan.merged_id))
    finally:
        lock.release()
    result.seconds = time.monotonic() - t0
    return result
