"""`remove` and `prune`: take backups out of an archive, merging forward what kept backups
depend on (the archive decides everything: dcptool.archive.retention; the merges' vbuckets
are written as Spark tasks, as `merge` writes them)."""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from typing import Any, Iterable

from dcptool.archive import Archive
from dcptool.archive.retention import (
    Policy,
    RemovalResult,
    older_than,
    parse_duration,
    remove_archive_backups,
    select_prune,
    within_newest,
)
from dcptool.errors import UsageError
from dcptool.runlog import RunLog

from .merge import SparkMerger


def _result(archive: Archive, res: RemovalResult, dry_run: bool, seconds: float,
            log: str | None, **selection: Any) -> dict[str, Any]:
    plan = res.plan
    types = {r["id"]: r["type"] for r in res.rows}
    return {
        "archive": str(archive.path), "dry_run": dry_run, **selection,
        "backups": res.rows, "kept": plan.keep, "removed": plan.remove,
        "deleted": plan.delete if dry_run else res.deleted,
        "merges": [{"replaced": rng, "kept": kept, "merged_id": None,
                    "type": types[rng[0]] if types[rng[0]] == "full" else "incremental"}
                   for _, kept, rng in plan.merges] if dry_run else res.merges,
        "renamed": res.renamed, "finished_earlier": res.finished_earlier,
        "seconds": round(seconds, 3), "log": log,
    }


def run_removal(command: str, archive_path: Any, select, *, dry_run: bool, strict: bool,
                partitions: int | None, master: str | None, level: int | None, spark,
                selection: dict[str, Any]) -> dict[str, Any]:
    """One `prune` or `remove` (`command`) of one bucket archive: the backups `select(archive)`
    names removed under its lock, merged forward where kept ones depend on them."""
    t0 = time.monotonic()
    archive = Archive.opened(archive_path)
    with RunLog(command) as rl:
        if not dry_run:
            rl.attach(archive.path.absolute())
        rl.info("%s of %s%s (pid %d): %s", command, archive.path, " (dry run)" if dry_run else "",
                os.getpid(), selection)
        # a dry run only reads, as info does: it takes no lock
        with nullcontext() if dry_run else archive.lock(command):
            remove, reasons = select(archive)
            merger = SparkMerger(rl, archive, spark, master, partitions)
            res = remove_archive_backups(
                archive, remove, reasons=reasons, dry_run=dry_run, strict=strict,
                run_vbuckets=merger, level=level, log=rl,
                on_plan=lambda p: merger.prepare() if p.merges else None)
        if not dry_run:
            rl.info("%s: kept %d backups, deleted %s, merged %s; renamed %s", command,
                    len(res.plan.keep), ", ".join(res.deleted) or "nothing",
                    "; ".join(f"{', '.join(m['replaced'])} into {m['merged_id']}"
                              for m in res.merges) or "nothing",
                    res.renamed or "nothing")
    return _result(archive, res, dry_run, time.monotonic() - t0,
                   str(rl.path) if rl.path and not dry_run else None, **selection)


def run_prune(archive_path: Any, policy: Policy, *, dry_run: bool = False,
              partitions: int | None = None, master: str | None = None,
              level: int | None = None, spark=None) -> dict[str, Any]:
    """Remove every backup `policy` does not keep; the result as `prune --json` prints it."""
    if policy.empty:
        raise UsageError("prune needs a policy: give at least one --keep-* option",
                         hint="e.g. --keep-last 3 --keep-daily 7")

    return run_removal("prune", archive_path, lambda archive: select_prune(archive, policy),
                dry_run=dry_run, strict=False, partitions=partitions, master=master,
                level=level, spark=spark, selection={"policy": policy.as_dict()})


def run_remove(archive_path: Any, backups: Iterable[str] = (), *, older: str | None = None,
               dry_run: bool = False, partitions: int | None = None,
               master: str | None = None, level: int | None = None,
               spark=None, keep_within: str | None = None) -> dict[str, Any]:
    """Remove the named backups, or those older than a duration ('30d'); the result as
    `remove --json` prints it. `keep_within` ('7d'): never the backups within that
    duration of the newest (naming one is an error)."""
    backups = list(backups)
    if bool(backups) == (older is not None):
        raise UsageError("give --backup ID (one or more) or --older-than DURATION",
                         hint="e.g. dcptool remove ARCHIVE --older-than 30d")
    age = parse_duration(older) if older is not None else None

    def select(archive: Archive):
        ids = archive.committed_ids()
        kept = within_newest(ids, keep_within) if keep_within else set()
        if age is None:
            for b in backups:
                if b not in ids:
                    archive.manifest(b)  # raises: missing or partial
                if b in kept:
                    raise UsageError(f"backup {b} is within {keep_within} of the newest "
                                     "backup (--keep-within)")
            return backups, None
        # the newest backup is never removed (see dcptool.archive.retention)
        return [b for b in older_than(ids, age) if b != ids[-1] and b not in kept], None

    return run_removal("remove", archive_path, select, dry_run=dry_run, strict=age is None,
                partitions=partitions, master=master, level=level, spark=spark,
                selection={"selection": {"backups": backups, "older_than": older,
                                         **({"keep_within": keep_within}
                                            if keep_within else {})}})
