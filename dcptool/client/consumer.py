"""The blocking driver of a DCP session: one connection, one receive buffer, one loop.

    with DcpConsumer.open(host, port, username=u, password=pw, bucket="default",
                          config=SessionConfig(name="backup:task-3")) as c:
        for vb, (pos, end) in plan.items():
            c.add_stream(vb, pos, end_seqno=end)
        for events in c.batches():
            for ev in events:
                ...                       # ev[0] is the kind, see dcptool.client.events
        final = c.positions()

`batches()` yields a list of events per read from the socket (an empty list after
`tick` seconds without data, so callers can check clocks and signals) and stops when
every stream has ended. Errors a stream ran into (NOT_MY_VBUCKET, a refused request,
a rollback under `fail_on_rollback`) are raised after the events before them were
handed out; the session stays usable for the other streams.
"""
from __future__ import annotations

import socket
import ssl
import time
from typing import Callable, Iterable, Iterator

from dcptool.protocol.constants import HEADER_LEN, SEQNO_MAX, Feature
from dcptool.protocol.collections import StreamFilter
from dcptool.protocol.frame import HEADER

from .connection import DEFAULT_FEATURES, DEFAULT_PORT, Connection
from .errors import ClientError, ClientTimeout, ConnectionClosed
from .position import ZERO, Position
from .session import DcpSession, RollbackCallback, SessionConfig

DEFAULT_RECV_BUFFER = 1024 * 1024


def collections_features(features: Iterable[int]) -> tuple[int, ...]:
    """`features` with HELLO Collections (0x12) added (once)."""
    out = tuple(features)
    return out if Feature.COLLECTIONS in out else out + (Feature.COLLECTIONS,)
#: seconds before asking again for streams the node answered TMPFAIL/ENOMEM/EBUSY
RETRY_DELAY = 0.5


