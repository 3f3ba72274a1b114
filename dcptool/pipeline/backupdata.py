"""What a backup streams of a bucket with collections: the node's manifest, the data
selection (`--include-data` / `--exclude-data`, kept along the chain) and the stream filter
it becomes.

A selection names scopes and collections (`pipeline/datafilter.py`); the stream filter
holds collection ids (`dcptool.protocol.collections.StreamFilter`), resolved against the
node's manifest when the backup begins, so the node streams only the data selected. A
selection of exactly one whole scope becomes a scope filter, which also carries the drops
of that scope's collections.

An incremental backup keeps the selection of the backup it continues (the manifest's
`"data"`); another selection needs a full backup. A node refuses a stream filter naming a
collection it no longer has, so when a collection the selection held in the previous
backup was dropped since, that incremental streams every collection and keeps, on the
client, the selected collections' records and the system events of the selected
collections and their scopes (`ClientFilter`): the drops are recorded. Only that backup
pays for it; the next one streams with a filter again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dcptool.errors import UsageError
from dcptool.client.events import RECORD_KINDS, SYSTEM_EVENT
from dcptool.protocol.collections import (
    DEFAULT_COLLECTION,
    DEFAULT_SCOPE,
    CollectionsError,
    Manifest,
    StreamFilter,
    doc_key_cid,
)

from .datafilter import DataSelection, Name, selection, show

INCLUDE_ENV = "DCPTOOL_INCLUDE_DATA"
EXCLUDE_ENV = "DCPTOOL_EXCLUDE_DATA"


def selection_json(sel: DataSelection) -> dict[str, list[str]] | None:
    """The manifest's `"data"` of a selection (None: everything)."""
    if sel.everything:
        return None
    return {"include": [show(n) for n in sel.include], "exclude": [show(n) for n in sel.exclude]}


def selection_from_json(data: Any, bucket: str) -> DataSelection:
    """The selection a backup's manifest recorded (`"data"`, names without the bucket)."""
    if not isinstance(data, dict):
        return DataSelection()
    return selection([f"{bucket}.{n}" for n in data.get("include") or ()],
                     [f"{bucket}.{n}" for n in data.get("exclude") or ()], bucket=bucket)


def chain_selection(given: DataSelection, recorded: Any, bucket: str, *,
                    full: bool, what: str = "the archive's last backup") -> DataSelection:
    """The selection a backup runs with: `given` for a full backup; for an incremental (or
    resumed) one the `recorded` selection, which `given` may repeat but not change."""
    if full:
        return given
    before = selection_from_json(recorded, bucket)
    if given.everything or selection_json(given) == selection_json(before):
        return before
    def describe(s: DataSelection) -> str:
        j = selection_json(s)
        if j is None:
            return "all data"
        return ", ".join([f"include {n}" for n in j["include"]]
                         + [f"exclude {n}" for n in j["exclude"]])
    raise UsageError(f"{what} holds {describe(before)}; an incremental backup keeps its "
                     f"selection, not {describe(given)}",
                     hint="take a --full backup to change --include-data/--exclude-data")


def _known(manifest: Manifest, name: Name) -> bool:
    s = manifest.scope(name[0])
    return s is not None and (name[1] is None or s.collection(name[1]) is not None)


def stream_filter(sel: DataSelection, manifest: Manifest | None, bucket: str, *,
                  check_names: bool = True) -> StreamFilter | None:
    """The stream filter of a selection (None: every collection, no filter sent).

    `manifest` None: the node has no collections, only the default collection exists.
    `check_names`: names the manifest does not know are a UsageError (names given on the
    command line); off for a selection recorded by an earlier backup, whose collections may
    have been dropped since. A selection that leaves nothing is a UsageError.
    """
    if sel.everything:
        return None
    if manifest is None:
        manifest = Manifest()  # the default scope and collection only
        legacy = True
    else:
        legacy = False
    if check_names:
        for option, name in sel.names():
            if not _known(manifest, name):
                what = "scope" if name[1] is None else "collection"
                raise UsageError(f"{option}: {what} {bucket}.{show(name)} does not exist"
                                 + (" (the node has no collections)" if legacy else ""))
    ids = sorted(c.uid for s in manifest.scopes for c in s.collections
                 if sel.selects(s.name, c.name))
    if not ids:
        raise UsageError("--include-data/--exclude-data select no collection of bucket "
                         f"{bucket} to back up",
                         hint="take a --full backup with another selection" if not check_names
                         else None)
    if len(sel.include) == 1 and sel.include[0][1] is None and not sel.exclude:
        scope = manifest.scope(sel.include[0][0])
        if scope is not None and not legacy:
            return StreamFilter(scope=scope.uid)
    return StreamFilter(collections=frozenset(ids))


def _manifest_of(doc: Any) -> Manifest | None:
    if doc is None:
        return None
    try:
        return Manifest.from_json(doc)
    except CollectionsError:
        return None


def selected_ids(sel: DataSelection, manifest: Manifest | None) -> set[int]:
    """The ids of the collections of `manifest` a selection selects (a node without
    collections: the default collection, if selected)."""
    m = manifest or Manifest()
    return {c.uid for s in m.scopes for c in s.collections if sel.selects(s.name, c.name)}


def dropped_since(sel: DataSelection, previous: Any, manifest: Manifest | None) -> set[int]:
    """Collections the selection held in the previous backup (its recorded manifest,
    `previous`, JSON) that the node's `manifest` no longer has: dropped since."""
    prev = _manifest_of(previous)
    if sel.everything or prev is None:
        return set()
    live = set((manifest or Manifest()).collection_ids())
    return selected_ids(sel, prev) - live


@dataclass(frozen=True)
class ClientFilter:
    """The selection applied by the backup task to an unfiltered stream: the records of
    `collections` and the system events of those collections and of `scopes`."""

    collections: frozenset[int]
    scopes: frozenset[int]

    def filter(self, events: list) -> list:
        cols, scopes, kinds = self.collections, self.scopes, RECORD_KINDS
        out = []
        for e in events:
            k = e[0]
            if k in kinds:
                if doc_key_cid(e[8]) in cols:
                    out.append(e)
            elif k == SYSTEM_EVENT:
                ev = e[2]
                if (ev.collection_id in cols) if ev.collection_id is not None \
                        else ev.scope_id in scopes:
                    out.append(e)
            else:
                out.append(e)
        return out


def client_filter(sel: DataSelection, previous: Any, manifest: Manifest | None,
                  gone: set[int]) -> ClientFilter:
    """The ClientFilter of a selection whose collections `gone` were dropped since the
    previous backup: the selected collections of now and the dropped ones, and their scopes
    (the scopes the selection names too)."""
    cols = selected_ids(sel, manifest) | gone
    scopes = set()
    for m in (_manifest_of(previous), manifest):
        for s in (m.scopes if m is not None else ()):
            if any(c.uid in cols for c in s.collections) or any(
                    n[0] == s.name and n[1] is None for n in sel.include):
                scopes.add(s.uid)
    return ClientFilter(frozenset(cols), frozenset(scopes))


__all__ = ["ClientFilter", "client_filter", "dropped_since", "selected_ids", "INCLUDE_ENV", "EXCLUDE_ENV", "selection_json", "selection_from_json",
           "chain_selection", "stream_filter", "DEFAULT_SCOPE", "DEFAULT_COLLECTION"]
