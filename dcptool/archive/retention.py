"""Retention: which backups a policy keeps, and removing the others without breaking a chain.

Policies (`Policy`, the same rules as restic's `forget`). A backup's time is the UTC
timestamp of its id (`YYYYMMDDTHHMMSS.ffffffZ`: when it began; a merged backup's id is the
last original's plus a microsecond, so it keeps the original's place in time).

- keep-last N: the N newest backups.
- keep-hourly / keep-daily / keep-weekly / keep-monthly N: going from the newest backup
  back, the newest backup of each hour (day, ISO week, calendar month, in UTC) that has a
  backup, for the N newest such hours (days, weeks, months). Hours without a backup do not
  count.
- A backup is kept when any rule keeps it (the union); the newest backup is always kept.

Removing backups (`plan_removal`, `remove_archive_backups`). A backup nothing kept depends
on (no kept backup descends from it) is deleted. A backup that a kept later backup
depends on is merged forward: the removed backups between a kept backup and the kept
backup it descends from (or the start of its chain) are merged with it, as `merge` does
(`merging.merge_range`); the merged backup takes the kept backup's place (its id is the
kept backup's plus a microsecond; it is full when the range began with the full backup).
A removed backup that two kept backups on separate branches depend on is kept (it would
have to be merged into both).

The newest backup is never removed: its end is where the next incremental backup starts
and the position the archive's high watermark on the node protects; keeping it means a
removal never moves a watermark backwards.

Crash safety: every step leaves a restorable archive. Deletions go newest first (a
backup before the backup it continues from); each merge is published with one rename
before its originals are removed; a kill in between is finished by the next merge,
remove or prune (`merging.finish_interrupted_merges`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Mapping

from dcptool.errors import UsageError

from .archive import Archive
from .chain import effective_parents, merged_from
from .errors import ArchiveError
from .format import parse_backup_id, parse_duration, utc_now
from .merging import VBucketRunner, finish_interrupted_merges, merge_here, merge_range, \
    remove_backups

#: the time-bucket rules, in the order they are listed: (name, bucket of a UTC time)
BUCKETS: tuple[tuple[str, Any], ...] = (
    ("hourly", lambda t: t.strftime("%Y-%m-%d %H:00")),
    ("daily", lambda t: t.strftime("%Y-%m-%d")),
    ("weekly", lambda t: "%04d-W%02d" % t.isocalendar()[:2]),
    ("monthly", lambda t: t.strftime("%Y-%m")),
)


@dataclass(frozen=True)
class Policy:
    """How many backups each rule keeps (0: the rule is off); `within`: a duration ("7d",
    None: off) within which of the newest backup every backup is kept."""

    last: int = 0
    hourly: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0
    within: str | None = None

    def __post_init__(self) -> None:
        for k, v in self.as_dict().items():
            if k == "within":
                parse_duration(v, option="--keep-within")
            elif not isinstance(v, int) or v < 0:
                raise UsageError(f"--keep-{k} must be a count of 0 or more, not {v!r}")

    def as_dict(self) -> dict[str, Any]:
        """The rules; "within" (its duration) only when set."""
        d: dict[str, Any] = {"last": self.last, "hourly": self.hourly, "daily": self.daily,
                             "weekly": self.weekly, "monthly": self.monthly}
        if self.within:
            d["within"] = self.within
        return d

    @property
    def empty(self) -> bool:
        return not any(self.as_dict().values())


def backup_time(backup_id: str) -> datetime:
    """The time retention goes by: the UTC timestamp in the backup's id."""
    return parse_backup_id(backup_id)


def apply_policy(ids: Iterable[str], policy: Policy) -> dict[str, list[str]]:
    """{backup id: why the policy keeps it} for every id (an empty list: not kept),
    e.g. ["last", "daily 2026-11-22", "newest"]."""
    ordered = sorted(set(ids), reverse=True)
    reasons: dict[str, list[str]] = {b: [] for b in ordered}
    for bid in ordered[:policy.last]:
        reasons[bid].append("last")
    if policy.within:
        # restic's --keep-within: every backup within the duration of the newest one
        kept = within_newest(ordered, policy.within)
        for bid in ordered:
            if bid in kept:
                reasons[bid].append(f"within {policy.within}")
    for name, bucket in BUCKETS:
        n = getattr(policy, name)
        seen: str | None = None
        for bid in ordered:
            if n <= 0:
                break
            b = bucket(backup_time(bid))
            if b != seen:
                reasons[bid].append(f"{name} {b}")
                seen = b
                n -= 1
    if ordered:
        reasons[ordered[0]].append("newest")
    return reasons


def within_newest(ids: Iterable[str], within: str) -> set[str]:
    """The ids whose time is within the duration `within` ("7d") of the newest id's
    (restic's --keep-within)."""
    ordered = sorted(set(ids), reverse=True)
    if not ordered:
        return set()
    span = parse_duration(within, option="--keep-within")
    newest = backup_time(ordered[0])
    return {b for b in ordered if newest - backup_time(b) <= span}


