"""The high watermark table from the client side: register, list and remove watermarks.

A client registers, per vbucket, the seqno up to which it durably holds every change;
the node's tombstone purger then never purges a deletion above it while the row lives
(seed 002). These are dcptool's own opcodes (docs/protocol-extensions.md): a real
Couchbase Server answers UNKNOWN_COMMAND, which `WatermarkUnsupported` reports and
`WatermarkReporter` turns into one notice.

    with opts.connect() as conn:
        register_watermark(conn, "my-app", "instance-1", {0: 120, 1: 98}, ttl=86400)
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable

from dcptool.protocol.constants import Opcode, Status, status_name
from dcptool.protocol.messages import HwtRequest, Stat

from .connection import Connection, error_context, raise_for_status
from .errors import ClientError, RequestFailed

#: the statuses a node without the extension answers
_UNSUPPORTED = (Status.UNKNOWN_COMMAND, Status.NOT_SUPPORTED)


class WatermarkUnsupported(ClientError):
    """The node has no high watermark table (a real Couchbase Server, or an older node)."""


class WatermarkNotFound(ClientError):
    """HWT_REMOVE named no registered row."""


def watermark_error(rsp, what: str, address: str) -> ClientError | None:
    """How the high watermark table's commands read a failure first: a node without the
    table, no row matched, a request the node refused with a reason (None: the common
    reading of `raise_for_status`)."""
    st = rsp.status
    if st in _UNSUPPORTED:
        return WatermarkUnsupported(
            f"{address} has no high watermark table support (it answered "
            f"{status_name(st)} to {what})",
            host=address, hint="the node's purger will not wait for this client")
    context = error_context(rsp)
    if st == Status.KEY_ENOENT:
        return WatermarkNotFound(context or f"{what}: nothing matched", host=address)
    if st == Status.EINVAL and context:
        return RequestFailed(f"{address} refused {what}: {context}", host=address,
                             status=st, opcode=rsp.opcode)
    return None


def hwt_call(conn: Connection, op: int, doc: dict[str, Any] | None, what: str
             ) -> dict[str, Any]:
    """Send one of the table's commands; the JSON object it answers, or the error
    `watermark_error` (then `raise_for_status`) reads."""
    rsp = conn.call(HwtRequest.make(op, doc), what, errors=watermark_error)
    value = bytes(getattr(rsp, "value", b"") or b"")
    try:
        doc_out = json.loads(value.decode("utf-8")) if value else {}
    except (UnicodeDecodeError, ValueError):
        doc_out = None
    if not isinstance(doc_out, dict):
        raise RequestFailed(f"{conn.address} answered {what} with a value that is not a JSON "
                            f"object", host=conn.address, status=rsp.status, opcode=op)
    return doc_out


def register_watermark(conn: Connection, name: str, instance: str, seqnos: dict[int, int], *,
                       ttl: float | None = None, meta: dict[str, Any] | None = None
                       ) -> dict[str, Any]:
    """Register (or replace) the row (`name`, `instance`). Returns the node's answer:
    name, instance, replaced, reported_at, expires_at, vbuckets and behind_purge_seqno
    ({vbucket: purge seqno} where the watermark is already below the purge seqno)."""
    doc: dict[str, Any] = {"name": name, "instance": instance,
                           "vbuckets": {str(vb): int(s) for vb, s in sorted(seqnos.items())}}
    if ttl is not None:
        doc["ttl"] = ttl
    if meta:
        doc["meta"] = meta
    return hwt_call(conn, Opcode.HWT_REGISTER, doc, "HWT_REGISTER")


def list_watermarks(conn: Connection, name: str | None = None,
                    instance: str | None = None, *, vbuckets: list[int] | None = None,
                    holding: bool | None = None) -> dict[str, Any]:
    """The node's table: {now, purge_age, max_hold, compaction_interval, entries,
    purge_seqnos}; each entry has name, instance, state (ok/expired/lost), reported_at,
    expires_at, lost_at, lost_reason, meta, vbuckets {vb: seqno}, lowest_seqno,
    highest_seqno and holding {vb: {tombstones, up_to_seqno, seconds}}. `vbuckets`: only
    these vbuckets' seqnos; `holding=False`: without the holding figures."""
    doc = {k: v for k, v in (("name", name), ("instance", instance), ("vbuckets", vbuckets),
                             ("holding", holding)) if v is not None}
    return hwt_call(conn, Opcode.HWT_LIST, doc or None, "HWT_LIST")


