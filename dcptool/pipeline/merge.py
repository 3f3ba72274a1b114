"""The merge job: fold a range of backups of one chain into one backup.

The merged backup holds, per vbucket, the resolved state of the range (the newest surviving
version of each key, tombstones kept, dead branches dropped) inside the range's live
snapshot markers, from the first backup's start position to the last backup's end
position. So the chain through it restores exactly what the chain through the originals
restored, and an incremental backup taken after it starts where the last original ended.

When the range does not start at a full backup and one of its backups recorded a rollback
below where the chain before the range ended, the merged backup keeps that rollback record
(the lowest one), so the older backups' records above it stay dead.

Safety, in order:

1. Under the archive lock, the merged backup is written into `ARCHIVE/.merge-staging/`
   (outside `backups/`, so no reader, backup or resume ever sees it half-written). One Spark
   task per group of vbuckets; each re-reads what it wrote and compares it with what it
   meant to write.
2. Its manifest is committed there, then the whole backup is verified (sizes, SHA-256,
   every record, the invariants, the counts).
3. It is moved into `backups/` with one rename: the merged backup appears committed at once.
   Its id is the last original's id plus a microsecond, so it sorts where the last original
   did (before any backup that descends from it).
4. Backups whose parent was the last original are re-linked to the merged backup (their
   manifest's and backup.json's `parent` is rewritten atomically; nothing else changes).
5. The originals are removed.

A merge killed after step 3 leaves a sound archive (the originals and the merged backup
side by side, restores unchanged); the next `merge` finishes steps 4 and 5 first.
"""
from __future__ import annotations

import gc
import hashlib
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from dcptool.archive import Archive, BackupWriter, VBucketWriter
from dcptool.archive.errors import ArchiveError
from dcptool.archive.format import (
    BACKUP_ID_RE,
    BACKUP_JSON,
    BACKUPS_DIR,
    FORMAT_VERSION,
    FULL,
    INCREMENTAL,
    MANIFEST_JSON,
    atomic_write_json,
    backup_id_for,
    fsync_dir,
    iso_time,
    make_dir,
    parse_backup_id,
    read_json,
    utc_now,
)
from dcptool.archive.lock import ArchiveLock
from dcptool.archive.manifest import check_manifest
from dcptool.archive.reader import iter_vbucket_batches
from dcptool.archive.resolve import part_cuts
from dcptool.archive.verify import verify_backup_dir
from dcptool.runlog import RunLog
from dcptool.errors import DcptoolError, UsageError

from .datasource import chain_ids, load_manifests
from .runtime import default_parallelism, get_spark, plan_groups

STAGING = ".merge-staging"
WRITE_CHUNK = 8192


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
            "seconds": round(self.seconds, 3), "finished_earlier": self.finished_earlier,
            "log": self.log,
        }


# -- one vbucket ---------------------------------------------------------------------------------


def _resolve_with_markers(parts: list[tuple[Path, dict[str, Any]]]) -> tuple[list[tuple], list[tuple]]:
    """Over the range's parts of one vbucket (oldest first): the surviving snapshot markers
    in order, and the resolved items sorted by seqno."""
    cuts = part_cuts([[r["seqno"] for r in e["rollbacks"]] for _, e in parts])
    state: dict[bytes, tuple] = {}
    markers: list[tuple] = []
    for (bdir, entry), cut in zip(parts, cuts):
        for batch in iter_vbucket_batches(bdir, entry):
            for r in batch:
                t = r[0]
                if t == 3:
                    if cut is None or r[1] <= cut:
                        state[r[7]] = r
                elif t == 4 or t == 5:
                    if cut is None or r[1] <= cut:
                        state[r[4]] = r
                elif t == 2:
                    if cut is not None and r[1] > cut:
                        continue
                    if cut is not None and r[2] > cut:
                        r = (2, r[1], cut, r[3])
                    markers.append(r)
    items = sorted(state.values(), key=lambda r: r[1])
    return markers, items


def _interleave(markers: list[tuple], items: list[tuple]):
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


def _item_digest(items) -> tuple[int, str]:
    h = hashlib.blake2b(digest_size=16)
    n = 0
    for r in items:
        h.update(repr(r).encode())
        n += 1
    return n, h.hexdigest()


def merge_vbucket(staging: str, merged_id: str, vb: int, plan: dict[str, Any]) -> dict[str, Any]:
    """Write vbucket `vb` of the merged backup; return its summary (with a self-check)."""
    archive = Path(plan["archive"]) / BACKUPS_DIR
    parts = [(archive / bid, entry) for bid, entry in plan["parts"]]
    markers, items = _resolve_with_markers(parts)
    w = VBucketWriter(staging, merged_id, vb, plan["start"], plan["failover_log"])
    try:
        rb = plan.get("rollback")
        if rb is not None:
            w.rollback(rb["seqno"], rb["vbucket_uuid"])
        for chunk in _interleave(markers, items):
            w.write(chunk)
        summary = w.close(plan["end"])
    except BaseException:
        w.abort()
        raise
    # read back what was written: the same items, in the same order
    want = _item_digest(items)
    del items
    entry = summary
    got = _item_digest(r for batch in iter_vbucket_batches(Path(staging) / BACKUPS_DIR / merged_id,
                                                            entry, check_sha256=True)
                       for r in batch if 2 < r[0] < 6)
    if got != want:
        raise DcptoolError(f"vbucket {vb}: the merged files do not read back as written "
                           f"({got[0]} items read, {want[0]} written)")
    return summary


