"""DCP commands on the producer side: open, control, stream requests, close, acks, logs.

A connection becomes a DCP producer connection with DCP_OPEN (Producer flag); the
other DCP opcodes are EINVAL elsewhere. The stream request is judged by
`decisions.evaluate_stream_request` (fact sheet 8.1); on success the answer carries the
failover log, newest first, and the stream starts sending after it.

On a connection that negotiated Collections the stream-request value (JSON) is parsed
into the stream's filter (`dcptool.node.dcpfilter`: collections, scope, uid, sid,
purge_seqno); its refusals are judged at step 7 of the order. Without Collections a value
is EINVAL and the stream gets the default collection only (docs/collections-dcp.md).
"""
from __future__ import annotations

import json
import struct

from dcptool.protocol.constants import DcpOpenFlag, Opcode, Status

from dcptool.protocol.collections import StreamFilter

from ..access import Privilege, has_privilege
from ..dcpfilter import DcpFilter, FilterRefused, parse_request_value
from ..decisions import VBucketView, evaluate_stream_request
from ..producer import Producer
from ..stream import ProducerStream
from .common import CHECKED_IN_HANDLER, command, unknown_collection
from .vbucket import failover_log_bytes, get_failover_log

_U64 = struct.Struct(">Q")

#: DCP_OPEN flags a node accepts; 0x002 (old Notifier), 0x010 and 0x080 (PiTR) are refused
_OPEN_KNOWN = 0x3FF
_OPEN_REFUSED = int(DcpOpenFlag.INVALID | DcpOpenFlag.UNUSED | DcpOpenFlag.PITR)
MAX_NAME = 200


@command(Opcode.DCP_OPEN, privilege=CHECKED_IN_HANDLER)
def dcp_open(conn, frame, msg) -> None:
    flags = msg.flags
    if not has_privilege(conn, Privilege.DCP_PRODUCER if flags & DcpOpenFlag.PRODUCER
                         else Privilege.DCP_CONSUMER):
        conn.error(frame, Status.EACCESS)
        return
    if conn.dcp_opened:
        conn.reply(frame, Status.EINVAL)
        return
    if flags & ~_OPEN_KNOWN or flags & _OPEN_REFUSED:
        conn.reply(frame, Status.EINVAL)
        return
    if flags & DcpOpenFlag.NO_VALUE and flags & DcpOpenFlag.NO_VALUE_WITH_UNDERLYING_DATATYPE:
        conn.reply(frame, Status.EINVAL)
        return
    if flags & DcpOpenFlag.INCLUDE_DELETED_USER_XATTRS and not flags & DcpOpenFlag.INCLUDE_XATTRS:
        conn.reply(frame, Status.EINVAL)
        return
    if flags & DcpOpenFlag.SKIP_DELETES_IN_INITIAL_BACKFILL:
        conn.reply(frame, Status.EINVAL)  # needs collections
        return
    if len(msg.name) > MAX_NAME:
        conn.reply(frame, Status.EINVAL)
        return
    if msg.value:
        # only {"consumer_name": ...} on consumer connections, with datatype JSON
        try:
            doc = json.loads(msg.value)
        except ValueError:
            doc = None
        if flags & DcpOpenFlag.PRODUCER or not isinstance(doc, dict) or set(doc) - {"consumer_name"}:
            conn.reply(frame, Status.EINVAL)
            return
    if not flags & DcpOpenFlag.PRODUCER:
        conn.reply(frame, Status.NOT_SUPPORTED)  # this node has no DCP consumer endpoint
        return
    bucket = conn.bucket
    old = bucket.producers.get(msg.name)
    if old is not None:
        # a second connection with the same name replaces the first
        old.close()
        old.conn.close()
    prod = Producer(conn, msg.name, flags, bucket=bucket, backfills=conn.node.backfills)
    conn.producer = prod
    conn.dcp_opened = True
    conn.json = True  # DCP_OPEN turns JSON on for the connection
    bucket.producers[msg.name] = prod
    conn.reply(frame)


@command(Opcode.DCP_CONTROL, dcp=True, privilege=Privilege.DCP_PRODUCER)
def dcp_control(conn, frame, msg) -> None:
    conn.reply(frame, conn.producer.control(msg.key, msg.value_text))