def select_prune(archive: Archive, policy: Policy) -> tuple[list[str], dict[str, list[str]]]:
    """(the committed backups `policy` does not keep, {id: why kept})."""
    reasons = apply_policy(archive.committed_ids(), policy)
    return sorted(b for b, why in reasons.items() if not why), reasons


def older_than(ids: Iterable[str], age: timedelta, now: datetime | None = None) -> list[str]:
    """The ids whose time is more than `age` before `now`."""
    cutoff = (now or utc_now()) - age
    return sorted(b for b in ids if backup_time(b) < cutoff)


# -- planning ----------------------------------------------------------------------------------


@dataclass
class RemovalPlan:
    """How to remove backups (see the module doc). All ids are committed backups'."""

    keep: list[str]
    remove: list[str]
    #: removed outright: no kept backup depends on them (newest first)
    delete: list[str] = field(default_factory=list)
    #: (first, kept backup, the range first..kept oldest first): merged into one backup
    #: that takes the kept backup's place
    merges: list[tuple[str, str, list[str]]] = field(default_factory=list)
    #: asked to be removed but kept: {id: why}
    held: dict[str, str] = field(default_factory=dict)

    def action(self, bid: str) -> str:
        """keep | delete | merge (removed, merged into a kept backup) | merge-into (kept,
        takes the merged range's place)."""
        for _, last, rng in self.merges:
            if bid == last:
                return "merge-into"
            if bid in rng:
                return "merge"
        return "delete" if bid in self.delete else "keep"

    def merged_into(self, bid: str) -> str | None:
        """The kept backup a removed one is merged into (None for any other)."""
        for _, last, rng in self.merges:
            if bid in rng[:-1]:
                return last
        return None


def plan_removal(manifests: Mapping[str, dict[str, Any]], remove: Iterable[str]) -> RemovalPlan:
    """Plan the removal of `remove` from the committed backups `manifests` (by id).

    Raises UsageError when `remove` holds the newest backup or an id not among them."""
    ids = sorted(manifests)
    remove = set(remove)
    unknown = remove - set(ids)
    if unknown:
        raise UsageError(f"no committed backup {min(unknown)} in the archive",
                         hint="see 'dcptool info' for the backups it holds")
    if ids and ids[-1] in remove:
        raise UsageError(f"backup {ids[-1]} is the newest: it is never removed (the next "
                         "incremental backup and the node's high watermark go by its end)",
                         hint="remove older backups, or take a new backup first")
    parents = effective_parents(manifests)
    held: dict[str, str] = {}
    while True:
        keep = [b for b in ids if b not in remove]
        owners: dict[str, set[str]] = {b: set() for b in remove}
        segments: dict[str, list[str]] = {}
        for k in keep:
            seg = []
            p = parents[k]
            while p is not None and p in remove:
                seg.append(p)
                owners[p].add(k)
                p = parents[p]
            if seg:
                segments[k] = seg[::-1]
        shared = [b for b in remove if len(owners[b]) > 1]
        if not shared:
            break
        b = max(shared)  # the newest backup two kept branches share: keep it, plan again
        held[b] = ("kept: backups " + ", ".join(sorted(owners[b])) + " on separate "
                   "branches depend on it")
        remove.discard(b)
    delete = sorted((b for b in remove if not owners[b]), reverse=True)
    merges = [(seg[0], k, [*seg, k]) for k, seg in sorted(segments.items())]
    return RemovalPlan(keep, sorted(remove), delete, merges, held)


def preview(archive: Archive, remove: Iterable[str],
            reasons: Mapping[str, list[str]] | None = None) -> tuple[RemovalPlan, list[dict]]:
    """The plan and one row per committed backup, oldest first: {"id", "time", "type",
    "action", "reasons", "merged_into"} (what `prune --dry-run` and `info --keep-*` show)."""
    manifests = archive.manifests()
    plan = plan_removal(manifests, remove)
    rows = []
    for bid in sorted(manifests):
        why = list((reasons or {}).get(bid, []))
        if bid in plan.held:
            why.append(plan.held[bid])
        rows.append({"id": bid, "time": backup_time(bid).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                     "type": manifests[bid]["type"], "action": plan.action(bid),
                     "reasons": why, "merged_into": plan.merged_into(bid)})
    return plan, rows


# -- removing (archive lock held) -------------------------------------------------------------


@dataclass
class RemovalResult:
    plan: RemovalPlan
    rows: list[dict[str, Any]]
    deleted: list[str] = field(default_factory=list)
    #: {"replaced": [...], "kept": id, "merged_id": id, "type": full|incremental}
    merges: list[dict[str, Any]] = field(default_factory=list)
    finished_earlier: list[str] = field(default_factory=list)

    @property
    def renamed(self) -> dict[str, str]:
        return {m["kept"]: m["merged_id"] for m in self.merges}


