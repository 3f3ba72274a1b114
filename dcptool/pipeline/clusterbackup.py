"""A backup of every bucket of a cluster into a cluster archive (`archive/cluster.py`).

One run: the cluster archive's lock is taken; the buckets the user may back up are listed
over the node's REST port (Couchbase's `GET /pools/default/buckets`, which lists those
the user may see) and each is checked for the privileges a backup needs (a bucket the user
may see but not back up is left out with a notice, or refused when named); users and groups are read from Couchbase's backup endpoint (`GET
/settings/rbac/backup`) before any data moves, so a user who may not read them is told
before any work; then each bucket is backed up into its bucket archive, one after the
other on the one Spark context the first starts (its chain incremental on its own; a
bucket new since the last run starts full; one dropped and created again since then,
whose history no longer continues its archive's, starts a new full backup in the same
bucket archive); buckets the archive holds that the node no longer has are kept and
reported as dropped. Last, the run's record (`runs/RUN-ID.json`) commits the run: each
bucket's backup id, its settings, its scopes and collections, and the users and groups.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dcptool.archive import storage
from dcptool.archive.cluster import BUCKET_NAME_RE, ClusterArchive, archive_kind
from dcptool.archive.format import iso_time, utc_now
from dcptool.errors import UsageError

#: the fields of a Couchbase bucket document that are its settings (what a restore that
#: creates the bucket gives back), as Couchbase Server names them
SETTINGS_FIELDS = ("bucketType", "storageBackend", "replicaNumber", "replicaIndex",
                   "evictionPolicy", "maxTTL", "compressionMode", "conflictResolutionType",
                   "durabilityMinLevel", "numVBuckets", "quota", "flushEnabled",
                   "threadsNumber", "purgeInterval")


@dataclass
class ClusterBackupResult:
    run_id: str
    archive: str
    #: bucket -> {"status": "full" | "incremental" | "recreated", "backup": backup summary}
    buckets: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: buckets the archive holds that the node no longer has
    dropped: list[str] = field(default_factory=list)
    #: buckets the user may see but not back up, left out of the run (sorted)
    left_out: list[str] = field(default_factory=list)
    #: how many users and groups the run recorded (None: left out)
    users: int | None = None
    groups: int | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        totals = {k: sum(b["backup"][k] for b in self.buckets.values())
                  for k in ("mutations", "deletions", "expirations", "items_streamed",
                            "size_on_disk")}
        return {"run_id": self.run_id, "archive": self.archive, "buckets": self.buckets,
                "dropped": self.dropped, "left_out": self.left_out, "users": self.users, "groups": self.groups,
                "totals": totals, "seconds": round(self.seconds, 3)}


def settings_of(doc: dict[str, Any]) -> dict[str, Any]:
    """A bucket's settings from its Couchbase bucket document."""
    out = {k: doc[k] for k in SETTINGS_FIELDS if k in doc}
    if "flushEnabled" not in out:  # Couchbase shows it as the flush controller
        out["flushEnabled"] = "flush" in (doc.get("controllers") or {})
    if "numVBuckets" not in out and isinstance(doc.get("vBucketServerMap"), dict):
        out["numVBuckets"] = len(doc["vBucketServerMap"].get("vBucketMap") or [])
    return out


def open_or_create(location: str, *, passphrase: Any,
                   new_passphrase: str | None) -> tuple[ClusterArchive, bool]:
    """(the cluster archive at `location`, whether it was created now)."""
    kind = archive_kind(location)
    if kind == "bucket":
        raise UsageError(f"{location} is an archive of one bucket, not of a cluster",
                         hint="back up that bucket with -b, or the cluster into a new archive")
    if kind == "cluster":
        return ClusterArchive.open(location, passphrase=passphrase), False
    from dcptool.archive.errors import ArchiveExistsError

    try:
        return ClusterArchive.create(location, passphrase=new_passphrase), True
    except ArchiveExistsError:  # another run created it a moment ago
        return ClusterArchive.open(location, passphrase=new_passphrase or passphrase), False