class DcpConsumer:
    """A DcpSession driven over a blocking Connection."""

    def __init__(self, conn: Connection, config: SessionConfig | None = None, *,
                 on_rollback: RollbackCallback | None = None,
                 recv_buffer: int = DEFAULT_RECV_BUFFER, session: DcpSession | None = None) -> None:
        self.conn = conn
        # a connection that negotiated Snappy may get compressed values (the session
        # decompresses them) and may ask for every value compressed
        snappy = Feature.SNAPPY in getattr(conn, "features", ())
        # keys are doc keys when the node accepted Collections (HELLO 0x12)
        collections = Feature.COLLECTIONS in getattr(conn, "features", ())
        self.session = session or DcpSession(config, on_rollback=on_rollback, address=conn.address,
                                             snappy=snappy, collections=collections,
                                             username=getattr(conn, "username", None),
                                             bucket=getattr(conn, "bucket", None))
        self.config = self.session.config
        self._buf = bytearray(max(recv_buffer, 64 * 1024))
        self._mv = memoryview(self._buf)
        leftover = conn.take_buffered()
        self._have = len(leftover)
        self._mv[:self._have] = leftover
        self._early: list = []
        self._retry_at: float | None = None
        self._last_rx = time.monotonic()
        self.dead_timeout = self.config.effective_dead_timeout

    @classmethod
    def open(cls, host: str, port: int = DEFAULT_PORT, *, username: str, password: str | None,
             bucket: str = "default", tls: ssl.SSLContext | None = None, timeout: float = 10.0,
             config: SessionConfig | None = None, on_rollback: RollbackCallback | None = None,
             features: Iterable[int] = DEFAULT_FEATURES, agent: str | None = None,
             recv_buffer: int = DEFAULT_RECV_BUFFER) -> "DcpConsumer":
        """Connect and start a session. A config with `collections` adds HELLO Collections
        to `features`."""
        if config is not None and config.collections:
            features = collections_features(features)
        conn = Connection.open(host, port, username=username, password=password, bucket=bucket,
                               tls=tls, timeout=timeout, features=features, agent=agent)
        try:
            try:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            except OSError:
                pass
            consumer = cls(conn, config, on_rollback=on_rollback, recv_buffer=recv_buffer)
            consumer.start()
        except BaseException:
            conn.close()
            raise
        return consumer

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        self.session.start()
        self.flush()

    def add_stream(self, vbucket: int, position: Position = ZERO, *, end_seqno: int = SEQNO_MAX,
                   flags: int = 0, filter: StreamFilter | None = None) -> None:
        self.session.add_stream(vbucket, position, end_seqno=end_seqno, flags=flags,
                                filter=filter)
        self.flush()

    def add_streams(self, plan: dict[int, Position | tuple[Position, int]], *,
                    filter: StreamFilter | None = None) -> None:
        """Request many vbuckets at once: {vb: position} or {vb: (position, end_seqno)};
        `filter` (collections) for each, default the config's."""
        for vb, item in plan.items():
            if isinstance(item, tuple):
                pos, end = item
            else:
                pos, end = item, SEQNO_MAX
            self.session.add_stream(vb, pos, end_seqno=end, filter=filter)
        self.flush()

    def close_stream(self, vbucket: int) -> None:
        self.session.close_stream(vbucket)
        self.flush()

    def flush(self) -> None:
        data = self.session.data_to_send()
        if data:
            self.conn.sock.settimeout(self.conn.timeout)
            self.conn.send_bytes(data)

    def position(self, vbucket: int, consistent: bool | None = None) -> Position:
        return self.session.position(vbucket, consistent)

    def positions(self, consistent: bool | None = None) -> dict[int, Position]:
        return self.session.positions(consistent)

    @property
    def done(self) -> bool:
        return self.session.done

    def raise_errors(self) -> None:
        exc = self.session.take_error()
        if exc is not None:
            raise exc

    # ------------------------------------------------------------------ the loop

    def poll(self, timeout: float | None = 1.0) -> list:
        """Send what is pending, read once (waiting at most `timeout` s), return the events.

        Raises a stream's error (after an earlier poll returned the events before it),
        ClientTimeout when the connection is presumed dead, ConnectionClosed.
        """
        self.raise_errors()
        if self._retry_at is not None and time.monotonic() >= self._retry_at:
            self._retry_at = None
            self.session.retry_waiting()
        self.flush()
        if self.conn.has_buffered:
            self._take_from_connection()
            if self._early:
                early, self._early = self._early, []
                return early
        mv = self._mv
        have = self._have
        cap = len(mv)
        if have >= HEADER_LEN:
            need = HEADER_LEN + HEADER.unpack_from(mv, 0)[6]
            if need > cap:
                self._grow(need)
                mv = self._mv
                cap = len(mv)
        dead = self.dead_timeout
        if dead is not None and (timeout is None or timeout > dead):
            timeout = dead  # wake up in time to notice a dead connection
        if self._retry_at is not None:
            left = max(0.0, self._retry_at - time.monotonic())
            if timeout is None or timeout > left:
                timeout = left or 0.001
        sock = self.conn.sock
        sock.settimeout(timeout)
        try:
            n = sock.recv_into(mv[have:])
        except (socket.timeout, TimeoutError, ssl.SSLWantReadError):
            self._check_dead()
            return []
        except OSError as exc:
            raise ConnectionClosed(f"connection to {self.conn.address} broke: {exc.strerror or exc}",
                                   host=self.conn.address) from None
        if n == 0:
            raise ConnectionClosed(f"{self.conn.address} closed the connection",
                                   host=self.conn.address)
        self._last_rx = time.monotonic()
        total = have + n
        if total >= HEADER_LEN and HEADER_LEN + HEADER.unpack_from(mv, 0)[6] > total:
            # the first frame is still incomplete (a large document arriving): nothing to
            # parse, and no copy of the partial frame for the session
            self._have = total
            return []
        out: list = []
        used = self.session.parse(mv[:total], out)
        rest = total - used
        if rest and used:
            # the events parsed hold nothing of this buffer (the session parses a bytes copy
            # of the chunk; values handed out as views are views of that copy)
            mv[:rest] = bytes(mv[used:total])
        self._have = rest
        if self._retry_at is None and self.session.waiting():
            self._retry_at = time.monotonic() + RETRY_DELAY
        return out

    def _take_from_connection(self) -> None:
        """Frames the Connection read while answering a request made through it (e.g.
        `get_failover_logs(consumer.conn, ...)` before streaming) go back to the session."""
        extra = self.conn.take_buffered()
        need = self._have + len(extra)
        if need > len(self._buf):
            self._grow(need)
        self._mv[self._have:need] = extra
        self._have = need
        out: list = []
        used = self.session.parse(self._mv[:need], out)
        self._early.extend(out)
        rest = need - used
        if rest and used:
            self._mv[:rest] = bytes(self._mv[used:need])
        self._have = rest

    def _grow(self, need: int) -> None:
        # a new buffer (memoryviews handed out keep the old one alive)
        size = max(need, 2 * len(self._buf))
        buf = bytearray(size)
        buf[:self._have] = self._mv[:self._have]
        self._buf = buf
        self._mv = memoryview(buf)

    def _check_dead(self) -> None:
        dead = self.dead_timeout
        if dead is None or not self.session.noop_enabled or self.session.active_streams == 0:
            return
        idle = time.monotonic() - self._last_rx
        if idle > dead:
            raise ClientTimeout(
                f"nothing from {self.conn.address} for {idle:.0f}s (not even a noop): "
                f"connection presumed dead", host=self.conn.address)

    def batches(self, tick: float | None = 1.0) -> Iterator[list]:
        """Yield lists of events until every stream has ended; [] after `tick` idle seconds."""
        while not self.session.done:
            yield self.poll(tick)
        self.raise_errors()
        self.flush()

    def run(self, handle: Callable[[list], object], *, tick: float | None = 1.0) -> dict[int, Position]:
        """Hand every batch to `handle(events)` until all streams end; return the positions."""
        for events in self.batches(tick):
            if events:
                handle(events)
        return self.positions()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "DcpConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: reconnect attempts in a row (without an event in between) before a lost connection is
