"""Merging a range of backups of one chain into one backup: the archive's side.

The merged backup holds, per vbucket, the resolved state of the range (the newest surviving
version of each key, tombstones kept, dead branches dropped) inside the range's live
snapshot markers, from the first backup's start position to the last backup's end
position. So the chain through it restores exactly what the chain through the originals
restored, and an incremental backup taken after it starts where the last original ended.

System events (format 3: scopes and collections created and dropped) that survive the
cuts are kept in seqno order among the items, and the merged manifest carries the first
original's `"collections"` (the node's manifest when the range began) and `"data"`
filter, so names, drops and point-in-time restores read the same through it.

When the range does not start at a full backup and one of its backups recorded a rollback
below where the chain before the range ended, the merged backup keeps that rollback record
(the lowest one), so the older backups' records above it stay dead.

The lifecycle, all under the archive lock the caller holds:

1. `plan_merge`: the range, the merged backup's id, type and parent, one `VBucketMergePlan`
   per vbucket (picklable: the tasks that write the vbuckets get nothing else).
2. `StagedMerge.begin`: the merged backup is written into `ARCHIVE/.merge-staging/`
   (outside `backups/`, so no reader, backup or resume ever sees it half-written);
   `merge_vbucket` writes one vbucket there and re-reads it against what it meant to write.
3. `StagedMerge.commit`: its manifest is committed in the staging directory, then the whole
   backup is verified (sizes, SHA-256, every record, the invariants, the counts).
4. `StagedMerge.publish`: it is moved into `backups/` with one rename, so the merged backup
   appears committed at once. Its id is the last original's id plus a microsecond, so it
   sorts where the last original did (before any backup that descends from it). Then the
   originals are removed.

No committed manifest is ever edited. Backups that descended from the last original keep
naming it as their parent; the merged manifest lists the ids it replaces
(`extra.merge.replaced`) and chain resolution follows that pointer once the originals are
gone (see archive.chain).

A merge killed after the rename leaves a sound archive (the originals and the merged backup
side by side, restores unchanged); `finish_interrupted_merges` removes the originals.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from dcptool.errors import DcptoolError, UsageError
from dcptool.faults import fault_point

from . import storage
from .archive import REMOVING, Archive, BackupWriter, backup_path
from .chain import effective_parents, merged_from
from .errors import ArchiveError
from .format import (
    MANIFEST_JSON,
    BACKUP_ID_RE,
    BACKUP_JSON,
    BACKUPS_DIR,
    COLLECTIONS_VERSION,
    FORMAT_VERSION,
    FULL,
    INCREMENTAL,
    REC_DELETION,
    REC_EXPIRATION,
    REC_MUTATION,
    REC_SYSTEM_EVENT,
    SNAPSHOT,
    atomic_write_json,
    backup_id_for,
    fsync_dir,
    iso_time,
    make_dir,
    parse_backup_id,
    utc_now,
)
from .lock import ArchiveLock
from .packing import Packer
from .reader import iter_vbucket_batches
from .resolve import part_cuts
from .verify import verify_backup_dir
from .writer import VBucketWriter

#: where a merged backup is written before it is published (inside the archive directory)
STAGING = ".merge-staging"
#: records handed to the vbucket writer per call
WRITE_CHUNK = 8192


@dataclass(frozen=True, slots=True)
class VBucketMergePlan:
    """What one vbucket of the merged backup is made of (shipped to a Spark task)."""

    vbucket: int
    #: (backup directory, that backup's manifest entry for the vbucket), oldest first
    parts: tuple[tuple[str, dict[str, Any]], ...]
    start: dict[str, Any]
    end: dict[str, Any]
    failover_log: list[Any]
    #: the rollback record the merged vbucket keeps (it cuts records before the range)
    rollback: dict[str, Any] | None = None
    #: keep every surviving version (the range's history), not only each key's newest
    history: bool = False


@dataclass(frozen=True, slots=True)
class MergeTarget:
    """Where a task writes its vbuckets of the merged backup (picklable): the opened
    archive rooted at its staging directory (its key seals the merged files)."""

    archive: Archive
    merged_id: str

    @property
    def staging(self) -> str:
        return str(self.archive.path)

    @property
    def backup_dir(self) -> Path:
        return backup_path(self.staging, self.merged_id)


@dataclass
class MergePlan:
    """A merge decided from the committed manifests (see `plan_merge`)."""

    first: str
    last: str
    replaced: list[str]
    #: committed backups whose parent is the last original: they continue from the merged one
    children: list[str]
    merged_id: str
    type: str
    parent: str | None
    vbuckets: dict[int, VBucketMergePlan] = field(default_factory=dict)
    compression: dict[str, Any] = field(default_factory=dict)
    records_before: int = 0
    items_before: int = 0
    bytes_before: int = 0
    #: a history-keeping merge (see plan_merge)
    history: bool = False


# -- one vbucket (runs in a task) -----------------------------------------------------------------


def _resolve_with_markers(parts: Sequence[tuple[str, dict[str, Any]]], key: Any = None,
                          history: bool = False) -> tuple[list[tuple], list[tuple]]:
    """Over the range's parts of one vbucket (oldest first): the surviving snapshot markers
    in order, and the resolved items with the surviving system events, sorted by seqno.
    With `history`, every surviving item is kept, not only the newest version of each key:
    each snapshot of the range keeps what it held, so its boundaries stay states of the
    vbucket (what restore --to-time cuts at)."""
    cuts = part_cuts([[r["seqno"] for r in e["rollbacks"]] for _, e in parts])
    state: dict[bytes, tuple] = {}
    kept: list[tuple] = []
    markers: list[tuple] = []
    events: list[tuple] = []
    for (bdir, entry), cut in zip(parts, cuts):
        for batch in iter_vbucket_batches(storage.location(bdir), entry, key=key):
            for r in batch:
                t = r[0]
                if t == REC_MUTATION:
                    if cut is None or r[1] <= cut:
                        if history:
                            kept.append(r)
                        else:
                            state[r[7]] = r
                elif t == REC_DELETION or t == REC_EXPIRATION:
                    if cut is None or r[1] <= cut:
                        if history:
                            kept.append(r)
                        else:
                            state[r[4]] = r
                elif t == SNAPSHOT:
                    if cut is not None and r[1] > cut:
                        continue
                    if cut is not None and r[2] > cut:
                        r = (SNAPSHOT, r[1], cut, r[3])
                    markers.append(r)
                elif t == REC_SYSTEM_EVENT:
                    if cut is None or r[1] <= cut:
                        events.append(r)
    items = sorted([*state.values(), *kept, *events], key=lambda r: r[1])
    return markers, items


def _interleave(markers: list[tuple], items: list[tuple]) -> Iterator[list[tuple]]:
    """Markers and items in file order: each marker followed by its items."""
    out: list[tuple] = []
    i = 0
    n = len(items)
    for m in markers:
        out.append(m)
        end = m[2]
        while i < n and items[i][1] <= end:
            out.append(items[i])
            i += 1
        if len(out) >= WRITE_CHUNK:
            yield out
            out = []
    if i < n:
        out.extend(items[i:])  # cannot happen in a sound archive; verify would report it
    if out:
        yield out


def _item_digest(items: Iterable[tuple]) -> tuple[int, str]:
    h = hashlib.blake2b(digest_size=16)
    n = 0
    for r in items:
        h.update(repr(r).encode())
        n += 1
    return n, h.hexdigest()


def merge_vbucket(target: MergeTarget, plan: VBucketMergePlan) -> dict[str, Any]:
    """Write one vbucket of the merged backup; return its summary (after a self-check: the
    files read back as the items meant to be written, in the same order)."""
    summary, want = _write_vbucket(target, plan)
    _check_written(target, summary, want)
    return summary


def merge_vbuckets(target: MergeTarget, plans: Iterable[VBucketMergePlan],
                   written_one: Callable[[VBucketMergePlan], None] | None = None
                   ) -> list[dict[str, Any]]:
    """`merge_vbucket` for several vbuckets (one task's). On object storage their small last
    segments and summaries are packed (packing.py: a few objects instead of two per
    vbucket); every vbucket is read back once the packs are written. `written_one` is
    called with each plan once its vbucket is written (for a progress bar)."""
    def each(done: Any, p: VBucketMergePlan) -> Any:
        if written_one is not None:
            written_one(p)
        return done

    if not storage.store_of(target.staging).packs:
        return [each(merge_vbucket(target, p), p) for p in plans]
    packer = Packer(target.backup_dir, key=target.archive.key)
    written = [each(_write_vbucket(target, p, packer), p) for p in plans]
    packer.flush()
    storage.sync_filesystem(storage.location(target.backup_dir))
    with storage.pack_cache():
        for summary, want in written:
            _check_written(target, summary, want)
    return [s for s, _w in written]


def _write_vbucket(target: MergeTarget, plan: VBucketMergePlan,
                   packer: Packer | None = None) -> tuple[dict[str, Any], tuple[int, str]]:
    markers, items = _resolve_with_markers(plan.parts, target.archive.key, plan.history)
    w = VBucketWriter(target.archive, target.merged_id, plan.vbucket, plan.start,
                      plan.failover_log, packer=packer, sync=packer is None)
    try:
        rb = plan.rollback
        if rb is not None:
            w.rollback(rb["seqno"], rb["vbucket_uuid"])
        for chunk in _interleave(markers, items):
            w.write(chunk)
        summary = w.close(plan.end)
    except BaseException:
        w.abort()
        raise
    return summary, _item_digest(items)


def _check_written(target: MergeTarget, summary: dict[str, Any], want: tuple[int, str]) -> None:
    got = _item_digest(r for batch in iter_vbucket_batches(target.backup_dir, summary,
                                                            check_sha256=True,
                                                            key=target.archive.key)
                       for r in batch
                       if REC_MUTATION <= r[0] <= REC_EXPIRATION or r[0] == REC_SYSTEM_EVENT)
    if got != want:
        raise DcptoolError(f"vbucket {summary['vbucket']}: the merged files do not read back "
                           f"as written ({got[0]} items read, {want[0]} written)")


# -- planning (driver, archive lock held) ---------------------------------------------------------


def _merged_id_after(last: str, taken: set[str], below: str | None) -> str:
    t = parse_backup_id(last)
    for _ in range(1000):
        t += timedelta(microseconds=1)
        bid = backup_id_for(t)
        if bid in taken:
            continue
        if below is not None and bid >= below:
            break
        return bid
    raise ArchiveError(f"no free backup id between {last} and {below}",
                       hint="merge a range that ends one backup earlier")


def plan_merge(archive: Archive, first: str | None = None, last: str | None = None, *,
               level: int | None = None, history: bool = False) -> MergePlan:
    """Decide the merge of `first`..`last` (default: the whole chain of the newest backup).
    With `history` the merged backup keeps every version the range held (a continuous
    backup's rotation: fewer files, the same points in time), else each key's newest.

    Raises UsageError for a range that cannot be merged (a partial backup exists, one
    backup only, a backup outside the range descends from inside it)."""
    partial = archive.partial_ids()
    if partial:
        raise UsageError(f"archive {archive.path} holds a partial backup {partial[-1]}",
                         hint="resume it with the next backup, or purge it with "
                              "'dcptool backup --purge-partial', before merging")
    manifests = archive.manifests()
    if not manifests:
        raise UsageError(f"archive {archive.path} holds no committed backup to merge")
    for bid in (first, last):
        if bid is not None and bid not in manifests:
            archive.manifest(bid)  # raises the precise error (missing or partial)
    chain = archive.chain_ids(manifests, last)
    last = chain[-1]
    first = first or chain[0]
    if first not in chain:
        raise UsageError(f"--from {first} is not in the chain of backup {last}",
                         hint="see 'dcptool info' for the parents of each backup")
    lo = chain.index(first)
    rng = chain[lo:]
    if len(rng) < 2:
        raise UsageError(f"nothing to merge: the range {first}..{last} holds one backup")
    inside = set(rng)
    parents = effective_parents(manifests)
    children = []
    for bid in manifests:
        if bid in inside:
            continue
        parent = parents[bid]
        if parent in inside:
            if parent != last:
                raise UsageError(f"backup {bid} descends from {parent}, inside the range; "
                                 "merging would orphan it",
                                 hint="merge a range that ends before that backup")
            children.append(bid)
    merged_id = _merged_id_after(last, set(archive.backup_ids()),
                                 min(children) if children else None)
    first_m = manifests[first]
    pre_ends: dict[int, int] = {}
    for bid in chain[:lo]:
        for e in manifests[bid]["vbuckets"]:
            pre_ends[e["vbucket"]] = e["end"]["seqno"]

    # per vbucket: the parts, where it starts and ends, a rollback to keep
    acc: dict[int, dict[str, Any]] = {}
    for bid in rng:
        bdir = str(archive.backup_dir(bid).absolute())
        for e in manifests[bid]["vbuckets"]:
            vb = e["vbucket"]
            p = acc.get(vb)
            if p is None:
                p = acc[vb] = {"parts": [], "start": e["start"], "rollback": None}
            p["parts"].append((bdir, e))
            p["end"] = e["end"]
            p["failover_log"] = e["failover_log"]
            for r in e["rollbacks"]:
                if p["rollback"] is None or r["seqno"] < p["rollback"]["seqno"]:
                    p["rollback"] = dict(r)
    plans: dict[int, VBucketMergePlan] = {}
    for vb, p in sorted(acc.items()):
        rb = p["rollback"]
        if rb is not None and not (vb in pre_ends and rb["seqno"] < pre_ends[vb]):
            rb = None  # it cuts nothing outside the range
        plans[vb] = VBucketMergePlan(vb, tuple(p["parts"]), p["start"], p["end"],
                                     p["failover_log"], rb, history)
    comp = dict(manifests[last].get("compression") or {})
    if level is not None:
        comp["level"] = int(level)
    return MergePlan(
        first, last, list(rng), sorted(children), merged_id,
        FULL if first_m["type"] == FULL else INCREMENTAL, parents[first], plans, comp,
        records_before=sum(manifests[b]["totals"]["records"] for b in rng),
        items_before=sum(manifests[b]["totals"][k] for b in rng
                         for k in ("mutations", "deletions", "expirations")),
        bytes_before=sum(manifests[b]["totals"]["file_bytes"] for b in rng), history=history)


# -- staging, commit, publish (driver, archive lock held) -----------------------------------------


def ends_as(last_manifest: dict[str, Any], last: str) -> list[str]:
    """The ids whose end a merged backup of a range ending at `last` restores exactly:
    `last`, and when `last` is itself merged, the ids it ended as (`extra.merge.ends_as`,
    else the last it replaced), so that the backup an outside record names (a cluster
    archive's run) is found after a merged backup is merged again."""
    out = [last]
    merge = (last_manifest.get("extra") or {}).get("merge")
    if isinstance(merge, dict):
        prior = merge.get("ends_as")
        if not isinstance(prior, list):
            replaced = merged_from(last_manifest) or []
            prior = replaced[-1:]
        out.extend(str(b) for b in prior if b != last and str(b) not in out)
    return out


def covered_spans(archive: Archive, ids: Sequence[str]) -> list[list[str]]:
    """The wall-clock spans the backups `ids` covered (their own, or their originals'),
    merged where they touch: a merged backup's `extra.merge.covered`, so point-in-time
    reads still see the gaps between its originals."""
    from .pointintime import covered, iso

    spans = sorted(s for b in ids for s in covered(archive.manifest(b)))
    out: list[list[int]] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [[iso(a), iso(b)] for a, b in out]


def checkpoint_interval(archive: Archive, ids: Sequence[str]) -> float | None:
    """The greatest `extra.checkpoint_interval` the backups `ids` recorded (a continuous
    backup's checkpoints), which a merge of them keeps: the gaps point-in-time reads see
    between its originals are judged as they were."""
    vals = [v for b in ids
            for v in [(archive.manifest(b).get("extra") or {}).get("checkpoint_interval")]
            if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(vals) if vals else None


class StagedMerge:
    """The merged backup being written in the staging directory."""

    def __init__(self, archive: Archive, plan: MergePlan, info: dict[str, Any],
                 writer: BackupWriter):
        self.archive = archive
        self.plan = plan
        self.info = info
        self.writer = writer
        self.root = archive.path / STAGING
        self.target = MergeTarget(archive.at(self.root.absolute()), plan.merged_id)
        self.manifest: dict[str, Any] | None = None

    @classmethod
    def begin(cls, archive: Archive, plan: MergePlan) -> "StagedMerge":
        """Make the staging directory (emptied first) with the merged backup's intent."""
        root = archive.path / STAGING
        storage.remove_tree(root)
        make_dir(root)
        make_dir(root / BACKUPS_DIR)
        bdir = backup_path(root, plan.merged_id)
        make_dir(bdir)
        info = {"replaced": list(plan.replaced), "from": plan.first, "to": plan.last,
                "ends_as": ends_as(archive.manifest(plan.last), plan.last),
                "items_before": plan.items_before, "finished": None,
                "covered": covered_spans(archive, plan.replaced)}
        if plan.history:
            info["history"] = True
        intent = {
            "format": "dcptool-backup", "version": FORMAT_VERSION, "archive": archive.uuid,
            "id": plan.merged_id, "parent": plan.parent, "type": plan.type,
            "started": iso_time(utc_now()), "compression": plan.compression,
            "extra": {"merge": info},
        }
        if FORMAT_VERSION >= COLLECTIONS_VERSION:
            first = archive.manifest(plan.first)
            intent["collections"] = first.get("collections")
            if first.get("data") is not None:
                intent["data"] = first["data"]
        atomic_write_json(bdir / BACKUP_JSON, intent, key=archive.key)
        staged = archive.at(root)
        writer = BackupWriter(staged, intent, ArchiveLock(root, "merge").acquire())
        return cls(archive, plan, info, writer)

    def commit(self, summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Commit the merged backup's manifest in the staging directory and verify the whole
        backup; returns the manifest."""
        extra: dict[str, Any] = {"merge": {**self.info, "finished": iso_time(utc_now())}}
        interval = checkpoint_interval(self.archive, self.plan.replaced)
        if interval is not None:
            extra["checkpoint_interval"] = interval
        manifest = self.writer.commit(summaries, extra=extra)
        report = verify_backup_dir(self.target.backup_dir, manifest, key=self.archive.key)
        if not report.ok:
            p = report.problems[0]
            raise DcptoolError(f"the merged backup failed verification: {p.path}: {p.message}",
                               hint="the archive is unchanged")
        self.manifest = manifest
        return manifest

    def publish(self) -> None:
        """Move the committed merged backup into backups/ (one rename), then remove the
        originals and the staging directory."""
        if self.manifest is None:
            raise ArchiveError(f"merged backup {self.plan.merged_id} is not committed")
        storage.rename_dir(self.target.backup_dir, self.archive.backup_dir(self.plan.merged_id),
                           last=MANIFEST_JSON)
        fsync_dir(self.archive.backups_dir)
        fault_point("removal-step")  # DCPTOOL_FAULT: kill-after-removal-step (published)
        remove_backups(self.archive, self.plan.replaced)
        self.discard()

    def discard(self) -> None:
        """Delete the staging directory (nothing in backups/ is touched)."""
        discard_staging(self.archive)


def discard_staging(archive: Archive) -> None:
    """Delete the merge staging directory, if any (nothing in backups/ is touched)."""
    storage.remove_tree(archive.path / STAGING)


def remove_backups(archive: Archive, ids: Iterable[str]) -> None:
    """Take backups out of backups/ (one rename each), then delete them, newest first (a
    backup goes before the one it continues from, so a kill in between never leaves a
    committed backup whose parent is gone). The caller holds the archive lock.

    On object storage a directory cannot be renamed away at once: each backup is marked
    first (`REMOVING`: it is then never taken for a partial backup to resume), then its
    manifest goes, then the rest; `finish_interrupted_merges` removes what a kill left."""
    ids = sorted(set(ids), reverse=True)
    if not storage.store_of(archive.path).dirs:  # (no directory to rename at once)
        for bid in ids:
            src = archive.backup_dir(bid)
            if src.is_dir():
                storage.atomic_write_bytes(src / REMOVING, b"")
        for bid in ids:
            src = archive.backup_dir(bid)
            committed = (src / MANIFEST_JSON).is_file()
            storage.unlink(src / MANIFEST_JSON)
            if committed:
                fault_point("removal-step")  # DCPTOOL_FAULT: kill-after-removal-step
            storage.remove_tree(src)
        return
    trash = archive.path / STAGING / "removed"
    storage.prepare_dir(trash)
    for bid in ids:
        src = archive.backup_dir(bid)
        if src.is_dir():
            storage.remove_tree(trash / bid)
            storage.rename_dir(src, trash / bid)
            fsync_dir(archive.backups_dir)
            fault_point("removal-step")  # DCPTOOL_FAULT: kill-after-removal-step
    storage.remove_tree(trash)


def finish_interrupted_merges(archive: Archive) -> list[str]:
    """Complete merges that were killed after their merged backup was published: remove the
    originals left beside it, and any staging directory. Call with the archive lock held.
    Returns the ids removed."""
    removed: list[str] = []
    for bid in archive.committed_ids():
        try:
            m = archive.manifest(bid)
        except ArchiveError:
            continue
        left = [r for r in merged_from(m) or () if BACKUP_ID_RE.match(r) and r != bid
                and archive.backup_dir(r).is_dir()]
        if not left:
            continue
        remove_backups(archive, left)
        removed.extend(left)
    # removals (of merged originals, or by remove and prune) killed after marking
    marked = [b for b in archive.backup_ids() if archive.is_being_removed(b)]
    if marked:
        remove_backups(archive, marked)
        removed.extend(marked)
    discard_staging(archive)
    return sorted(set(removed))


#: runs `merge_vbucket` for each plan (in this process, or as Spark tasks) and returns the
#: summaries
VBucketRunner = Callable[[MergeTarget, list[VBucketMergePlan]], list[dict[str, Any]]]


def merge_here(target: MergeTarget, plans: list[VBucketMergePlan]) -> list[dict[str, Any]]:
    """A `VBucketRunner` that merges the vbuckets one after the other in this process."""
    return merge_vbuckets(target, plans)


def merge_range(archive: Archive, first: str | None = None, last: str | None = None, *,
                level: int | None = None, history: bool = False,
                run_vbuckets: VBucketRunner = merge_here,
                expect: Sequence[str] | None = None,
                on_plan: Callable[[MergePlan], None] | None = None
                ) -> tuple[MergePlan, dict[str, Any]]:
    """The whole merge of `first`..`last` with the archive lock held (the caller's): plan,
    stage, write the vbuckets with `run_vbuckets`, commit and verify, publish, remove the
    originals. `expect`: the ids the range must be (a caller that planned it already).
    Nothing in backups/ changes unless the merged backup was committed and verified."""
    plan = plan_merge(archive, first, last, level=level, history=history)
    if expect is not None and list(plan.replaced) != list(expect):
        raise ArchiveError(f"the chain changed: merging {plan.first}..{plan.last} would replace "
                           f"{', '.join(plan.replaced)}, not {', '.join(expect)}",
                           hint="the archive is unchanged; run the command again")
    if on_plan is not None:
        on_plan(plan)
    staged = StagedMerge.begin(archive, plan)
    try:
        plans = [plan.vbuckets[vb] for vb in sorted(plan.vbuckets)]
        summaries = list(run_vbuckets(staged.target, plans)) if plans else []
        manifest = staged.commit(summaries)
        staged.publish()
    except BaseException:
        # nothing in backups/ was touched before the rename; after it, what staging holds
        # (originals being removed) was meant to go
        discard_staging(archive)
        raise
    return plan, manifest


__all__ = ["STAGING", "ends_as", "VBucketMergePlan", "MergeTarget", "MergePlan", "StagedMerge",
           "plan_merge", "merge_vbucket", "merge_vbuckets", "remove_backups", "finish_interrupted_merges",
           "discard_staging", "merge_range", "merge_here", "VBucketRunner"]
