"""Reading a cluster archive as a whole: which of its buckets a reader wants, what it
holds (for `dcptool info`) and whether its run files are sound (for `dcptool verify`).
Reads metadata files only; each bucket archive is described and verified by the bucket
archive's own code (archive/info.py, archive/verify.py)."""
from __future__ import annotations

from typing import Any, Iterable

from .cluster import ClusterArchive
from .errors import ArchiveError
from .info import describe_archive
from .lock import ArchiveLock

_ITEM_COUNTS = ("mutations", "deletions", "expirations")


def split_names(values: Iterable[str] | str | None) -> list[str]:
    """Bucket names as given: repeated options and comma lists, in order, once each."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for v in values:
        for name in str(v).split(","):
            name = name.strip()
            if name and name not in out:
                out.append(name)
    return out


def select_buckets(cluster: ClusterArchive, wanted: Iterable[str] | str | None, *,
                   option: str = "--bucket") -> list[str]:
    """The buckets of `cluster` a reader wants: those named (checked to be in it), or
    every bucket it holds when none is named. An unknown name is one ArchiveError that
    lists the buckets there are."""
    have = cluster.bucket_names()
    names = split_names(wanted)
    unknown = [n for n in names if n not in have]
    if unknown:
        raise ArchiveError(
            f"{option} {unknown[0]}: cluster archive {cluster.path} holds no bucket "
            f"{unknown[0]!r} (it holds {', '.join(have) or 'none'})")
    return names or have


def one_bucket(cluster: ClusterArchive, wanted: Iterable[str] | str | None, *,
               option: str = "--bucket") -> str:
    """The one bucket a reader of one bucket wants: the one named, or the archive's only
    bucket; an ArchiveError naming the buckets when that is not one."""
    names = select_buckets(cluster, wanted, option=option)
    if len(names) == 1:
        return names[0]
    if not names:
        raise ArchiveError(f"cluster archive {cluster.path} holds no bucket yet")
    raise ArchiveError(f"{cluster.path} is a cluster archive of {len(names)} buckets "
                       f"({', '.join(names)}): give {option} NAME")


def run_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """A run's record, short: its id, each bucket's status and backup, users and groups
    counted (None: the run did not back them up). No password hash."""
    buckets = doc.get("buckets") if isinstance(doc.get("buckets"), dict) else {}
    users, groups = doc.get("users"), doc.get("groups")
    return {
        "id": doc.get("id"),
        "buckets": {name: {"status": (b or {}).get("status"), "backup": (b or {}).get("backup")}
                    for name, b in sorted(buckets.items())},
        "backed_up": sorted(n for n, b in buckets.items() if (b or {}).get("backup")),
        "users": len(users) if isinstance(users, list) else None,
        "groups": len(groups) if isinstance(groups, list) else None,
    }


def _bucket_row(desc: dict[str, Any]) -> dict[str, Any]:
    complete = [b for b in desc["backups"] if b["state"] == "complete"]
    return {
        "backups": len(complete),
        "partial_backups": sum(1 for b in desc["backups"] if b["state"] == "partial"),
        "damaged_backups": sum(1 for b in desc["backups"] if b["state"] == "damaged"),
        "items": sum(b[k] for b in complete for k in _ITEM_COUNTS),
        **{k: sum(b[k] for b in complete) for k in _ITEM_COUNTS},
        "size_on_disk": desc["archive"]["size_on_disk"],
        "newest_backup": complete[-1]["id"] if complete else None,
    }


def describe_cluster(cluster: ClusterArchive, buckets: list[str]) -> dict[str, Any]:
    """What a cluster archive holds (docs/json-output.md, `dcptool info` of a cluster
    archive): its metadata, the bucket-archive description of each of `buckets` (with a
    `summary` of it and the latest run's status of the bucket), totals and its runs,
    oldest first. A bucket archive that does not open is described by its error."""
    runs: list[dict[str, Any]] = []
    for rid in cluster.run_ids():
        try:
            runs.append(run_summary(cluster.run(rid)))
        except ArchiveError as exc:
            runs.append({"id": rid, "error": exc.message})
    latest = next((r for r in reversed(runs) if "error" not in r), None)
    described: dict[str, Any] = {}
    for name in buckets:
        try:
            desc = describe_archive(cluster.open_bucket(name))
        except ArchiveError as exc:
            described[name] = {"error": exc.message, "hint": exc.hint}
            continue
        desc["summary"] = {**_bucket_row(desc), "latest_run_status":
                           ((latest or {}).get("buckets", {}).get(name) or {}).get("status")}
        described[name] = desc
    rows = [d["summary"] for d in described.values() if "summary" in d]
    totals = {"buckets": len(described), "backups": sum(r["backups"] for r in rows),
              "items": sum(r["items"] for r in rows),
              **{k: sum(r[k] for r in rows) for k in _ITEM_COUNTS},
              "size_on_disk": sum(r["size_on_disk"] for r in rows)}
    meta = cluster.meta
    return {
        "kind": "cluster", "path": str(cluster.path), "format": meta["format"],
        "version": meta["version"], "uuid": cluster.uuid, "created": meta["created"],
        "encrypted": cluster.encrypted,
        "locked_by": ArchiveLock(cluster.path, "info").holder(),
        "buckets": described, "totals": totals, "runs": runs,
    }


def check_cluster(cluster: ClusterArchive, buckets: Iterable[str] | None = None
                  ) -> tuple[int, list[tuple[str, str]]]:
    """(runs checked, problems as (path, message)) of the cluster archive's own files: its
    key files (encrypted), every run file opens (a sealed one under the cluster archive's
    key) and each backup a run names of `buckets` (default: every bucket) is in its bucket
    archive, committed, or was merged into a backup there (whose manifest lists it as
    replaced)."""
    from . import crypto

    wanted = None if buckets is None else set(buckets)
    problems: list[tuple[str, str]] = []
    if cluster.key is not None:
        problems += [(str(p), why) for p, why in crypto.check_key_files(cluster.path, cluster.key)]
    opened: dict[str, Any] = {}
    ids = cluster.run_ids()
    for rid in ids:
        where = str(cluster.path / "runs" / f"{rid}.json")
        try:
            doc = cluster.run(rid)
        except ArchiveError as exc:
            problems.append((where, exc.message))
            continue
        buckets = doc.get("buckets")
        if not isinstance(buckets, dict):
            problems.append((where, "names no buckets"))
            continue
        for name, entry in sorted(buckets.items()):
            backup = (entry or {}).get("backup") if isinstance(entry, dict) else None
            if not backup or (wanted is not None and name not in wanted):
                continue  # dropped (its earlier backups are kept), or nothing backed up
            if name not in opened:
                try:
                    opened[name] = cluster.open_bucket(name)
                except ArchiveError as exc:
                    opened[name] = exc
            arch = opened[name]
            if isinstance(arch, ArchiveError):
                problems.append((where, f"bucket {name}: its archive does not open: "
                                        f"{arch.message}"))
                continue
            try:
                found = arch.resolve_parent(backup)
            except ArchiveError as exc:
                problems.append((where, f"bucket {name}: backup {backup}: {exc.message}"))
                continue
            if found is None or not arch.is_committed(found):
                problems.append((where, f"bucket {name}: backup {backup} is not in "
                                        f"{arch.path} (neither committed nor merged)"))
    return len(ids), problems


__all__ = ["check_cluster", "describe_cluster", "one_bucket", "run_summary", "select_buckets",
           "split_names"]
