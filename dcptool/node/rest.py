"""The node's management REST port: the part of Couchbase Server's cluster manager REST API
that tools and SDKs read to find their way around a cluster (docs/rest.md).

    GET /pools                                  the pools (one: default) and the version
    GET /pools/default                          the cluster: its nodes, where its buckets are
    GET /pools/default/nodeServices             every node's service ports (nodesExt)
    GET /pools/default/buckets                  [the bucket]
    GET /pools/default/buckets/NAME             the bucket with its vBucketServerMap
    GET /pools/default/b/NAME                   the terse bucket config (GET_CLUSTER_CONFIG)
    GET /pools/default/buckets/NAME/ddocs       design documents: none ({"rows": []})

Everything is read-only and JSON. The cluster the answers describe is the one
GET_CLUSTER_CONFIG describes (`bucketconfig.cluster_members`, `bucket_config`): alone,
this node; in a cluster, every member with its data and REST ports.

Users and roles are the data port's (`Users`, `access`), given with HTTP Basic auth: no or
wrong credentials are answered 401 with a `WWW-Authenticate` challenge, a user without the
privilege an endpoint needs 403; neither answer says anything about the bucket. /pools
needs any privilege, the others MetaRead (what GET_CLUSTER_CONFIG needs). A password is
checked like a PLAIN login (a PBKDF2 derivation, in a worker thread); a successful check is
remembered for `AUTH_CACHE_SECONDS`, under a keyed hash of the user and password.

The server is aiohttp's, on the node's event loop: a plain HTTP listener and, when the node
has a TLS certificate, an HTTPS one with the data port's TLS context. Requests are logged at
debug level on `dcptool.node.rest`, never the credentials.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from typing import Any, Awaitable, Callable

from aiohttp import BasicAuth, hdrs, web
from aiohttp.abc import AbstractAccessLogger

from .access import Privilege
from .bucketconfig import bucket_config, cluster_members, host_of, host_port, member_hostname
from .commands.session import SERVER_VERSION

log = logging.getLogger("dcptool.node.rest")

#: the challenge of a 401, as Couchbase Server sends it
CHALLENGE = 'Basic realm="Couchbase Server Admin / REST"'
#: how long a successful password check is remembered, and for how many logins at most
AUTH_CACHE_SECONDS = 10.0
AUTH_CACHE_SIZE = 1024
#: any privilege at all (a user with some role): what /pools asks
ANY = None

Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]


class RestAuth:
    """HTTP Basic credentials checked against the node's users."""

    def __init__(self, node) -> None:
        self.node = node
        self._key = os.urandom(32)
        #: keyed hash of (user, password) -> (expiry, the user's entry when it was checked)
        self._ok: dict[bytes, tuple[float, Any]] = {}

    async def user(self, request: web.Request) -> str | None:
        """The authenticated user name, or None (no, malformed or wrong credentials)."""
        header = request.headers.get(hdrs.AUTHORIZATION)
        if not header:
            return None
        try:
            creds = BasicAuth.decode(header, encoding="utf-8")
        except ValueError:
            return None
        name, password = creds.login, creds.password
        users = self.node.users
        entry = users.users.get(name)
        if entry is None or not password:
            self._failed(request, name)
            return None
        key = hmac.new(self._key, f"{name}\0{password}".encode("utf-8", "surrogatepass"),
                       hashlib.sha256).digest()
        now = time.monotonic()
        hit = self._ok.get(key)
        # a changed password or a reloaded user file replaces the entry: checked again
        if hit is not None and hit[0] > now and hit[1] is entry:
            return name
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, users.check_password, name, password):
            self._ok.pop(key, None)
            self._failed(request, name)
            return None
        if len(self._ok) >= AUTH_CACHE_SIZE:
            self._ok = {k: v for k, v in self._ok.items() if v[0] > now}
            if len(self._ok) >= AUTH_CACHE_SIZE:
                self._ok.clear()
        self._ok[key] = (now + AUTH_CACHE_SECONDS, entry)
        return name

    @staticmethod
    def _failed(request: web.Request, name: str) -> None:
        log.warning("%s: REST login failed for user %r", request.remote, name[:128])


def _json(doc: Any, status: int = 200) -> web.Response:
    resp = web.json_response(doc, status=status)
    resp.headers[hdrs.CACHE_CONTROL] = "no-cache,no-store,must-revalidate"
    return resp


