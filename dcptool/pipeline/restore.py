"""The restore job: write an archive's resolved state (as of a backup) back into a node.

Per vbucket the chain is resolved to the newest surviving version of each key (dead
history branches cut by rollback records are skipped) and written with SET_WITH_META /
DEL_WITH_META, so cas, rev seqno, flags and expiry are kept. The node's conflict
resolution decides: where it holds newer data the write is counted as skipped, unless
`force` is set. One Spark task per group of vbuckets, each with its own connection.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from dcptool.archive import DELETION, EXPIRATION, MUTATION, Archive, VBucketHistory, resolve

from . import metawriter as mw
from .nodeinfo import vbucket_count
from .spark import default_parallelism, get_spark, plan_groups

_KIND = {MUTATION: mw.MUTATION, DELETION: mw.DELETION, EXPIRATION: mw.EXPIRATION}


def resolved_records(archive_path: str, vbucket: int, backup: str | None,
                     key_filter: str | None = None, *, chain=None):
    """(kind, key, value, flags, expiry, rev_seqno, cas, datatype) for each resolved key of the
    vbucket, in seqno order. `chain` (from Archive.chain) saves re-reading the manifests when
    many vbuckets are resolved in a row."""
    if chain is None:
        chain = Archive.open(archive_path).chain(backup)
    pattern = re.compile(key_filter.encode()) if key_filter else None
    parts = [VBucketHistory(b, vbucket) for b in chain if b.entry(vbucket) is not None]
    recs = sorted(resolve(parts).values(), key=lambda r: r[1])
    for r in recs:
        t = r[0]
        if t == MUTATION:
            _t, _s, rev, cas, flags, expiry, datatype, key, value, _x = r
            out = (mw.MUTATION, key, value, flags, expiry, rev, cas, datatype)
        else:
            _t, _s, rev, cas, key, delete_time, datatype, value = r
            out = (_KIND[t], key, value or b"", 0, delete_time, rev, cas, datatype)
        if pattern is not None and not pattern.search(out[1]):
            continue
        yield out


def restore_task(spec: dict[str, Any]) -> dict[str, Any]:
    counts = mw.WriteCounts()
    chain = Archive.open(spec["archive"]).chain(spec["backup"])
    records = (rec for vb in spec["vbuckets"]
               for rec in resolved_records(spec["archive"], vb, spec["backup"], spec.get("filter"),
                                           chain=chain))
    if spec.get("dry_run"):
        for rec in records:
            counts.restored[rec[0]] += 1
        return counts.as_dict()
    with spec["opts"].connect() as conn:
        writer = mw.MetaWriter(conn, spec["node_vbuckets"], force=spec.get("force", False))
        writer.write(records)
    return writer.counts.as_dict()


@dataclass
class RestoreResult:
    backup_id: str
    vbuckets: int
    dry_run: bool
    counts: mw.WriteCounts = field(default_factory=mw.WriteCounts)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = self.counts.as_dict()
        total = sum(d["restored"].values())
        return {"backup_id": self.backup_id, "vbuckets": self.vbuckets, "dry_run": self.dry_run,
                **d, "seconds": round(self.seconds, 3),
                "items_per_second": round(total / self.seconds, 1) if self.seconds else None}


def run_restore(archive_path: str, opts=None, *, backup: str | None = None,
                vbuckets: list[int] | None = None, key_filter: str | None = None,
                force: bool = False, dry_run: bool = False, partitions: int | None = None,
                master: str | None = None, spark=None) -> RestoreResult:
    t0 = time.monotonic()
    archive = Archive.open(archive_path)
    chain = archive.chain(backup)
    if not chain:
        from dcptool.errors import DcptoolError
        raise DcptoolError(f"archive {archive_path} has no committed backup to restore")
    target = chain[-1].id
    held = sorted({vb for b in chain for vb in b.vbuckets})
    if vbuckets is not None:
        held = [vb for vb in held if vb in set(vbuckets)]
    if key_filter:
        try:
            re.compile(key_filter)
        except re.error as exc:
            from dcptool.errors import UsageError
            raise UsageError(f"--filter-keys: bad regular expression: {exc}") from None
    node_vbuckets = archive.vbucket_count
    if not dry_run:
        with opts.connect() as conn:
            node_vbuckets = vbucket_count(conn)
    result = RestoreResult(target, len(held), dry_run)
    if held:
        spark = spark or get_spark(master)
        n = partitions or 2 * default_parallelism(spark)
        specs = [{"opts": opts, "archive": str(archive.path), "backup": target, "vbuckets": g,
                  "filter": key_filter, "force": force, "dry_run": dry_run,
                  "node_vbuckets": node_vbuckets} for g in plan_groups(held, n)]
        try:
            results = spark.sparkContext.parallelize(specs, len(specs)).map(restore_task).collect()
        except Exception as exc:
            from .backup import _task_error
            err = _task_error(exc)
            err.message = err.message.replace("backup task", "restore task")
            err.hint = "the restore can be rerun: it is idempotent"
            raise err from None
        for r in results:
            part = mw.WriteCounts(restored=r["restored"], skipped=r["skipped"], failed=r["failed"],
                                  retries=r["retries"], errors=r["errors"])
            result.counts.add(part)
    result.seconds = time.monotonic() - t0
    return result
