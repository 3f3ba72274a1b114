"""Chains over committed manifests: parent links, the chain of a backup, dead records.

A backup's manifest names its parent once, when it is committed, and is never edited. A
merge replaces a range of backups with one merged backup whose manifest lists the ids it
replaces (`extra.merge.replaced`); once the originals are gone, a parent link that names
one of them resolves to the merged backup (transitively, when that was merged again). So
the backups that descended from a merged range keep their manifests byte for byte.

While a merged backup and its originals are both present (a merge interrupted after
publishing), links resolve to the originals, which still exist and restore the same.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from .errors import ChainError

Manifests = Mapping[str, dict[str, Any]]


def merged_from(manifest: dict[str, Any]) -> list[str] | None:
    """The ids of the backups a merged backup replaced (None for an ordinary backup)."""
    merge = (manifest.get("extra") or {}).get("merge")
    if isinstance(merge, dict) and isinstance(merge.get("replaced"), list):
        return [str(b) for b in merge["replaced"]]
    return None


def replacements(manifests: Manifests) -> dict[str, str]:
    """{replaced backup id: id of the merged backup that replaced it}."""
    out: dict[str, str] = {}
    for bid in sorted(manifests):
        for old in merged_from(manifests[bid]) or ():
            out[old] = bid
    return out


def follow(parent: str | None, present: Callable[[str], bool],
           replaced: Callable[[], Mapping[str, str]]) -> str | None:
    """Where a parent link leads: `parent` itself while it is `present`, else the merged
    backup that replaced it (followed again while that one is gone too). `replaced` is only
    called when a link needs it."""
    seen: set[str] = set()
    table: Mapping[str, str] | None = None
    while parent is not None and not present(parent):
        if table is None:
            table = replaced()
        nxt = table.get(parent)
        if nxt is None or nxt in seen:
            break
        seen.add(nxt)
        parent = nxt
    return parent


def effective_parents(manifests: Manifests) -> dict[str, str | None]:
    """{backup id: the id its parent link resolves to} over committed manifests."""
    table: dict[str, str] | None = None

    def table_once() -> dict[str, str]:
        nonlocal table
        if table is None:
            table = replacements(manifests)
        return table

    return {bid: follow(m.get("parent"), manifests.__contains__, table_once)
            for bid, m in manifests.items()}


def chain_ids(manifests: Manifests, upto: str | None = None, *,
              parents: Mapping[str, str | None] | None = None,
              describe_missing: Callable[[str], str] = lambda bid: "missing",
              missing_target: Callable[[str], Any] | None = None) -> list[str]:
    """The ids of the chain ending at `upto` (default the newest committed backup), oldest
    first, along resolved parent links.

    `describe_missing(id)` says what a missing parent is ("partial", "missing");
    `missing_target(id)` is called when `upto` itself is not committed (to raise the
    precise error)."""
    if upto is None:
        if not manifests:
            return []
        upto = max(manifests)
    if parents is None:
        parents = effective_parents(manifests)
    out: list[str] = []
    bid: str | None = upto
    while bid is not None:
        if bid not in manifests:
            if not out and missing_target is not None:
                missing_target(bid)
            child = out[-1] if out else None
            raise ChainError(f"backup {child} names parent {bid}, which is "
                             f"{describe_missing(bid)}",
                             hint="restore an older backup, or run a new full backup")
        if bid in out:
            raise ChainError(f"backup {bid} is its own ancestor")
        out.append(bid)
        bid = parents[bid]
    out.reverse()
    return out


def descendant_cuts(manifests: Manifests) -> dict[str, dict[int, int]]:
    """{backup id: {vbucket: seqno}}: records of that backup above the seqno are dead,
    because a later backup descending from it recorded a rollback to that seqno (the
    lowest one wins). `manifests` are those of the committed backups, by id."""
    parents = effective_parents(manifests)
    cuts: dict[str, dict[int, int]] = {b: {} for b in manifests}
    for bid, m in manifests.items():
        rbs = {}
        for e in m["vbuckets"]:
            if e["rollbacks"]:
                rbs[e["vbucket"]] = min(r["seqno"] for r in e["rollbacks"])
        if not rbs:
            continue
        parent = parents[bid]
        seen = set()
        while parent is not None and parent in manifests and parent not in seen:
            seen.add(parent)
            c = cuts[parent]
            for vb, s in rbs.items():
                if vb not in c or s < c[vb]:
                    c[vb] = s
            parent = parents[parent]
    return cuts
