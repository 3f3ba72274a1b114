"""What a cluster archive's runs name, after merges and removals in its bucket archives.

A run file (`runs/RUN-ID.json`) is written once and never edited: it names, per bucket,
the id of the backup the run committed in that bucket's archive. Merges (`merge`, and the
merges forward of `remove` and `prune`) replace backups with merged ones, so a run's
backup id resolves:

- to itself while that backup is committed;
- to the merged backup that replaced it when the merge's range ENDED with it (the merged
  manifest's `extra.merge.replaced` ends with it, or its `extra.merge.ends_as` names it:
  a merged backup merged again): the merged backup ends where it ended, so the run still
  restores exactly the state it recorded;
- to nothing (gone) otherwise: deleted, or merged into a backup that ends later.

A run is complete when every bucket it names resolves; `restore --run` refuses an
incomplete one. Deleting a run file (`delete_run`) is the last step of `prune`, `remove`
and `merge` of a cluster archive.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from . import storage
from .archive import Archive
from .chain import merged_from
from .cluster import ClusterArchive
from dcptool.errors import UsageError


def named_backups(record: Mapping[str, Any]) -> dict[str, str]:
    """{bucket: backup id} that a run's record names (dropped buckets name none)."""
    out: dict[str, str] = {}
    for name, entry in (record.get("buckets") or {}).items():
        if isinstance(entry, dict) and isinstance(entry.get("backup"), str):
            out[name] = entry["backup"]
    return out


def end_aliases(manifests: Mapping[str, dict[str, Any]]) -> dict[str, str]:
    """{backup id: the committed merged backup that ends exactly where it ended}."""
    out: dict[str, str] = {}
    for bid in sorted(manifests):
        m = manifests[bid]
        replaced = merged_from(m)
        if not replaced:
            continue
        merge = (m.get("extra") or {}).get("merge") or {}
        ends = merge.get("ends_as") if isinstance(merge.get("ends_as"), list) else []
        for old in (replaced[-1], *ends):
            if str(old) != bid:
                out[str(old)] = bid
    return out


def resolve_backup(manifests: Mapping[str, dict[str, Any]], backup_id: str,
                   aliases: Mapping[str, str] | None = None) -> str | None:
    """The committed backup that restores exactly as `backup_id` did (None: gone)."""
    if aliases is None:
        aliases = end_aliases(manifests)
    seen: set[str] = set()
    bid = backup_id
    while bid not in manifests:
        if bid in seen or bid not in aliases:
            return None
        seen.add(bid)
        bid = aliases[bid]
    return bid


@dataclass
class RunState:
    """A run and where each backup it names resolves today."""

    id: str
    record: dict[str, Any]
    #: {bucket: the backup id the run file names}
    named: dict[str, str]
    #: {bucket: the committed backup it resolves to, None: gone}
    resolved: dict[str, str | None] = field(default_factory=dict)

    @property
    def gone(self) -> dict[str, str]:
        """{bucket: named backup id} of the buckets whose backup is gone."""
        return {b: self.named[b] for b, r in sorted(self.resolved.items()) if r is None}

    @property
    def complete(self) -> bool:
        return not self.gone


class RunResolver:
    """Resolves runs against a cluster archive's bucket archives (manifests read once per
    bucket; `forget(bucket)` after changing a bucket archive)."""

    def __init__(self, cluster: ClusterArchive) -> None:
        self.cluster = cluster
        self._manifests: dict[str, dict[str, dict[str, Any]]] = {}
        self._aliases: dict[str, dict[str, str]] = {}
        self._archives: dict[str, Archive | None] = {}
        self._records: dict[str, dict[str, Any]] = {}

    def archive(self, bucket: str) -> Archive | None:
        """The bucket's archive (None: the cluster archive holds none of that name)."""
        if bucket not in self._archives:
            self._archives[bucket] = (self.cluster.open_bucket(bucket)
                                      if bucket in self.cluster.bucket_names() else None)
        return self._archives[bucket]

    def manifests(self, bucket: str) -> dict[str, dict[str, Any]]:
        if bucket not in self._manifests:
            a = self.archive(bucket)
            self._manifests[bucket] = a.manifests() if a is not None else {}
            self._aliases[bucket] = end_aliases(self._manifests[bucket])
        return self._manifests[bucket]

    def forget(self, bucket: str) -> None:
        self._manifests.pop(bucket, None)
        self._aliases.pop(bucket, None)

    def record(self, run_id: str) -> dict[str, Any]:
        if run_id not in self._records:
            self._records[run_id] = self.cluster.run(run_id)
        return self._records[run_id]

    def resolve(self, bucket: str, backup_id: str) -> str | None:
        manifests = self.manifests(bucket)
        return resolve_backup(manifests, backup_id, self._aliases[bucket])

    def state(self, run_id: str, buckets: Iterable[str] | None = None) -> RunState:
        """Run `run_id` resolved (only `buckets` of it, when given)."""
        record = self.record(run_id)
        named = named_backups(record)
        if buckets is not None:
            wanted = set(buckets)
            named = {b: i for b, i in named.items() if b in wanted}
        st = RunState(run_id, record, named)
        for b, bid in sorted(named.items()):
            st.resolved[b] = self.resolve(b, bid)
        return st


def incomplete_message(state: RunState) -> str:
    """One line: which bucket's backup a run names is gone."""
    bucket, bid = next(iter(state.gone.items()))
    more = len(state.gone) - 1
    return (f"run {state.id} is incomplete: bucket {bucket}'s backup {bid} is gone (removed, "
            "or merged into a later backup)" + (f", and {more} more bucket" + "s" * (more > 1)
                                                if more else ""))


def delete_run(cluster: ClusterArchive, run_id: str) -> None:
    """Delete a run's file (its bucket backups are the caller's business)."""
    path, _name = cluster._run_file(run_id)
    try:
        storage.unlink(path)
    except FileNotFoundError:
        pass


def check_run_ids(cluster: ClusterArchive, ids: Iterable[str]) -> list[str]:
    """The given run ids, each checked to be a committed run of `cluster`."""
    have = set(cluster.run_ids())
    out = []
    for rid in ids:
        if rid not in have:
            cluster._run_file(rid)  # raises for a malformed id
            raise UsageError(f"{cluster.path} holds no run {rid}",
                             hint=f"its runs are the files under {cluster.path / 'runs'}")
        out.append(rid)
    return out


__all__ = ["named_backups", "end_aliases", "resolve_backup", "RunState", "RunResolver",
           "incomplete_message", "delete_run", "check_run_ids"]
