"""The DCP consumer session as a sans-I/O state machine.

Bytes from the node go in through `feed` (or `parse` on a caller-owned buffer); events
come out as compact tuples (see `dcptool.client.events`); bytes to send to the node
(DCP_OPEN, controls, stream requests, NOOP replies, buffer acks) come out of
`data_to_send`. No sockets, threads or clocks: the blocking driver in
`dcptool.client.consumer` does the I/O, and tests feed bytes directly.

The mutation path is flat: one precompiled header unpack and one extras unpack on a
memoryview, a tuple, a list store of the seqno. Everything rare (responses, stream
ends, rollbacks, unknown opcodes) goes through the codec's typed messages.

Values the node sent snappy-compressed (datatype bit 0x02; see `dcptool.protocol.snappy`)
come out decompressed, with the bit cleared from the event's datatype, whatever the
connection negotiated: every consumer of the session (backup, tail, streams) sees one
form. An uncompressed value costs one comparison of its datatype.

Collections (`SessionConfig(collections=True)`, the connection asks for HELLO Collections):
every record's key is the collection-prefixed doc key (`dcptool.protocol.collections`). A
node that did not accept Collections sends plain keys of the default collection; the
session then gives them the 0x00 prefix itself (once per parsed chunk, after the hot loop),
so callers see one form. When the node accepted, keys go out as they came: no per-item work.
DCP_SYSTEM_EVENT becomes `(SYSTEM_EVENT, vb, SystemEvent)`; DCP_SEQNO_ADVANCED moves the
stream's position (a snapshot end whose last items the filter hides); a stream request
carries the stream's `StreamFilter` as its value; STREAM_END FilterEmpty ends a stream
normally (every collection it asked for was dropped).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Callable

from dcptool.protocol import ProtocolError, decode_frame, decode_message
from dcptool.protocol import wire as w
from dcptool.protocol.constants import (
    SEQNO_MAX,
    DcpOpenFlag,
    Magic,
    Opcode,
    SnapshotFlag,
    Status,
    StreamEndReason,
    opcode_name,
    status_name,
)
from dcptool.protocol.frame import encode_frame
from dcptool.protocol.messages import (
    DcpBufferAck,
    DcpCloseStream,
    DcpControl,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpOpen,
    DcpSnapshotMarker,
    DcpStreamReq,
    StreamReqOk,
    StreamReqRollback,
)
from dcptool.protocol.collections import CollectionsError, StreamFilter, SystemEvent
from dcptool.protocol.snappy import SNAPPY, decompress

from .errors import NotMyVbucketError, ProtocolViolation, RequestFailed, RollbackError, StreamError
from .events import (
    DELETION,
    EXPIRATION,
    MUTATION,
    RECORD_KINDS,
    ROLLBACK,
    SEQNO_ADVANCED,
    SNAPSHOT,
    STREAM_END,
    STREAM_OPEN,
    SYSTEM_EVENT,
    VBUCKET_STATE,
    RollbackInfo,
)
from .position import ZERO, Position, thin_ends

_HEADER = w.HEADER
_MUT = w.MUTATION_EXTRAS  # 31-byte mutation extras
_DEL2 = w.DELETION_V2_EXTRAS  # 21-byte deletion extras (with delete time)
_DEL1 = w.DELETION_V1_EXTRAS  # 18-byte deletion extras
_EXP = w.EXPIRATION_EXTRAS  # 20-byte expiration extras
_MARKER = w.MARKER_V1  # 20-byte snapshot marker v1

#: stream end reasons after which the session asks for the stream again from its position
RETRY_REASONS = frozenset({StreamEndReason.STATE_CHANGED, StreamEndReason.SLOW,
                           StreamEndReason.ROLLBACK})

REQUESTED, OPEN, CLOSING, ENDED, FAILED = "requested", "open", "closing", "ended", "failed"
#: a stream request answered "try again later" waits in this state until `retry_waiting`
WAITING = "waiting"
#: statuses after which a stream request is tried again later (warm-up, memory pressure)
TEMPORARY = frozenset({Status.ETMPFAIL, Status.ENOMEM, Status.EBUSY})

RollbackCallback = Callable[[RollbackInfo], "Position | None"]

#: the session's counters of snappy-compressed values (see DcpSession.__init__); a driver
#: that replaces a session by a new one carries them over (`carry_counters`)
VALUE_COUNTERS = ("values_decompressed", "compressed_bytes", "decompressed_bytes")


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """How the session opens its DCP connection.

    `buffer_size` is the flow-control window in bytes (0: no flow control);
    a BUFFER_ACK is sent once `ack_ratio` of it has been received and processed.
    `noop_interval` (seconds) is asked of the node; the driver treats the connection
    as dead after `dead_timeout` seconds without a single byte (default: twice the interval
    plus 5 s). `consistent` makes `position()` report snapshot ends only.
    `copy_values=False` hands values out as memoryviews into the receive buffer.
    `ack_vbucket_state=False` leaves the answer to a takeover stream's SET_VBUCKET_STATE
    to the caller (`DcpSession.ack_vbucket_state`, once the state is applied).
    `force_value_compression`: when the connection negotiated Snappy (HELLO 0x0a; the
    session is told so by its driver), ask the node to send every value compressed
    (DCP_CONTROL force_value_compression). Values arrive decompressed either way.
    `collections`: the connection asks for HELLO Collections; record keys are doc keys
    (prefixed by the session when the node refused), system events are handed out.
    `stream_filter`: the StreamFilter every stream request carries unless `add_stream` is
    given one (collections only; None: every collection).
    """

    name: str = "dcptool"
    no_value: bool = False
    include_xattrs: bool = False
    delete_times: bool = True
    expiry_opcode: bool = True
    buffer_size: int = 8 * 1024 * 1024
    ack_ratio: float = 0.5
    noop_interval: float = 60.0
    dead_timeout: float | None = None
    priority: str | None = None
    consistent: bool = True
    fail_on_rollback: bool = False
    max_rollbacks: int = 8
    max_temporary_failures: int = 30
    typed: bool = False
    copy_values: bool = True
    ack_vbucket_state: bool = True
    force_value_compression: bool = True
    collections: bool = False
    stream_filter: StreamFilter | None = None

    def open_flags(self) -> int:
        flags = DcpOpenFlag.PRODUCER
        if self.no_value:
            flags |= DcpOpenFlag.NO_VALUE
        if self.include_xattrs:
            flags |= DcpOpenFlag.INCLUDE_XATTRS
        if self.delete_times:
            flags |= DcpOpenFlag.INCLUDE_DELETE_TIMES
        return int(flags)

    @property
    def effective_dead_timeout(self) -> float | None:
        if self.dead_timeout is not None:
            return self.dead_timeout if self.dead_timeout > 0 else None
        if self.noop_interval <= 0:
            return None
        return 2 * self.noop_interval + 5.0


class ConsumerStream:
    """The session's record of one vbucket stream. Only the session mutates it."""

    __slots__ = ("vbucket", "opaque", "state", "end_seqno", "flags", "base", "failover_log",
                 "marker_start", "marker_end", "complete_end", "ends", "rollbacks", "reason",
                 "tmpfails", "filter")

    def __init__(self, vbucket: int, base: Position, end_seqno: int, flags: int,
                 filter: StreamFilter | None = None) -> None:
        self.vbucket = vbucket
        #: the stream-request value (collections); None: none sent
        self.filter = filter
        self.opaque = 0
        self.state = REQUESTED
        self.end_seqno = end_seqno
        self.flags = flags
        self.base = base
        self.failover_log = base.failover_log
        self.marker_start: int | None = None
        self.marker_end: int | None = None
        self.complete_end: int | None = None
        self.ends: list[int] = list(base.snapshot_ends)
        self.rollbacks = 0
        self.reason: int | None = None
        self.tmpfails = 0

    def reset(self, base: Position) -> None:
        self.base = base
        self.failover_log = base.failover_log
        self.marker_start = self.marker_end = self.complete_end = None
        self.ends = list(base.snapshot_ends)

    def snapshot_done(self) -> None:
        """The current snapshot was received completely."""
        if self.marker_end is not None:
            end = self.marker_end
            self.complete_end = end
            if not self.ends or self.ends[-1] < end:
                self.ends.append(end)
                if len(self.ends) > 64:
                    self.ends = list(thin_ends(tuple(self.ends)))

    @property
    def finished(self) -> bool:
        return self.state in (ENDED, FAILED)