def remove_archive_backups(archive: Archive, remove: Iterable[str], *,
                           reasons: Mapping[str, list[str]] | None = None,
                           dry_run: bool = False, strict: bool = False,
                           run_vbuckets: VBucketRunner = merge_here,
                           level: int | None = None, log: Any = None,
                           on_plan: Callable[[RemovalPlan], None] | None = None
                           ) -> RemovalResult:
    """Remove backups (see the module doc). The caller holds the archive lock (a dry run
    changes nothing and needs none). `strict`: refuse (UsageError) instead of
    keeping a backup that two kept branches depend on (an explicit `remove --backup`).
    `on_plan(plan)` runs once the removal is planned, before anything is deleted or
    merged (a check that may refuse it)."""
    finished = [] if dry_run else finish_interrupted_merges(archive)
    if not dry_run:
        partial = archive.partial_ids()
        if partial:
            raise UsageError(f"archive {archive.path} holds a partial backup {partial[-1]}",
                             hint="resume it with the next backup, or purge it with "
                                  "'dcptool backup --purge-partial', before removing backups")
    remove = list(remove)
    damaged = [b for b in remove if archive.is_damaged(b)]
    if damaged:
        return _remove_damaged(archive, remove, damaged, dry_run=dry_run, log=log,
                               finished=finished)
    plan, rows = preview(archive, remove, reasons)
    if strict and plan.held:
        bid, why = next(iter(sorted(plan.held.items())))
        raise UsageError(f"backup {bid} cannot be removed: {why.removeprefix('kept: ')}",
                         hint="remove one of those branches first")
    result = RemovalResult(plan, rows, finished_earlier=finished)
    if dry_run:
        return result
    if on_plan is not None:
        on_plan(plan)
    if plan.delete:
        if log is not None:
            log.info("deleting %d backups nothing kept depends on: %s", len(plan.delete),
                     ", ".join(plan.delete))
        remove_backups(archive, plan.delete)
        result.deleted = list(plan.delete)
    for first, kept, rng in plan.merges:
        if log is not None:
            log.info("merging %s into %s (%d backups)", ", ".join(rng[:-1]), kept, len(rng))
        mplan, manifest = merge_range(archive, first, kept, level=level,
                                      run_vbuckets=run_vbuckets, expect=rng)
        result.merges.append({"replaced": list(mplan.replaced), "kept": kept,
                              "merged_id": mplan.merged_id, "type": mplan.type})
    return result


def _remove_damaged(archive: Archive, remove: list[str], damaged: list[str], *,
                    dry_run: bool, log: Any, finished: list[str]) -> RemovalResult:
    """Delete backups whose manifest is damaged (see Archive.is_damaged), with nothing
    merged and nothing else touched. A damaged backup's own parent is unknown, but a backup
    that names it as parent (or as merged) cannot be restored without it: such backups
    must be named too, and go with it; any other backup named with a damaged one is
    refused (remove it on its own)."""
    gone = set(damaged)
    readable: dict[str, dict[str, Any]] = {}
    for bid in archive.committed_ids():
        if bid in gone:
            continue
        try:
            readable[bid] = archive.manifest(bid)
        except ArchiveError:
            continue  # another problem (verify names it); it is not this removal's
    # backups that continue from a damaged one (directly or through another such)
    depends: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for bid, m in readable.items():
            if bid in depends:
                continue
            links = [m.get("parent"), *(merged_from(m) or ())]
            hit = next((p for p in links if p in gone or p in depends), None)
            if hit is not None:
                depends[bid] = hit
                changed = True
    missing = sorted(b for b in depends if b not in remove)
    if missing:
        raise UsageError(f"backup {missing[0]} continues from damaged backup "
                         f"{depends[missing[0]]}: it cannot be restored without it",
                         hint="remove it too: add --backup " + " --backup ".join(missing))
    others = sorted(b for b in remove if b not in gone and b not in depends)
    if others:
        raise UsageError(f"backup {others[0]} is not damaged and does not depend on a damaged "
                         f"backup: remove the damaged backups {', '.join(sorted(damaged))} "
                         "on their own first")
    delete = sorted(set(remove), reverse=True)
    keep = sorted(b for b in archive.committed_ids() if b not in set(delete))
    rows = []
    for bid in sorted([*keep, *delete]):
        m = readable.get(bid)
        why = (["damaged manifest"] if bid in damaged else
               [f"continues from damaged backup {depends[bid]}"] if bid in depends else [])
        rows.append({"id": bid, "time": backup_time(bid).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                     "type": m["type"] if m else "damaged",
                     "action": "delete" if bid in delete else "keep",
                     "reasons": why, "merged_into": None})
    plan = RemovalPlan(keep, sorted(delete), delete, [], {})
    result = RemovalResult(plan, rows, finished_earlier=finished)
    if dry_run:
        return result
    if log is not None:
        log.info("deleting damaged backups %s%s", ", ".join(sorted(damaged)),
                 f" and the backups that continue from them: {', '.join(sorted(depends))}"
                 if depends else "")
    remove_backups(archive, delete)
    result.deleted = delete
    return result


__all__ = ["Policy", "BUCKETS", "backup_time", "apply_policy", "select_prune", "parse_duration",
           "older_than", "RemovalPlan", "plan_removal", "preview", "RemovalResult", "remove_archive_backups"]