def run_cluster_backup(opts: Any, location: str, *, passphrase: Any = None,
                       new_passphrase: str | None = None, buckets: list[str] | None = None,
                       bucket_config: bool = True, users: bool = True,
                       rest_port: int | None = None,
                       notice: Callable[[str], None] | None = None,
                       on_bucket: Callable[[str, int, int], None] | None = None,
                       **backup: Any) -> ClusterBackupResult:
    """Back up every bucket of the node `opts` the user may back up (or those named in
    `buckets`) into the cluster archive at `location` (created when there is none,
    encrypted under `new_passphrase` when given; an encrypted one opens with
    `passphrase`). `backup`: run_backup's options, for each bucket. `on_bucket(name, i,
    n)` is called as each bucket's backup begins."""
    from dcptool.client.rest import rest_client_for
    from dcptool.pipeline.backup import AnotherBucketError, run_backup

    started = time.monotonic()
    tell = notice or (lambda _msg: None)
    cluster, _created = open_or_create(location, passphrase=passphrase,
                                       new_passphrase=new_passphrase)
    key = cluster.passphrase
    with cluster.lock("backup"):
        rest = rest_client_for(opts, rest_port)
        listed = node_buckets(rest)
        rbac = read_rbac(opts, rest) if users else None
        include = data_names(backup.pop("include_data", None))
        exclude = data_names(backup.pop("exclude_data", None))
        buckets = named_buckets(buckets, include)
        on_node = selected(opts, listed, buckets, exclude)
        left_out = left_out_for_privileges(opts, on_node, named=bool(buckets),
                                                  watermark=backup.get("watermark", True),
                                                  tell=tell)
        if not on_node:
            raise UsageError(f"{opts.address} has no bucket {opts.username} may back up"
                             + (" that the selection leaves in" if exclude else ""))
        run_id = cluster.new_run_id()
        result = ClusterBackupResult(run_id, str(storage.location(location)),
                                     left_out=left_out)
        record: dict[str, Any] = {"time": iso_time(utc_now()), "node": opts.address,
                                  "buckets": {}}
        for i, name in enumerate(sorted(on_node)):
            doc = on_node[name]
            if on_bucket is not None:
                on_bucket(name, i, len(on_node))
            b_opts = dataclasses.replace(opts, bucket=name)
            status = None
            backup["include_data"] = names_of_bucket(include, name)
            backup["exclude_data"] = names_of_bucket(exclude, name)
            try:
                r = run_backup(b_opts, cluster.bucket_path(name), passphrase=key, notice=notice,
                               **backup)
            except AnotherBucketError:
                tell(f"bucket {name} was dropped and created again since its last backup: "
                     "a new full backup of it")
                r = run_backup(b_opts, cluster.bucket_path(name), passphrase=key, notice=notice,
                               **{**backup, "full": True})
                status = "recreated"
            entry: dict[str, Any] = {"backup": r.backup_id, "uuid": doc.get("uuid"),
                                     "status": status or r.type}
            if bucket_config:
                entry["settings"] = settings_of(doc)
                scopes = read_scopes(rest, name)
                if scopes is not None:
                    entry["scopes"] = scopes
            record["buckets"][name] = entry
            result.buckets[name] = {"status": entry["status"], "backup": r.as_dict()}
        if not buckets:
            for name in cluster.bucket_names():
                if name not in on_node:
                    result.dropped.append(name)
                    record["buckets"][name] = {"status": "dropped"}
                    tell(f"bucket {name} is in the archive but no longer on {opts.address}: "
                         "its backups are kept")
        if rbac is not None:
            record.update(rbac_fields(rbac))
            result.users, result.groups = len(record["users"]), len(record["groups"])
        cluster.write_run(run_id, record)
    result.seconds = time.monotonic() - started
    return result


