"""COMPACT_DB (0xb3): compact one vbucket now, purging the tombstones the HWT allows.

Extras (24 bytes): purge_before_ts u64, purge_before_seq u64, drop_deletes u8, pad u8,
vbucket u16, pad u32; the header's vbucket names the vbucket (the one in the extras must
be 0 or the same). purge_before_ts 0 means "the node's --purge-age"; otherwise it is the
Unix time at or before which a tombstone must have been deleted. drop_deletes ignores the
age. purge_before_seq (0: none) caps the seqno. No field lets the purger pass a live high
watermark. The answer comes when the compaction is done: SUCCESS with a small JSON
summary (kv_engine sends no value; clients that do not look are not bothered).
"""
from __future__ import annotations

import json

from dcptool.protocol.constants import Datatype, Opcode, Status

from ..access import Privilege
from .common import answer_later, command, not_my_vbucket


@command(Opcode.COMPACT_DB, privilege=Privilege.COMPACT)
def compact_db(conn, frame, msg) -> None:
    vbid = frame.specific
    if msg.db_file_id not in (0, vbid):
        conn.reply(frame, Status.EINVAL, value=_context(
            f"the extras name vbucket {msg.db_file_id} but the header vbucket {vbid}"),
            datatype=Datatype.JSON if conn.json else 0)
        return
    bucket = conn.bucket
    if vbid not in bucket.vbuckets:
        not_my_vbucket(conn, frame)
        return

    async def work() -> None:
        summary = await bucket.purger.compact(
            [vbid], purge_before_ts=msg.purge_before_ts, purge_before_seq=msg.purge_before_seq,
            drop_deletes=bool(msg.drop_deletes), reason=f"COMPACT_DB from {conn.peer}")
        vb = bucket.vbuckets[vbid]
        doc = {"vbucket": vbid, "purged": summary["purged"], "purge_seqno": vb.purge_seqno,
               "expired_rows": summary["expired_rows"], "lost_rows": summary["lost_rows"],
               "dropped_collection_items_purged": summary["dropped_collection_items_purged"]}
        conn.reply(frame, value=json.dumps(doc).encode(),
                   datatype=Datatype.JSON if conn.json else 0)

    answer_later(conn, frame, work)


def _context(text: str) -> bytes:
    return json.dumps({"error": {"context": text}}).encode()
