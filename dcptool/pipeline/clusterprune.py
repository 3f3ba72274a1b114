"""`prune`, `remove` and `merge` of a cluster archive: the unit is the run.

A user prunes, removes and merges runs (`runs/RUN-ID.json`, archive/cluster.py); each
bucket archive follows, with the bucket archive's own machinery (archive/retention.py,
archive/merging.py, run by pipeline/prune.py and pipeline/merge.py), each bucket under its
own archive lock, the whole under the cluster archive's lock.

Prune and remove. The policy (or the runs named) chooses the runs to drop among the
committed runs; the newest run is always kept. In each bucket archive, the backups that
only dropped runs name (resolved as archive/clusterruns.py resolves them) are removed as
`remove` removes backups: what a kept backup depends on is merged forward into it (its
merged backup ends where it ended, so the runs naming it still resolve), the rest is
deleted; the bucket's newest backup is never removed, and backups no run names (a killed
run's) are left. Then, last, the dropped runs' files are deleted. In that order a kill
leaves the dropped runs' files, naming backups that are gone (incomplete runs, which
`restore --run` refuses in one line and the next prune or remove deletes), and never a
kept run naming a removed backup nor backups that no run names any more (which nothing
would remove: they look like a killed backup's).

Merge. Per bucket, the backups from the one the first run of the range names (default:
the start of the bucket's chain) to the one its last run naming the bucket names are
merged into one; then the run files of the range that no longer restore (all but the
last, unless none of their backups was merged) are deleted: the last run resolves through
the merged backup. A bucket whose runs in the range name backups on two chains (dropped
and created again) is reported and left as it is.

`buckets` restricts any of them to those buckets; the run files are then kept (the runs
that named removed backups are reported as incomplete).
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Iterable

from dcptool.archive.cluster import ClusterArchive
from dcptool.archive.clusterruns import (
    RunResolver,
    check_run_ids,
    delete_run,
    named_backups,
)
from dcptool.archive.merging import finish_interrupted_merges, plan_merge
from dcptool.archive.retention import Policy, apply_policy, backup_time, older_than, \
    parse_duration, within_newest
from dcptool.errors import UsageError


def _time(rid: str) -> str:
    return backup_time(rid).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def select_buckets(cluster: ClusterArchive, buckets: Iterable[str] | None) -> list[str]:
    """The bucket archives to work on: `buckets` (each checked), else all."""
    have = cluster.bucket_names()
    wanted = sorted(set(buckets or ()))
    if not wanted:
        return have
    unknown = [b for b in wanted if b not in have]
    if unknown:
        raise UsageError(f"{cluster.path} holds no bucket {', '.join(unknown)}",
                         hint=f"its buckets: {', '.join(have) or 'none'}")
    return wanted


def _incomplete(resolver: RunResolver, run_ids: Iterable[str]) -> dict[str, dict[str, str]]:
    out = {}
    for rid in run_ids:
        st = resolver.state(rid)
        if not st.complete:
            out[rid] = st.gone
    return out


# -- prune and remove ----------------------------------------------------------------------------


def _drop_runs(command: str, cluster: ClusterArchive, drop: Iterable[str],
               reasons: dict[str, list[str]], *, buckets: Iterable[str] | None,
               dry_run: bool, partitions: int | None, master: str | None,
               level: int | None, spark: Any, selection: dict[str, Any]) -> dict[str, Any]:
    from .prune import run_removal

    t0 = time.monotonic()
    run_ids = cluster.run_ids()
    drop = sorted(set(drop))
    kept = [r for r in run_ids if r not in set(drop)]
    names = select_buckets(cluster, buckets)
    resolver = RunResolver(cluster)
    out: dict[str, Any] = {
        "archive": str(cluster.path), "dry_run": dry_run, **selection,
        "runs": [{"id": r, "time": _time(r), "action": "drop" if r in drop else "keep",
                  "reasons": reasons.get(r, [])} for r in run_ids],
        "kept_runs": kept, "dropped_runs": drop, "deleted_runs": [],
        "buckets": {}, "incomplete_runs": {}, "seconds": 0.0,
    }
    # a dry run only reads, as a bucket archive's does: it takes no lock
    with nullcontext() if dry_run else cluster.lock(command):

        def wanted(b: str, archive: Any = None) -> tuple[list[str], dict[str, list[str]]]:
            """(the backups of bucket b to remove, {backup: why kept or removed})."""
            if archive is not None and not dry_run:
                finish_interrupted_merges(archive)
                resolver.forget(b)
            manifests = resolver.manifests(b)
            why: dict[str, list[str]] = {bid: [] for bid in manifests}
            by_kept: set[str] = set()
            by_dropped: set[str] = set()
            for rid in run_ids:
                named = named_backups(resolver.record(rid)).get(b)
                bid = resolver.resolve(b, named) if named else None
                if bid is None:
                    continue
                if rid in drop:
                    by_dropped.add(bid)
                    why[bid].append(f"run {rid} (dropped)")
                else:
                    by_kept.add(bid)
                    why[bid].append(f"run {rid}")
            newest = max(manifests) if manifests else None
            if newest is not None:
                why[newest].append("newest")
            for bid, w in why.items():
                if not w:
                    w.append("named by no run")
            remove = sorted(bid for bid in by_dropped - by_kept if bid != newest)
            return remove, why

        if not dry_run:
            # refuse before any bucket archive changes, not halfway through
            for b in names:
                remove, _ = wanted(b)
                partial = resolver.archive(b).partial_ids() if remove else []
                if partial:
                    raise UsageError(f"bucket {b}'s archive holds a partial backup "
                                     f"{partial[-1]} (a backup run that did not finish)",
                                     hint="the next backup of the cluster resumes it; "
                                          f"{command} after it")
        for b in names:
            archive = resolver.archive(b)
            remove, _ = wanted(b)
            only_read = dry_run or not remove  # then no lock is taken: nothing is finished
            res = run_removal(command, archive,
                       lambda a, b=b, r=only_read: wanted(b, None if r else a),
                       dry_run=only_read, strict=False, partitions=partitions,
                       master=master, level=level, spark=spark, selection={})
            resolver.forget(b)
            res.pop("dry_run", None)
            out["buckets"][b] = res
        if not dry_run and not buckets:
            # last: see the module doc for why after the bucket archives
            for rid in drop:
                delete_run(cluster, rid)
            out["deleted_runs"] = list(drop)
        out["incomplete_runs"] = _incomplete(
            resolver, [r for r in run_ids if r not in out["deleted_runs"]])
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def run_cluster_prune(cluster: ClusterArchive, policy: Policy, *, buckets=None,
                      dry_run: bool = False, partitions: int | None = None,
                      master: str | None = None, level: int | None = None,
                      spark=None) -> dict[str, Any]:
    """Drop the runs `policy` does not keep; the result as `prune --json` prints it for a
    cluster archive."""
    if policy.empty:
        raise UsageError("prune needs a policy: give at least one --keep-* option",
                         hint="e.g. --keep-last 3 --keep-daily 7")
    reasons = apply_policy(cluster.run_ids(), policy)
    drop = [r for r, why in reasons.items() if not why]
    return _drop_runs("prune", cluster, drop, reasons, buckets=buckets, dry_run=dry_run,
                      partitions=partitions, master=master, level=level, spark=spark,
                      selection={"policy": policy.as_dict()})


def run_cluster_remove(cluster: ClusterArchive, runs: Iterable[str] = (), *,
                       older: str | None = None, buckets=None, dry_run: bool = False,
                       partitions: int | None = None, master: str | None = None,
                       level: int | None = None, spark=None,
                       keep_within: str | None = None) -> dict[str, Any]:
    """Drop the named runs, or those older than a duration; the result as `remove --json`
    prints it for a cluster archive. `keep_within`: never the runs within that duration of
    the newest run."""
    runs = list(runs)
    if bool(runs) == (older is not None):
        raise UsageError("give --run RUN-ID (one or more) or --older-than DURATION",
                         hint="e.g. dcptool remove ARCHIVE --older-than 30d")
    ids = cluster.run_ids()
    if not ids:
        raise UsageError(f"{cluster.path} holds no committed backup run to remove")
    kept = within_newest(ids, keep_within) if keep_within else set()
    if older is not None:
        drop = [r for r in older_than(ids, parse_duration(older)) if r != ids[-1]
                and r not in kept]
    else:
        drop = check_run_ids(cluster, runs)
        inside = [r for r in drop if r in kept]
        if inside:
            raise UsageError(f"run {inside[0]} is within {keep_within} of the newest run "
                             "(--keep-within)")
        if ids[-1] in drop:
            raise UsageError(f"run {ids[-1]} is the newest: it is never removed (the next "
                             "backup of each bucket continues from its backups)",
                             hint="remove older runs, or take a new backup first")
    reasons = {r: [] if r in drop else ["newest"] if r == ids[-1] else
               [f"within {keep_within}"] if r in kept else ["not named"] for r in ids}
    return _drop_runs("remove", cluster, drop, reasons, buckets=buckets, dry_run=dry_run,
                      partitions=partitions, master=master, level=level, spark=spark,
                      selection={"selection": {"runs": runs, "older_than": older}})


# -- merge ---------------------------------------------------------------------------------------


def run_cluster_merge(cluster: ClusterArchive, *, first: str | None = None,
                      last: str | None = None, buckets=None, level: int | None = None,
                      partitions: int | None = None, master: str | None = None,
                      spark=None) -> dict[str, Any]:
    """Merge the runs `first`..`last` (default: all); the result as `merge --json` prints it
    for a cluster archive."""
    from .merge import run_merge

    t0 = time.monotonic()
    ids = cluster.run_ids()
    if not ids:
        raise UsageError(f"{cluster.path} holds no committed backup run to merge")
    check_run_ids(cluster, [r for r in (first, last) if r is not None])
    lo, hi = first or ids[0], last or ids[-1]
    if lo > hi:
        raise UsageError(f"--from {lo} is after --to {hi}")
    rng = [r for r in ids if lo <= r <= hi]
    names = select_buckets(cluster, buckets)
    out: dict[str, Any] = {"archive": str(cluster.path), "from": lo, "to": hi, "runs": rng,
                           "buckets": {}, "deleted_runs": [], "kept_runs": [],
                           "seconds": 0.0}
    with cluster.lock("merge"):
        resolver = RunResolver(cluster)
        todo: dict[str, tuple[str, str]] = {}
        for b in names:
            archive = resolver.archive(b)
            with archive.lock("merge"):
                finish_interrupted_merges(archive)
            resolver.forget(b)
            named = [(r, n, resolver.resolve(b, n)) for r in rng
                     for n in [named_backups(resolver.record(r)).get(b)] if n]
            entry: dict[str, Any] = {"status": "nothing", "reason": None, "first": None,
                                     "last": None, "merge": None}
            out["buckets"][b] = entry
            if not named:
                entry["reason"] = "no run of the range backed it up"
                continue
            r_last, n_last, end = named[-1]
            if end is None:
                entry.update(status="left", reason=f"run {r_last}'s backup {n_last} is gone")
                continue
            manifests = resolver.manifests(b)
            chain = archive.chain_ids(manifests, end)
            off = [(r, x) for r, _n, x in named if x is not None and x not in chain]
            if off:
                entry.update(status="left", reason=(
                    f"two chains: run {off[0][0]}'s backup {off[0][1]} is not on the chain of "
                    f"{end} (the bucket was dropped and created again)"))
                continue
            if first is not None:
                start = named[0][2]
                if start is None:
                    entry.update(status="left",
                                 reason=f"run {named[0][0]}'s backup {named[0][1]} is gone")
                    continue
            else:
                start = chain[0]
            entry.update(first=start, last=end)
            if chain.index(end) <= chain.index(start):
                entry["reason"] = "one backup"
                continue
            try:
                plan_merge(archive, start, end)  # refuses before any bucket changes
            except UsageError as exc:
                raise UsageError(f"bucket {b}: {exc}", hint=exc.hint) from None
            todo[b] = (start, end)
        for b, (start, end) in todo.items():
            r = run_merge(resolver.archive(b), first=start, last=end, partitions=partitions,
                          master=master, level=level, spark=spark)
            resolver.forget(b)
            out["buckets"][b].update(status="merged", merge=r.as_dict())
        if todo and not buckets:
            # last: the runs of the range that the merges left incomplete (the last run
            # resolves through the merged backups)
            for rid in rng[:-1]:
                if resolver.state(rid).complete:
                    out["kept_runs"].append(rid)
                else:
                    delete_run(cluster, rid)
                    out["deleted_runs"].append(rid)
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


__all__ = ["run_cluster_prune", "run_cluster_remove", "run_cluster_merge", "select_buckets"]
