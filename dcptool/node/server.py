"""The node process: warm-up, the asyncio server, background tasks, clean shutdown.

`Node.run()` is what `dcptool node start` calls. It warms the bucket up from disk,
listens, writes `DIR/node.json`, prints `listening on HOST:PORT` (and `rest on
http://HOST:PORT` for the management REST port, `dcptool.node.rest`), and serves until
SIGTERM or SIGINT; then it stops accepting, closes connections, lets the flusher write
everything, marks a clean shutdown and returns.

Shared state, and why it exists:

* `buckets`: name -> Bucket, every bucket this node holds (vbuckets, storage,
  checkpoints, producers, purger each), in creation order; `bucket` is the first, made
  from --bucket at start with its data in DIR itself (a one-bucket data directory opens
  unchanged); the others are created and dropped over REST (`dcptool.node.restbuckets`)
  and live in DIR/buckets/NAME (`dcptool.node.bucketset`, registry DIR/buckets.json).
* `replications`: name -> Replication, each bucket's cluster map and replica streams
  (`dcptool.node.replication`); `replication` is the first bucket's. In a cluster every
  bucket has its own map (same members, its own vbucket count and replicas), kept in its
  data directory (the first bucket's in DIR/cluster.json, where it always was).
* `users`: credentials and roles for SASL and REST, read again when `DIR/users.json`
  changes (`dcptool node user add` on a running node): open connections get their
  user's new privileges, and the streams of a DCP producer whose user lost DcpProducer
  end (LostPrivileges), as Couchbase Server applies a role change to open connections.
* `connections`: live client connections (closed at shutdown; counted in stats).
* `unauth`, `unauth_by_address`: the connections not yet logged in, oldest first
  (bounded by --max-unauth-connections and --max-unauth-per-address).
* `login_guard`: failed logins per user and address, and the delays they set
  (`dcptool.node.loginguard`), for KV and REST alike.
* `backfills`: admission control for disk backfills (read transactions).
* `config_rev`: revision of the cluster map; bumped when a vbucket changes state.
* `bucket_uuid`: the first bucket's uuid (`Bucket.uuid`: each bucket's, kept in its
  database; a bucket created again under a dropped one's name gets a new one).
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
from pathlib import Path

from dcptool import __version__

from .auth import Users
from .backfill import BackfillManager
from .bucket import Bucket
from .bucketset import Registry, default_settings, new_uuid
from .config import NodeConfig
from .connection import Connection
from .datalock import NODE_FILE
from .producer import end_streams_on_state_change
from .replication import Replication
from dcptool.logsafe import shown

log = logging.getLogger("dcptool.node")


class Node:
    def __init__(self, config: NodeConfig, users: Users) -> None:
        self.config = config
        self.users = users
        self.registry = Registry(config.data_dir)
        self.buckets: dict[str, Bucket] = {}
        first = default_settings(config)
        entry = self.registry.entries.get(config.bucket)
        if entry is not None:
            # the node's options keep deciding the first bucket's layout and eviction
            kept = {k: first[k] for k in ("numVBuckets", "evictionPolicy", "ramQuota")}
            first.update(entry.get("settings", {}), **kept)
        self.buckets[config.bucket] = self._make_bucket(config.bucket, first)
        for name, entry in self.registry.entries.items():
            if name not in self.buckets:
                self.buckets[name] = self._make_bucket(name, dict(entry["settings"]))
        #: each bucket's compaction task (started with the bucket, cancelled at its drop)
        self._bucket_tasks: dict[str, asyncio.Task] = {}
        #: names of the buckets being created or dropped (a second request for one waits
        #: for nothing: it is refused as if the bucket existed)
        self.busy_buckets: set[str] = set()
        self.connections: set[Connection] = set()
        self.throttled: set[Connection] = set()
        self.write_throttles = 0
        self._throttle_timer = None
        self.total_connections = 0
        self.auth_failures = 0
        #: failed REST logins (HTTP basic auth)
        self.rest_auth_failures = 0
        from .loginguard import LoginGuard

        self.login_guard = LoginGuard(config.auth_failure_delay)
        #: connections not logged in yet, oldest first, and the same per client address
        self.unauth: dict[Connection, None] = {}
        self.unauth_by_address: dict[str, dict[Connection, None]] = {}
        self.max_unauth, self.max_unauth_per_address = config.unauth_limits()
        #: unauthenticated connections closed to make room for newer ones, and frames
        #: above PRE_AUTH_FRAME before login (each closed its connection)
        self.unauth_evicted = 0
        self.pre_auth_too_big = 0
        self._evicted_logged_at = 0.0
        self._evicted_unlogged = 0
        #: the input budget (--max-input-memory): bytes held by large frames not yet
        #: whole, the connections waiting for room (oldest first, with the size they
        #: need), and how often one had to wait
        self.max_input_memory = config.input_budget()
        self.input_reserved = 0
        self.input_waiting: dict[Connection, int] = {}
        self.input_waits = 0
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
        #: each bucket's cluster map and replica streams
        self.replications: dict[str, Replication] = {
            name: Replication(self, bucket) for name, bucket in self.buckets.items()}

    # -- buckets -----------------------------------------------------------------------

    @property
    def bucket(self) -> Bucket:
        """The first bucket (--bucket), its data in DIR itself; its cluster map says who
        the cluster's members are (`cluster_map`)."""
        return self.buckets[self.config.bucket]

    @property
    def replication(self) -> Replication:
        """The first bucket's cluster map and replica streams."""
        return self.replications[self.config.bucket]

    def replication_of(self, bucket) -> Replication | None:
        """`bucket`'s cluster map and replica streams (None: a bucket no longer served)."""
        repl = self.replications.get(bucket.name)
        return repl if repl is not None and repl.bucket is bucket else None

    def cluster_map(self):
        """The cluster this node is a member of, as its first bucket's map says (None:
        alone). Every bucket of a cluster has the same members."""
        return self.replication.map

    @property
    def bucket_uuid(self) -> str:
        return self.bucket.uuid

    def _make_bucket(self, name: str, settings: dict) -> Bucket:
        config = self.config
        data_dir = self.registry.bucket_dir(name, config.bucket)
        data_dir.mkdir(parents=True, exist_ok=True)
        bucket = Bucket(
            data_dir, name=name, num_vbuckets=int(settings["numVBuckets"]),
            flush_interval=config.flush_interval, checkpoint_memory=config.checkpoint_memory,
            checkpoint_max_items=config.checkpoint_max_items,
            purge_age=config.purge_age, hwt_max_hold=config.hwt_max_hold,
            compaction_interval=config.compaction_interval,
            hwt_default_ttl=config.hwt_default_ttl,
            eviction="full" if settings["evictionPolicy"] == "fullEviction" else "value",
            memory_quota=int(settings["ramQuota"]),
        )
        bucket.settings = settings
        bucket.max_ttl = int(settings.get("maxTTL", 0))
        return bucket

    def _warm_up(self, bucket: Bucket, uuid: str | None = None) -> None:
        """Load `bucket` from disk and give it its uuid (a new one for a new bucket)."""
        bucket.warm_up()
        meta = bucket.storage.get_meta()
        bucket.uuid = meta.get("bucket_uuid") or uuid or new_uuid()
        if "bucket_uuid" not in meta:
            bucket.storage.set_meta(bucket_uuid=bucket.uuid)

    def _start_bucket(self, bucket: Bucket, loop) -> None:
        for vb in bucket.vbuckets.values():
            # a state change first ends the vbucket's DCP streams, then tells the node
            vb.state_listeners.append(end_streams_on_state_change)
            vb.state_listeners.append(self._vbucket_state_changed)
        bucket.start(loop)
        self._bucket_tasks[bucket.name] = loop.create_task(bucket.purger.run_scheduled())

    async def create_bucket(self, name: str, settings: dict) -> Bucket:
        """Create bucket `name` (a new uuid, an empty data directory) and serve it."""
        import shutil

        loop = asyncio.get_running_loop()
        self.busy_buckets.add(name)
        try:
            data_dir = self.registry.bucket_dir(name, self.config.bucket)
            if data_dir.exists():  # left over by a drop that did not finish
                await loop.run_in_executor(None, shutil.rmtree, data_dir)
            bucket = await loop.run_in_executor(None, self._make_bucket, name, settings)
            await loop.run_in_executor(None, self._warm_up, bucket, new_uuid())
        finally:
            self.busy_buckets.discard(name)
        self.buckets[name] = bucket
        self.registry.put(name, bucket.uuid, settings)
        self._start_bucket(bucket, loop)
        self.replications[name] = Replication(self, bucket)
        await self.replications[name].start()
        self.config_rev += 1
        log.info("bucket %s created (uuid %s, %d vbuckets, %s)", shown(name), bucket.uuid,
                 bucket.num_vbuckets, settings["evictionPolicy"])
        return bucket

    async def edit_bucket(self, bucket: Bucket, settings: dict) -> None:
        """Keep `bucket`'s new settings; maxTTL applies at once. A new eviction policy or
        RAM quota restarts the bucket, as Couchbase Server does: its connections are
        closed, its data flushed and opened again under the new policy."""
        restart = any(settings.get(k) != bucket.settings.get(k)
                      for k in ("evictionPolicy", "ramQuota"))
        bucket.settings = settings
        bucket.max_ttl = int(settings.get("maxTTL", 0))
        self.registry.put(bucket.name, bucket.uuid, settings)
        if restart and bucket is not self.bucket:
            await self._restart_bucket(bucket)
        self.config_rev += 1

    async def _restart_bucket(self, bucket: Bucket) -> None:
        name = bucket.name
        loop = asyncio.get_running_loop()
        self.busy_buckets.add(name)
        try:
            await self._stop_replication(name)
            self._stop_bucket(bucket)
            await loop.run_in_executor(None, lambda: bucket.stop(clean=True))
            new = await loop.run_in_executor(None, self._make_bucket, name, bucket.settings)
            await loop.run_in_executor(None, self._warm_up, new, bucket.uuid)
        finally:
            self.busy_buckets.discard(name)
        self.buckets[name] = new
        self._start_bucket(new, loop)
        # the map stayed in the bucket's directory: the replicas resume from it
        self.replications[name] = Replication(self, new)
        await self.replications[name].start()
        log.info("bucket %s restarted (%s)", shown(name), new.settings["evictionPolicy"])

    async def _stop_replication(self, name: str) -> None:
        repl = self.replications.pop(name, None)
        if repl is not None and repl.loop is not None:
            await repl.stop_all()

    def _stop_bucket(self, bucket: Bucket) -> None:
        """Take `bucket` out of service: its compaction task ends, the connections that
        selected it are closed (as kv_engine does)."""
        self.buckets.pop(bucket.name, None)
        task = self._bucket_tasks.pop(bucket.name, None)
        if task is not None:
            task.cancel()
        for conn in list(self.connections):
            if conn.bucket is bucket:
                conn.close()

    async def drop_bucket(self, bucket: Bucket) -> None:
        """Drop `bucket`: close the connections that selected it (as kv_engine does), stop
        its tasks and flusher, remove its files."""
        import shutil

        name = bucket.name
        self.busy_buckets.add(name)
        self.registry.remove(name)
        loop = asyncio.get_running_loop()
        try:
            await self._stop_replication(name)
            self._stop_bucket(bucket)
            await loop.run_in_executor(None, lambda: bucket.stop(clean=True))
            await loop.run_in_executor(None, shutil.rmtree, bucket.data_dir, True)
        finally:
            self.busy_buckets.discard(name)
        self.config_rev += 1
        log.info("bucket %s dropped", shown(name))

    # -- connections -------------------------------------------------------------------

    def connection_opened(self, conn: Connection) -> bool:
        """Admit a new connection, or close it at once above --max-connections (False).

        Like kv_engine, the connection is accepted and then closed without a word (the
        client sees the connection closed), and counted in the `rejected_conns` stat. The
        warning is logged at most every 10 seconds, with the count since the last one.

        A new connection is not logged in yet. Such connections are bounded by
        --max-unauth-connections and, per client address, --max-unauth-per-address: above
        either bound the oldest of them (of that address) is closed to make room, and a
        full node closes its oldest unauthenticated connection rather than refuse a new
        one. The oldest that has sent nothing yet goes first (`_oldest_silent`): a client
        busy logging in outlives connections that only sit there. A flood of connections
        that never log in thus holds a bounded part of the slots, and a client that logs
        in promptly still gets served.
        """
        self.total_connections += 1
        if len(self.connections) >= self.config.max_connections and not self.unauth:
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
        same = self.unauth_by_address.get(conn.peer_host)
        if same is not None and len(same) >= self.max_unauth_per_address:
            self._evict(_oldest_silent(same), "per address")
        if self.unauth and (len(self.unauth) >= self.max_unauth
                            or len(self.connections) >= self.config.max_connections):
            self._evict(_oldest_silent(self.unauth), "in all")
        self.connections.add(conn)
        self.unauth[conn] = None
        self.unauth_by_address.setdefault(conn.peer_host, {})[conn] = None
        return True

    def _evict(self, conn: Connection, scope: str) -> None:
        """Close the unauthenticated `conn` to make room (logged at most every 10 s)."""
        self._forget_unauth(conn)
        self.connections.discard(conn)
        self.unauth_evicted += 1
        self._evicted_unlogged += 1
        now = time.monotonic()
        if now - self._evicted_logged_at >= 10.0:
            log.warning("too many connections not logged in (limit %d, %d per address): "
                        "closed %d of them, the latest from %s (%s)", self.max_unauth,
                        self.max_unauth_per_address, self._evicted_unlogged, conn.peer, scope)
            self._evicted_logged_at = now
            self._evicted_unlogged = 0
        conn.abort()

    def _forget_unauth(self, conn: Connection) -> None:
        if self.unauth.pop(conn, 0) is None:
            same = self.unauth_by_address.get(conn.peer_host)
            if same is not None:
                same.pop(conn, None)
                if not same:
                    del self.unauth_by_address[conn.peer_host]

    def connection_authenticated(self, conn: Connection) -> None:
        self._forget_unauth(conn)

    def connection_closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.throttled.discard(conn)
        self._forget_unauth(conn)
        if conn.reserved or conn in self.input_waiting:
            self.input_changed(conn, 0)

    # -- the input budget ----------------------------------------------------------------
    #
    # Every large frame that has not arrived whole holds its whole size of the budget from
    # its header on, so the frames admitted can always complete: memory that connections
    # hold for frames in flight stays under --max-input-memory (plus, per connection, one
    # read and a frame below LARGE_FRAME), and a frame that does not fit waits its turn.

    def input_changed(self, conn: Connection, need: int) -> None:
        """`conn`'s incomplete large frame now needs `need` bytes (0: none)."""
        if conn.waiting_memory and self.input_waiting.get(conn) == need:
            return
        if conn.reserved:
            self.input_reserved -= conn.reserved
            conn.reserved = 0
        self.input_waiting.pop(conn, None)
        if need:
            if not self.input_waiting and self.input_reserved + need <= self.max_input_memory:
                conn.reserved = need
                self.input_reserved += need
                if conn.waiting_memory:
                    conn.memory_granted()
            else:
                self.input_waits += 1
                self.input_waiting[conn] = need
                conn.wait_memory()
        elif conn.waiting_memory:
            conn.memory_granted()
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self.input_waiting:
            conn, need = next(iter(self.input_waiting.items()))
            if self.input_reserved + need > self.max_input_memory:
                return
            del self.input_waiting[conn]
            conn.reserved = need
            self.input_reserved += need
            conn.memory_granted()

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
            (conn.bucket or self.bucket).storage.kick()
            if self._throttle_timer is None:
                self._throttle_timer = asyncio.get_event_loop().call_later(0.05, self._unthrottle_check)

    def _unthrottle_check(self) -> None:
        self._throttle_timer = None
        if not self.throttled:
            return
        busy = []
        for bucket in self.buckets.values():
            mem = bucket.memory
            mem.maybe_reduce()
            if mem.used > mem.budget * 0.9 and bucket.storage.dirty:
                busy.append(bucket)
        if not busy:
            for conn in list(self.throttled):
                conn.resume_reading()
            self.throttled.clear()
        else:
            for bucket in busy:
                bucket.storage.kick()
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
        for name, bucket in self.buckets.items():
            entry = self.registry.entries.get(name)
            self._warm_up(bucket, entry.get("uuid") if entry else None)
        if self.config.bucket not in self.registry.entries:
            self.registry.put(self.config.bucket, self.bucket.uuid, self.bucket.settings)
        for bucket in self.buckets.values():
            self._start_bucket(bucket, loop)
        for repl in list(self.replications.values()):
            await repl.start()
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
        for t in self._tasks + list(self._bucket_tasks.values()):
            t.cancel()
        for repl in list(self.replications.values()):
            if repl.loop is not None:
                await repl.stop_all()
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
        for bucket in list(self.buckets.values()):
            await loop.run_in_executor(None, lambda b=bucket: b.stop(clean=clean))
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
        self.config_changed()

    def config_changed(self) -> None:
        """The map clients see changed: tell the connections that subscribed to it."""
        from . import configpush

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        configpush.schedule(self, loop)

    async def _expiry_pager(self) -> None:
        interval = self.config.expiry_pager_interval
        while True:
            await asyncio.sleep(interval)
            for bucket in list(self.buckets.values()):
                try:
                    bucket.run_expiry_pager()
                except Exception:  # pragma: no cover - keep paging
                    log.exception("expiry pager failed (bucket %s)", shown(bucket.name))

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
            bucket = conn.bucket.name if conn.bucket is not None else None
            conn.privileges = self.users.privileges(conn.user, bucket=bucket)
            producer = conn.producer
            if producer is not None and Privilege.DCP_PRODUCER not in conn.privileges:
                streams = list(producer.streams.values())
                log.info("%s: user %s lost DcpProducer: ending its %d DCP streams",
                         conn.peer, shown(conn.user), len(streams))
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


#: how many of the oldest unauthenticated connections eviction looks at for a silent one
_EVICT_SCAN = 32


def _oldest_silent(conns: dict) -> Connection:
    """Of the oldest few connections in `conns` (oldest first), the first that has sent
    nothing yet (no request handled, nothing buffered, nothing waiting in its socket); the
    oldest of all when each of them has."""
    oldest = None
    for i, conn in enumerate(conns):
        if oldest is None:
            oldest = conn
        if conn.frames_in == 0 and not conn.decoder.buffered and not conn.bytes_waiting():
            return conn
        if i + 1 >= _EVICT_SCAN:
            break
    return oldest


def run_node(config: NodeConfig, users: Users) -> int:
    """Run a node in the foreground until SIGTERM/SIGINT. Returns the exit status."""
    node = Node(config, users)

    def announce(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    asyncio.run(node.serve(announce=announce))
    return 0
