"""`dcptool examine`: the timeline of one key across an archive's backups.

The key's vbucket follows from the key (Couchbase's CRC32 mapping and the archive's vbucket
count), so only that vbucket's files are read: a small read that needs no Spark. Each
version found is reported with its backup, seqno, rev seqno, cas, type and size; versions on
a dead history branch (above a rollback recorded by a later backup of the same chain) are
marked dead, and the version `restore` would write is marked as such.
"""
from __future__ import annotations

import base64
import os
from typing import Any

from dcptool.archive import Archive
from dcptool.archive.chain import descendant_cuts
from dcptool.archive.reader import iter_vbucket_batches
from dcptool.protocol.errors import ProtocolError
from dcptool.protocol.snappy import SNAPPY, decompress
from dcptool.protocol.vbucket import vbucket_of


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
                vbucket: int | None = None) -> dict[str, Any]:
    """{"key", "vbucket", "versions": [...]} oldest first. With `backup`, only the chain of
    that backup; otherwise every committed backup."""
    archive = Archive.open(archive_path)
    k = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    vb = vbucket_of(k, archive.vbucket_count) if vbucket is None else vbucket
    manifests = archive.manifests()
    ids = archive.chain_ids(manifests, backup) if backup else sorted(manifests)
    scope = {b: manifests[b] for b in ids}
    cuts = descendant_cuts(scope)
    live_chain = set(archive.chain_ids(manifests, backup)) if manifests else set()
    versions: list[dict[str, Any]] = []
    for bid in ids:
        entry = next((e for e in scope[bid]["vbuckets"] if e["vbucket"] == vb), None)
        if entry is None:
            continue
        cut = cuts[bid].get(vb)
        for batch in iter_vbucket_batches(archive.backup_dir(bid), entry):
            for r in batch:
                t = r[0]
                if t == 3:
                    if r[7] != k:
                        continue
                    v = {"backup": bid, "vbucket": vb, "seqno": r[1], "rev_seqno": r[2],
                         "cas": r[3], "type": "mutation", "size": len(r[8]), "flags": r[4],
                         "expiry": r[5], "datatype": r[6], "deleted": False,
                         "xattrs_size": len(r[9]) if r[9] is not None else 0}
                    value, dt = r[8], r[6]
                elif t == 4 or t == 5:
                    if r[4] != k:
                        continue
                    v = {"backup": bid, "vbucket": vb, "seqno": r[1], "rev_seqno": r[2],
                         "cas": r[3], "type": NAMES[t], "size": len(r[7]), "flags": None,
                         "expiry": None, "datatype": r[6], "deleted": True,
                         "delete_time": r[5]}
                    value, dt = r[7], r[6]
                else:
                    continue
                v["dead"] = cut is not None and r[1] > cut
                v["restored"] = False
                if values:
                    v.update(_value_text(value, dt))
                versions.append(v)
    # the version restore writes: the last live one on the chain being restored
    for v in reversed(versions):
        if v["backup"] in live_chain and not v["dead"]:
            v["restored"] = True
            break
    return {"archive": str(archive.path), "key": k.decode("utf-8", "replace"), "vbucket": vb,
            "backups_read": len([b for b in ids
                                 if any(e["vbucket"] == vb for e in scope[b]["vbuckets"])]),
            "versions": versions}


__all__ = ["examine_key"]
