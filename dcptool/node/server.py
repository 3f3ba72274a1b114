"""The node process: warm-up, the asyncio server, background tasks, clean shutdown.

`Node.run()` is what `dcptool node start` calls. It warms the bucket up from disk,
listens, writes `DIR/node.json`, prints `listening on HOST:PORT` (and `rest on
http://HOST:PORT` for the management REST port, `dcptool.node.rest`), and serves until
SIGTERM or SIGINT; then it stops accepting, closes connections, lets the flusher write
everything, marks a clean shutdown and returns.

Shared state, and why it exists:

* `bucket`: the one bucket this node serves (vbuckets, storage, checkpoints).
* `users`: credentials and roles for SASL and REST, read again when `DIR/users.json`
  changes (`dcptool node user add` on a running node): open connections get their
  user's new privileges, and the streams of a DCP producer whose user lost DcpProducer
  end (LostPrivileges), as Couchbase Server applies a role change to open connections.
* `connections`: live client connections (closed at shutdown; counted in stats).
* `backfills`: admission control for disk backfills (read transactions).
* `config_rev`: revision of the cluster map; bumped when a vbucket changes state.
* `bucket_uuid`: stable identity of the bucket, kept in the database.
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import sys
import time
import uuid as uuidlib
from pathlib import Path

from dcptool import __version__

from .auth import Users
from .backfill import BackfillManager
from .bucket import Bucket
from .config import NodeConfig
from .connection import Connection
from .datalock import NODE_FILE
from .producer import end_streams_on_state_change
from .replication import Replication

log = logging.getLogger("dcptool.node")


class Node:
    def __init__(self, config: NodeConfig, users: Users) -> None:
        self.config = config
        self.users = users
        self.bucket = Bucket(
            config.data_dir, name=config.bucket, num_vbuckets=config.vbuckets,
            flush_interval=config.flush_interval, checkpoint_memory=config.checkpoint_memory,
            checkpoint_max_items=config.checkpoint_max_items,
            purge_age=config.purge_age, hwt_max_hold=config.hwt_max_hold,
            compaction_interval=config.compaction_interval,
            hwt_default_ttl=config.hwt_default_ttl,
            eviction=config.eviction, memory_quota=config.memory_quota,
        )
        self.connections: set[Connection] = set()
        self.throttled: set[Connection] = set()
        self.write_throttles = 0
        self._throttle_timer = None
        self.total_connections = 0
        self.auth_failures = 0
        #: limit counters (STAT): connections refused above --max-connections, frames
        #: answered E2BIG / EINVAL, connections closed for lost framing, for not
        #: authenticating in time, for replies stuck unread; times reading was held back
        self.rejected_connections = 0
        self.frames_too_big = 0
        self.bad_frames = 0
        self.framing_lost = 0
        self.auth_timeouts = 0
        self.stuck_closed = 0
        self.output_holds = 0
        self._rejected_logged_at = 0.0
        self._rejected_unlogged = 0
        self.config_rev = 1
        self.bucket_uuid = ""
        self.started_at = time.time()
        self.backfills = BackfillManager(config.max_backfills)
        self.port = config.port
        self.host = config.host
        self._stop: asyncio.Event | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tls_server: asyncio.AbstractServer | None = None
        self.tls_port: int | None = None
        #: the management REST listeners (dcptool.node.rest) and their ports
        self.rest = None
        self.rest_port: int | None = None
        self.rest_tls_port: int | None = None
        #: how client certificates log in (None without --client-ca; see node/tlsconfig.py)
        self.client_auth = None
        if getattr(config, "client_ca", None) is not None:
            from .tlsconfig import ClientAuth

            self.client_auth = ClientAuth.load(config.client_auth)
        self._tasks: list[asyncio.Task] = []
        self.replication = Replication(self)

    # -- connections -------------------------------------------------------------------

    def connection_opened(self, conn: Connection) -> bool:
        """Admit a new connection, or close it at once above --max-connections (False).

        Like kv_engine, the connection is accepted and then closed without a word (the
        client sees the connection closed), and counted in the `rejected_conns` stat. The
        warning is logged at most every 10 seconds, with the count since the last one.
        """
        self.total_connections += 1
        if len(self.connections) >= self.config.max_connections:
            self.rejected_connections += 1
            self._rejected_unlogged += 1
            now = time.monotonic()
            if now - self._rejected_logged_at >= 10.0:
                log.warning("too many connections (limit %d): closed %d new connection(s), "
                            "the latest from %s", self.config.max_connections,
                            self._rejected_unlogged, conn.peer)
                self._rejected_logged_at = now
                self._rejected_unlogged = 0
            conn.close()
            return False
        self.connections.add(conn)
        return True

    def connection_closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.throttled.discard(conn)

    # -- write throttling ----------------------------------------------------------------
    #
    # Items the flusher has not written yet cannot leave checkpoint memory. When writers
    # outrun the flusher and checkpoint memory passes its budget, the node stops reading
    # from the connections that write (TCP pushes back on the client) until the flusher
    # has caught up. kv_engine answers TMPFAIL instead; pausing needs no client retries.

    def throttle(self, conn: Connection) -> None:
        if conn not in self.throttled:
            self.throttled.add(conn)
            self.write_throttles += 1
            conn.pause_reading()
            self.bucket.storage.kick()
            if self._throttle_timer is None:
                self._throttle_timer = asyncio.get_event_loop().call_later(0.05, self._unthrottle_check)

    def _unthrottle_check(self) -> None:
        self._throttle_timer = None
        if not self.throttled:
            return
        mem = self.bucket.memory
        mem.maybe_reduce()
        if mem.used <= mem.budget * 0.9 or not self.bucket.storage.dirty:
            for conn in list(self.throttled):
                conn.resume_reading()
            self.throttled.clear()
        else:
            self.bucket.storage.kick()
            self._throttle_timer = asyncio.get_event_loop().call_later(0.01, self._unthrottle_check)

    # -- lifecycle ----------------------------------------------------------------------

    def request_stop(self) -> None:
        if self._stop is not None and not self._stop.is_set():
            log.info("stopping")
            self._stop.set()

    async def serve(self, *, announce=print) -> None:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        # a SIGTERM that arrives during warm-up still ends in a clean shutdown
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):  # pragma: no cover
                pass
        bucket = self.bucket
        bucket.warm_up()
        meta = bucket.storage.get_meta()
        self.bucket_uuid = meta.get("bucket_uuid") or uuidlib.uuid4().hex
        if "bucket_uuid" not in meta:
            bucket.storage.set_meta(bucket_uuid=self.bucket_uuid)
        for vb in bucket.vbuckets.values():
            # a state change first ends the vbucket's DCP streams, then tells the node
            vb.state_listeners.append(end_streams_on_state_change)
            vb.state_listeners.append(self._vbucket_state_changed)
        bucket.start(loop)
        await self.replication.start()
        # The node holds millions of small acyclic objects (items); the cyclic collector
        # would walk them again and again. Keep what warm-up loaded out of its way and
        # collect young objects less often.
        gc.collect()
        gc.freeze()
        gc.set_threshold(100_000, 50, 100)
        try:
            self._server = await loop.create_server(
                lambda: Connection(self), self.config.host, self.config.port,
                reuse_address=True, backlog=1024)
            sock = self._server.sockets[0]
            self.host, self.port = sock.getsockname()[:2]
            ssl_ctx = self._ssl_context()
            if ssl_ctx is not None:
                from .tlsconfig import TlsConnection

                self._tls_server = await loop.create_server(
                    lambda: TlsConnection(self), self.config.host, self.config.tls_port,
                    ssl=ssl_ctx, reuse_address=True, backlog=1024, ssl_handshake_timeout=10.0)
                self.tls_port = self._tls_server.sockets[0].getsockname()[1]
            from .rest import RestServer

            self.rest = RestServer(self)
            rest_port, rest_tls_port = self.config.rest_ports()
            await self.rest.start(self.config.host, rest_port, rest_tls_port, ssl_ctx)
            self.rest_port, self.rest_tls_port = self.rest.port, self.rest.tls_port
            self._tasks.append(loop.create_task(self._expiry_pager()))
            self._tasks.append(loop.create_task(bucket.purger.run_scheduled()))
            self._tasks.append(loop.create_task(self._users_watcher()))
            self._write_node_file()
            announce(f"listening on {self.config.host}:{self.port}")
            if self.tls_port is not None:
                announce(f"listening (tls) on {self.config.host}:{self.tls_port}")
            for url in self.rest.urls(self.config.host):
                announce(f"rest on {url}")
            await self._stop.wait()
        finally:
            # everything acknowledged gets flushed: the shutdown is clean unless that fails
            await self._shutdown(clean=True)

    async def _shutdown(self, *, clean: bool) -> None:
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
        if self.rest is not None:
            await self.rest.stop()
        for t in self._tasks:
            t.cancel()
        await self.replication.stop_all()
        for conn in list(self.connections):
            conn.close()
        # give transports a moment to flush and run connection_lost
        for _ in range(50):
            if not self.connections:
                break
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: self.bucket.stop(clean=clean))
        log.info("stopped (clean=%s)", clean)

    def _ssl_context(self):
        """The TLS listeners' context (TLS 1.2 or later, AEAD suites; client certificates
        with --client-ca), or None without --tls-cert."""
        if self.config.tls_cert is None:
            return None

        from .tlsconfig import server_context

        return server_context(self.config.tls_cert, self.config.tls_key,
                              self.config.client_ca, self.client_auth)

    def _vbucket_state_changed(self, vb, old_state: int) -> None:
        self.config_rev += 1

    async def _expiry_pager(self) -> None:
        interval = self.config.expiry_pager_interval
        while True:
            await asyncio.sleep(interval)
            try:
                self.bucket.run_expiry_pager()
            except Exception:  # pragma: no cover - keep paging
                log.exception("expiry pager failed")

    async def _users_watcher(self, interval: float = 0.25) -> None:
        """Read the users file again when it changes and apply it to open connections."""
        path = self.users.path

        def stamp():
            try:
                st = os.stat(path)
            except OSError:
                return None
            return (st.st_mtime_ns, st.st_size, st.st_ino)

        seen = stamp()
        while True:
            await asyncio.sleep(interval)
            now = stamp()
            if now == seen or now is None:
                continue
            seen = now
            try:
                users = Users.load(path.parent)
            except Exception as exc:  # a half-written or broken file: keep the users we have
                log.warning("users file changed but cannot be read; keeping the users: %s", exc)
                continue
            self.users = users
            self.apply_users()
            log.info("users file changed: %d users", len(users.users))

    def apply_users(self) -> None:
        """Give every authenticated connection its user's privileges as the users now say;
        end the streams of a DCP producer whose user may no longer stream (StreamEnd
        LostPrivileges, as kv_engine does; its further requests get EACCESS)."""
        from dcptool.protocol.constants import StreamEndReason

        from .access import Privilege

        for conn in list(self.connections):
            if not getattr(conn, "authenticated", False) or conn.user is None:
                continue
            conn.privileges = self.users.privileges(conn.user)
            producer = conn.producer
            if producer is not None and Privilege.DCP_PRODUCER not in conn.privileges:
                streams = list(producer.streams.values())
                log.info("%s: user %r lost DcpProducer: ending its %d DCP streams",
                         conn.peer, conn.user, len(streams))
                for s in streams:
                    s.end_stream(StreamEndReason.LOST_PRIVILEGES)

    def _write_node_file(self) -> None:
        doc = {
            "host": self.config.host,
            "port": self.port,
            "pid": os.getpid(),
            "bucket": self.bucket.name,
            "vbuckets": self.bucket.num_vbuckets,
            "started_at": self.started_at,
            "version": __version__,
        }
        if self.tls_port is not None:
            doc["tls_port"] = self.tls_port
        if self.rest_port is not None:
            doc["rest_port"] = self.rest_port
        if self.rest_tls_port is not None:
            doc["rest_tls_port"] = self.rest_tls_port
        path = Path(self.config.data_dir) / NODE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)


def run_node(config: NodeConfig, users: Users) -> int:
    """Run a node in the foreground until SIGTERM/SIGINT. Returns the exit status."""
    node = Node(config, users)

    def announce(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    asyncio.run(node.serve(announce=announce))
    return 0
