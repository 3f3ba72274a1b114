"""The node's management REST port: the part of Couchbase Server's cluster manager REST API
that tools and SDKs read to find their way around a cluster (docs/rest.md).

    GET /pools                                  the pools (one: default) and the version
    GET /pools/default                          the cluster: its nodes, where its buckets are
    GET /pools/default/nodeServices             every node's service ports (nodesExt)
    GET /pools/default/buckets                  every bucket
    GET /pools/default/buckets/NAME             the bucket with its vBucketServerMap
    GET /pools/default/b/NAME                   the terse bucket config (GET_CLUSTER_CONFIG)
    GET /pools/default/buckets/NAME/ddocs       design documents: none ({"rows": []})

Creating, editing and dropping buckets (POST /pools/default/buckets, POST and DELETE
/pools/default/buckets/NAME) are `dcptool.node.restbuckets`'s.

Scopes and collections (Couchbase's endpoints and shapes; `dcptool.node.bucket`):

    GET    /pools/default/buckets/NAME/scopes                        the manifest (hex uids)
    POST   /pools/default/buckets/NAME/scopes             name=S     -> {"uid": "<hex>"}
    POST   /pools/default/buckets/NAME/scopes/S/collections  name=C [maxTTL=N] -> {"uid":..}
    DELETE /pools/default/buckets/NAME/scopes/S/collections/C          -> {"uid": ...}
    DELETE /pools/default/buckets/NAME/scopes/S                        -> {"uid": ...}

`uid` is the manifest uid after the change. Errors as Couchbase Server answers them:
400 `{"errors": {"name": "..."}}` for a missing or invalid name (`maxTTL` likewise), 400
`{"errors": {"_": "Scope with name \"S\" already exists"}}` (or the collection's), 404
`{"errors": {"_": "Scope with name \"S\" is not found"}}` (or the collection's), 400 for
dropping the _default scope (or, on this node, the _default collection), 429 when the
bucket already has MAX_SCOPES scopes or MAX_COLLECTIONS collections. Changing them needs
the ManageCollections privilege (roles admin, scope_admin); listing them MetaRead. In a
cluster the member that took a change sends the whole manifest to every other member
(SET_COLLECTIONS_MANIFEST, 0xb9, over the data port with the map's credentials); each
member writes the system events into its active vbuckets, replicas get them over DCP.

Users and groups: Couchbase's /settings/rbac endpoints, `dcptool.node.rbac`.

Everything else is read-only and JSON. The cluster the answers describe is the one
GET_CLUSTER_CONFIG describes (`bucketconfig.cluster_members`, `bucket_config`): alone,
this node; in a cluster, every member with its data and REST ports, and for each bucket its
own map (vBucketServerMap).

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

from dcptool.protocol.collections import MAX_NAME_LENGTH, ManifestError, hex_id, valid_name

from . import rbac
from .access import Privilege
from .auth import REST_CHALLENGE
from .bucketconfig import (
    bucket_config,
    cluster_members,
    map_of,
    global_config,
    host_of,
    host_port,
    member_hostname,
)
from .commands.session import SERVER_VERSION
from dcptool.logsafe import shown

log = logging.getLogger("dcptool.node.rest")

#: the challenge of a 401, as Couchbase Server sends it
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
        if getattr(self.node, "client_auth", None) is not None:  # a certificate first
            from .tlsconfig import certificate_user

            try:
                name = certificate_user(self.node, request.transport)
            except LookupError as exc:
                log.warning("%s: client certificate refused: %s", request.remote, exc)
                return None
            if name is not None:
                return name
        header = request.headers.get(hdrs.AUTHORIZATION)
        if not header:
            return None
        try:
            creds = BasicAuth.decode(header, encoding="utf-8")
        except ValueError:
            return None
        name, password = creds.login, creds.password
        key = hmac.new(self._key, f"{name}\0{password}".encode("utf-8", "surrogatepass"),
                       hashlib.sha256).digest()
        hit = self._ok.get(key)
        # a changed password or a reloaded user file replaces the entry: checked again
        if (hit is not None and hit[0] > time.monotonic()
                and hit[1] is self.node.users.users.get(name)):
            return name
        # failed logins of this user or address make the check wait (LoginGuard)
        guard = self.node.login_guard
        address = request.remote or "?"
        while True:
            wait = guard.wait(name, address)
            if wait <= 0:
                break
            guard.delayed += 1
            await asyncio.sleep(wait)
        users = self.node.users
        entry = users.users.get(name)
        loop = asyncio.get_running_loop()
        if (entry is None or not password
                or not await loop.run_in_executor(None, users.check_password, name, password)):
            self._ok.pop(key, None)
            self._failed(request, name, guard.failed(name, address))
            return None
        guard.succeeded(name, address)
        now = time.monotonic()
        if len(self._ok) >= AUTH_CACHE_SIZE:
            self._ok = {k: v for k, v in self._ok.items() if v[0] > now}
            if len(self._ok) >= AUTH_CACHE_SIZE:
                self._ok.clear()
        self._ok[key] = (now + AUTH_CACHE_SECONDS, entry)
        return name

    def _failed(self, request: web.Request, name: str, counted: tuple[int, float]) -> None:
        self.node.rest_auth_failures += 1
        count, delay = counted
        then = ""
        if count > 1:
            then = f" ({count} failures in a row"
            then += f", next attempt waits {delay:g}s)" if delay else ")"
        log.warning("%s: REST login failed for user %s%s", request.remote, shown(name, 64), then)


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
            ("/pools/default/buckets/{name}/scopes", Privilege.META_READ, self.scopes),
        ]
        config = getattr(self.node, "config", None)
        if config is not None and not config.collections_enabled:
            routes.pop()  # --no-collections: a server without them has no such endpoints
        for path, privilege, handler in routes:
            app.router.add_get(path, self._guard(handler, privilege))
        rbac.register(app, self)  # /settings/rbac/...
        if config is not None and not config.collections_enabled:
            from .restbuckets import add_routes

            add_routes(app, self.node, self._guard)
            app.on_response_prepare.append(self._headers)
            return app
        base = "/pools/default/buckets/{name}/scopes"
        manage = Privilege.MANAGE_COLLECTIONS
        app.router.add_post(base, self._guard(self.create_scope, manage))
        app.router.add_post(base + "/{scope}/collections",
                            self._guard(self.create_collection, manage))
        app.router.add_delete(base + "/{scope}/collections/{collection}",
                              self._guard(self.drop_collection, manage))
        app.router.add_delete(base + "/{scope}", self._guard(self.drop_scope, manage))
        from .restbuckets import add_routes

        add_routes(app, self.node, self._guard)
        app.on_response_prepare.append(self._headers)
        return app

    def _guard(self, handler: Handler, privilege: Privilege | None):
        async def guarded(request: web.Request) -> web.StreamResponse:
            name = await self.auth.user(request)
            if name is None:
                return web.Response(status=401, headers={hdrs.WWW_AUTHENTICATE: REST_CHALLENGE})
            held = self.node.users.privileges(name, bucket=request.match_info.get("name"))
            allowed = bool(held) if privilege is ANY else privilege in held
            if not allowed:
                need = "any role" if privilege is ANY else privilege.value
                if privilege is Privilege.MANAGE_COLLECTIONS:
                    # Couchbase names the permission a scope change needs like this
                    bucket = request.match_info.get("name", "")
                    scope = request.match_info.get("scope")
                    need = (f"cluster.collection[{bucket}:{scope}:.].collections!write"
                            if scope is not None
                            else f"cluster.bucket[{bucket}].collections!write")
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

    def _nodes(self, host: str, *, failed: bool = False, bucket=None) -> list[dict[str, Any]]:
        """`nodes[]` of /pools/default and the bucket: the members as Couchbase describes
        them (`hostname` is host:REST port, `ports.direct` the data port), as `bucket`'s map
        (the first bucket's when None) has them; with `failed` (/pools/default) the nodes
        failed over too, as inactiveFailed."""
        cmap = map_of(self.node, bucket)
        in_chains = None if cmap is None else {i for c in cmap.vbmap for i in c if i >= 0}
        out = []
        for i, m in enumerate(cluster_members(self.node, host, bucket)):
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
        if failed and cmap is not None:
            for f in cmap.failed:
                h, _, p = f["node"].rpartition(":")
                m = {"host": h.strip("[]"), "kv": int(p), "services": f["services"]}
                out.append({
                    "hostname": member_hostname(m), "thisNode": False,
                    "clusterMembership": "inactiveFailed", "status": "unhealthy",
                    "otpNode": f"ns_1@{m['host']}", "version": SERVER_VERSION,
                    "services": ["kv"], "ports": {"direct": m["kv"]},
                })
        return out

    def _bucket_doc(self, host: str, bucket=None) -> dict[str, Any]:
        from .restbuckets import settings_doc

        node = self.node
        bucket = bucket or node.bucket
        doc = bucket_config(node, host, bucket)
        name, uuid = doc["name"], doc["uuid"]
        quota = bucket.settings.get("ramQuota", node.config.memory_quota)
        doc.update({
            "nodes": self._nodes(host, bucket=bucket),
            "bucketType": "membase",
            "uri": f"/pools/default/buckets/{name}?bucket_uuid={uuid}",
            "streamingUri": f"/pools/default/bucketsStreaming/{name}?bucket_uuid={uuid}",
            "ddocs": {"uri": f"/pools/default/buckets/{name}/ddocs"},
            "replicaNumber": doc["vBucketServerMap"]["numReplicas"],
            "numVBuckets": bucket.num_vbuckets,
            "evictionPolicy": "fullEviction" if bucket.full_eviction else "valueOnly",
            "conflictResolutionType": "seqno",
            "quota": {"ram": quota, "rawRAM": quota},
        })
        doc.update(settings_doc(bucket, doc["replicaNumber"]))
        return doc

    def _bucket_named(self, request: web.Request):
        """The bucket the path names (None: no such bucket)."""
        return self.node.buckets.get(request.match_info["name"])

    # -- endpoints -----------------------------------------------------------------------

    async def pools(self, request: web.Request, user: str) -> web.Response:
        uuid = self.node.bucket_uuid
        admin = "admin" in self.node.users.effective_roles(user)
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
            "nodes": self._nodes(host, failed=True),
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
        return _json(global_config(self.node, self._host(request)))

    async def buckets(self, request: web.Request, user: str) -> web.Response:
        """The buckets `user` may see (a role in each), as Couchbase lists them."""
        host = self._host(request)
        users = self.node.users
        return _json([self._bucket_doc(host, b) for b in list(self.node.buckets.values())
                      if users.privileges(user, bucket=b.name)])

    async def bucket(self, request: web.Request, user: str) -> web.Response:
        bucket = self._bucket_named(request)
        if bucket is None:
            return _not_found()
        return _json(self._bucket_doc(self._host(request), bucket))

    async def terse_bucket(self, request: web.Request, user: str) -> web.Response:
        bucket = self._bucket_named(request)
        if bucket is None:
            return _not_found()
        return _json(bucket_config(self.node, self._host(request), bucket))

    async def ddocs(self, request: web.Request, user: str) -> web.Response:
        if not self._bucket_named(request):
            return _not_found()
        return _json({"rows": []})


    # -- scopes and collections ---------------------------------------------------------

    async def scopes(self, request: web.Request, user: str) -> web.Response:
        bucket = self._bucket_named(request)
        if bucket is None:
            return _not_found()
        return _json(bucket.manifest.to_json())

    async def _change(self, request: web.Request, change) -> web.Response:
        """Run `change(bucket)` (a Bucket method call), answer {"uid": ...} or the error
        Couchbase answers, then send the new manifest to the other members."""
        bucket = self._bucket_named(request)
        if bucket is None:
            return _not_found()
        try:
            change(bucket)
        except ManifestError as exc:
            return _manifest_error(exc)
        except _FormError as exc:
            return _json({"errors": {exc.field: exc.message}}, status=400)
        from .manifestshare import share_manifest

        await share_manifest(self.node, bucket)
        return _json({"uid": hex_id(bucket.manifest.uid)})

    async def create_scope(self, request: web.Request, user: str) -> web.Response:
        form = await request.post()
        name = _form_name(form)
        return await self._change(request, lambda b: b.create_scope(name()))

    async def create_collection(self, request: web.Request, user: str) -> web.Response:
        form = await request.post()
        name = _form_name(form)
        scope = request.match_info["scope"]

        def change(b) -> None:
            ttl = _form_ttl(form)
            b.create_collection(scope, name(), ttl)
        return await self._change(request, change)

    async def drop_collection(self, request: web.Request, user: str) -> web.Response:
        scope, coll = request.match_info["scope"], request.match_info["collection"]
        return await self._change(request, lambda b: b.drop_collection(scope, coll))

    async def drop_scope(self, request: web.Request, user: str) -> web.Response:
        scope = request.match_info["scope"]
        return await self._change(request, lambda b: b.drop_scope(scope))


class _FormError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


_NAME_CHARS = "Can only contain characters A-Z, a-z, 0-9 and the following symbols _ - %"


def _form_name(form):
    """A function giving the form's valid `name` (raising _FormError as Couchbase words it)."""
    def name() -> str:
        value = form.get("name")
        if value is None or value == "":
            raise _FormError("name", "The value must be supplied")
        value = str(value)
        if len(value) > MAX_NAME_LENGTH:
            raise _FormError("name", f"Length must be in range from 1 to {MAX_NAME_LENGTH}")
        if value[0] in "_%":
            raise _FormError("name", "First character must not be _ or %")
        if not valid_name(value):
            raise _FormError("name", _NAME_CHARS)
        return value
    return name


def _form_ttl(form) -> int:
    raw = form.get("maxTTL")
    if raw is None or raw == "":
        return 0
    try:
        ttl = int(str(raw))
    except ValueError:
        raise _FormError("maxTTL", "The value must be an integer") from None
    if ttl == -1:  # "never expire" even under a bucket max TTL: this node has none
        return 0
    if not 0 <= ttl <= 0x7FFFFFFF:
        raise _FormError("maxTTL", "The value must be in range from -1 to 2147483647")
    return ttl


def _manifest_error(exc: ManifestError) -> web.Response:
    """The answer Couchbase Server gives for a change that cannot be made."""
    text = str(exc)
    if exc.kind == "limit":
        what = "scopes" if "scopes" in text else "collections"
        return _json({"errors": {"_": f"Maximum number of {what} has been reached for "
                                      "the bucket"}}, status=429)
    if exc.kind == "invalid":
        field = "maxTTL" if "maxTTL" in text else "name"
        return _json({"errors": {field: text}}, status=400)
    msg = _couchbase_words(text)
    return _json({"errors": {"_": msg}}, status=404 if exc.kind == "not-found" else 400)


def _couchbase_words(text: str) -> str:
    """ManifestError's text as Couchbase Server words it."""
    import re

    m = re.match(r"scope '(.*)' (already exists|does not exist)$", text)
    if m:
        verb = "already exists" if m.group(2) == "already exists" else "is not found"
        return f'Scope with name "{m.group(1)}" {verb}'
    m = re.match(r"collection (.*)\.(.*) (already exists|does not exist)$", text)
    if m:
        verb = "already exists" if m.group(3) == "already exists" else "is not found"
        return f'Collection with name "{m.group(2)}" in scope "{m.group(1)}" {verb}'
    if "_default scope" in text:
        return "Deleting _default scope is not allowed"
    if "_default collection" in text:
        return "Deleting _default collection is not allowed"
    return text


class _AccessLog(AbstractAccessLogger):
    """One debug line per request on the node's logger (aiohttp's own goes nowhere)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("%s %s %s -> %d (%.1f ms)", request.remote,
                              shown(request.method, 16), shown(request.path), response.status,
                              time * 1000)


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