def merge_task(spec: dict[str, Any]) -> list[dict[str, Any]]:
    # no reference cycles are made here: pausing the cyclic collector saves its passes
    # over the millions of record tuples a resolution holds
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return [merge_vbucket(spec["staging"], spec["merged_id"], int(vb), plan)
                for vb, plan in spec["plan"].items()]
    finally:
        if was_enabled:
            gc.enable()


# -- the driver ----------------------------------------------------------------------------------


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


def _relink(archive: Archive, child: str, parent: str) -> None:
    """Point committed backup `child` at `parent` (its manifest and backup.json)."""
    bdir = archive.backup_dir(child)
    m = read_json(bdir / MANIFEST_JSON)
    m["parent"] = parent
    problems = check_manifest(m, child, archive.meta)
    if problems:
        raise ArchiveError(f"cannot re-link backup {child} to {parent}: {problems[0]}")
    intent_path = bdir / BACKUP_JSON
    if intent_path.exists():
        try:
            intent = read_json(intent_path)
            if isinstance(intent, dict):
                intent["parent"] = parent
                atomic_write_json(intent_path, intent)
        except (OSError, ValueError):
            pass
    atomic_write_json(bdir / MANIFEST_JSON, m)


def _remove_backups(archive: Archive, ids: list[str]) -> None:
    """Take backups out of backups/ (one rename each), then delete them."""
    trash = archive.path / STAGING / "removed"
    trash.mkdir(parents=True, exist_ok=True)
    for bid in ids:
        src = archive.backup_dir(bid)
        if src.is_dir():
            os.rename(src, trash / bid)
    fsync_dir(archive.backups_dir)
    shutil.rmtree(trash, ignore_errors=True)


def finish_interrupted(archive: Archive) -> list[str]:
    """Complete merges that were killed after their merged backup was committed: re-link
    and remove what is left. Call with the archive lock held. Returns the ids removed."""
    removed: list[str] = []
    ids = set(archive.committed_ids())
    for bid in sorted(ids):
        try:
            m = archive.manifest(bid)
        except ArchiveError:
            continue
        info = (m.get("extra") or {}).get("merge")
        if not isinstance(info, dict):
            continue
        left = [r for r in info.get("replaced", []) if isinstance(r, str)
                and BACKUP_ID_RE.match(r) and archive.backup_dir(r).is_dir()]
        if not left:
            continue
        last = info.get("to")
        for other in sorted(ids):
            if other in left or other == bid:
                continue
            try:
                om = archive.manifest(other)
            except ArchiveError:
                continue
            if om.get("parent") == last:
                _relink(archive, other, bid)
        _remove_backups(archive, left)
        removed.extend(left)
    staging = archive.path / STAGING
    if staging.exists():
        shutil.rmtree(staging, ignore_errors=True)
    return removed