@command(Opcode.DCP_STREAM_REQ, dcp=True, privilege=Privilege.DCP_PRODUCER)
def dcp_stream_req(conn, frame, msg) -> None:
    prod = conn.producer
    vbid = frame.specific
    vb = conn.bucket.vbuckets.get(vbid)
    view = None
    if vb is not None:
        view = VBucketView(vb.state, vb.high_seqno, vb.persisted_seqno, vb.purge_seqno,
                           tuple(vb.failover_log))
    sid = msg.stream_id
    value = msg.value
    collections = conn.collections
    manifest = getattr(conn.bucket, "manifest", None)
    filt = None
    filter_error = None
    client_purge = 0
    filtered_high = None
    try:
        if collections:
            # the value: which collections, the stream id, the client's manifest uid
            sf = parse_request_value(value) if value else StreamFilter()
            if sf.sid is not None:
                if sid is not None and sid != sf.sid:
                    raise FilterRefused(Status.DCP_STREAM_ID_INVALID,
                                        "the frame's stream id is not the value's sid")
                sid = sf.sid
            filt = DcpFilter.from_request(sf, manifest)
            client_purge = sf.purge_seqno or 0
            if filt.cids is not None and vb is not None:
                filtered_high = max((vb.collection_high(c) or 0 for c in filt.cids), default=0)
        elif not value:
            filt = DcpFilter.legacy_filter(manifest)
    except FilterRefused as exc:
        filter_error = (exc.status, exc.reason)
    d = evaluate_stream_request(
        view, flags=msg.flags, start=msg.start_seqno, end=msg.end_seqno,
        vb_uuid=msg.vbucket_uuid, snap_start=msg.snap_start_seqno, snap_end=msg.snap_end_seqno,
        has_value=bool(value) and not collections, noop_enabled=prod.noop_enabled,
        wants_xattrs=prod.include_xattrs, stream_ids_enabled=prod.stream_ids, stream_id=sid,
        stream_exists=prod.has_stream(vbid, sid), client_purge_seqno=client_purge,
        filter_error=filter_error, filtered_high=filtered_high)
    if d.status == Status.ROLLBACK:
        conn.reply(frame, Status.ROLLBACK, value=_U64.pack(d.rollback_seqno))
        return
    if d.status == Status.UNKNOWN_COLLECTION:
        unknown_collection(conn, frame)  # with the manifest uid, as kv_engine answers
        return
    if d.status:
        conn.error(frame, d.status)
        return
    conn.reply(frame, value=failover_log_bytes(vb))
    prod.add_stream(ProducerStream(prod, vb, frame.opaque, sid, d.plan, filt))


@command(Opcode.DCP_CLOSE_STREAM, dcp=True, privilege=Privilege.DCP_PRODUCER)
def dcp_close_stream(conn, frame, msg) -> None:
    prod = conn.producer
    sid = msg.stream_id
    if prod.stream_ids != (sid is not None):
        conn.error(frame, Status.DCP_STREAM_ID_INVALID)
        return
    if not prod.close_stream(frame.specific, sid):
        conn.reply(frame, Status.KEY_ENOENT)
        return
    conn.reply(frame)


@command(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, dcp=True, privilege=Privilege.DCP_PRODUCER)
def dcp_buffer_ack(conn, frame, msg) -> None:
    conn.producer.ack(msg.bytes_to_ack)  # no response on success


# the same answer as GET_FAILOVER_LOG, asked on a producer connection
command(Opcode.DCP_GET_FAILOVER_LOG, dcp=True, privilege=Privilege.DCP_PRODUCER)(get_failover_log)


@command(Opcode.DCP_NOOP, dcp=True, decode=False, privilege=Privilege.DCP_PRODUCER)
def dcp_noop_request(conn, frame) -> None:
    conn.reply(frame)


@command(Opcode.DCP_ADD_STREAM, dcp=True, decode=False, privilege=Privilege.DCP_CONSUMER)
def dcp_add_stream(conn, frame) -> None:
    conn.reply(frame, Status.NOT_SUPPORTED)  # consumer-side command; this is a producer


@command(Opcode.DCP_STREAM_END, Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_MUTATION,
         Opcode.DCP_DELETION, Opcode.DCP_EXPIRATION, Opcode.DCP_FLUSH,
         Opcode.DCP_SET_VBUCKET_STATE, Opcode.DCP_SYSTEM_EVENT, Opcode.DCP_PREPARE,
         Opcode.DCP_SEQNO_ACKNOWLEDGED, Opcode.DCP_COMMIT, Opcode.DCP_ABORT,
         Opcode.DCP_SEQNO_ADVANCED, Opcode.DCP_OSO_SNAPSHOT, dcp=True, decode=False,
         privilege=Privilege.DCP_PRODUCER)
def dcp_wrong_direction(conn, frame) -> None:
    conn.reply(frame, Status.EINVAL)  # producer-to-consumer messages sent to a producer
