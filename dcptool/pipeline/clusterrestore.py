"""Restore a cluster archive's run (`archive/cluster.py`) into a cluster: every bucket of the
run (or a selection), each into the target's bucket of its name (or the one --map-data
gives), building what is missing first.

Before anything is written, the run's buckets are matched with the target's (Couchbase's
`GET /pools/default/buckets`): a bucket the target lacks is an error in one line unless
`auto_create` creates it (`POST /pools/default/buckets`) with its recorded settings (the
RAM quota overridable: a smaller target); `bucket_config` applies the recorded settings a
bucket may change (`POST /pools/default/buckets/NAME`) to buckets that exist; `users`
restores the run's users and groups through Couchbase's backup endpoint (`PUT
/settings/rbac/backup`), existing ones left alone unless `force_users`. Then each bucket
is restored as `dcptool restore` restores a bucket archive, one after the other on the one
Spark context the first starts. A dry run reports all of it and changes nothing.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dcptool.archive.cluster import ClusterArchive
from dcptool.archive.clusterruns import RunResolver, incomplete_message
from dcptool.errors import UsageError

from .clusterbackup import data_names, names_of_bucket

#: recorded settings a bucket takes at creation, as Couchbase's create parameters
CREATE_FIELDS = ("bucketType", "replicaNumber", "evictionPolicy", "maxTTL", "compressionMode",
                 "conflictResolutionType", "durabilityMinLevel")
#: those an existing bucket may change (Couchbase's edit refuses the others)
EDIT_FIELDS = ("replicaNumber", "evictionPolicy", "maxTTL", "compressionMode",
               "durabilityMinLevel")
MIB = 1024 * 1024


@dataclass
class ClusterRestoreResult:
    run_id: str
    dry_run: bool
    #: source bucket -> {"target", "backup", "restore": the bucket's restore summary}
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    configured: dict[str, dict[str, Any]] = field(default_factory=dict)
    users: dict[str, Any] | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "dry_run": self.dry_run, "buckets": self.buckets,
                "created_buckets": self.created, "configured_buckets": self.configured,
                "users": self.users, "seconds": round(self.seconds, 3)}


def create_form(name: str, settings: dict[str, Any], ram_quota: int | None) -> dict[str, Any]:
    """Couchbase's create-bucket parameters for a bucket of recorded `settings`."""
    form: dict[str, Any] = {"name": name}
    for k in CREATE_FIELDS:
        if k in settings and settings[k] is not None:
            form[k] = settings[k]
    quota = settings.get("quota")
    if ram_quota is not None:
        form["ramQuota"] = ram_quota
    elif isinstance(quota, dict) and isinstance(quota.get("rawRAM") or quota.get("ram"), int):
        form["ramQuota"] = max(1, (quota.get("rawRAM") or quota["ram"]) // MIB)
    if settings.get("numVBuckets") in (64, 128, 1024):  # what Couchbase lets a bucket have
        form["numVBuckets"] = settings["numVBuckets"]
    if settings.get("flushEnabled") is not None:
        form["flushEnabled"] = int(bool(settings["flushEnabled"]))
    return form


def edit_form(settings: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The recorded settings an existing bucket may change and holds otherwise."""
    return {k: settings[k] for k in EDIT_FIELDS
            if k in settings and settings[k] is not None and current.get(k) != settings[k]}


def bucket_maps(given: list[str] | None, names: set[str]) -> tuple[dict[str, str], list[str]]:
    """({source bucket: target bucket}, the other --map-data entries): an entry whose source
    is a bucket of the run renames that bucket; the others map scopes and collections in
    every bucket, as in a bucket archive's restore."""
    buckets: dict[str, str] = {}
    rest: list[str] = []
    for g in given or ():
        for entry in (e.strip() for e in g.split(",")):
            if not entry:
                continue
            src, sep, dst = entry.partition("=")
            if sep and src in names:
                if not dst or "." in dst:
                    raise UsageError(f"--map-data {entry}: a bucket maps to a bucket name")
                buckets[src] = dst
            else:
                rest.append(entry)
    return buckets, rest


def run_cluster_restore(opts: Any, cluster: ClusterArchive, *, run_id: str | None = None,
                        buckets: list[str] | None = None, map_data: list[str] | None = None,
                        auto_create: bool = False, bucket_config: bool = False,
                        users: bool = False, force_users: bool = False,
                        ram_quota: int | None = None, dry_run: bool = False,
                        rest_port: int | None = None,
                        notice: Callable[[str], None] | None = None,
                        on_bucket: Callable[[str, int, int], None] | None = None,
                        **restore: Any) -> ClusterRestoreResult:
    """Restore run `run_id` (default: the latest) of `cluster` into the node `opts`;
    `restore`: run_restore's options for each bucket (include_data/exclude_data names
    select buckets too: a bare bucket name, or bucket.scope[.collection])."""
    from dcptool.client.rest import rest_client_for

    started = time.monotonic()
    tell = notice or (lambda _msg: None)
    record = cluster.run(run_id)
    result = ClusterRestoreResult(record["id"], dry_run)
    in_run = {n: b for n, b in record.get("buckets", {}).items()
              if isinstance(b, dict) and b.get("backup")}
    renames, scope_maps = bucket_maps(map_data, set(in_run))
    include = data_names(restore.pop("include_data", None))
    exclude = data_names(restore.pop("exclude_data", None))
    in_run = _selected_buckets(record["id"], in_run, buckets or [], include, exclude)
    in_run = _resolved_backups(cluster, record["id"], in_run)
    at = restore.get("to_time")
    if at is not None:
        _backups_at(cluster, in_run, at, nearest=restore.get("nearest", False))
    rest = rest_client_for(opts, rest_port)
    on_target = {b["name"]: b for b in rest.request("GET", "/pools/default/buckets") or []
                 if isinstance(b, dict) and isinstance(b.get("name"), str)}
    missing = sorted(renames.get(n, n) for n in in_run if renames.get(n, n) not in on_target)
    if missing and not auto_create:
        raise UsageError(f"{opts.address} has no bucket {', '.join(missing)}",
                         hint="--auto-create-buckets creates it with its recorded settings")

    # what the restore builds, before any document: buckets, their settings, users
    _build_buckets(rest, opts.address, in_run, renames, on_target, result,
                   ram_quota=ram_quota, bucket_config=bucket_config, dry_run=dry_run, tell=tell)
    if users:
        result.users = _restore_users(rest, record, force_users, dry_run, tell)

    _restore_buckets(opts, cluster, in_run, renames, result, by_time=at is not None,
                     dry_run=dry_run, scope_maps=scope_maps, include=include, exclude=exclude,
                     rest_port=rest_port, notice=notice, on_bucket=on_bucket, restore=restore)
    result.seconds = time.monotonic() - started
    return result


def _selected_buckets(run: str, in_run: dict[str, dict[str, Any]], buckets: list[str],
                      include: list[str], exclude: list[str]) -> dict[str, dict[str, Any]]:
    """The buckets of run `run` (`in_run`) that `buckets` and the --include-data names'
    buckets select (all without them), less those --exclude-data names; none left, or a
    bucket named that the run lacks, is a usage error."""
    wanted = set(buckets) | {n.split(".", 1)[0] for n in include}
    if wanted:
        unknown = sorted(wanted - set(in_run))
        if unknown:
            raise UsageError(f"run {run} holds no bucket {', '.join(unknown)}",
                             hint=f"its buckets: {', '.join(sorted(in_run)) or 'none'}")
        in_run = {n: b for n, b in in_run.items() if n in wanted}
    in_run = {n: b for n, b in in_run.items() if n not in exclude}
    if not in_run:
        raise UsageError(f"run {run} holds no bucket to restore"
                         + (" that the selection leaves in" if (wanted or exclude) else ""))
    return in_run


def _resolved_backups(cluster: ClusterArchive, run: str,
                      in_run: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`in_run` with each bucket's backup as the run names it, resolved through the merges
    since (a merged backup that ends where the named one ended restores the same); a
    backup gone stops the restore here."""
    state = RunResolver(cluster).state(run, in_run)
    if not state.complete:
        bucket = next(iter(state.gone))
        raise UsageError(incomplete_message(state),
                         hint=f"restore another run, or leave the bucket out with "
                              f"--exclude-data {bucket}")
    return {n: {**b, "backup": state.resolved[n]} for n, b in in_run.items()}


def _backups_at(cluster: ClusterArchive, in_run: dict[str, dict[str, Any]], at: int, *,
                nearest: bool) -> None:
    """Each bucket of `in_run` to the time `at`, by its own archive's coverage: its backup
    becomes the last of the chain that holds the time. Every bucket is checked (a gap
    refused) before anything is created or written."""
    from dcptool.archive.pointintime import plan_time

    for n in sorted(in_run):
        when = plan_time(cluster.open_bucket(n), at, nearest=nearest,
                         option=f"--to-time (bucket {n})")
        if not when.chain:
            raise UsageError(f"bucket {n}: no chain of its archive began by the time "
                             "asked")
        in_run[n]["backup"] = when.chain[-1]


def _build_buckets(rest: Any, address: str, in_run: dict[str, dict[str, Any]],
                   renames: dict[str, str], on_target: dict[str, dict[str, Any]],
                   result: ClusterRestoreResult, *, ram_quota: int | None, bucket_config: bool,
                   dry_run: bool, tell: Callable[[str], None]) -> None:
    """Create the target buckets `on_target` lacks with their recorded settings, and
    (`bucket_config`) give the others the recorded settings they may change; noted in
    `result` (a dry run changes nothing)."""
    from dcptool.client.rest import RestError

    for name in sorted(in_run):
        target = renames.get(name, name)
        settings = in_run[name].get("settings") or {}
        if target not in on_target:
            form = create_form(target, settings, ram_quota)
            result.created.append(target)
            if not dry_run:
                try:
                    rest.request("POST", "/pools/default/buckets", form)
                except RestError as exc:
                    raise UsageError(f"creating bucket {target} on {address} failed: "
                                     f"{exc}") from None
                tell(f"created bucket {target}")
        elif bucket_config:
            change = edit_form(settings, on_target[target])
            if change:
                result.configured[target] = change
                if not dry_run:
                    rest.request("POST", f"/pools/default/buckets/{target}", change)
                    tell(f"changed bucket {target}'s {', '.join(sorted(change))}")


def _restore_buckets(opts: Any, cluster: ClusterArchive, in_run: dict[str, dict[str, Any]],
                     renames: dict[str, str], result: ClusterRestoreResult, *, by_time: bool,
                     dry_run: bool, scope_maps: list[str], include: list[str],
                     exclude: list[str], rest_port: int | None,
                     notice: Callable[[str], None] | None,
                     on_bucket: Callable[[str, int, int], None] | None,
                     restore: dict[str, Any]) -> None:
    """Restore each bucket of `in_run` as a bucket archive is restored, one after the
    other, into `result.buckets` (`by_time`: to the time in `restore`, not a backup)."""
    from dcptool.pipeline.restore import run_restore

    for i, name in enumerate(sorted(in_run)):
        target = renames.get(name, name)
        if on_bucket is not None:
            on_bucket(name, i, len(in_run))
        if dry_run and target in result.created:
            # nothing to check the documents against yet: the bucket would be made first
            result.buckets[name] = {"target": target, "backup": in_run[name]["backup"],
                                    "restore": None}
            continue
        r = run_restore(cluster.open_bucket(name), dataclasses.replace(opts, bucket=target),
                        backup=None if by_time else in_run[name]["backup"],
                        dry_run=dry_run, map_data=scope_maps,
                        include_data=names_of_bucket(include, name),
                        exclude_data=names_of_bucket(exclude, name), rest_port=rest_port,
                        notice=notice, **restore)
        result.buckets[name] = {"target": target, "backup": in_run[name]["backup"],
                                "restore": r.as_dict()}


def _restore_users(rest: Any, record: dict[str, Any], force: bool, dry_run: bool,
                   tell: Callable[[str], None]) -> dict[str, Any]:
    """Put the run's users and groups on the target through Couchbase's backup endpoint
    (existing ones kept unless `force`): {"users", "groups": names added (or that would
    be), "kept_users", "kept_groups": names the target has already and keeps}."""
    run_users = record.get("users")
    run_groups = record.get("groups") or []
    if run_users is None:
        raise UsageError(f"run {record['id']} recorded no users (it was made with "
                         "--disable-users)", hint="leave --enable-users out")

    def ids(path: str) -> set[str]:
        return {str(d.get("id") or d.get("name")) for d in rest.request("GET", path) or []
                if isinstance(d, dict)}

    have_users, have_groups = ids("/settings/rbac/users"), ids("/settings/rbac/groups")
    user_ids = [str(u.get("id")) for u in run_users]
    group_ids = [str(g.get("name") or g.get("id")) for g in run_groups]
    out = {"users": sorted(u for u in user_ids if force or u not in have_users),
           "groups": sorted(g for g in group_ids if force or g not in have_groups),
           "kept_users": [] if force else sorted(set(user_ids) & have_users),
           "kept_groups": [] if force else sorted(set(group_ids) & have_groups)}
    if not dry_run and (run_users or run_groups):
        doc = {"version": record.get("rbac_version") or "1", "users": run_users,
               "groups": run_groups}
        rest.request("PUT", "/settings/rbac/backup",
                     {"backup": json.dumps(doc), "canOverwrite": "true" if force else "false"})
        tell(f"restored {len(out['users'])} users and {len(out['groups'])} groups")
    return out