def remove_watermark(conn: Connection, name: str, instance: str | None = None) -> list[dict]:
    """Remove the rows of `name` (all instances, or one). Returns the removed
    {name, instance} pairs; raises WatermarkNotFound when there were none."""
    doc = {"name": name}
    if instance is not None:
        doc["instance"] = instance
    return list(hwt_call(conn, Opcode.HWT_REMOVE, doc, "HWT_REMOVE").get("removed", []))


def get_stats(conn: Connection, group: str = "") -> dict[str, str]:
    """One STAT group as {name: value} (one response per stat, an empty key ends it)."""
    frame = Stat(group=group).to_frame()
    frame.opaque = conn.next_opaque()
    conn.send_bytes(frame.encode())
    out: dict[str, str] = {}
    while True:
        f = conn.wait_response(frame.opaque)
        if f.specific != Status.SUCCESS:
            from .connection import decode_response

            raise_for_status(decode_response(f, conn.address), f"STAT {group}",
                             address=conn.address)
        if not f.key:
            return out
        out[bytes(f.key).decode("utf-8", "replace")] = bytes(f.value).decode("utf-8", "replace")


def get_purge_seqnos(conn: Connection) -> dict[int, int]:
    """{vbucket: purge seqno} from STAT vbucket-seqno (Couchbase Server reports it too)."""
    out = {}
    for k, v in get_stats(conn, "vbucket-seqno").items():
        vb, _, name = k.partition(":")
        if name == "purge_seqno" and vb.startswith("vb_"):
            try:
                out[int(vb[3:])] = int(v)
            except ValueError:
                continue
    return out


class WatermarkReporter:
    """Registers one client's watermark from time to time for a long-running command.

    `report(seqnos)` registers at most once per `interval` seconds (unless forced) over
    its own connection, opened when needed and opened again after a failure. A node
    without the extension is told about once through `notice` and never asked again;
    other failures are told through `notice` (once per distinct message) and the caller
    carries on: a missing registration only means the purger does not wait.
    """

    def __init__(self, connect: Callable[[], Connection], name: str, instance: str, *,
                 ttl: float | None = None, meta: dict[str, Any] | None = None,
                 interval: float = 0.0, notice: Callable[[str], None] = lambda m: None) -> None:
        self._connect = connect
        self.name = name
        self.instance = instance
        self.ttl = ttl
        self.meta = meta
        self.interval = interval
        self.notice = notice
        self.unsupported = False
        self.registered = 0
        self.last: dict[str, Any] | None = None
        self._last_at = 0.0
        self._told: set[str] = set()
        self._conn: Connection | None = None

    def due(self) -> bool:
        return not self.unsupported and time.monotonic() - self._last_at >= self.interval

    def report(self, seqnos: dict[int, int], *, force: bool = False) -> dict[str, Any] | None:
        if self.unsupported or not seqnos or (not force and not self.due()):
            return None
        self._last_at = time.monotonic()
        try:
            if self._conn is None:
                self._conn = self._connect()
            answer = register_watermark(self._conn, self.name, self.instance, seqnos,
                                        ttl=self.ttl, meta=self.meta)
        except WatermarkUnsupported as exc:
            self.unsupported = True
            self.close()
            self.notice(f"{exc}; carrying on without a registered watermark")
            return None
        except ClientError as exc:
            self.close()
            msg = f"cannot register the high watermark {self.name}: {exc}"
            if msg not in self._told:
                self._told.add(msg)
                self.notice(msg)
            return None
        self.registered += 1
        self.last = answer
        behind = answer.get("behind_purge_seqno") or {}
        if behind:
            vbs = sorted(int(v) for v in behind)
            msg = (f"the node already purged deletions above this client's position in "
                   f"{len(vbs)} vbuckets (e.g. vbucket {vbs[0]}: purge seqno "
                   f"{behind[str(vbs[0])]}); those vbuckets will be read again from seqno 0")
            if msg not in self._told:
                self._told.add(msg)
                self.notice(msg)
        return answer

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None


__all__ = ["WatermarkUnsupported", "WatermarkNotFound", "WatermarkReporter", "hwt_call",
           "watermark_error",
           "register_watermark", "list_watermarks", "remove_watermark", "get_stats",
           "get_purge_seqnos"]
