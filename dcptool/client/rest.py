"""A small client of a node's management REST port: a bucket's scopes and collections.

Couchbase Server (and dcptool's reference node) manage scopes and collections over HTTP:

    GET    /pools/default/buckets/NAME/scopes                       the manifest
    POST   /pools/default/buckets/NAME/scopes                       name=S
    POST   /pools/default/buckets/NAME/scopes/S/collections         name=C[&maxTTL=N]
    DELETE /pools/default/buckets/NAME/scopes/S[/collections/C]

with HTTP Basic authentication (the data port's user and password). Changes answer
`{"uid": "<hex manifest uid>"}`. Standard library only (urllib); TLS with the connection
options' CA file and verification.

Where the REST port is: `rest_port_of(conn)` reads it from the node's cluster config
(GET_CLUSTER_CONFIG's `nodesExt[].services.mgmt` / `mgmtSSL` of the node that answers).
"""
from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from dcptool.protocol.collections import CollectionsError, Manifest

from .errors import ClientError


class RestError(ClientError):
    """A REST request failed. `status` is the HTTP status (0 when the port could not be
    reached); `forbidden` when the user lacks the privilege (403)."""

    def __init__(self, message: str, *, status: int = 0, host: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, host=host, hint=hint)
        self.status = status

    @property
    def forbidden(self) -> bool:
        return self.status == 403

    @property
    def unreachable(self) -> bool:
        return self.status == 0


class RestClient:
    """Scopes and collections of one bucket over a node's REST port."""

    def __init__(self, host: str, port: int, *, username: str, password: str, bucket: str,
                 tls: bool = False, context: ssl.SSLContext | None = None,
                 timeout: float = 30.0) -> None:
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 literal
        self.base = f"{'https' if tls else 'http'}://{host}:{port}"
        self.address = f"{host}:{port}"
        self.bucket = bucket
        self.timeout = timeout
        self.context = context if tls else None
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self._auth = f"Basic {token}"

    @classmethod
    def for_options(cls, opts: Any, port: int, *, tls: bool | None = None) -> "RestClient":
        """A client for the node of connection options `opts` (ConnOptions) on REST `port`."""
        use_tls = opts.tls if tls is None else tls
        return cls(opts.host, port, username=opts.username, password=opts.password,
                   bucket=opts.bucket, tls=use_tls,
                   context=opts.ssl_context() if use_tls else None,
                   timeout=max(10.0, float(getattr(opts, "timeout", 10.0))))

    # -- requests ------------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        q = urllib.parse.quote
        return "/pools/default/buckets/" + "/".join(q(p, safe="") for p in (self.bucket, *parts))

    def request(self, method: str, path: str, form: dict[str, Any] | None = None) -> Any:
        """Send one request; the JSON answer (None for an empty body). Raises RestError."""
        data = None
        headers = {"Authorization": self._auth, "Accept": "application/json"}
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        what = f"{method} {path} on {self.address}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as rsp:
                body = rsp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read() or b""
            raise RestError(f"{what} failed: HTTP {exc.code}{_reason(body)}", status=exc.code,
                            host=self.address) from None
        except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RestError(f"{what} failed: {reason}", host=self.address) from None
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except ValueError:
            raise RestError(f"{what} answered something that is not JSON",
                            status=200, host=self.address) from None

    # -- scopes and collections -------------------------------------------------------------

    def manifest(self) -> Manifest:
        doc = self.request("GET", self._path("scopes"))
        try:
            return Manifest.from_json(doc)
        except CollectionsError as exc:
            raise RestError(f"the manifest {self.address} answered is malformed: {exc}",
                            status=200, host=self.address) from None

    def create_scope(self, name: str) -> int | None:
        """Create scope `name`; the new manifest uid (None when not answered)."""
        return _uid(self.request("POST", self._path("scopes"), {"name": name}))

    def create_collection(self, scope: str, name: str, max_ttl: int = 0) -> int | None:
        form: dict[str, Any] = {"name": name}
        if max_ttl:
            form["maxTTL"] = int(max_ttl)
        return _uid(self.request("POST", self._path("scopes", scope, "collections"), form))

    def drop_scope(self, name: str) -> int | None:
        return _uid(self.request("DELETE", self._path("scopes", name)))

    def drop_collection(self, scope: str, name: str) -> int | None:
        return _uid(self.request("DELETE", self._path("scopes", scope, "collections", name)))


def _uid(doc: Any) -> int | None:
    if isinstance(doc, dict) and isinstance(doc.get("uid"), str):
        try:
            return int(doc["uid"], 16)
        except ValueError:
            return None
    return None


def _reason(body: bytes) -> str:
    """A short reason from an error body (Couchbase answers JSON or plain text)."""
    text = ""
    try:
        doc = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
    else:
        if isinstance(doc, dict):
            errs = doc.get("errors")
            if isinstance(errs, dict) and errs:
                text = "; ".join(f"{k}: {v}" for k, v in errs.items())
            elif isinstance(errs, list) and errs:
                text = "; ".join(map(str, errs))
            elif doc.get("message"):
                text = str(doc["message"])
                if doc.get("permissions"):
                    text += f" {doc['permissions']}"
            elif doc.get("error"):
                text = str(doc["error"])
        elif isinstance(doc, list) and doc:
            text = "; ".join(map(str, doc))
        elif isinstance(doc, str):
            text = doc
    text = " ".join(text.split())[:200]
    return f" ({text})" if text else ""


def rest_client_for(opts: Any, rest_port: int | None = None, *,
                    select_bucket: bool = False) -> RestClient:
    """A REST client of the node of connection options `opts`: on `rest_port`, or on the
    port the node's cluster config names (the node's global config, or, with
    `select_bucket`, the config of `opts`' bucket: an unknown bucket is told at once)."""
    from dcptool.errors import DcptoolError

    from .topology import cluster_config

    port = rest_port
    if port is None:
        with (opts.connect() if select_bucket else opts.connect(bucket=None)) as conn:
            port = rest_port_of(cluster_config(conn), tls=bool(opts.tls))
        if port is None:
            raise DcptoolError(f"{opts.address} names no REST port in its cluster config",
                               hint="pass --rest-port")
    return RestClient.for_options(opts, port)


def rest_port_of(config: dict[str, Any], *, tls: bool = False) -> int | None:
    """The REST (mgmt, or mgmtSSL with `tls`) port of the node that answered a cluster
    config (`nodesExt` entry with `thisNode`, or the only one). None when it lists none."""
    nodes = config.get("nodesExt") if isinstance(config, dict) else None
    if not isinstance(nodes, list) or not nodes:
        return None
    mine = [n for n in nodes if isinstance(n, dict) and n.get("thisNode")]
    if not mine and len(nodes) == 1:
        mine = nodes
    key = "mgmtSSL" if tls else "mgmt"
    for n in mine:
        port = (n.get("services") or {}).get(key)
        if isinstance(port, int) and port > 0:
            return port
    return None


__all__ = ["RestClient", "RestError", "rest_port_of"]
