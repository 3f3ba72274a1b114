"""One client connection: buffered frame reading, dispatch, batched replies.

A `Connection` is an `asyncio.BufferedProtocol`: the loop reads straight into our buffer,
a `FrameDecoder` cuts it into frames, and each frame goes to the command registered for
its opcode (`dcptool.node.commands`). Replies produced while handling one read are
joined and written once. A frame whose sections do not fit gets EINVAL; a frame whose
body is above `--max-body` gets E2BIG and its body is dropped as it arrives (never
buffered); when the byte stream can no longer be framed (unknown magic) the connection is
closed. Nothing a client sends can stop the node: a failing command answers EINTERNAL.

Limits on what one client can make the node hold:

* input: the loop reads every connection into one shared buffer (`READ_BUFFER`), which
  `buffer_updated` empties at once, so an idle connection holds no read buffer at all;
  before login a read takes at most `PRE_AUTH_READ` bytes and a frame may be at most
  `PRE_AUTH_FRAME` bytes (a larger one is answered E2BIG and the connection closed at its
  header, before its body is read); after login a connection holds at most one read plus
  one frame of at most `--max-body` bytes;
* output: the transport pauses the DCP producer at half of `--max-pending-output`; when a
  connection's unsent replies reach the whole of it (a client that pipelines requests
  without reading the answers) the node stops reading that connection until they drain,
  and closes it when they make no progress for `--stuck-timeout`;
* all connections: a frame of `LARGE_FRAME` or more that has not arrived whole holds its
  size of `--max-input-memory`; a connection whose frame does not fit stops reading
  until other frames complete (`Node.input_changed`);
* time: a connection that has not authenticated within `--auth-timeout` is closed;
* slots: unauthenticated connections are bounded in number, per client address too
  (`Node.connection_opened`).
"""
from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import socket
import struct
import termios
import time
from typing import TYPE_CHECKING, Any, Protocol

from dcptool.protocol import FrameDecoder, ProtocolError, decode_message
from dcptool.protocol import wire as w
from dcptool.protocol.constants import (
    DEFAULT_MAX_BODY,
    RESPONSE_MAGICS,
    Magic,
    Status,
)
from dcptool.protocol.frame import Frame

from .commands import COMMANDS
from .ingest import FAST_OPCODES, take_writes

if TYPE_CHECKING:
    from .bucket import Bucket
    from .producer import Producer

log = logging.getLogger("dcptool.node.connection")

_RSP_PACK = w.HEADER.pack
_RES = w.RES

#: statuses a client without XERROR never sees: the connection is closed instead
_DISCONNECT_WITHOUT_XERROR = frozenset({
    Status.EACCESS, Status.NO_BUCKET, Status.AUTH_STALE, Status.DCP_STREAM_ID_INVALID,
    Status.UNKNOWN_FRAME_INFO, Status.NOT_INITIALIZED,
})
#: statuses mapped to older ones for a client without XERROR
_REMAP_WITHOUT_XERROR = {
    Status.LOCKED: Status.KEY_EEXISTS,
    Status.CAS_VALUE_INVALID: Status.KEY_EEXISTS,
    Status.NOT_LOCKED: Status.ETMPFAIL,
    Status.UNKNOWN_COLLECTION: Status.EINVAL,
    Status.UNKNOWN_SCOPE: Status.EINVAL,
}

READ_BUFFER = 256 * 1024
#: before login: the most one read takes, and the largest frame (header included) a
#: connection may send; kv_engine closes an unauthenticated connection whose frame is
#: above 16 KiB too (its `MaxUnauthenticatedFrameSize`)
PRE_AUTH_READ = 16 * 1024
PRE_AUTH_FRAME = 16 * 1024
#: before login: unsent replies at which reading stops, and the queued replies written
#: out (and checked against it) within one read
PRE_AUTH_PENDING = 64 * 1024
PRE_AUTH_FLUSH = 16 * 1024
#: a frame at least this large that has not arrived whole holds its size of the node's
#: input budget (--max-input-memory) until it has; a connection that finds the budget
#: spent stops reading until other frames complete
LARGE_FRAME = 64 * 1024
_BODY_LENGTH = struct.Struct(">I").unpack_from
#: the one read buffer of every connection of this process: the event loop reads into
#: it and `buffer_updated` copies what arrived into the connection's decoder before it
#: returns, so no two connections ever use it at once
_READ = bytearray(READ_BUFFER)
_READ_VIEW = memoryview(_READ)
_PRE_AUTH_VIEW = _READ_VIEW[:PRE_AUTH_READ]
WRITE_HIGH_WATER = 4 * 1024 * 1024
#: queued replies are written out once they pass this many bytes within one read
FLUSH_BYTES = 256 * 1024