class DcpSession:
    """A DCP consumer over one connection: many vbucket streams, flow control, NOOP,
    rollback and re-requests. Sans-I/O; see the module docstring.

    `on_rollback(info)` is called when the node answers a stream request with ROLLBACK;
    it may return a different Position (at or below `info.rollback_seqno`) to resume
    from, e.g. a snapshot end an archive holds; None accepts `info.after`.
    """

    def __init__(self, config: SessionConfig | None = None, *,
                 on_rollback: RollbackCallback | None = None, address: str = "node",
                 snappy: bool = False, collections: bool | None = None,
                 username: str | None = None, bucket: str | None = None) -> None:
        self.config = config or SessionConfig()
        #: who streams what (for the error when the node refuses the DCP connection)
        self.username = username
        self.bucket = bucket
        #: the connection negotiated HELLO Collections (None: as the config asks)
        self.collections = self.config.collections if collections is None else bool(collections)
        #: the caller wants doc keys but the node sends plain ones: prefix them (0x00)
        self._prefix_keys = self.config.collections and not self.collections
        self.on_rollback = on_rollback
        self.address = address
        #: the connection negotiated Snappy (HELLO 0x0a): the node may send compressed values
        self.snappy = snappy
        #: values that arrived snappy-compressed, and their bytes on the wire and decompressed
        self.values_decompressed = 0
        self.compressed_bytes = 0
        self.decompressed_bytes = 0
        self.streams: dict[int, ConsumerStream] = {}
        self.errors: list[Exception] = []
        self.control_failures: dict[str, int] = {}
        self.started = False
        self.opened = False
        self.noop_enabled = False
        self.flow_control = self.config.buffer_size > 0
        self.stream_end_on_close = False
        self.noops_answered = 0
        self.bytes_received = 0
        self._out = bytearray()
        self._tail = b""
        self._by_opaque: dict[int, ConsumerStream] = {}
        self._pending: dict[int, tuple[str, str, bool]] = {}
        self._opaques = itertools.count(1)
        self._last = [0] * 65536
        self._unacked = 0
        self._ack_threshold = max(1, int(self.config.buffer_size * self.config.ack_ratio))

    # ------------------------------------------------------------------ outgoing

    def _next_opaque(self) -> int:
        return next(self._opaques) & 0xFFFFFFFF

    def _queue(self, msg, kind: str = "", what: str = "", required: bool = False) -> int:
        frame = msg.to_frame()
        if kind:
            frame.opaque = self._next_opaque()
            self._pending[frame.opaque] = (kind, what, required)
        self._out += frame.encode()
        return frame.opaque

    def start(self) -> None:
        """Queue DCP_OPEN and the controls. Call once, before any stream is requested."""
        if self.started:
            return
        self.started = True
        cfg = self.config
        self._queue(DcpOpen(name=cfg.name, flags=cfg.open_flags()), "open", "DCP_OPEN", True)
        if cfg.buffer_size > 0:
            self._control("connection_buffer_size", str(int(cfg.buffer_size)), False)
        if cfg.noop_interval > 0:
            need = cfg.include_xattrs
            self._control("enable_noop", "true", need)
            interval = cfg.noop_interval
            text = str(int(interval)) if float(interval).is_integer() else f"{interval:g}"
            self._control("set_noop_interval", text, need)
        if cfg.expiry_opcode and cfg.delete_times:
            self._control("enable_expiry_opcode", "true", False)
        self._control("send_stream_end_on_client_close_stream", "true", False)
        if self.snappy and cfg.force_value_compression:
            self._control("force_value_compression", "true", False)
        if cfg.priority:
            self._control("set_priority", cfg.priority, False)

    def _control(self, key: str, value: str, required: bool) -> None:
        self._queue(DcpControl(key=key, value=value.encode()), "control", key, required)

    def add_stream(self, vbucket: int, position: Position = ZERO, *, end_seqno: int = SEQNO_MAX,
                   flags: int = 0, filter: StreamFilter | None = None) -> None:
        """Ask for vbucket `vbucket` from `position` up to `end_seqno` (default: forever).

        A position beyond `end_seqno` is still sent (with end = start) so the node can
        check its history and answer ROLLBACK if needed; otherwise the stream ends at once.
        `filter` (default: the config's `stream_filter`) is sent as the request's value on a
        collections connection. On a connection whose node refused Collections only the
        default collection can be streamed: a filter that asks for anything else raises
        StreamError.
        """
        if not self.started:
            self.start()
        old = self.streams.get(vbucket)
        if old is not None and not old.finished:
            raise StreamError(f"vbucket {vbucket} already has a stream in this session",
                              vbucket=vbucket)
        if filter is None:
            filter = self.config.stream_filter
        if filter is not None and filter.passthrough and filter.uid is None \
                and filter.sid is None and filter.purge_seqno is None:
            filter = None  # every collection: no value (a node refuses "{}")
        if filter is not None and not self.collections:
            if not (filter.passthrough or filter.collections == frozenset((0,))):
                raise StreamError(f"{self.address} did not accept Collections (HELLO 0x12): "
                                  "only the default collection can be streamed from it",
                                  vbucket=vbucket)
            filter = None  # a legacy stream is the default collection
        st = ConsumerStream(vbucket, position, end_seqno, flags, filter)
        self.streams[vbucket] = st
        self._request(st)

    def _request(self, st: ConsumerStream) -> None:
        pos = st.base
        self._last[st.vbucket] = pos.seqno
        end = st.end_seqno if st.end_seqno >= pos.seqno else pos.seqno
        if st.opaque:
            self._by_opaque.pop(st.opaque, None)
        st.state = REQUESTED
        st.opaque = self._queue(
            DcpStreamReq(vbucket=st.vbucket, flags=st.flags, start_seqno=pos.seqno, end_seqno=end,
                         vbucket_uuid=pos.uuid, snap_start_seqno=pos.snap_start,
                         snap_end_seqno=pos.snap_end,
                         value=st.filter.to_bytes() if st.filter is not None else b""),
            "stream", "DCP_STREAM_REQ")
        self._by_opaque[st.opaque] = st

    def waiting(self) -> list[int]:
        """vbuckets whose stream request got a temporary failure (TMPFAIL, ENOMEM, EBUSY)
        and wait to be asked again; the driver calls `retry_waiting` after a pause."""
        return [vb for vb, st in self.streams.items() if st.state == WAITING]

    def retry_waiting(self) -> None:
        for st in self.streams.values():
            if st.state == WAITING:
                self._request(st)

    def close_stream(self, vbucket: int) -> None:
        st = self.streams.get(vbucket)
        if st is None or st.finished:
            return
        st.state = CLOSING
        self._queue(DcpCloseStream(vbucket=vbucket), "close", str(vbucket))

    def ack_vbucket_state(self, opaque: int) -> None:
        """Answer a takeover stream's SET_VBUCKET_STATE (the producer waits for it)."""
        self._out += encode_frame(Magic.RESPONSE, Opcode.DCP_SET_VBUCKET_STATE, 0, opaque)

    def data_to_send(self) -> bytes:
        """Bytes the session wants sent to the node now (empty when none)."""
        if not self._out:
            return b""
        out = bytes(self._out)
        self._out.clear()
        return out

    # ------------------------------------------------------------------ state

    @property
    def active_streams(self) -> int:
        return sum(1 for s in self.streams.values() if not s.finished)

    @property
    def done(self) -> bool:
        """Every stream has ended (or failed) and nothing is outstanding."""
        return bool(self.streams) and all(s.finished for s in self.streams.values())

    def take_error(self) -> Exception | None:
        return self.errors.pop(0) if self.errors else None

    def position(self, vbucket: int, consistent: bool | None = None) -> Position:
        """Where vbucket `vbucket` stands now.

        Consistent (the default set in the config): the last complete snapshot end, so a
        resume never starts inside a snapshot the consumer only partly holds. Otherwise
        the last seqno received, inside its snapshot.
        """
        st = self.streams[vbucket]
        if consistent is None:
            consistent = self.config.consistent
        log = st.failover_log
        uuid = log[0][0] if log else st.base.uuid
        last = self._last[vbucket]
        ends = tuple(st.ends)
        ms, me = st.marker_start, st.marker_end
        if me is not None and last >= me:
            if not ends or ends[-1] < me:
                ends = thin_ends(ends + (me,))
            return Position(uuid, me, me, me, log, ends)
        if not consistent and ms is not None and ms <= last:
            return Position(uuid, last, ms, me, log, ends)
        if st.complete_end is not None:
            c = st.complete_end
            return Position(uuid, c, c, c, log, ends)
        base = st.base
        if log is not base.failover_log:
            return Position(uuid, base.seqno, base.snap_start, base.snap_end, log, ends)
        return base

    def positions(self, consistent: bool | None = None) -> dict[int, Position]:
        return {vb: self.position(vb, consistent) for vb in self.streams}

    # ------------------------------------------------------------------ incoming

    def feed(self, data) -> list:
        """Process bytes from the node; return the events they complete."""
        if self._tail:
            buf = self._tail + bytes(data)
        else:
            buf = data
        out: list = []
        used = self.parse(buf, out)
        self._tail = bytes(memoryview(buf)[used:]) if used < len(buf) else b""
        return out

    def parse(self, buf, out: list) -> int:
        """Process the whole frames at the start of `buf`, appending events to `out`.

        Returns the number of bytes consumed; the caller keeps the rest for later.
        This is the hot path.
        """
        if self._prefix_keys:
            first = len(out)
            used = self._parse(buf, out)
            _prefix_default(out, first, self.config.typed)
            return used
        return self._parse(buf, out)

    def _parse(self, buf, out: list) -> int:
        if type(buf) is not bytes:
            # one copy of the chunk: a slice of bytes is a bytes object made in one step,
            # where bytes(memoryview[a:b]) builds a view first (2.5x the cost per key/value)
            buf = bytes(buf)
        # values handed out as views (copy_values=False) are views of these immutable bytes
        mv = memoryview(buf)
        n = len(buf)
        pos = 0
        hdr = _HEADER.unpack_from
        # a mutation's header and extras in one unpack (55 bytes: every complete mutation
        # has them; for other frames the fields after the header are not used)
        full = w.MUTATION.unpack_from
        append = out.append
        last = self._last
        copy = self.config.copy_values
        typed = self.config.typed
        plain = copy and not typed
        # bytes of frames flow control does not count (noops, responses); the rest is counted
        uncounted = 0
        # the protocol's plain ints as locals (see dcptool.protocol.wire)
        req, rsp, snappy = w.REQ, w.RES, w.DT_SNAPPY
        op_mut, op_del, op_exp = w.OP_DCP_MUTATION, w.OP_DCP_DELETION, w.OP_DCP_EXPIRATION
        op_marker, op_noop = w.OP_DCP_SNAPSHOT_MARKER, w.OP_DCP_NOOP
        mut_ext, del1_ext, del2_ext = w.MUTATION_EXTLEN, w.DELETION_V1_EXTLEN, w.DELETION_V2_EXTLEN
        exp_ext, marker_ext = w.EXPIRATION_EXTLEN, w.MARKER_V1_EXTLEN
        mut_base = w.MUTATION_BASE
        while True:
            left = n - pos
            if left >= mut_base:
                (magic, op, klen, elen, dt, vb, blen, opq, cas,
                 seq, rev, flags, exp, lt, _nmeta, nru) = full(buf, pos)
            elif left >= 24:  # (a frame this short is no complete mutation)
                magic, op, klen, elen, dt, vb, blen, opq, cas = hdr(buf, pos)
            else:
                break
            end = pos + 24 + blen
            if end > n:
                break
            if magic == req:
                if op == op_mut and elen == mut_ext:
                    k = pos + mut_base
                    v = k + klen
                    # the backup's case first: tuples with bytes values, raw or JSON
                    # (datatype 0, 1: not SNAPPY); `op` is the event's kind, MUTATION
                    if plain and dt < 2:
                        append((op, vb, seq, rev, cas, flags, exp, dt, buf[k:v], buf[v:end]))
                    # SNAPPY: off the hot path; `dt > 1` first, as it is cheaper than the
                    # bit test and settles raw and JSON values (0, 1) alone
                    elif dt > 1 and dt & snappy:
                        self._compressed(out, MUTATION, vb, opq, cas, dt, buf[k:v], mv[v:end],
                                         seq, rev, flags, exp, lt, nru)
                    elif typed:
                        append((MUTATION, vb, DcpMutation(
                            vbucket=vb, opaque=opq, cas=cas, datatype=dt, key=buf[k:v],
                            value=buf[v:end], by_seqno=seq, rev_seqno=rev, flags=flags,
                            expiry=exp, lock_time=lt, nru=nru)))
                    elif copy:
                        append((op, vb, seq, rev, cas, flags, exp, dt, buf[k:v], buf[v:end]))
                    else:
                        append((MUTATION, vb, seq, rev, cas, flags, exp, dt, buf[k:v],
                                mv[v:end]))
                    last[vb] = seq
                    pos = end
                    continue
                if op == op_del and (elen == del2_ext or elen == del1_ext):
                    self._deletion(buf, mv, pos, end, vb, opq, cas, dt, klen, elen, out)
                    pos = end
                    continue
                if op == op_marker and elen == marker_ext:
                    s, e, f = _MARKER.unpack_from(mv, pos + 24)
                    self._marker(vb, s, e, f, opq, out, typed)
                    pos = end
                    continue
                if op == op_noop:
                    # DCP_NOOP: answer at once with the same opaque bytes; not flow controlled
                    self._out += _HEADER.pack(rsp, op_noop, 0, 0, 0, 0, 0, opq, 0)
                    self.noops_answered += 1
                    uncounted += end - pos
                    pos = end
                    continue
                if op == op_exp and elen == exp_ext:
                    self._expiration(buf, mv, pos, end, vb, opq, cas, dt, klen, out)
                    pos = end
                    continue
            # everything else: decode with the codec and handle it off the hot path
            used, counted = self._other_frame(mv, pos, out)
            if not counted:
                uncounted += used
            pos += used
        self._received(pos, pos - uncounted)
        return pos

    # the steps of `_parse` off its hot path (mutations stay inline: measured,
    # benchmarks/client_replay.py)
    def _deletion(self, buf: bytes, mv: memoryview, pos: int, end: int, vb: int, opq: int,
                  cas: int, dt: int, klen: int, elen: int, out: list) -> None:
        """A DCP_DELETION (v1 or v2 extras) as an event."""
        if elen == w.DELETION_V2_EXTLEN:
            seq, rev, dtime, _u = _DEL2.unpack_from(mv, pos + 24)
        else:
            seq, rev, _nm = _DEL1.unpack_from(mv, pos + 24)
            dtime = 0
        k = pos + 24 + elen
        v = k + klen
        if dt > 1 and dt & w.DT_SNAPPY:
            self._compressed(out, DELETION, vb, opq, cas, dt, buf[k:v], mv[v:end],
                             seq, rev, 0, dtime, v1=elen == w.DELETION_V1_EXTLEN)
        elif self.config.typed:
            out.append((DELETION, vb, DcpDeletion(
                vbucket=vb, opaque=opq, cas=cas, datatype=dt, key=buf[k:v],
                value=buf[v:end], by_seqno=seq, rev_seqno=rev,
                delete_time=dtime if elen == w.DELETION_V2_EXTLEN else None)))
        else:
            out.append((DELETION, vb, seq, rev, cas, 0, dtime, dt, buf[k:v],
                        buf[v:end] if self.config.copy_values else mv[v:end]))
        self._last[vb] = seq

    def _expiration(self, buf: bytes, mv: memoryview, pos: int, end: int, vb: int, opq: int,
                    cas: int, dt: int, klen: int, out: list) -> None:
        """A DCP_EXPIRATION as an event."""
        seq, rev, dtime = _EXP.unpack_from(mv, pos + 24)
        k = pos + w.EXPIRATION_BASE
        v = k + klen
        if dt > 1 and dt & w.DT_SNAPPY:
            self._compressed(out, EXPIRATION, vb, opq, cas, dt, buf[k:v], mv[v:end],
                             seq, rev, 0, dtime)
        elif self.config.typed:
            out.append((EXPIRATION, vb, DcpExpiration(
                vbucket=vb, opaque=opq, cas=cas, datatype=dt, key=buf[k:v],
                value=buf[v:end], by_seqno=seq, rev_seqno=rev,
                delete_time=dtime)))
        else:
            out.append((EXPIRATION, vb, seq, rev, cas, 0, dtime, dt, buf[k:v],
                        buf[v:end] if self.config.copy_values else mv[v:end]))
        self._last[vb] = seq

    def _other_frame(self, mv: memoryview, pos: int, out: list) -> tuple[int, bool]:
        """Any other frame, decoded with the codec: its size, and whether flow control
        counts it (not responses and noops)."""
        try:
            frame, used = decode_frame(mv, pos)
        except ProtocolError as exc:
            raise ProtocolViolation(f"{self.address} sent an invalid frame: {exc}",
                                    host=self.address) from None
        counted = not (frame.magic not in (Magic.REQUEST, Magic.ALT_REQUEST)
                       or frame.opcode == Opcode.DCP_NOOP)
        self._slow(frame, out)
        return used, counted

    def _received(self, size: int, counted: int) -> None:
        """`size` bytes were parsed, `counted` of them flow controlled: acknowledge them once
        past the threshold."""
        self.bytes_received += size
        if self.flow_control and counted:
            self._unacked += counted
            if self._unacked >= self._ack_threshold:
                self._out += DcpBufferAck(bytes_to_ack=self._unacked & 0xFFFFFFFF).encode()
                self._unacked = 0

    def _marker(self, vb: int, start: int, end: int, flags: int, opaque: int, out: list,
                typed: bool) -> None:
        st = self.streams.get(vb)
        if st is None or st.opaque != opaque:
            return  # a stray marker of a stream no longer ours
        if st.marker_end is not None:
            st.snapshot_done()
        st.marker_start, st.marker_end = start, end
        if flags & SnapshotFlag.ACK:
            self._out += encode_frame(Magic.RESPONSE, Opcode.DCP_SNAPSHOT_MARKER, 0, opaque)
        if typed:
            out.append((SNAPSHOT, vb, DcpSnapshotMarker(vbucket=vb, opaque=opaque, start_seqno=start,
                                                        end_seqno=end, flags=flags)))
        else:
            out.append((SNAPSHOT, vb, start, end, flags))

    # ------------------------------------------------------------------ compressed values

    def carry_counters(self, old: "DcpSession") -> None:
        """Add the compressed-value counters of `old` (a session this one replaces)."""
        for name in VALUE_COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(old, name))

    def _inflate(self, raw, vb: int, seqno: int, key: bytes) -> bytes:
        """The decompressed value of a record whose datatype has the SNAPPY bit."""
        try:
            value = decompress(raw)
        except ProtocolError as exc:
            raise ProtocolViolation(
                f"{self.address} sent vbucket {vb} seqno {seqno} (key "
                f"{bytes(key).decode('utf-8', 'replace')!r}) with a snappy-compressed value "
                f"that does not decompress: {exc.reason}", host=self.address) from None
        self.values_decompressed += 1
        self.compressed_bytes += len(raw)
        self.decompressed_bytes += len(value)
        return value

    def _compressed(self, out: list, kind: int, vb: int, opaque: int, cas: int, dt: int,
                    key: bytes, raw, seqno: int, rev: int, a: int, b: int, lock_time: int = 0,
                    nru: int = 0, v1: bool = False) -> None:
        """Append the event of a record with a snappy-compressed value: the value
        decompressed, the SNAPPY bit cleared. `a, b` are the event's flags and expiry
        (deletions and expirations: 0 and the delete time)."""
        value = self._inflate(raw, vb, seqno, key)
        dt &= ~SNAPPY
        if not self.config.typed:
            out.append((kind, vb, seqno, rev, cas, a, b, dt, key, value))
            return
        if kind == MUTATION:
            msg = DcpMutation(vbucket=vb, opaque=opaque, cas=cas, datatype=dt, key=key,
                              value=value, by_seqno=seqno, rev_seqno=rev, flags=a, expiry=b,
                              lock_time=lock_time, nru=nru)
        elif kind == DELETION:
            msg = DcpDeletion(vbucket=vb, opaque=opaque, cas=cas, datatype=dt, key=key,
                              value=value, by_seqno=seqno, rev_seqno=rev,
                              delete_time=None if v1 else b)
        else:
            msg = DcpExpiration(vbucket=vb, opaque=opaque, cas=cas, datatype=dt, key=key,
                                value=value, by_seqno=seqno, rev_seqno=rev, delete_time=b)
        out.append((kind, vb, msg))

    # ------------------------------------------------------------------ the rare cases

    def _fail(self, st: ConsumerStream | None, exc: Exception) -> None:
        if st is not None:
            st.state = FAILED
        self.errors.append(exc)

    def _slow(self, frame, out: list) -> None:
        try:
            msg = decode_message(frame)
        except ProtocolError as exc:
            raise ProtocolViolation(f"{self.address} sent a malformed "
                                    f"{opcode_name(frame.opcode)}: {exc}", host=self.address) from None
        if frame.is_request:
            self._server_request(frame, msg, out)
        else:
            self._response(frame, msg, out)

    def _server_request(self, frame, msg, out: list) -> None:
        op = frame.opcode
        vb = frame.specific
        if op == Opcode.DCP_STREAM_END:
            self._stream_end(vb, msg.reason, frame.opaque, out)
        elif op == Opcode.DCP_SNAPSHOT_MARKER:
            self._marker(vb, msg.start_seqno, msg.end_seqno, msg.flags, frame.opaque, out,
                         self.config.typed)
        elif op in (Opcode.DCP_MUTATION, Opcode.DCP_DELETION, Opcode.DCP_EXPIRATION):
            # a well-formed record that missed the fast path (e.g. flexible framing)
            kind = op
            if msg.datatype & SNAPPY:
                msg = replace(msg, value=self._inflate(msg.value, vb, msg.by_seqno, msg.key),
                              datatype=msg.datatype & ~SNAPPY)
            if self.config.typed:
                out.append((kind, vb, msg))
            else:
                third = (msg.flags, msg.expiry) if op == Opcode.DCP_MUTATION else \
                    (0, msg.delete_time or 0)
                out.append((kind, vb, msg.by_seqno, msg.rev_seqno, msg.cas, third[0], third[1],
                            msg.datatype, msg.key, msg.value))
            self._last[vb] = msg.by_seqno
        elif op == Opcode.DCP_NOOP:
            self._out += encode_frame(Magic.RESPONSE, Opcode.DCP_NOOP, 0, frame.opaque)
            self.noops_answered += 1
        elif op == Opcode.DCP_SEQNO_ADVANCED:
            st = self.streams.get(vb)
            if st is not None and st.opaque == frame.opaque:
                seqno = msg.by_seqno
                if st.marker_end is None or seqno > st.marker_end:
                    # past the snapshot the stream is in (or outside any): the advance is
                    # a snapshot of its own ending there, so a resume starts above it
                    if st.marker_end is not None and self._last[vb] >= st.marker_end:
                        st.snapshot_done()
                    st.marker_start = st.marker_end = seqno
                self._last[vb] = seqno
                out.append((SEQNO_ADVANCED, vb, seqno))
        elif op == Opcode.DCP_SYSTEM_EVENT:
            st = self.streams.get(vb)
            if st is not None and st.opaque == frame.opaque:
                try:
                    ev = SystemEvent.decode(msg.by_seqno, msg.event, msg.version, msg.key,
                                            msg.value)
                except CollectionsError as exc:
                    raise ProtocolViolation(f"{self.address} sent vbucket {vb} a system event "
                                            f"at seqno {msg.by_seqno} that does not decode: "
                                            f"{exc}", host=self.address) from None
                self._last[vb] = msg.by_seqno
                out.append((SYSTEM_EVENT, vb, ev))
        elif op == Opcode.DCP_SET_VBUCKET_STATE:
            out.append((VBUCKET_STATE, vb, msg.state, frame.opaque))
            if self.config.ack_vbucket_state:
                self.ack_vbucket_state(frame.opaque)
        # other producer messages (OSO markers, sync writes, ...) are not negotiated
        # by this session; they are counted for flow control and otherwise ignored

    def _response(self, frame, msg, out: list) -> None:
        opaque = frame.opaque
        pending = self._pending.pop(opaque, None)
        if pending is None:
            if frame.opcode == Opcode.DCP_BUFFER_ACKNOWLEDGEMENT:
                self._fail(None, RequestFailed(
                    f"{self.address} refused a buffer acknowledgement: {status_name(frame.status)}",
                    host=self.address, status=frame.status, opcode=frame.opcode))
            return  # a reply to something we did not wait for (e.g. a keep-alive NOOP)
        kind, what, required = pending
        status = frame.status
        if kind == "stream":
            self._stream_response(self._by_opaque.get(opaque), msg, out)
        elif kind == "open":
            if status == Status.EACCESS and self.username is not None:
                from .privileges import DCP_PRODUCER, privilege_error

                self._fail(None, privilege_error(self.username, DCP_PRODUCER, "stream from",
                                                 self.address, self.bucket))
            elif status != Status.SUCCESS:
                self._fail(None, RequestFailed(
                    f"{self.address} refused to open a DCP connection: {status_name(status)}",
                    host=self.address, status=status, opcode=frame.opcode))
            else:
                self.opened = True
        elif kind == "control":
            if status == Status.SUCCESS:
                if what == "enable_noop":
                    self.noop_enabled = True
                elif what == "send_stream_end_on_client_close_stream":
                    self.stream_end_on_close = True
            else:
                self.control_failures[what] = status
                if what == "connection_buffer_size":
                    self.flow_control = False
                if required:
                    self._fail(None, RequestFailed(
                        f"{self.address} refused DCP control '{what}': {status_name(status)}",
                        host=self.address, status=status, opcode=frame.opcode))
        elif kind == "close":
            st = self.streams.get(int(what))
            if st is not None and st.state == CLOSING:
                if status != Status.SUCCESS or not self.stream_end_on_close:
                    st.state = ENDED
                    st.reason = StreamEndReason.CLOSED
                    out.append((STREAM_END, st.vbucket, int(StreamEndReason.CLOSED), False))

    def _stream_response(self, st: ConsumerStream | None, msg, out: list) -> None:
        if st is None:
            return
        vb = st.vbucket
        if isinstance(msg, StreamReqOk):
            st.failover_log = tuple(msg.failover_log)
            if st.state == REQUESTED:
                st.state = OPEN
            st.rollbacks = 0
            st.tmpfails = 0
            out.append((STREAM_OPEN, vb, st.failover_log, st.base))
            return
        if isinstance(msg, StreamReqRollback):
            self._rollback(st, msg.rollback_seqno, out)
            return
        status = msg.status
        pos = st.base
        if status == Status.NOT_MY_VBUCKET:
            self._fail(st, NotMyVbucketError(
                f"{self.address} does not hold vbucket {vb} (NOT_MY_VBUCKET on stream request)",
                host=self.address, vbucket=vb, config=bytes(getattr(msg, "value", b"") or b"")))
        elif status == Status.ERANGE:
            self._fail(st, StreamError(
                f"{self.address} refused vbucket {vb} from seqno {pos.seqno} (snapshot "
                f"[{pos.snap_start}, {pos.snap_end}], end {st.end_seqno}): seqno range not valid",
                host=self.address, vbucket=vb, seqno=pos.seqno, status=status))
        elif status in TEMPORARY and st.tmpfails < self.config.max_temporary_failures:
            st.tmpfails += 1
            st.state = WAITING
            st.reason = status
        elif status == Status.KEY_EEXISTS:
            self._fail(st, StreamError(
                f"{self.address} already has a stream for vbucket {vb} on this connection",
                host=self.address, vbucket=vb, status=status))
        else:
            self._fail(st, StreamError(
                f"stream request for vbucket {vb} from seqno {pos.seqno} on {self.address} "
                f"failed: {status_name(status)}", host=self.address, vbucket=vb, seqno=pos.seqno,
                status=status))

    def _rollback(self, st: ConsumerStream, rollback_seqno: int, out: list) -> None:
        vb = st.vbucket
        before = st.base
        after = before.rolled_back(rollback_seqno)
        st.rollbacks += 1
        if before.seqno > 0 and (after.seqno >= before.seqno or st.rollbacks > self.config.max_rollbacks):
            # the node keeps asking: fall back to the always-correct rollback to zero
            after = before.moved_to(0)
        elif before.seqno == 0 and st.rollbacks > 1:
            self._fail(st, StreamError(
                f"{self.address} asked vbucket {vb} to roll back to {rollback_seqno} "
                f"although the stream starts at 0", host=self.address, vbucket=vb,
                seqno=rollback_seqno, status=Status.ROLLBACK))
            return
        info = RollbackInfo(vb, rollback_seqno, before, after)
        if self.config.fail_on_rollback:
            self._fail(st, RollbackError(
                f"{self.address} asked vbucket {vb} to roll back from seqno {before.seqno} "
                f"(uuid {before.uuid}) to {rollback_seqno}", host=self.address, vbucket=vb,
                seqno=rollback_seqno, status=Status.ROLLBACK))
            return
        if self.on_rollback is not None:
            chosen = self.on_rollback(info)
            if chosen is not None:
                if chosen.seqno > rollback_seqno:
                    self._fail(st, StreamError(
                        f"rollback of vbucket {vb}: the position chosen ({chosen.seqno}) is above "
                        f"the node's rollback seqno {rollback_seqno}", host=self.address,
                        vbucket=vb, seqno=rollback_seqno))
                    return
                info = replace(info, after=chosen)
        out.append((ROLLBACK, vb, rollback_seqno, info))
        st.reset(info.after)
        self._request(st)

    def _stream_end(self, vb: int, reason: int, opaque: int, out: list) -> None:
        st = self.streams.get(vb)
        if st is None or st.opaque != opaque or st.finished:
            return
        if reason == StreamEndReason.OK or (st.marker_end is not None
                                            and self._last[vb] >= st.marker_end):
            st.snapshot_done()
        st.reason = reason
        if reason == StreamEndReason.LOST_PRIVILEGES and self.username is not None:
            # the user's roles changed: every stream of the connection ends the same way,
            # and the run with one error
            from .privileges import DCP_PRODUCER, privilege_error

            st.state = ENDED
            if not any(getattr(e, "privilege", None) == DCP_PRODUCER for e in self.errors):
                self._fail(st, privilege_error(self.username, DCP_PRODUCER, "stream from",
                                               self.address, self.bucket, lost=True))
            return
        if reason in RETRY_REASONS and st.state != CLOSING:
            out.append((STREAM_END, vb, int(reason), True))
            st.reset(self.position(vb, consistent=False))
            self._request(st)
            return
        st.state = ENDED
        out.append((STREAM_END, vb, int(reason), False))


def _prefix_default(out: list, first: int, typed: bool) -> None:
    """Give the keys of the records in `out[first:]` the default collection's prefix (0x00):
    the events of a connection whose node refused Collections, for a caller that asked for
    doc keys."""
    kinds = RECORD_KINDS
    for i in range(first, len(out)):
        ev = out[i]
        if ev[0] in kinds:
            if typed:
                msg = ev[2]
                out[i] = (ev[0], ev[1], replace(msg, key=b"\x00" + bytes(msg.key)))
            else:
                out[i] = ev[:8] + (b"\x00" + ev[8], ev[9])


__all__ = ["DcpSession", "SessionConfig", "ConsumerStream", "RETRY_REASONS", "VALUE_COUNTERS"]
