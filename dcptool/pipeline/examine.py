"""`dcptool examine`: the timeline of one key across an archive's backups.

The key's vbucket follows from the key (Couchbase's CRC32 mapping and the archive's vbucket
count), so only that vbucket's files are read: a small read that needs no Spark. Each
version found is reported with its backup, seqno, rev seqno, cas, type and size; versions on
a dead history branch (above a rollback recorded by a later backup of the same chain) are
marked dead, and the version `restore` would write is marked as such.

Collections: the key is matched in every collection (or only in `collection`,
"scope.collection"); each version names its scope and collection (through the archive's
manifests and system events; an id none names shows as its hex id) and says whether that
collection was dropped (a drop event on the history read, not cut off by a rollback). A
dropped collection's versions are not restored as of a point after the drop.
"""
from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any

from dcptool.archive import Archive
from dcptool.archive.chain import descendant_cuts
from dcptool.archive.reader import iter_vbucket_batches
from dcptool.archive.resolve import Drops
from dcptool.errors import UsageError
from dcptool.protocol.collections import hex_id, split_doc_key
from dcptool.protocol.errors import ProtocolError
from dcptool.protocol.snappy import SNAPPY, decompress
from dcptool.protocol.vbucket import vbucket_of

if TYPE_CHECKING:
    from .collnames import CollectionNames


NAMES = {3: "mutation", 4: "deletion", 5: "expiration"}


def _value_text(value: bytes, datatype: int) -> dict[str, Any]:
    if datatype & SNAPPY:
        # dcptool stores values decompressed; a compressed one (an archive written by
        # other means) is shown decompressed, or as stored when it does not decompress
        try:
            value = decompress(value)
        except ProtocolError:
            return {"value_base64": base64.b64encode(value).decode()}
    try:
        return {"value": value.decode("utf-8")}
    except UnicodeDecodeError:
        return {"value_base64": base64.b64encode(value).decode()}


def examine_key(archive_path: str | os.PathLike[str], key: str | bytes, *,
                backup: str | None = None, values: bool = False,
                vbucket: int | None = None, collection: str | None = None,
                at: int | None = None, nearest: bool = False) -> dict[str, Any]:
    """{"key", "vbucket", "versions": [...]} oldest first. With `backup`, only the chain of
    that backup; otherwise every committed backup. `collection` ("scope.collection"): only
    the versions in collections of that name. `at` (ns since the epoch): the chain that
    holds that time, each version marked `as_of` when it is the key's state at the
    vbucket's cut for it (restore --to-time's), and "at" gives the cut."""
    from .collnames import CollectionNames

    archive = Archive.opened(archive_path)
    if at is not None:
        return _examine_at(archive, key, at, nearest=nearest, backup=backup, values=values,
                           vbucket=vbucket, collection=collection)
    k = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    want = _wanted_collection(collection)
    vb = vbucket_of(k, archive.vbucket_count) if vbucket is None else vbucket
    manifests = archive.manifests()
    ids = archive.chain_ids(manifests, backup) if backup else sorted(manifests)
    scope = {b: manifests[b] for b in ids}
    cuts = descendant_cuts(scope)
    live_chain = set(archive.chain_ids(manifests, backup)) if manifests else set()
    names = CollectionNames()
    for bid in ids:
        names.add_manifest(scope[bid].get("collections"))
    drops = Drops()  # on the chain restored
    dropped_any = Drops()  # anywhere in what was read
    versions: list[dict[str, Any]] = []
    for bid in ids:
        entry = next((e for e in scope[bid]["vbuckets"] if e["vbucket"] == vb), None)
        if entry is None:
            continue
        cut = cuts[bid].get(vb)
        for batch in iter_vbucket_batches(archive.backup_dir(bid), entry, key=archive.key):
            for r in batch:
                t = r[0]
                if t == 8:
                    names.add_event(r)
                    if cut is None or r[1] <= cut:
                        dropped_any.add(r)
                        if bid in live_chain:
                            drops.add(r)
                    continue
                if t == 3:
                    if not r[7].endswith(k):
                        continue
                    cid, kk = split_doc_key(r[7])
                    if kk != k:
                        continue
                    v = {"backup": bid, "vbucket": vb, "seqno": r[1], "rev_seqno": r[2],
                         "cas": r[3], "type": "mutation", "size": len(r[8]), "flags": r[4],
                         "expiry": r[5], "datatype": r[6], "deleted": False,
                         "xattrs_size": len(r[9]) if r[9] is not None else 0}
                    value, dt = r[8], r[6]
                elif t == 4 or t == 5:
                    if not r[4].endswith(k):
                        continue
                    cid, kk = split_doc_key(r[4])
                    if kk != k:
                        continue
                    v = {"backup": bid, "vbucket": vb, "seqno": r[1], "rev_seqno": r[2],
                         "cas": r[3], "type": NAMES[t], "size": len(r[7]), "flags": None,
                         "expiry": None, "datatype": r[6], "deleted": True,
                         "delete_time": r[5]}
                    value, dt = r[7], r[6]
                else:
                    continue
                v["collection_id"] = hex_id(cid)
                v["dead"] = cut is not None and r[1] > cut
                v["restored"] = False
                if values:
                    v.update(_value_text(value, dt))
                versions.append(v)
    scope_of = names.scope_of()
    versions = _named_versions(versions, names, scope_of, dropped_any, want)
    _mark_restored(versions, live_chain, drops, scope_of)
    return {"archive": str(archive.path), "key": k.decode("utf-8", "replace"), "vbucket": vb,
            "backups_read": len([b for b in ids
                                 if any(e["vbucket"] == vb for e in scope[b]["vbuckets"])]),
            "versions": versions}