class ConnectionHost(Protocol):
    """What a connection needs of the node that accepted it (`server.Node`): its
    configuration and buckets (`bucket`: the first), the admission and throttling it
    decides for every connection, and the counters a connection adds to. The command handlers reach the
    rest of the node's state through `Connection.node` too."""

    config: Any
    bucket: Any
    buckets: Any
    throttled: Any
    pre_auth_too_big: int
    frames_too_big: int
    framing_lost: int
    bad_frames: int
    output_holds: int
    stuck_closed: int
    auth_timeouts: int

    def connection_opened(self, conn: "Connection") -> bool | None: ...

    def connection_closed(self, conn: "Connection") -> None: ...

    def throttle(self, conn: "Connection") -> None: ...


class Connection(asyncio.BufferedProtocol):
    """Per-connection state.

    * `authenticated`/`user`: set by a successful SASL exchange.
    * `bucket`: the selected bucket (None until SELECT_BUCKET, or auto-selected when the
      user has the bucket's name).
    * `features`: HELLO features in force; `xerror`, `json`, `xattr`, `snappy`,
      `mutation_seqno` are shortcuts read on hot paths.
    * `sasl`: the SASL exchange in progress.
    * `producer`: the DCP producer once DCP_OPEN succeeded.
    """

    def __init__(self, node: ConnectionHost) -> None:
        self.node = node
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        #: the client's address without the port (the per-address bounds)
        self.peer_host = "?"
        config = getattr(node, "config", None)
        #: the largest body once logged in; until then PRE_AUTH_FRAME bounds the frame
        self.max_body = getattr(config, "max_body", DEFAULT_MAX_BODY)
        self.decoder = FrameDecoder(max_body=PRE_AUTH_FRAME - 24)
        #: unsent replies at which reading stops (the transport's high water is half)
        self.max_pending_logged_in = getattr(config, "max_pending_output", 2 * WRITE_HIGH_WATER)
        self.max_pending = min(PRE_AUTH_PENDING, self.max_pending_logged_in)
        self.flush_bytes = PRE_AUTH_FLUSH
        self._view = _PRE_AUTH_VIEW
        self._discard = 0
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.closing = False
        self.authenticated = False
        self.user: str | None = None
        self.bucket: "Bucket | None" = None
        self.agent = ""
        self.features: frozenset[int] = frozenset()
        self.xerror = False
        self.json = False
        self.xattr = False
        self.snappy = False
        self.mutation_seqno = False
        #: HELLO Collections (0x12) acknowledged: every key on this connection starts with
        #: its collection id (LEB128); otherwise only the default collection is reachable
        self.collections = False
        self.sasl: Any = None
        self.producer: "Producer | None" = None
        self.dcp_opened = False
        self.write_paused = False
        self.frames_in = 0
        #: this read stored something (set by the KV/meta handlers; checked for throttling)
        self.wrote = False
        self.read_paused = False
        #: reading stopped because the client does not read its replies
        self.input_held = False
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._stuck_since = 0.0
        self._stuck_size = 0
        #: bytes of the node's input budget this connection's incomplete frame holds, and
        #: whether it stopped reading until the budget has room for that frame
        self.reserved = 0
        self.waiting_memory = False
        #: a login attempt waits (LoginGuard): nothing more is read or handled until then
        self.deferred = False
        #: the socket's descriptor (`bytes_waiting`)
        self._fd = -1

    # -- asyncio callbacks ---------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self._fd = sock.fileno() if sock is not None else -1
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
            self.peer_host = str(peer[0])
        transport.set_write_buffer_limits(high=max(1, self.max_pending // 2))
        if self.node.connection_opened(self) is False:
            return
        timeout = getattr(self.node.config, "auth_timeout", None)
        if timeout is not None:
            self._timers["auth"] = asyncio.get_running_loop().call_later(
                timeout, self._auth_expired)

    def connection_lost(self, exc) -> None:
        self.closing = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self.producer is not None:
            try:
                self.producer.close()
            except Exception:  # pragma: no cover - never let teardown fail
                log.exception("closing DCP producer")
            self.producer = None
        self.node.connection_closed(self)
        self.transport = None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.input_held:
            self._release_input()
        if self.producer is not None:
            self.producer.schedule()

    def get_buffer(self, sizehint: int):
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        if self.producer is not None:
            self.producer.last_recv = time.monotonic()
        data = self._view[:nbytes]  # the shared buffer: copied into the decoder below
        if self._discard:
            n = min(self._discard, nbytes)
            self._discard -= n
            data = data[n:]
            if not len(data):
                return
        self.decoder.feed(data)
        # held or deferred: a TLS transport may still hand over one record
        if not self.input_held and not self.deferred:
            self._process()

    def eof_received(self):
        return False

    # -- framing -------------------------------------------------------------------------

    def _process(self) -> None:
        decoder = self.decoder
        buf = decoder._buf  # the decoder's buffer: plain writes are taken from it directly
        flush_bytes = self.flush_bytes
        try:
            while not self.closing and not self.deferred:
                if len(buf) >= 24 and buf[0] == 0x80 and buf[1] in FAST_OPCODES:
                    used = take_writes(self, buf, decoder.max_body)
                    if used:
                        decoder.skip(used)
                        if self.out_bytes >= flush_bytes:
                            self.flush()
                            if self._output_full():
                                break
                        continue
                try:
                    frame = decoder.next_frame()
                except ProtocolError as exc:
                    if not self._bad_frame(exc):
                        return
                    continue
                if frame is None:
                    break
                self.frames_in += 1
                self.dispatch(frame)
                if self.out_bytes >= flush_bytes:
                    self.flush()
                    if self._output_full():
                        break
        finally:
            self.flush()
            if not self.closing and self._output_full():
                self._hold_input()
            if len(buf) >= 24 or self.reserved:
                self._account_partial(buf)
            if self.wrote:
                self.wrote = False
                mem = (self.bucket or self.node.bucket).memory
                if mem.used > mem.budget:
                    self.node.throttle(self)

    def _account_partial(self, buf) -> None:
        """Hold (or give back) the node's input budget for a large frame not yet whole."""
        need = 0
        if len(buf) >= 24 and not self.closing:
            size = 24 + _BODY_LENGTH(buf, 8)[0]
            if size >= LARGE_FRAME and size > len(buf):
                need = size
        if need != self.reserved:
            changed = getattr(self.node, "input_changed", None)
            if changed is not None:
                changed(self, need)

    def wait_memory(self) -> None:
        self.waiting_memory = True
        self.pause_reading()

    def memory_granted(self) -> None:
        self.waiting_memory = False
        if self not in getattr(self.node, "throttled", ()):
            self.resume_reading()

    def _bad_frame(self, exc: ProtocolError) -> bool:
        """Answer or drop a malformed frame; False when the connection had to be closed."""
        too_big = exc.framing_lost and exc.field == "body_length" and exc.frame_size is not None
        if too_big and not self.authenticated:
            # before login only small frames: refused at the header, the body never read
            self.node.pre_auth_too_big += 1
            log.debug("%s: closing, a %d-byte frame before login", self.peer, exc.frame_size)
            self._send_header(exc.opcode or 0, Status.E2BIG, exc.opaque or 0)
            self.close()
            return False
        if too_big:
            self.node.frames_too_big += 1
        elif exc.framing_lost or exc.frame_size is None:
            # debug only: a client sending garbage must not be able to flood the log
            self.node.framing_lost += 1
            log.debug("%s: closing, framing lost: %s", self.peer, exc)
            self.close()
            return False
        else:
            self.node.bad_frames += 1
        size = exc.frame_size
        have = self.decoder.buffered
        if size <= have:
            self.decoder.skip(size)
        else:
            self.decoder.skip(have)
            self._discard = size - have
        opcode = exc.opcode if exc.opcode is not None else 0
        self._send_header(opcode, Status.E2BIG if too_big else Status.EINVAL, exc.opaque or 0)
        return True

    # -- limits ----------------------------------------------------------------------------

    def _output_full(self) -> bool:
        t = self.transport
        return t is not None and t.get_write_buffer_size() >= self.max_pending

    def _hold_input(self) -> None:
        """Stop reading a client that does not read its replies (until they drain)."""
        if self.input_held:
            return
        self.input_held = True
        self.node.output_holds += 1
        self.pause_reading()
        timeout = getattr(self.node.config, "stuck_timeout", None)
        if timeout is not None:
            self._stuck_since = time.monotonic()
            self._stuck_size = self.transport.get_write_buffer_size() if self.transport else 0
            self._arm_stuck_check(timeout)

    def _arm_stuck_check(self, timeout: float) -> None:
        self._timers["stuck"] = asyncio.get_running_loop().call_later(
            min(1.0, timeout / 4), self._stuck_check, timeout)

    def _stuck_check(self, timeout: float) -> None:
        self._timers.pop("stuck", None)
        t = self.transport
        if not self.input_held or t is None or self.closing:
            return
        size = t.get_write_buffer_size()
        now = time.monotonic()
        if size < self._stuck_size:  # the client read something: not stuck
            self._stuck_since = now
        self._stuck_size = size
        if now - self._stuck_since >= timeout:
            self.node.stuck_closed += 1
            log.info("%s: closing, %d bytes of replies unread for %.1fs", self.peer, size,
                     now - self._stuck_since)
            self.abort()
            return
        self._arm_stuck_check(timeout)

    def _release_input(self) -> None:
        self.input_held = False
        timer = self._timers.pop("stuck", None)
        if timer is not None:
            timer.cancel()
        if self not in self.node.throttled:
            self.resume_reading()
        if self.decoder.buffered and not self.closing:
            self._process()

    def bytes_waiting(self) -> int:
        """Bytes the client sent that the node has not read yet (FIONREAD; 0 when unknown)."""
        if self._fd < 0 or self.closing:
            return 0
        n = array.array("i", [0])
        try:
            fcntl.ioctl(self._fd, termios.FIONREAD, n, True)
        except OSError:
            return 0
        return n[0]

    def logged_in(self, username: str) -> None:
        """A SASL exchange succeeded: full-size reads and frames from now on."""
        first = not self.authenticated
        self.authenticated = True
        self.user = username
        if first:
            self.decoder.max_body = self.max_body
            self._view = _READ_VIEW
            self.max_pending = self.max_pending_logged_in
            self.flush_bytes = FLUSH_BYTES
            if self.transport is not None:
                self.transport.set_write_buffer_limits(high=max(1, self.max_pending // 2))
            timer = self._timers.pop("auth", None)
            if timer is not None:
                timer.cancel()
            authenticated = getattr(self.node, "connection_authenticated", None)
            if authenticated is not None:
                authenticated(self)

    def defer(self, delay: float, fn) -> None:
        """Handle nothing more of this connection for `delay` seconds, then call `fn`
        (the frame that had to wait) and go on with what the client sent meanwhile."""
        self.deferred = True
        self.pause_reading()
        self._timers["defer"] = asyncio.get_running_loop().call_later(
            delay, self._run_deferred, fn)

    def _run_deferred(self, fn) -> None:
        self._timers.pop("defer", None)
        self.deferred = False
        if self.closing:
            return
        try:
            fn()
        except Exception:  # pragma: no cover - a command never fails the connection
            log.exception("%s: deferred command failed", self.peer)
        self.flush()
        if self.deferred or self.closing:
            return
        if self not in getattr(self.node, "throttled", ()):
            self.resume_reading()
        if self.decoder.buffered and not self.input_held:
            self._process()

    def _auth_expired(self) -> None:
        self._timers.pop("auth", None)
        if self.authenticated or self.closing:
            return
        self.node.auth_timeouts += 1
        log.debug("%s: closing, not authenticated in time", self.peer)
        self.flush()
        self.close()

    # -- dispatch ------------------------------------------------------------------------

    def dispatch(self, frame: Frame) -> None:
        if frame.magic in RESPONSE_MAGICS:
            if self.producer is not None:
                self.producer.handle_response(frame)
            return
        if frame.magic == Magic.SERVER_REQUEST:
            self.reply(frame, Status.EINVAL)
            return
        cmd = COMMANDS.get(frame.opcode)
        if cmd is None:
            self.reply(frame, Status.UNKNOWN_COMMAND)
            return
        if not self.authenticated and not cmd.pre_auth:
            self.error(frame, Status.EACCESS)
            return
        if cmd.needs_bucket and self.bucket is None:
            self.error(frame, Status.NO_BUCKET)
            return
        if cmd.dcp and not self.dcp_opened:
            self.reply(frame, Status.EINVAL)
            return
        try:
            if cmd.decode:
                try:
                    msg = decode_message(frame)
                except ProtocolError as exc:
                    log.debug("%s: EINVAL for opcode 0x%02x: %s", self.peer, frame.opcode, exc)
                    self.reply(frame, Status.EINVAL)
                    return
                cmd.fn(self, frame, msg)
            else:
                cmd.fn(self, frame)
        except ProtocolError as exc:
            self.reply(frame, Status.EINVAL)
            log.debug("%s: EINVAL: %s", self.peer, exc)
        except Exception:
            log.exception("%s: command 0x%02x failed", self.peer, frame.opcode)
            self.reply(frame, Status.EINTERNAL)

    # -- replies -------------------------------------------------------------------------

    def reply(self, frame: Frame, status: int = Status.SUCCESS, *, extras: bytes = b"",
              key: bytes = b"", value: bytes = b"", cas: int = 0, datatype: int = 0) -> None:
        """Queue the response to `frame` (same opcode and opaque)."""
        klen = len(key)
        elen = len(extras)
        blen = elen + klen + len(value)
        self.out_bytes += 24 + blen
        self.out.append(_RSP_PACK(_RES, frame.opcode, klen, elen, datatype, status,
                                  blen, frame.opaque, cas))
        if elen:
            self.out.append(extras)
        if klen:
            self.out.append(key)
        if value:
            self.out.append(value)

    def _send_header(self, opcode: int, status: int, opaque: int) -> None:
        self.out.append(_RSP_PACK(_RES, opcode, 0, 0, 0, status, 0, opaque, 0))

    def error(self, frame: Frame, status: int, value: bytes = b"", datatype: int = 0) -> None:
        """An error reply, following what a client without XERROR expects (section 2.1)."""
        if not self.xerror:
            if status in _DISCONNECT_WITHOUT_XERROR:
                self.flush()
                self.close()
                return
            status = _REMAP_WITHOUT_XERROR.get(status, status)
        self.reply(frame, status, value=value, datatype=datatype)

    def write(self, data: bytes) -> None:
        """Write at once (DCP producer output), after anything queued by `reply`."""
        if self.out:
            self.flush()
        t = self.transport
        if t is not None and not self.closing:
            t.write(data)

    def flush(self) -> None:
        out = self.out
        if not out:
            return
        self.out = []
        self.out_bytes = 0
        t = self.transport
        if t is None or t.is_closing():
            return
        t.write(out[0] if len(out) == 1 else b"".join(out))

    def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        t = self.transport
        if t is not None:
            self.flush_pending_then_close(t)

    def flush_pending_then_close(self, t) -> None:
        out = self.out
        self.out = []
        if out and not t.is_closing():
            t.write(b"".join(out))
        t.close()

    def pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closing:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.input_held and not self.waiting_memory:
            self.read_paused = False
            if self.transport is not None and not self.closing:
                self.transport.resume_reading()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()
