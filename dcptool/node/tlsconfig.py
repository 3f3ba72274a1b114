"""The node's TLS: the listeners' context and who a client certificate logs in as.

Ciphers: TLS 1.3 suites (all AEAD) and, for TLS 1.2, ECDHE/DHE key exchange with AES-GCM or
ChaCha20-Poly1305 only: no CBC suite (ECDHE-RSA-AES128-SHA256 and the like) is offered on
the KV or the REST listener.

Client certificates (`node start --client-ca FILE`): the TLS listeners ask a client for a
certificate and verify it against FILE. A verified certificate logs the connection in as
the user its rules name, as Couchbase Server's client certificate authentication does
(`couchbase-cli ssl-manage --set-client-auth`, docs/compatibility.md "Client
certificates"): the rules are a JSON document

    {"state": "enable", "prefixes": [{"path": "subject.cn", "prefix": "", "delimiter": ""}]}

- `state`: "enable" (a certificate is optional: a client without one logs in with SASL or
  HTTP Basic as before) or "mandatory" (a client without a trusted certificate is refused
  at the handshake);
- `prefixes`: tried in order, the first that yields a name wins. `path` is where the name
  is read: `subject.cn` (the subject's common name), `san.uri`, `san.dnsname` or
  `san.email` (each value of that kind in the subjectAltName, in order). A rule applies to
  a value that starts with `prefix` (when set), which is cut off; then, when `delimiter`
  is set, the name ends before the first of its characters found (`@` turns
  `backup@example.com` into `backup`). An empty result does not match.

The name must be a user of the node (`node user`), whose roles apply as after a password
login. A certificate whose rules name no user is refused: on KV the connection is
closed, on REST the request is answered 401.
"""
from __future__ import annotations

import json
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcptool.errors import DcptoolError, UsageError

from .connection import Connection

log = logging.getLogger("dcptool.node.auth")

#: TLS 1.2 suites the node offers: forward secrecy and AEAD only (TLS 1.3's are all AEAD)
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL:!eNULL:!DSS"
#: where a user name may be read from in a client certificate
PATHS = ("subject.cn", "san.uri", "san.dnsname", "san.email")
STATES = ("enable", "mandatory")
_SAN_KEYS = {"san.uri": "URI", "san.dnsname": "DNS", "san.email": "email"}


@dataclass(frozen=True)
class Rule:
    path: str
    prefix: str = ""
    delimiter: str = ""

    def apply(self, value: str) -> str | None:
        if self.prefix:
            if not value.startswith(self.prefix):
                return None
            value = value[len(self.prefix):]
        if self.delimiter:
            cut = [i for i in (value.find(c) for c in self.delimiter) if i >= 0]
            if cut:
                value = value[:min(cut)]
        return value or None


@dataclass(frozen=True)
class ClientAuth:
    """How client certificates log in (see the module's doc)."""

    state: str = "enable"
    rules: tuple[Rule, ...] = field(default_factory=lambda: (Rule("subject.cn"),))

    @classmethod
    def parse(cls, doc: Any, *, what: str = "--client-auth") -> "ClientAuth":
        if not isinstance(doc, dict):
            raise UsageError(f"{what}: expected a JSON object with state and prefixes")
        state = doc.get("state", "enable")
        if state not in STATES:
            raise UsageError(f"{what}: state {state!r} is not one of {', '.join(STATES)}")
        raw = doc.get("prefixes", [{"path": "subject.cn"}])
        if not isinstance(raw, list) or not raw:
            raise UsageError(f"{what}: prefixes must be a non-empty list")
        rules = []
        for i, r in enumerate(raw):
            if not isinstance(r, dict) or r.get("path") not in PATHS:
                raise UsageError(f"{what}: prefixes[{i}].path must be one of "
                                 f"{', '.join(PATHS)}")
            prefix, delim = r.get("prefix", ""), r.get("delimiter", "")
            if not isinstance(prefix, str) or not isinstance(delim, str):
                raise UsageError(f"{what}: prefixes[{i}]: prefix and delimiter are strings")
            rules.append(Rule(r["path"], prefix, delim))
        return cls(state, tuple(rules))

    @classmethod
    def load(cls, path: Path | None) -> "ClientAuth":
        if path is None:
            return cls()
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"--client-auth {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise UsageError(f"--client-auth {path}: not JSON ({exc})") from None
        return cls.parse(doc, what=f"--client-auth {path}")

    def user_of(self, cert: dict[str, Any] | None) -> str | None:
        """The user name the rules read from a verified peer certificate (as
        `SSLSocket.getpeercert()` returns it), or None."""
        if not cert:
            return None
        for rule in self.rules:
            for value in _values(cert, rule.path):
                name = rule.apply(value)
                if name is not None:
                    return name
        return None


def _values(cert: dict[str, Any], path: str) -> list[str]:
    if path == "subject.cn":
        return [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
    key = _SAN_KEYS[path]
    return [v for k, v in cert.get("subjectAltName", ()) if k == key]


def server_context(cert: Path, key: Path, client_ca: Path | None = None,
                   client_auth: ClientAuth | None = None) -> ssl.SSLContext:
    """The listeners' context: TLS 1.2 or later, AEAD suites only; with `client_ca`, client
    certificates verified against it (required when the state is mandatory)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise DcptoolError(f"cannot load --tls-cert/--tls-key: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None
    if client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(client_ca))
        except (OSError, ssl.SSLError) as exc:
            raise DcptoolError(f"cannot load --client-ca {client_ca}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from None
        mandatory = client_auth is not None and client_auth.state == "mandatory"
        ctx.verify_mode = ssl.CERT_REQUIRED if mandatory else ssl.CERT_OPTIONAL
    return ctx


def certificate_user(node: Any, transport: Any) -> str | None:
    """The node user a TLS transport's verified client certificate logs in as; None when
    the client sent no certificate (or client certificates are off). Raises LookupError
    when a certificate was sent but its rules name no user of the node."""
    auth = getattr(node, "client_auth", None)
    if auth is None or transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    if not cert:
        return None
    name = auth.user_of(cert)
    if name is None or name not in node.users.users:
        raise LookupError("no user" if name is None else f"unknown user {name[:64]!r}")
    return name


class TlsConnection(Connection):
    """A connection accepted on the TLS listener: a client certificate logs it in."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if not self.closing and self.transport is not None:
            login_by_certificate(self, transport)


def login_by_certificate(conn: Any, transport: Any) -> None:
    """A KV connection on the TLS listener: log it in as its certificate's user (the
    session then skips SASL, as with Couchbase Server); a certificate that names no user
    closes it."""
    try:
        name = certificate_user(conn.node, transport)
    except LookupError as exc:
        log.warning("%s: client certificate refused: %s", conn.peer, exc)
        conn.node.auth_failures = getattr(conn.node, "auth_failures", 0) + 1
        conn.close()
        return
    if name is None:
        return
    conn.authenticated = True
    conn.user = name
    conn.privileges = conn.node.users.privileges(name)
    timer = conn._timers.pop("auth", None)
    if timer is not None:
        timer.cancel()
    if conn.bucket is None and name in conn.node.buckets:
        # kv_engine selects the bucket named like the user
        conn.bucket = conn.node.buckets[name]
        conn.privileges = conn.node.users.privileges(name, bucket=name)