def _not_found() -> web.Response:
    return web.Response(status=404, text="Requested resource not found.\r\n")


class RestApp:
    """The endpoints over one node."""

    def __init__(self, node) -> None:
        self.node = node
        self.auth = RestAuth(node)

    def app(self) -> web.Application:
        app = web.Application()
        routes = [
            ("/pools", ANY, self.pools),
            ("/pools/default", Privilege.META_READ, self.pool),
            ("/pools/default/nodeServices", Privilege.META_READ, self.node_services),
            ("/pools/default/buckets", Privilege.META_READ, self.buckets),
            ("/pools/default/buckets/{name}", Privilege.META_READ, self.bucket),
            ("/pools/default/b/{name}", Privilege.META_READ, self.terse_bucket),
            ("/pools/default/buckets/{name}/ddocs", Privilege.META_READ, self.ddocs),
        ]
        for path, privilege, handler in routes:
            app.router.add_get(path, self._guard(handler, privilege))
        app.on_response_prepare.append(self._headers)
        return app

    def _guard(self, handler: Handler, privilege: Privilege | None):
        async def guarded(request: web.Request) -> web.StreamResponse:
            name = await self.auth.user(request)
            if name is None:
                return web.Response(status=401, headers={hdrs.WWW_AUTHENTICATE: CHALLENGE})
            held = self.node.users.privileges(name)
            allowed = bool(held) if privilege is ANY else privilege in held
            if not allowed:
                need = "any role" if privilege is ANY else privilege.value
                return _json({"message": "Forbidden. User needs the following permissions",
                              "permissions": [need]}, status=403)
            return await handler(request, name)
        return guarded

    @staticmethod
    async def _headers(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[hdrs.SERVER] = "dcptool"

    # -- what the answers are made of ----------------------------------------------------

    def _host(self, request: web.Request) -> str:
        return host_of(self.node, request.transport)

    def _nodes(self, host: str) -> list[dict[str, Any]]:
        """`nodes[]` of /pools/default and the bucket: the members as Couchbase describes
        them (`hostname` is host:REST port, `ports.direct` the data port)."""
        cmap = self.node.replication.map
        in_chains = None if cmap is None else {i for c in cmap.vbmap for i in c if i >= 0}
        out = []
        for i, m in enumerate(cluster_members(self.node, host)):
            ports: dict[str, int] = {"direct": m["kv"]}
            if "mgmtSSL" in m["services"]:
                ports["httpsMgmt"] = m["services"]["mgmtSSL"]
            # a member no vbucket chain names any more was failed over
            active = in_chains is None or i in in_chains
            out.append({
                "hostname": member_hostname(m),
                "thisNode": m["this"],
                "clusterMembership": "active" if active else "inactiveFailed",
                "status": "healthy",
                "otpNode": f"ns_1@{m['host']}",
                "version": SERVER_VERSION,
                "services": ["kv"],
                "ports": ports,
            })
        return out

    def _bucket_doc(self, host: str) -> dict[str, Any]:
        node = self.node
        doc = bucket_config(node, host)
        name, uuid = doc["name"], doc["uuid"]
        quota = node.config.memory_quota
        doc.update({
            "nodes": self._nodes(host),
            "bucketType": "membase",
            "uri": f"/pools/default/buckets/{name}?bucket_uuid={uuid}",
            "streamingUri": f"/pools/default/bucketsStreaming/{name}?bucket_uuid={uuid}",
            "ddocs": {"uri": f"/pools/default/buckets/{name}/ddocs"},
            "replicaNumber": doc["vBucketServerMap"]["numReplicas"],
            "numVBuckets": node.bucket.num_vbuckets,
            "evictionPolicy": "fullEviction" if node.config.eviction == "full" else "valueOnly",
            "conflictResolutionType": "seqno",
            "quota": {"ram": quota, "rawRAM": quota},
        })
        return doc

    def _bucket_named(self, request: web.Request) -> bool:
        return request.match_info["name"] == self.node.bucket.name

    # -- endpoints -----------------------------------------------------------------------

    async def pools(self, request: web.Request, user: str) -> web.Response:
        uuid = self.node.bucket_uuid
        admin = "admin" in self.node.users.roles(user)
        return _json({
            "pools": [{"name": "default", "uri": f"/pools/default?uuid={uuid}",
                       "streamingUri": f"/poolsStreaming/default?uuid={uuid}"}],
            "isAdminCreds": admin,
            "isROAdminCreds": False,
            "isEnterprise": False,
            "allowedServices": ["kv"],
            "uuid": uuid,
            "implementationVersion": SERVER_VERSION,
            "componentsVersion": {"dcptool": SERVER_VERSION},
        })

    async def pool(self, request: web.Request, user: str) -> web.Response:
        node = self.node
        host = self._host(request)
        return _json({
            "name": "default",
            "nodes": self._nodes(host),
            "buckets": {"uri": f"/pools/default/buckets?v={node.config_rev}"
                               f"&uuid={node.bucket_uuid}",
                        "terseBucketsBase": "/pools/default/b/",
                        "terseStreamingBucketsBase": "/pools/default/bs/"},
            "nodeServicesUri": "/pools/default/nodeServices",
            "rebalanceStatus": "none",
            "balanced": True,
            "clusterName": "",
        })

    async def node_services(self, request: web.Request, user: str) -> web.Response:
        cfg = bucket_config(self.node, self._host(request))
        return _json({key: cfg[key] for key in ("rev", "nodesExt", "clusterCapabilitiesVer",
                                                 "clusterCapabilities")})

    async def buckets(self, request: web.Request, user: str) -> web.Response:
        return _json([self._bucket_doc(self._host(request))])

    async def bucket(self, request: web.Request, user: str) -> web.Response:
        if not self._bucket_named(request):
            return _not_found()
        return _json(self._bucket_doc(self._host(request)))

    async def terse_bucket(self, request: web.Request, user: str) -> web.Response:
        if not self._bucket_named(request):
            return _not_found()
        return _json(bucket_config(self.node, self._host(request)))

    async def ddocs(self, request: web.Request, user: str) -> web.Response:
        if not self._bucket_named(request):
            return _not_found()
        return _json({"rows": []})


class _AccessLog(AbstractAccessLogger):
    """One debug line per request on the node's logger (aiohttp's own goes nowhere)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("%s %s %s -> %d (%.1f ms)", request.remote, request.method,
                              request.path, response.status, time * 1000)


class RestServer:
    """The REST listeners of a node: HTTP on `port`, HTTPS on `tls_port` with TLS."""

    #: seconds requests under way get to finish at shutdown
    SHUTDOWN_TIMEOUT = 2.0

    def __init__(self, node) -> None:
        self.node = node
        self.port: int | None = None
        self.tls_port: int | None = None
        self._runner: web.AppRunner | None = None
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self, host: str, port: int, tls_port: int | None, ssl_ctx=None) -> None:
        """Listen (0 picks a free port); DcptoolError names the port that is taken."""
        from dcptool.errors import DcptoolError

        self._runner = web.AppRunner(RestApp(self.node).app(), access_log_class=_AccessLog,
                                     access_log=log, handle_signals=False,
                                     shutdown_timeout=self.SHUTDOWN_TIMEOUT)
        await self._runner.setup()
        loop = asyncio.get_running_loop()
        for flag, want, ctx in (("--rest-port", port, None),
                                ("--rest-tls-port", tls_port, ssl_ctx)):
            if want is None or (flag == "--rest-tls-port" and ctx is None):
                continue
            try:
                server = await loop.create_server(
                    self._runner.server, host, want, ssl=ctx, reuse_address=True, backlog=128,
                    ssl_handshake_timeout=10.0 if ctx is not None else None)
            except OSError as exc:
                raise DcptoolError(f"cannot listen on {host_port(host, want)} ({flag}): "
                                   f"{exc.strerror or exc}") from None
            self._servers.append(server)
            bound = server.sockets[0].getsockname()[1]
            if ctx is None:
                self.port = bound
            else:
                self.tls_port = bound

    def urls(self, host: str) -> list[str]:
        """http://HOST:PORT, and https://HOST:PORT with TLS."""
        out = []
        if self.port is not None:
            out.append(f"http://{host_port(host, self.port)}")
        if self.tls_port is not None:
            out.append(f"https://{host_port(host, self.tls_port)}")
        return out

    def close(self) -> None:
        """Stop accepting connections."""
        for server in self._servers:
            server.close()

    async def stop(self) -> None:
        """Stop accepting, let requests under way finish briefly, close every connection."""
        self.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        servers, self._servers = self._servers, []
        for server in servers:
            try:
                await asyncio.wait_for(server.wait_closed(), self.SHUTDOWN_TIMEOUT)
            except asyncio.TimeoutError:  # pragma: no cover - connections were closed
                pass
