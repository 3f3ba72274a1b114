"""The restore job: write an archive's resolved state (as of a backup) back into a node.

Per vbucket the chain is resolved to the newest surviving version of each key (dead
history branches cut by rollback records are skipped) and written with SET_WITH_META /
DEL_WITH_META, so cas, rev seqno, flags and expiry are kept. The node's conflict
resolution decides: where it holds newer data the write is counted as skipped, unless
`force` is set. One Spark task per group of vbuckets, each with its own connection.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
import itertools
from typing import Any

from dcptool.archive import REC_DELETION, REC_EXPIRATION, REC_MUTATION, Archive, VBucketHistory, resolve
from dcptool.errors import DcptoolError
from dcptool.protocol.errors import ProtocolError
from dcptool.protocol.snappy import SNAPPY, plain

from dcptool.runlog import RunLog

from . import metawriter as mw
from .nodeinfo import active_nodes, vbucket_count
from .plans import RestoreTask, RestoreTaskResult
from .runtime import default_parallelism, get_spark, plan_groups
from .tasks import reporting_failures, task_failure

_KIND = {REC_MUTATION: mw.WRITE_MUTATION, REC_DELETION: mw.WRITE_DELETION,
         REC_EXPIRATION: mw.WRITE_EXPIRATION}


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
        if t == REC_MUTATION:
            _t, _s, rev, cas, flags, expiry, datatype, key, value, _x = r
            if datatype & SNAPPY:
                value, datatype = _plain(value, datatype, vbucket, key)
            out = (mw.WRITE_MUTATION, key, value, flags, expiry, rev, cas, datatype)
        else:
            _t, _s, rev, cas, key, delete_time, datatype, value = r
            if datatype & SNAPPY:
                value, datatype = _plain(value, datatype, vbucket, key)
            out = (_KIND[t], key, value or b"", 0, delete_time, rev, cas, datatype)
        if pattern is not None and not pattern.search(out[1]):
            continue
        yield out


def _plain(value: bytes, datatype: int, vbucket: int, key: bytes) -> tuple[bytes, int]:
    """A snappy-compressed value decompressed, the bit cleared: dcptool's archives hold
    values decompressed and restore writes them so (an archive written by other means
    may not), so the node gets no compressed value from a connection that may not have
    negotiated Snappy."""
    try:
        return plain(value, datatype)
    except ProtocolError as exc:
        raise DcptoolError(f"vbucket {vbucket} key {key.decode('utf-8', 'replace')!r}: the "
                           f"archive holds a snappy-compressed value that does not "
                           f"decompress ({exc.reason})") from None


def check_chain_files(chain, vbuckets) -> tuple[int, int, float]:
    """Check the size and SHA-256 of every data file a restore of `vbuckets` along `chain`
    reads against its manifest, before anything is written: a damaged or swapped file
    fails the whole restore up front instead of leaving a partial one. Returns (files,
    bytes, seconds); raises CorruptFileError naming the first bad file."""
    from concurrent.futures import ThreadPoolExecutor

    from dcptool.archive.errors import CorruptFileError
    from dcptool.archive.recovery import file_digest

    t0 = time.monotonic()
    wanted = set(vbuckets)
    files = [(b.dir / f["name"], f) for b in chain for vb in b.vbuckets if vb in wanted
             for f in b.entry(vb)["files"]]

    def digest(item):
        try:
            return file_digest(item[0])
        except OSError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=4) as pool:  # hashlib releases the GIL
        for (path, f), got in zip(files, pool.map(digest, files)):
            if isinstance(got, OSError):
                raise CorruptFileError(path, f"cannot read: {got.strerror or got}")
            if got != (f["size"], f["sha256"]):
                raise CorruptFileError(path, f"is not the file the manifest lists ({got[0]} "
                                             f"bytes, sha256 {got[1][:12]}...; expected "
                                             f"{f['size']} bytes, sha256 {f['sha256'][:12]}...)")
    return len(files), sum(f["size"] for _p, f in files), time.monotonic() - t0


def restore_task(task: RestoreTask) -> RestoreTaskResult:
    t0 = time.monotonic()
    counts = mw.WriteCounts()
    chain = Archive.open(task.archive).chain(task.backup)
    # records resolved per vbucket (what was sent), for the run log
    per_vb: dict[int, dict[str, int]] = {}

    def records_of(vb):
        recs = list(resolved_records(task.archive, vb, task.backup, task.key_filter,
                                     chain=chain))
        kinds = [r[0] for r in recs]
        per_vb[vb] = {k: kinds.count(k) for k in mw.WRITE_KINDS}
        return recs

    def records():
        return itertools.chain.from_iterable(map(records_of, task.vbuckets))

    if task.dry_run:
        for rec in records():
            counts.restored[rec[0]] += 1
        out = counts.as_dict()
    elif task.routes:  # a cluster: each vbucket to its active node
        out = mw.write_to_actives(task.opts, task.routes, task.node_vbuckets,
                                  ((vb, records_of(vb)) for vb in task.vbuckets),
                                  force=task.force).as_dict()
    else:
        with task.opts.connect() as conn:
            writer = mw.MetaWriter(conn, task.node_vbuckets, force=task.force)
            writer.write(records())
        out = writer.counts.as_dict()
    return RestoreTaskResult(out, {"vbuckets": per_vb, "seconds": round(time.monotonic() - t0, 3),
                                   "pid": os.getpid()})


@dataclass
class RestoreResult:
    backup_id: str
    vbuckets: int
    dry_run: bool
    counts: mw.WriteCounts = field(default_factory=mw.WriteCounts)
    seconds: float = 0.0
    log: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d = self.counts.as_dict()
        total = sum(d["restored"].values())
        return {"backup_id": self.backup_id, "vbuckets": self.vbuckets, "dry_run": self.dry_run,
                **d, "seconds": round(self.seconds, 3),
                "items_per_second": round(total / self.seconds, 1) if self.seconds else None,
                "log": self.log}


def run_restore(archive_path: str, opts=None, **kwargs: Any) -> RestoreResult:
    """Restore the archive at `archive_path` into the node `opts` (None with dry_run).

    Keyword arguments: backup, vbuckets, key_filter, force, dry_run, partitions, master,
    spark. The run is logged to `ARCHIVE/logs/restore-*.log`.
    """
    with RunLog("restore") as rl:
        result = _run_restore(rl, archive_path, opts, **kwargs)
    result.log = str(rl.path) if rl.path else None
    return result


def _kinds(c: dict[str, int]) -> str:
    return (f"{c.get(mw.WRITE_MUTATION, 0)} mutations, {c.get(mw.WRITE_DELETION, 0)} deletions, "
            f"{c.get(mw.WRITE_EXPIRATION, 0)} expirations")


def _run_restore(rl: RunLog, archive_path: str, opts=None, *, backup: str | None = None,
                 vbuckets: list[int] | None = None, key_filter: str | None = None,
                 force: bool = False, dry_run: bool = False, partitions: int | None = None,
                 master: str | None = None, spark=None) -> RestoreResult:
    t0 = time.monotonic()
    archive = Archive.open(os.path.abspath(archive_path))  # tasks may run elsewhere
    rl.attach(os.path.abspath(archive.path))
    rl.info("restore%s of %s into %s (pid %d)", " dry run" if dry_run else "", archive.path,
            "nothing" if opts is None else f"bucket {opts.bucket} on {opts.address}", os.getpid())
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
    routes = None  # on a cluster: {vbucket: its active node}
    if not dry_run:
        with opts.connect() as conn:
            node_vbuckets = vbucket_count(conn)
            found = active_nodes(opts, conn)
        if found is not None:
            routes = {vb: node for node, vbs in found[1].items() for vb in vbs}
    checked = check_chain_files(chain, held)  # a damaged file: nothing is written
    rl.info("checked %d files (%d bytes) against the manifests in %.2f s", *checked)
    result = RestoreResult(target, len(held), dry_run)
    rl.info("state as of backup %s (chain %s), %d vbuckets%s%s%s", target,
            " <- ".join(b.id for b in reversed(chain)), len(held),
            f", keys matching {key_filter!r}" if key_filter else "",
            ", --force-updates" if force else "", f"; the node has {node_vbuckets} vbuckets"
            if not dry_run else "")
    if held:
        ts = time.monotonic()
        spark = spark or get_spark(master)
        n = partitions or 2 * default_parallelism(spark)
        tasks = [RestoreTask(opts, str(archive.path), target, tuple(g), node_vbuckets,
                             key_filter=key_filter, force=force, dry_run=dry_run, routes=routes)
                 for g in plan_groups(held, n)]
        rl.info("spark %s: %d tasks (started in %.1f s)", spark.sparkContext.master, len(tasks),
                time.monotonic() - ts)
        try:
            results = spark.sparkContext.parallelize(tasks, len(tasks)) \
                .map(reporting_failures(restore_task)).collect()
        except Exception as exc:
            raise task_failure(exc, "restore task",
                               "the restore can be rerun: it is idempotent") from None
        for i, res in enumerate(results):
            r, run = res.counts, res.run
            for vb, c in sorted(run.get("vbuckets", {}).items()):
                rl.info("vbucket %s: %s %s", vb, "would write" if dry_run else "sent", _kinds(c))
            rl.info("task %d (%d vbuckets): %s %s; skipped (newer on the node) %s; failed "
                    "%s; %d retries; %.3f s", i, len(run.get("vbuckets", {})),
                    "would write" if dry_run else "restored",
                    _kinds(r["restored"]), _kinds(r["skipped"]), _kinds(r["failed"]),
                    r["retries"], run.get("seconds", 0.0))
            for e in r["errors"]:
                rl.error("task %d: %s", i, e)
            part = mw.WriteCounts(restored=r["restored"], skipped=r["skipped"], failed=r["failed"],
                                  retries=r["retries"], errors=r["errors"])
            result.counts.add(part)
    result.seconds = time.monotonic() - t0
    d = result.counts.as_dict()
    rl.info("%s backup %s in %.2f s: %s %s; skipped %s; failed %s; %d retries",
            "dry run of" if dry_run else "restored", target, result.seconds,
            "would write" if dry_run else "restored",
            _kinds(d["restored"]), _kinds(d["skipped"]), _kinds(d["failed"]), d["retries"])
    return result