def run_merge(archive_path: str | os.PathLike[str], **kwargs: Any) -> MergeResult:
    """Merge the backups `first`..`last` (default: the whole chain of the newest backup).

    Keyword arguments: first, last, partitions, master, level, spark. The run is logged to
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
               master: str | None = None, level: int | None = None, spark=None) -> MergeResult:
    t0 = time.monotonic()
    archive = Archive.open(archive_path)
    rl.attach(os.path.abspath(archive.path))
    rl.info("merge of %s (range %s..%s) (pid %d)", archive.path, first or "start of chain",
            last or "newest", os.getpid())
    lock = archive.lock("merge").acquire()
    try:
        done_before = finish_interrupted(archive)
        partial = archive.partial_ids()
        if partial:
            raise UsageError(f"archive {archive.path} holds a partial backup {partial[-1]}",
                             hint="resume it with the next backup, or purge it with "
                                  "'dcptool backup --purge-partial', before merging")
        manifests = load_manifests(archive)
        if not manifests:
            raise UsageError(f"archive {archive.path} holds no committed backup to merge")
        for bid in (first, last):
            if bid is not None and bid not in manifests:
                archive.manifest(bid)  # raises the precise error (missing or partial)
        chain = chain_ids(archive, manifests, last)
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
        children = []
        for bid, m in manifests.items():
            if bid in inside:
                continue
            if m.get("parent") in inside:
                if m["parent"] != last:
                    raise UsageError(f"backup {bid} descends from {m['parent']}, inside the range; "
                                     "merging would orphan it",
                                     hint="merge a range that ends before that backup")
                children.append(bid)
        merged_id = _merged_id_after(last, set(archive.backup_ids()),
                                     min(children) if children else None)
        first_m = manifests[first]
        last_m = manifests[last]
        btype = FULL if first_m["type"] == FULL else INCREMENTAL
        parent = first_m["parent"]
        pre_ends: dict[int, int] = {}
        for bid in chain[:lo]:
            for e in manifests[bid]["vbuckets"]:
                pre_ends[e["vbucket"]] = e["end"]["seqno"]

        # per vbucket: the parts, where it starts and ends, a rollback to keep
        plan: dict[int, dict[str, Any]] = {}
        root = str(archive.path.absolute())
        for bid in rng:
            for e in manifests[bid]["vbuckets"]:
                vb = e["vbucket"]
                p = plan.get(vb)
                if p is None:
                    p = plan[vb] = {"archive": root, "parts": [], "start": e["start"],
                                    "rollback": None}
                p["parts"].append((bid, e))
                p["end"] = e["end"]
                p["failover_log"] = e["failover_log"]
                for r in e["rollbacks"]:
                    if p["rollback"] is None or r["seqno"] < p["rollback"]["seqno"]:
                        p["rollback"] = dict(r)
        for vb, p in plan.items():
            rb = p["rollback"]
            if rb is not None and not (vb in pre_ends and rb["seqno"] < pre_ends[vb]):
                p["rollback"] = None  # it cuts nothing outside the range

        items_before = sum(manifests[b]["totals"][k] for b in rng
                           for k in ("mutations", "deletions", "expirations"))
        result = MergeResult(merged_id, btype, parent, list(rng), [], len(plan),
                             records_before=sum(manifests[b]["totals"]["records"] for b in rng),
                             items_before=items_before,
                             bytes_before=sum(manifests[b]["totals"]["file_bytes"] for b in rng),
                             finished_earlier=done_before)

        staging = archive.path / STAGING
        if staging.exists():
            shutil.rmtree(staging)
        make_dir(staging)
        make_dir(staging / BACKUPS_DIR)
        make_dir(staging / BACKUPS_DIR / merged_id)
        comp = dict(last_m.get("compression") or {})
        if level is not None:
            comp["level"] = int(level)
        merge_info = {"replaced": list(rng), "from": first, "to": last,
                      "items_before": items_before, "finished": None}
        intent = {
            "format": "dcptool-backup", "version": FORMAT_VERSION, "archive": archive.uuid,
            "id": merged_id, "parent": parent, "type": btype, "started": iso_time(utc_now()),
            "compression": comp, "extra": {"merge": merge_info},
        }
        atomic_write_json(staging / BACKUPS_DIR / merged_id / BACKUP_JSON, intent)
        staged = Archive(staging, archive.meta)
        writer = BackupWriter(staged, intent, ArchiveLock(staging, "merge").acquire())

        summaries: list[dict[str, Any]] = []
        if plan:
            spark = spark or get_spark(master)
            n = partitions or 2 * default_parallelism(spark)
            specs = [{"staging": str(staging.absolute()), "merged_id": merged_id,
                      "plan": {vb: plan[vb] for vb in g}}
                     for g in plan_groups(sorted(plan), n)]
            try:
                results = spark.sparkContext.parallelize(specs, len(specs)) \
                    .map(merge_task).collect()
            except Exception as exc:
                from .backup import _task_error
                err = _task_error(exc)
                err.message = err.message.replace("backup task", "merge task")
                err.hint = "the archive is unchanged; the merge can be rerun"
                raise err from None
            for r in results:
                summaries.extend(r)
            for sm in summaries:
                c = sm["counts"]
                rl.info("vbucket %s: %d mutations, %d deletions, %d expirations, %d rollback "
                        "records, %d bytes", sm["vbucket"], c["mutations"], c["deletions"],
                        c["expirations"], c["rollbacks"], sm["bytes"]["files"])
        manifest = writer.commit(summaries, extra={"merge": {**merge_info,
                                                             "finished": iso_time(utc_now())}})
        report = verify_backup_dir(staging / BACKUPS_DIR / merged_id, manifest)
        if not report.ok:
            p = report.problems[0]
            raise DcptoolError(f"the merged backup failed verification: {p.path}: {p.message}",
                               hint="the archive is unchanged")

        # publish, re-link, remove
        os.rename(staging / BACKUPS_DIR / merged_id, archive.backup_dir(merged_id))
        fsync_dir(archive.backups_dir)
        for child in sorted(children):
            _relink(archive, child, merged_id)
            result.relinked.append(child)
        _remove_backups(archive, list(rng))
        shutil.rmtree(staging, ignore_errors=True)
        t = manifest["totals"]
        result.mutations, result.deletions = t["mutations"], t["deletions"]
        result.expirations, result.rollbacks = t["expirations"], t["rollbacks"]
        result.bytes_after = t["file_bytes"]
    except BaseException:
        # nothing in backups/ was touched before the rename; after it, what staging holds
        # (originals being removed) was meant to go
        shutil.rmtree(archive.path / STAGING, ignore_errors=True)
        raise
    finally:
        lock.release()
    result.seconds = time.monotonic() - t0
    return result
