"""The high watermark table over the wire: HWT_REGISTER (0xe4), HWT_LIST (0xe5) and
HWT_REMOVE (0xe6), dcptool's own opcodes (kv_engine defines none of them; see
docs/protocol-extensions.md). Requests and answers are JSON objects in the value.

Register and remove need the WatermarkWrite privilege, list WatermarkRead. Register and
remove are answered once the change is on disk; list reads the tombstone index to say
how far each row holds the purger back.
"""
from __future__ import annotations

import asyncio
import json
import time

from dcptool.protocol.constants import Datatype, Opcode, Status

from ..access import Privilege
from ..compaction import hold_figures
from ..hwt import HwtRequestError, parse_list_request, parse_registration, parse_selector
from .common import answer_later, command


def _send(conn, frame, doc, status: int = Status.SUCCESS) -> None:
    conn.reply(frame, status, value=json.dumps(doc, separators=(",", ":")).encode(),
               datatype=Datatype.JSON if conn.json else 0)


def _refuse(conn, frame, status: int, text: str) -> None:
    _send(conn, frame, {"error": {"context": text}}, status)


def _disabled(conn, frame) -> bool:
    """A node started with --no-hwt answers like a server without the extension."""
    if conn.node.config.hwt_enabled:
        return False
    conn.reply(frame, Status.UNKNOWN_COMMAND)
    return True


@command(Opcode.HWT_REGISTER, privilege=Privilege.WATERMARK_WRITE)
def hwt_register(conn, frame, msg) -> None:
    if _disabled(conn, frame):
        return
    bucket = conn.bucket
    now = time.time()
    try:
        entry = parse_registration(msg.document(), num_vbuckets=bucket.num_vbuckets, now=now,
                                   default_ttl=bucket.hwt_default_ttl)
        replaced, fut = bucket.hwt.register(entry)
    except HwtRequestError as exc:
        _refuse(conn, frame, Status.EINVAL, str(exc))
        return
    # a watermark below the purge seqno comes too late: those deletions are gone, and a
    # stream from there will be told to roll back to 0
    behind = {}
    for vb, s in sorted(entry.seqnos.items()):
        p = bucket.vbuckets[vb].purge_seqno
        if s and s < p:
            behind[str(vb)] = p
    doc = {"name": entry.name, "instance": entry.instance, "replaced": replaced,
           "reported_at": entry.reported_at, "expires_at": entry.expires_at,
           "vbuckets": len(entry.seqnos), "behind_purge_seqno": behind}

    async def work() -> None:
        await asyncio.wrap_future(fut)
        _send(conn, frame, doc)

    answer_later(conn, frame, work)


@command(Opcode.HWT_LIST, privilege=Privilege.WATERMARK_READ)
def hwt_list(conn, frame, msg) -> None:
    if _disabled(conn, frame):
        return
    bucket = conn.bucket
    try:
        name, instance, want, holding = parse_list_request(
            msg.document(), num_vbuckets=bucket.num_vbuckets)
    except HwtRequestError as exc:
        _refuse(conn, frame, Status.EINVAL, str(exc))
        return
    now = time.time()
    table = bucket.hwt
    entries = table.select(name, instance)
    if want is not None:
        entries = [e for e in entries if not set(want).isdisjoint(e.seqnos)]
    replicated = table.select_replicated(name, instance, want)
    purger = bucket.purger

    async def work() -> None:
        holds = await hold_figures(bucket, entries, now, purger.purge_age) if holding else {}
        rows = []
        vbs: set[int] = set(want or ())
        for e in entries:
            d = e.describe(now)
            d["holding"] = holds.get(e.key, {})
            rows.append(d)
            vbs.update(e.seqnos)
        vbs.update(r.vb for r in replicated)
        shown = set(vbs) if want is None else set(want)
        _send(conn, frame, {
            "now": now, "purge_age": purger.purge_age, "max_hold": purger.max_hold,
            "compaction_interval": purger.interval, "entries": rows,
            "purge_seqnos": {str(vb): bucket.vbuckets[vb].purge_seqno for vb in sorted(vbs)
                             if vb in bucket.vbuckets},
            "replicated": [r.describe(now) for r in replicated],
            "pending": {str(vb): p for vb, p in sorted(table.pending.items())
                        if vb in shown or want is None},
            "source_purge_seqnos": {str(vb): {"source": src, "purge_seqno": p}
                                    for vb, (src, p) in sorted(table.source_purge.items())
                                    if vb in shown or want is None},
        })

    answer_later(conn, frame, work)


@command(Opcode.HWT_REMOVE, privilege=Privilege.WATERMARK_WRITE)
def hwt_remove(conn, frame, msg) -> None:
    if _disabled(conn, frame):
        return
    bucket = conn.bucket
    try:
        name, instance = parse_selector(msg.document(), name_required=True)
    except HwtRequestError as exc:
        _refuse(conn, frame, Status.EINVAL, str(exc))
        return
    gone, gone_r, fut = bucket.hwt.remove(name, instance)
    if fut is None:
        what = f"{name}/{instance}" if instance else name
        _refuse(conn, frame, Status.KEY_ENOENT, f"no high watermark registered as {what}")
        return
    # registered rows, then clients known here only from replicated rows
    removed = list(dict.fromkeys([(e.name, e.instance) for e in gone]
                                 + [(r.name, r.instance) for r in gone_r]))
    doc = {"removed": [{"name": n, "instance": i} for n, i in removed]}

    async def work() -> None:
        await asyncio.wrap_future(fut)
        _send(conn, frame, doc)

    answer_later(conn, frame, work)