def _examine_at(archive: Archive, key: str | bytes, at: int, *, nearest: bool,
                backup: str | None, values: bool, vbucket: int | None,
                collection: str | None) -> dict[str, Any]:
    """examine_key `at` a time (ns since the epoch): the chain that holds it, each version
    marked `as_of` when it is the key's state at the vbucket's cut, and "at" the cut."""
    from dcptool.archive.pointintime import plan_time

    if backup is not None:
        raise UsageError("--at and --backup exclude each other")
    chain = plan_time(archive, at, nearest=nearest, option="--at").chain
    if not chain:
        raise UsageError("--at: no chain of the archive began by then")
    backup = chain[-1]
    d = examine_key(archive, key, backup=backup, values=values, vbucket=vbucket,
                    collection=collection)
    d["at"] = _mark_as_of(archive, d, backup, at)
    return d


def _wanted_collection(collection: str | None) -> tuple[str, str] | None:
    """--collection "scope.collection" as (scope, collection) (None without it)."""
    if collection is None:
        return None
    parts = collection.split(".")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"--collection: {collection!r} is not scope.collection")
    return (parts[0], parts[1])


def _named_versions(versions: list[dict[str, Any]], names: CollectionNames,
                    scope_of: dict[int, int], dropped_any: Drops,
                    want: tuple[str, str] | None) -> list[dict[str, Any]]:
    """The versions, each given its scope and collection names and whether that
    collection was dropped (anywhere in what was read), of the collection `want` only
    when given."""
    kept = []
    for v in versions:
        cid = int(v["collection_id"], 16)
        sc, co = names.display(cid)
        v["scope"], v["collection"] = sc, co
        v["collection_dropped"] = dropped_any.dropped(cid, scope_of)
        if want is None or (sc, co) == want:
            kept.append(v)
    return kept


def _mark_restored(versions: list[dict[str, Any]], live_chain: set[str], drops: Drops,
                   scope_of: dict[int, int]) -> None:
    """Mark the version restore writes, per collection: the last live one on the chain
    being restored (`live_chain`), unless the chain dropped that collection (`drops`)."""
    done: set[str] = set()
    for v in reversed(versions):
        cid = v["collection_id"]
        if cid in done or v["backup"] not in live_chain or v["dead"]:
            continue
        done.add(cid)
        if not drops.dropped(int(cid, 16), scope_of):
            v["restored"] = True


def _mark_as_of(archive: Archive, d: dict[str, Any], backup: str, at: int) -> dict[str, Any]:
    """Mark the versions of `d` that are the key's state as of time `at` (`as_of`) and
    return the cut: the vbucket's last snapshot boundary at or before `at`, resolved as a
    restore to that time resolves it (rollbacks recorded later not applied)."""
    from dcptool.archive import VBucketHistory
    from dcptool.archive.pointintime import iso, part_meta, vbucket_cut
    from dcptool.archive.resolve import resolve

    vb = d["vbucket"]
    held = [b for b in archive.chain(backup) if b.entry(vb) is not None]
    meta = [part_meta(b.manifest) for b in held]
    cut = vbucket_cut(vb, [VBucketHistory(b, vb) for b in held], at, [m[0] for m in meta],
                      [m[1] for m in meta])
    k = d["key"].encode("utf-8")
    state = resolve([VBucketHistory(b, vb) for b in held[:cut.part + 1]], upto_seqno=cut.seqno)
    current = {(r[1], r[3]) for dk, r in state.items() if split_doc_key(dk)[1] == k}
    for v in d["versions"]:
        v["as_of"] = (v["seqno"], v["cas"]) in current
    out = {**cut.as_dict([b.id for b in held]), "to_time": iso(at)}
    out["exists"] = any(v["as_of"] and not v["deleted"] for v in d["versions"])
    return out


__all__ = ["examine_key"]
