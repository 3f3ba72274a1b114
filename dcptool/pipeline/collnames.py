"""Names of an archive's collections: which scope and collection an id was, ever.

An archive names its collections in two places (docs/archive-format.md, format 3): each
backup's manifest.json `"collections"` (the node's manifest when the backup began) and the
system event records in the vbuckets' data files (create-scope and create-collection events
carry the names of what was created between backups). Ids are never reused, so the union of
everything any of them says is one consistent map {collection id: (scope, collection)},
dropped collections included.

Archives of format 1 and 2 (and backups of nodes without collections, `"collections":
null`) know only the default collection, id 0.
"""
from __future__ import annotations

from typing import Any, Iterable

from dcptool.protocol.collections import (
    DEFAULT_COLLECTION,
    DEFAULT_SCOPE,
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_DROP_SCOPE,
    EVENT_END_COLLECTION,
    EVENT_MODIFY_COLLECTION,
    CollectionsError,
    Manifest,
    hex_id,
)

REC_SYSTEM_EVENT = 8


class CollectionNames:
    """{collection id: (scope id, scope name, collection name, max ttl)} learnt from
    manifests and system event records (either order; later facts fill gaps only)."""

    def __init__(self) -> None:
        self.scopes: dict[int, str] = {0: DEFAULT_SCOPE}
        self.collections: dict[int, tuple[int, str, int]] = {0: (0, DEFAULT_COLLECTION, 0)}
        #: the newest manifest seen (by uid)
        self.latest: Manifest | None = None

    def add_manifest(self, manifest: Any) -> None:
        """A manifest (Manifest, its JSON form, or None for a node without collections)."""
        if manifest is None:
            return
        if not isinstance(manifest, Manifest):
            try:
                manifest = Manifest.from_json(manifest)
            except CollectionsError:
                return
        if self.latest is None or manifest.uid >= self.latest.uid:
            self.latest = manifest
        for s in manifest.scopes:
            self.scopes.setdefault(s.uid, s.name)
            for c in s.collections:
                self.collections.setdefault(c.uid, (s.uid, c.name, c.max_ttl))

    def add_event(self, rec: tuple) -> None:
        """A REC_SYSTEM_EVENT record (8, seqno, event, uid, sid, cid, name, max_ttl)."""
        ev, sid, cid, name = rec[2], rec[4], rec[5], rec[6]
        if ev == EVENT_CREATE_SCOPE and name:
            self.scopes.setdefault(sid, name)
        elif ev in (EVENT_BEGIN_COLLECTION, EVENT_MODIFY_COLLECTION) and cid is not None and name:
            self.collections.setdefault(cid, (sid, name, rec[7] or 0))

    def add_records(self, records: Iterable[tuple]) -> None:
        for r in records:
            if r[0] == REC_SYSTEM_EVENT:
                self.add_event(r)

    def names(self, cid: int) -> tuple[str, str] | None:
        """(scope name, collection name) of a collection id, None when unknown."""
        c = self.collections.get(cid)
        if c is None:
            return None
        scope = self.scopes.get(c[0])
        if scope is None:
            return None
        return scope, c[1]

    def display(self, cid: int) -> tuple[str | None, str]:
        """(scope, collection) to show: names, or (None, hex id) for an id no manifest or
        event of the archive names."""
        n = self.names(cid)
        return n if n is not None else (None, hex_id(cid))

    def max_ttl(self, cid: int) -> int:
        c = self.collections.get(cid)
        return c[2] if c is not None else 0

    def scope_of(self) -> dict[int, int]:
        """{collection id: scope id} of every known collection."""
        return {cid: c[0] for cid, c in self.collections.items()}

    def ids_named(self, scope: str, collection: str) -> list[int]:
        """Every id that was ever `scope.collection` (a re-created collection has several)."""
        return sorted(cid for cid, (sid, name, _t) in self.collections.items()
                      if name == collection and self.scopes.get(sid) == scope)

    def to_json(self) -> dict[str, Any]:
        return {hex_id(cid): {"scope": self.scopes.get(sid), "collection": name,
                              **({"maxTTL": ttl} if ttl else {})}
                for cid, (sid, name, ttl) in sorted(self.collections.items())}


def names_of_backups(backups: Iterable[Any], *, events: bool = True,
                     vbuckets: Iterable[int] | None = None) -> CollectionNames:
    """The names along `backups` (archive.reader.Backup objects): every manifest's
    `"collections"` and, with `events`, the system events of one vbucket of each backup
    (every vbucket of a bucket gets every event, so one suffices for what happened while
    the backup streamed; the lowest of `vbuckets` the backup holds, else its lowest)."""
    out = CollectionNames()
    wanted = set(vbuckets) if vbuckets is not None else None
    for b in backups:
        out.add_manifest(b.manifest.get("collections"))
        if not events or not _may_hold_events(b.manifest):
            continue
        held = b.vbuckets if wanted is None else [v for v in b.vbuckets if v in wanted]
        if not held:
            continue
        out.add_records(r for batch in b.batches(held[0], validate=False) for r in batch
                        if r[0] == REC_SYSTEM_EVENT)
    return out


def chain_collections(backups: Iterable[Any], *, vbuckets: Iterable[int] | None = None
                      ) -> tuple[CollectionNames, set[int]]:
    """(names, live ids) along a chain, oldest first: live are the collections that exist
    at the chain's end, by the last backup's manifest and the events of one vbucket of
    it (and of the backups before it, for a chain whose manifests are null: a format 2
    archive or a node without collections knows the default collection only)."""
    names = CollectionNames()
    live: set[int] = {0}
    wanted = set(vbuckets) if vbuckets is not None else None
    for b in backups:
        m = b.manifest.get("collections")
        if m is not None:
            names.add_manifest(m)
            try:
                live = set(Manifest.from_json(m).collection_ids())
            except CollectionsError:
                pass
        if not _may_hold_events(b.manifest):
            continue
        held = b.vbuckets if wanted is None else [v for v in b.vbuckets if v in wanted]
        if not held:
            continue
        for batch in b.batches(held[0], validate=False):
            for r in batch:
                if r[0] != REC_SYSTEM_EVENT:
                    continue
                names.add_event(r)
                ev, sid, cid = r[2], r[4], r[5]
                if ev == EVENT_BEGIN_COLLECTION and cid is not None:
                    live.add(cid)
                elif ev == EVENT_END_COLLECTION and cid is not None:
                    live.discard(cid)
                elif ev == EVENT_DROP_SCOPE:
                    live -= {c for c, (s, _n, _t) in names.collections.items() if s == sid}
    return names, live


def _may_hold_events(manifest: dict[str, Any]) -> bool:
    """Only format 3 backups hold system events."""
    try:
        return int(manifest.get("version", 0)) >= 3
    except (TypeError, ValueError):
        return False


__all__ = ["CollectionNames", "names_of_backups", "chain_collections"]
