"""What an archive holds, as a JSON-able description (for `dcptool info`). Reads only
metadata files and directory listings: no data file is decompressed."""
from __future__ import annotations

from typing import Any

from .archive import Archive
from . import storage
from .chain import merged_from
from .errors import ArchiveError
from .format import BACKUP_JSON, MANIFEST_JSON, expand_ranges, parse_data_name, read_json
from .recovery import done_summaries
from .lock import ArchiveLock

_COUNTS = ("mutations", "deletions", "expirations", "snapshots", "rollbacks", "records")


def dir_size(path: Any) -> int:
    """Bytes of the files directly in `path`: a backup's size on disk, as `info` and
    `backup` report it (data, done, backup.json and manifest files)."""
    try:
        return sum(storage.list_sizes(storage.location(path)).values())
    except (OSError, ArchiveError):
        return 0


def _partial(archive: Archive, bid: str) -> dict[str, Any]:
    bdir = archive.backup_dir(bid)
    try:
        intent = read_json(bdir / BACKUP_JSON, archive.key)
        if not isinstance(intent, dict):
            intent = {}
    except (OSError, ValueError):
        intent = {}
    counts = dict.fromkeys(_COUNTS, 0)
    done = 0
    started: set[int] = set()
    value_bytes = 0
    rollbacks: list[dict[str, Any]] = []
    names = sorted(storage.listdir(bdir))
    for name in names:
        parsed = parse_data_name(name)
        if parsed:
            started.add(parsed[0])
    # (the done summaries: done files, and done batches of a packed backup)
    for s in done_summaries(bdir, names, key=archive.key).values():
        try:
            for k in _COUNTS:
                counts[k] += int(s["counts"][k])
            value_bytes += int(s["bytes"]["values"])
            rollbacks += [{"vbucket": s["vbucket"], **r} for r in s["rollbacks"]]
            done += 1
            started.add(s["vbucket"])
        except (KeyError, TypeError, ValueError):
            pass
    return {
        "id": bid, "parent": intent.get("parent"), "type": intent.get("type"),
        "state": "partial", "started": intent.get("started"), "finished": None,
        "vbuckets": done, "vbuckets_started": len(started),
        # how many the backup will hold (recorded when it began; None: an older dcptool)
        "vbuckets_planned": (intent.get("extra") or {}).get("vbuckets_planned"),
        **counts, "value_bytes": value_bytes, "size_on_disk": dir_size(bdir),
        "rollback_records": rollbacks,
        "note": "counts cover the vbuckets that completed",
    }


def _collection_count(manifest: Any) -> int | None:
    """How many collections a backup's recorded manifest names (None when it has none)."""
    if not isinstance(manifest, dict):
        return None
    return sum(len(s.get("collections") or ()) for s in manifest.get("scopes") or ()
               if isinstance(s, dict))


def describe_archive(archive: Archive) -> dict[str, Any]:
    """The archive's metadata and one entry per backup, oldest first."""
    backups = []
    for bid in archive.backup_ids():
        bdir = archive.backup_dir(bid)
        if not (bdir / MANIFEST_JSON).exists():
            if archive.is_being_removed(bid):
                continue  # an interrupted removal's leftover: the next merge or prune ends it
            backups.append(_partial(archive, bid))
            continue
        try:
            m = archive.manifest(bid)
        except ArchiveError as exc:
            backups.append({"id": bid, "state": "damaged", "error": exc.message,
                            "hint": exc.hint, "size_on_disk": dir_size(bdir)})
            continue
        t = m["totals"]
        backups.append({
            "id": bid, "parent": archive.resolve_parent(m["parent"]), "type": m["type"], "state": "complete",
            "started": m["started"], "finished": m["finished"],
            # vbuckets it covers: those it holds and those unchanged since its parent
            "vbuckets": t["vbuckets"] + len(expand_ranges(m.get("unchanged") or ())),
            "unchanged_vbuckets": len(expand_ranges(m.get("unchanged") or ())),
            **{k: t[k] for k in _COUNTS},
            "value_bytes": t["value_bytes"], "file_bytes": t["file_bytes"], "files": t["files"],
            # format 3: system events, the node's collections when the backup began (how
            # many), the data filter (None: all)
            "system_events": t.get("system_events", 0),
            "collections": _collection_count(m.get("collections")),
            "data": m.get("data"),
            "size_on_disk": dir_size(bdir),
            "compression": m.get("compression"),
            "rollback_records": [{"vbucket": e["vbucket"], **r} for e in m["vbuckets"]
                                 for r in e["rollbacks"]],
            "merged_from": merged_from(m),
        })
    holder = ArchiveLock(archive.path, "info").holder()
    return {
        "archive": {
            "path": str(archive.path), "format": archive.meta["format"],
            "version": archive.meta["version"], "uuid": archive.uuid, "bucket": archive.bucket,
            "vbuckets": archive.vbucket_count, "created": archive.meta["created"],
            "locked_by": holder, "encrypted": archive.encrypted,
            "size_on_disk": sum(b["size_on_disk"] for b in backups),
        },
        "backups": backups,
    }


def purge_warnings(end_seqnos: dict[int, int], purge_seqnos: dict[int, int]) -> list[dict[str, int]]:
    """The vbuckets whose next incremental backup the node will send back to seqno 0.

    `end_seqnos`: the archive's last backed-up seqno per vbucket; `purge_seqnos`: the node's
    purge seqno per vbucket. A stream request from a seqno above 0 but below the purge
    seqno is answered "roll back to 0" (deletions after it were purged), so those
    vbuckets will be read again in full. Vbuckets the archive does not hold yet start at 0
    anyway and are not listed.
    """
    out = []
    for vb in sorted(end_seqnos):
        end = end_seqnos[vb]
        purge = purge_seqnos.get(vb)
        if purge is not None and 0 < end < purge:
            out.append({"vbucket": vb, "backed_up_seqno": end, "purge_seqno": purge})
    return out