#: an error, and the first pause between them (doubled each time, at most RECONNECT_MAX_DELAY)
RECONNECT_ATTEMPTS = 6
RECONNECT_DELAY = 0.1
RECONNECT_MAX_DELAY = 2.0


class ResumingConsumer:
    """A DcpConsumer that survives a lost connection (the backup task's consumer).

    When the connection closes, breaks or goes silent, every stream that has not ended is
    asked again on a new connection from its last complete snapshot end (the consistent
    position): the caller sees a STREAM_OPEN event with that position and drops what it
    holds of the unfinished snapshot above it, so nothing is missing and nothing is held
    twice. Reconnects back off (RECONNECT_DELAY doubling up to RECONNECT_MAX_DELAY); after
    RECONNECT_ATTEMPTS in a row without a single event, the last error is raised.
    """

    def __init__(self, connect: Callable[[], DcpConsumer], *,
                 attempts: int = RECONNECT_ATTEMPTS, delay: float = RECONNECT_DELAY) -> None:
        self._connect = connect
        self.attempts = attempts
        self.delay = delay
        self.consumer = connect()
        self.plan: dict[int, tuple[Position, int]] = {}
        self.ended: dict[int, Position] = {}
        self.reconnects = 0

    @property
    def session(self) -> DcpSession:
        return self.consumer.session

    def add_streams(self, plan: dict[int, Position | tuple[Position, int]]) -> None:
        for vb, item in plan.items():
            self.plan[vb] = item if isinstance(item, tuple) else (item, SEQNO_MAX)
        self.consumer.add_streams(plan)

    def position(self, vbucket: int, consistent: bool | None = None) -> Position:
        return self.consumer.position(vbucket, consistent)

    def positions(self, consistent: bool | None = None) -> dict[int, Position]:
        return self.consumer.positions(consistent)

    @property
    def done(self) -> bool:
        return self.consumer.done

    def batches(self, tick: float | None = 1.0) -> Iterator[list]:
        failures = 0
        while not self.consumer.session.done:
            try:
                events = self.consumer.poll(tick)
            except (ConnectionClosed, ClientTimeout, OSError) as exc:
                failures = self._resume(exc, failures)
                continue
            if events:
                failures = 0
            yield events
        self.consumer.raise_errors()
        self.consumer.flush()

    def _resume(self, exc: Exception, failures: int) -> int:
        """Reconnect and ask again for every unfinished stream; returns the failure count."""
        old = self.consumer
        again: dict[int, tuple[Position, int]] = {}
        for vb, st in old.session.streams.items():
            if not st.finished:
                again[vb] = (old.position(vb, consistent=True), self.plan[vb][1])
        try:
            old.close()
        except OSError:
            pass
        last: Exception = exc
        while True:
            if failures >= self.attempts:
                raise ConnectionClosed(
                    f"lost the connection to {old.conn.address} and could not resume after "
                    f"{failures} attempts: {last}", host=old.conn.address) from None
            time.sleep(min(RECONNECT_MAX_DELAY, self.delay * (2 ** failures)))
            failures += 1
            try:
                fresh = self._connect()
            except (ClientError, OSError) as err:
                last = err
                continue
            # the streams that had ended keep their place; the others start again
            for vb, st in old.session.streams.items():
                if vb not in again:
                    fresh.session.streams[vb] = st
            try:
                fresh.add_streams(again)
            except (ClientError, OSError) as err:
                last = err
                fresh.close()
                continue
            fresh.session.carry_counters(old.session)
            self.consumer = fresh
            self.reconnects += 1
            return failures

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> "ResumingConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