def node_buckets(rest: Any) -> dict[str, dict[str, Any]]:
    """{name: Couchbase bucket document} of the buckets the node lists to the user."""
    listed = rest.request("GET", "/pools/default/buckets") or []
    return {b["name"]: b for b in listed
            if isinstance(b, dict) and isinstance(b.get("name"), str)
            and BUCKET_NAME_RE.fullmatch(b["name"])}


def read_rbac(opts: Any, rest: Any) -> Any:
    """The cluster's users and groups as its backup endpoint gives them (a user who may
    not read them: a one-line UsageError)."""
    from dcptool.client.rest import RestError

    try:
        return rest.request("GET", "/settings/rbac/backup")
    except RestError as exc:
        if exc.forbidden:
            raise UsageError(f"{opts.username} may not read the cluster's users and groups "
                             f"({exc})", hint="--disable-users leaves them out") from None
        raise


def rbac_fields(rbac: Any) -> dict[str, Any]:
    """What a run's record holds of the users and groups read by `read_rbac`."""
    ok = isinstance(rbac, dict)
    return {"users": rbac.get("users", []) if ok else [],
            "groups": rbac.get("groups", []) if ok else [],
            "rbac_version": rbac.get("version") if ok else None}


def read_scopes(rest: Any, name: str) -> Any:
    """A bucket's scopes and collections (None: the node has no collections)."""
    from dcptool.client.rest import RestError

    try:
        return rest.request("GET", f"/pools/default/buckets/{name}/scopes")
    except RestError as exc:
        if exc.status != 404:  # a node without collections has no such endpoint
            raise
        return None


def named_buckets(buckets: list[str] | None, include: list[str]) -> list[str] | None:
    """The buckets a selection names (-b, and the buckets --include-data names); None:
    every bucket."""
    if include:
        return sorted({n.split(".", 1)[0] for n in include} | set(buckets or ()))
    return list(buckets) if buckets else None


def selected(opts: Any, on_node: dict[str, Any], buckets: list[str] | None,
             exclude: list[str]) -> dict[str, Any]:
    """The buckets of `on_node` the selection leaves in (a named one the node lacks: a
    one-line UsageError)."""
    if buckets:
        missing = sorted(set(buckets) - set(on_node))
        if missing:
            raise UsageError(f"{opts.address} has no bucket {', '.join(missing)} "
                             "(or the user may not see it)")
        on_node = {n: on_node[n] for n in buckets}
    return {n: d for n, d in on_node.items() if n not in exclude}


def left_out_for_privileges(opts: Any, on_node: dict[str, Any], *, named: bool,
                            watermark: bool, tell: Callable[[str], None]) -> list[str]:
    """Check, before any data moves, that the user may back up each bucket of `on_node`
    (stream it over DCP, and register its watermark unless `watermark` is off): a bucket
    the user may list but not back up is taken out of `on_node` with a notice, or, when
    the buckets were `named` (-b, --include-data), is the run's one-line PrivilegeError.
    The buckets left out, sorted."""
    from dcptool.client.errors import UnknownBucketError
    from dcptool.client.privileges import (
        DCP_PRODUCER, WATERMARK_WRITE, PrivilegeError, check_privileges,
    )

    wanted = [DCP_PRODUCER, *([WATERMARK_WRITE] if watermark else [])]
    left_out = []
    for name in sorted(on_node):
        try:
            check_privileges(dataclasses.replace(opts, bucket=name), "back up", *wanted)
        except (PrivilegeError, UnknownBucketError) as exc:  # refused: no role in it
            if named:
                raise
            del on_node[name]
            left_out.append(name)
            tell(f"bucket {name} left out: {exc}")
    return left_out


def data_names(given: list[str] | None) -> list[str]:
    """--include-data/--exclude-data's names (comma-separated, repeatable)."""
    return [n.strip() for g in given or () for n in g.split(",") if n.strip()]


def names_of_bucket(names: list[str], bucket: str) -> list[str] | None:
    """The names of `bucket`'s scopes and collections among `names` (None: none, so the
    whole bucket; a bare bucket name selects it whole)."""
    mine = [n for n in names if n.startswith(bucket + ".")]
    return mine or None
