"""A test-side DCP consumer on top of `mcbputil.Client`: open, control, stream, collect."""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

from dcptool.protocol import decode_message
from dcptool.protocol.constants import SEQNO_MAX, Opcode, Status
from dcptool.protocol.frame import Frame
from dcptool.protocol.messages import (
    DcpControl,
    DcpDeletion,
    DcpExpiration,
    DcpMutation,
    DcpOpen,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpStreamReq,
)

from .mcbputil import Client, connect

U64 = struct.Struct(">Q")


@dataclass
class StreamLog:
    """Everything one stream delivered."""

    vb: int
    markers: list = field(default_factory=list)   # DcpSnapshotMarker
    items: list = field(default_factory=list)     # DcpMutation / DcpDeletion / DcpExpiration
    order: list = field(default_factory=list)     # ("marker"|"item", message) in arrival order
    end: int | None = None

    def seqnos(self) -> list[int]:
        return [i.by_seqno for i in self.items]

    def check_consistent(self) -> None:
        """Seqnos strictly increase and every item lies inside the marker before it."""
        last = -1
        current = None
        for kind, m in self.order:
            if kind == "marker":
                assert current is None or m.start_seqno >= 0
                current = m
            else:
                assert current is not None, "an item before any snapshot marker"
                assert m.by_seqno > last, f"vb {self.vb}: seqno {m.by_seqno} after {last}"
                assert current.start_seqno <= m.by_seqno <= current.end_seqno, (
                    f"vb {self.vb}: seqno {m.by_seqno} outside marker "
                    f"{current.start_seqno}..{current.end_seqno}")
                last = m.by_seqno


class DcpClient(Client):
    """A DCP consumer connection. Counts the flow-control bytes of everything received."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.received_bytes = 0   # flow-control bytes received (all producer requests but NOOP)
        self.acked = 0
        self.max_unacked = 0
        self.noops = 0
        self.answer_noops = True
        self.logs: dict[tuple[int, int], StreamLog] = {}  # (vb, opaque) -> log

    def open(self, name: str = "dcptool-test", flags: int = 0x1) -> Frame:
        return self.call_msg(DcpOpen(name=name, flags=flags, opaque=self.next_opaque()))

    def control(self, key: str, value: str | bytes) -> Frame:
        if isinstance(value, str):
            value = value.encode()
        return self.call_msg(DcpControl(key=key, value=value, opaque=self.next_opaque()))

    def stream_req(self, vb: int, *, start: int = 0, end: int = SEQNO_MAX, uuid: int = 0,
                   snap_start: int | None = None, snap_end: int | None = None, flags: int = 0,
                   opaque: int | None = None) -> Frame:
        if opaque is None:
            opaque = 0x100000 + vb
        msg = DcpStreamReq(vbucket=vb, opaque=opaque, flags=flags, start_seqno=start,
                           end_seqno=end, vbucket_uuid=uuid,
                           snap_start_seqno=start if snap_start is None else snap_start,
                           snap_end_seqno=start if snap_end is None else snap_end)
        f = self.call_msg(msg)
        if f.status == Status.SUCCESS:
            self.logs[(vb, opaque)] = StreamLog(vb)
        return f

    def get_failover_log(self, vb: int) -> tuple:
        return failover_log(self.call(Opcode.DCP_GET_FAILOVER_LOG, vbucket=vb))

    def ack(self, n: int) -> None:
        self.request(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, extras=struct.pack(">I", n))
        self.acked += n

    def next_message(self, timeout: float | None = None):
        """The next producer message (NOOPs are answered and skipped), decoded."""
        while True:
            f = self.recv(timeout)
            if f.magic in (0x80, 0x08) and f.opcode == Opcode.DCP_NOOP:
                self.noops += 1
                if self.answer_noops:
                    self.send(bytes([0x81, 0x5C]) + b"\x00" * 10 + struct.pack(">I", f.opaque)
                              + b"\x00" * 8)
                continue
            if f.magic in (0x80, 0x08):
                self.received_bytes += f.size
                unacked = self.received_bytes - self.acked
                self.max_unacked = max(self.max_unacked, unacked)
            msg = decode_message(f)
            self._log(msg)
            return msg

    def _log(self, msg) -> None:
        if isinstance(msg, (DcpSnapshotMarker, DcpMutation, DcpDeletion, DcpExpiration,
                            DcpStreamEnd)):
            log = self.logs.setdefault((msg.vbucket, msg.opaque), StreamLog(msg.vbucket))
            if isinstance(msg, DcpSnapshotMarker):
                log.markers.append(msg)
                log.order.append(("marker", msg))
            elif isinstance(msg, DcpStreamEnd):
                log.end = msg.reason
            else:
                log.items.append(msg)
                log.order.append(("item", msg))

    def drain(self, *, streams: int = 1, timeout: float = 30.0, ack_every: int = 0) -> None:
        """Read until `streams` STREAM_ENDs arrived (acking every `ack_every` bytes if set)."""
        deadline = time.monotonic() + timeout
        ended = sum(1 for lg in self.logs.values() if lg.end is not None)
        while ended < streams:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"only {ended} of {streams} streams ended")
            if ack_every and self.received_bytes - self.acked >= ack_every:
                self.ack(self.received_bytes - self.acked)
            msg = self.next_message(timeout=left)
            if isinstance(msg, DcpStreamEnd):
                ended += 1

    def read_n(self, n: int, timeout: float = 10.0) -> list:
        return [self.next_message(timeout) for _ in range(n)]

    def log(self, vb: int, opaque: int | None = None) -> StreamLog:
        return self.logs[(vb, 0x100000 + vb if opaque is None else opaque)]


def dcp_connect(node, name: str = "dcptool-test", flags: int = 0x1, **kw) -> DcpClient:
    c = DcpClient(node.host, node.port, vbuckets=node.vbuckets, **kw)
    c.setup()
    f = c.open(name, flags)
    assert f.status == Status.SUCCESS, f
    return c


def rollback_seqno(frame: Frame) -> int:
    assert frame.status == Status.ROLLBACK, frame
    return U64.unpack(frame.value)[0]


def failover_log(frame: Frame) -> tuple:
    """The failover log of a STREAM_REQ success or a (DCP_)GET_FAILOVER_LOG answer."""
    msg = decode_message(frame)
    return getattr(msg, "failover_log", None) or msg.entries


def vb_uuid(client: Client, vb: int) -> int:
    return decode_message(client.call(Opcode.GET_FAILOVER_LOG, vbucket=vb)).entries[0][0]


def high_seqno(client: Client, vb: int) -> int:
    return int(client.stats(f"vbucket-seqno {vb}")[f"vb_{vb}:high_seqno"])


__all__ = ["DcpClient", "dcp_connect", "rollback_seqno", "failover_log", "vb_uuid", "high_seqno",
           "connect", "StreamLog"]
