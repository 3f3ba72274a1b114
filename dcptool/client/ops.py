"""Plain requests a DCP client needs besides streams: failover logs, vbucket seqnos and the
collections manifest.

They run on an ordinary (non-DCP) connection and pipeline their requests, so asking
1024 vbuckets costs one round trip, not 1024.
"""
from __future__ import annotations

from typing import Iterable

from dcptool.protocol.collections import CollectionsError, Manifest
from dcptool.protocol.constants import Opcode, Status
from dcptool.protocol.messages import (
    FailoverLogResponse,
    GenericRequest,
    GetAllVbSeqnos,
    GetFailoverLog,
)

from .connection import Connection, decode_response, raise_for_status
from .errors import ProtocolViolation
from .position import Position


def get_failover_logs(conn: Connection, vbuckets: Iterable[int]) -> dict[int, tuple[tuple[int, int], ...]]:
    """{vb: failover log (newest first)} for each vbucket, via GET_FAILOVER_LOG (0x96).

    Raises NotMyVbucketError naming the first vbucket the node does not hold.
    """
    vbs = list(vbuckets)
    opaques = []
    out = bytearray()
    for vb in vbs:
        frame = GetFailoverLog(vbucket=vb).to_frame()
        frame.opaque = conn.next_opaque()
        opaques.append(frame.opaque)
        out += frame.encode()
        if len(out) > 256 * 1024:
            conn.send_bytes(out)
            out.clear()
    if out:
        conn.send_bytes(out)
    logs: dict[int, tuple[tuple[int, int], ...]] = {}
    error = None
    for vb, opaque in zip(vbs, opaques):
        rsp = decode_response(conn.wait_response(opaque), conn.address)
        if rsp.status != Status.SUCCESS:
            if error is None:
                error = (rsp, vb)
            continue
        if not isinstance(rsp, FailoverLogResponse):
            raise ProtocolViolation(f"{conn.address} answered GET_FAILOVER_LOG for vbucket {vb} "
                                    f"with an unexpected message", host=conn.address)
        logs[vb] = tuple(rsp.entries)
    if error is not None:
        raise_for_status(error[0], "GET_FAILOVER_LOG", address=conn.address, vbucket=error[1])
    return logs


def get_vbucket_seqnos(conn: Connection, state: int | None = None) -> dict[int, int]:
    """{vb: high seqno} of the vbuckets the node holds (state: 1 active, 2 replica, None all)."""
    rsp = conn.request(GetAllVbSeqnos(state=state))
    raise_for_status(rsp, "GET_ALL_VB_SEQNOS", address=conn.address)
    entries = getattr(rsp, "entries", None)
    if entries is None:
        raise ProtocolViolation(f"{conn.address} answered GET_ALL_VB_SEQNOS with an unexpected "
                                f"message", host=conn.address)
    return {vb: seqno for vb, seqno in entries}


def latest_positions(conn: Connection, vbuckets: Iterable[int] | None = None) -> dict[int, Position]:
    """The current end of each vbucket ("now"): newest uuid, high seqno, failover log."""
    seqnos = get_vbucket_seqnos(conn, state=1 if vbuckets is None else None)
    vbs = sorted(seqnos) if vbuckets is None else list(vbuckets)
    logs = get_failover_logs(conn, vbs)
    return {vb: Position.latest(logs[vb], seqnos.get(vb, 0)) for vb in vbs}


#: statuses of a node that has no collections (an older server, a node without the command)
_NO_COLLECTIONS = frozenset({Status.UNKNOWN_COMMAND, Status.NOT_SUPPORTED})


def get_collections_manifest(conn: Connection, *, missing_ok: bool = False) -> Manifest | None:
    """The bucket's collections manifest (GET_COLLECTIONS_MANIFEST, 0xba).

    `missing_ok`: None instead of an error when the node does not know the command (a
    node without collections). Raises RequestFailed for other refusals and
    ProtocolViolation for a manifest that does not parse.
    """
    rsp = conn.request(GenericRequest(op=Opcode.GET_COLLECTIONS_MANIFEST))
    if missing_ok and rsp.status in _NO_COLLECTIONS:
        return None
    raise_for_status(rsp, "GET_COLLECTIONS_MANIFEST", address=conn.address)
    try:
        return Manifest.from_json(bytes(getattr(rsp, "value", b"") or b""))
    except CollectionsError as exc:
        raise ProtocolViolation(f"{conn.address} answered GET_COLLECTIONS_MANIFEST with a "
                                f"manifest that does not parse: {exc}", host=conn.address) from None


__all__ = ["get_failover_logs", "get_vbucket_seqnos", "latest_positions",
           "get_collections_manifest"]
