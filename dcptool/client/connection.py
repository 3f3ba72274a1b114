"""A blocking connection to a node: connect, HELLO, SASL, SELECT_BUCKET, request/response.

This is the thin I/O layer. The bytes are encoded and decoded by `dcptool.protocol`;
everything here is sockets, timeouts and turning failures into typed errors.

    with Connection.open("127.0.0.1", 11210, username="admin", password=pw) as conn:
        rsp = conn.request(GetFailoverLog(vbucket=0))
"""
from __future__ import annotations

import itertools
import json
import socket
import ssl
import sys
from collections import deque
from typing import Callable, Iterable
from urllib.parse import urlsplit

import scramp

from dcptool import __version__
from dcptool.protocol import (
    Frame,
    ProtocolError,
    decode_frame,
    decode_message,
)
from dcptool.protocol.constants import (
    REQUEST_MAGICS,
    Feature,
    Opcode,
    Status,
    opcode_name,
    status_name,
)
from dcptool.protocol.messages import (
    GenericResponse,
    Hello,
    Request,
    Response,
    SaslAuth,
    SaslListMechs,
    SaslStep,
    SelectBucket,
)

from .errors import (
    AuthenticationError,
    ClientTimeout,
    ConnectError,
    ConnectionClosed,
    NotMyVbucketError,
    ProtocolViolation,
    RequestFailed,
    UnknownBucketError,
)

DEFAULT_PORT = 11210
DEFAULT_TLS_PORT = 11207

#: HELLO features asked for by default
DEFAULT_FEATURES: tuple[int, ...] = (
    Feature.XERROR,
    Feature.XATTR,
    Feature.JSON,
    Feature.SELECT_BUCKET,
    Feature.TCP_NODELAY,
    Feature.MUTATION_SEQNO,
)
#: the default features plus Collections: keys carry their LEB128 collection id
#: (`dcptool.protocol.collections`), every collection is reachable
COLLECTION_FEATURES: tuple[int, ...] = DEFAULT_FEATURES + (Feature.COLLECTIONS,)

#: SASL mechanisms we can use, strongest first, with the name scramp knows them by
_SCRAM = (
    ("SCRAM-SHA512", "SCRAM-SHA-512"),
    ("SCRAM-SHA256", "SCRAM-SHA-256"),
    ("SCRAM-SHA1", "SCRAM-SHA-1"),
)

_RECV_CHUNK = 256 * 1024


def parse_cluster_url(url: str) -> tuple[str, int, bool]:
    """Split `couchbase://h[:p]`, `couchbases://h[:p]`, `h:p` or `h` into (host, port, tls).

    The default port is 11210, or 11207 for `couchbases://`. IPv6 literals go in brackets.
    Raises ConnectError (exit code 2) on anything else.
    """
    text = url.strip()
    if not text:
        raise ConnectError("empty cluster address", exit_code=2)
    tls = False
    if "://" in text:
        scheme, _, rest = text.partition("://")
        scheme = scheme.lower()
        if scheme == "couchbase":
            tls = False
        elif scheme == "couchbases":
            tls = True
        else:
            raise ConnectError(f"unsupported scheme '{scheme}://' in cluster address '{url}'",
                               hint="use couchbase://HOST[:PORT], couchbases://HOST[:PORT] or HOST:PORT",
                               exit_code=2)
        text = rest
    # drop anything after the host part (a path or query string), and a trailing slash
    for sep in ("/", "?", "#"):
        text = text.split(sep, 1)[0]
    if "," in text:
        # a list of seed nodes: the first one is enough for a single-node connection
        text = text.split(",", 1)[0]
    try:
        parts = urlsplit("//" + text)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise ConnectError(f"bad cluster address '{url}': {exc}", exit_code=2) from None
    if not host:
        raise ConnectError(f"no host in cluster address '{url}'", exit_code=2)
    if port is None:
        port = DEFAULT_TLS_PORT if tls else DEFAULT_PORT
    return host, port, tls


#: addresses already warned about (once per process is enough)
_UNVERIFIED_WARNED: set[str] = set()


def _warn_unverified(addr: str) -> None:
    """One line on stderr, once per address: this TLS connection checks no certificate."""
    if addr not in _UNVERIFIED_WARNED:
        _UNVERIFIED_WARNED.add(addr)
        print(f"dcptool: warning: --no-verify: the TLS certificate of {addr} is not checked; "
              "anyone on the path can read and change the traffic", file=sys.stderr)


def _sasl_prep_mechs(offered: Iterable[str], tls: bool) -> list[str]:
    """The mechanisms we would use, in the order we prefer them."""
    names = set(offered)
    out = [cb for cb, _ in _SCRAM if cb in names]
    if "PLAIN" in names and (tls or not out):
        out.append("PLAIN")
    return out


class Connection:
    """One authenticated connection to one node, with a bucket selected.

    Not thread safe. `request` matches responses by opaque; frames that arrive
    while waiting and do not match are kept and handed out by `recv_frame` later.
    """

    def __init__(self, sock: socket.socket, host: str, port: int, *, timeout: float | None = 10.0,
                 tls: bool = False) -> None:
        self.sock = sock
        self.host = host
        self.port = port
        self.tls = tls
        self.timeout = timeout
        self.features: frozenset[int] = frozenset()
        self.mechanism: str | None = None
        self.username: str | None = None
        self.bucket: str | None = None
        self._buf = bytearray()
        self._pos = 0
        self._pending: deque[Frame] = deque()
        self._opaques = itertools.count(0x10000)
        self._closed = False
        sock.settimeout(timeout)

    # ------------------------------------------------------------------ set-up

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def connect(cls, host: str, port: int, *, tls: ssl.SSLContext | None = None,
                timeout: float | None = 10.0) -> "Connection":
        """Open the TCP (and TLS) connection only; no HELLO, no login."""
        addr = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except ConnectionRefusedError:
            raise ConnectError(f"cannot connect to {addr}: connection refused",
                               host=addr, hint="is the node running and is the port right?") from None
        except socket.gaierror as exc:
            raise ConnectError(f"cannot resolve host '{host}': {exc.strerror}", host=addr) from None
        except (socket.timeout, TimeoutError):
            raise ConnectError(f"cannot connect to {addr}: timed out after {timeout:g}s",
                               host=addr) from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {addr}: {exc.strerror or exc}", host=addr) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                raise ConnectError(f"TLS certificate of {addr} not trusted: {exc.verify_message}",
                                   host=addr, hint="pass --cacert FILE, or --no-verify") from None
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                raise ConnectError(f"TLS handshake with {addr} failed: {exc}", host=addr) from None
            if tls.verify_mode == ssl.CERT_NONE:
                _warn_unverified(addr)
        return cls(sock, host, port, timeout=timeout, tls=tls is not None)

    @classmethod
    def open(cls, host: str, port: int = DEFAULT_PORT, *, username: str, password: str | None,
             bucket: str | None = "default", tls: ssl.SSLContext | None = None,
             timeout: float | None = 10.0, features: Iterable[int] = DEFAULT_FEATURES,
             agent: str | None = None, mechanisms: Iterable[str] | None = None) -> "Connection":
        """Connect, HELLO, authenticate and select `bucket` (None: select no bucket).

        `mechanisms` restricts the SASL mechanisms that may be used (default: the
        strongest SCRAM the node offers; PLAIN only over TLS or when nothing else is offered).
        `password` None: no SASL, the client certificate in `tls` logged the connection in.
        """
        conn = cls.connect(host, port, tls=tls, timeout=timeout)
        try:
            conn.hello(features, agent or f"dcptool/{__version__}")
            if password is not None:
                conn.authenticate(username, password, mechanisms=mechanisms)
            else:
                conn.mechanism = "certificate"
            if bucket is not None:
                conn.select_bucket(bucket)
        except BaseException:
            conn.close()
            raise
        return conn

    def hello(self, features: Iterable[int] = DEFAULT_FEATURES, agent: str = "") -> frozenset[int]:
        rsp = self.request(Hello(user_agent=agent or f"dcptool/{__version__}",
                                 features=tuple(int(f) for f in features)))
        if rsp.status != Status.SUCCESS:
            # an old or minimal node: go on without features
            self.features = frozenset()
        else:
            self.features = frozenset(getattr(rsp, "features", ()))
        return self.features

    @property
    def collections(self) -> bool:
        """Did the node accept HELLO Collections? Then every key this connection sends and
        receives starts with its collection id (LEB128)."""
        return Feature.COLLECTIONS in self.features

    def list_mechanisms(self) -> tuple[str, ...]:
        rsp = self.request(SaslListMechs())
        if rsp.status != Status.SUCCESS:
            raise AuthenticationError(
                f"{self.address} refused to list SASL mechanisms ({status_name(rsp.status)})",
                host=self.address)
        return tuple(rsp.mechanisms)

    def authenticate(self, username: str, password: str, *,
                     mechanisms: Iterable[str] | None = None) -> str:
        """SASL login; returns the mechanism used."""
        offered = self.list_mechanisms()
        usable = _sasl_prep_mechs(offered, self.tls)
        if mechanisms is not None:
            wanted = {m.upper() for m in mechanisms}
            usable = [m for m in usable if m in wanted]
            if "PLAIN" in wanted and "PLAIN" in offered and "PLAIN" not in usable:
                usable.append("PLAIN")
        if not usable:
            raise AuthenticationError(
                f"{self.address} offers no SASL mechanism dcptool can use "
                f"(offered: {' '.join(offered) or 'none'})", host=self.address, username=username)
        mech = usable[0]
        if mech == "PLAIN":
            self._auth_plain(username, password)
        else:
            self._auth_scram(mech, dict(_SCRAM)[mech], username, password)
        self.mechanism = mech
        self.username = username
        return mech

    def _auth_failed(self, username: str, rsp: Response | None = None) -> AuthenticationError:
        detail = ""
        if rsp is not None and rsp.status not in (Status.AUTH_ERROR, Status.SUCCESS,
                                                  Status.AUTH_CONTINUE):
            detail = f" ({status_name(rsp.status)})"
        return AuthenticationError(
            f"authentication failed for user '{username}' at {self.address}{detail}",
            host=self.address, username=username,
            hint="check the user name and password")

    def _auth_plain(self, username: str, password: str) -> None:
        payload = b"\x00" + username.encode() + b"\x00" + password.encode()
        rsp = self.request(SaslAuth(mechanism="PLAIN", payload=payload))
        if rsp.status != Status.SUCCESS:
            raise self._auth_failed(username, rsp)

    def _auth_scram(self, mech: str, scramp_name: str, username: str, password: str) -> None:
        try:
            client = scramp.ScramClient([scramp_name], username, password)
            first = client.get_client_first()
        except scramp.ScramException as exc:
            raise AuthenticationError(f"cannot start {mech} for user '{username}': {exc}",
                                      host=self.address, username=username) from None
        rsp = self.request(SaslAuth(mechanism=mech, payload=first.encode()))
        if rsp.status != Status.AUTH_CONTINUE:
            raise self._auth_failed(username, rsp)
        try:
            client.set_server_first(bytes(rsp.value).decode())
            final = client.get_client_final()
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise ProtocolViolation(f"{self.address} sent a bad SCRAM server-first message: {exc}",
                                    host=self.address) from None
        rsp = self.request(SaslStep(mechanism=mech, payload=final.encode()))
        if rsp.status != Status.SUCCESS:
            raise self._auth_failed(username, rsp)
        try:
            client.set_server_final(bytes(rsp.value).decode())
        except (scramp.ScramException, UnicodeDecodeError) as exc:
            raise AuthenticationError(
                f"{self.address} could not prove it knows the password of '{username}' "
                f"(bad SCRAM server signature: {exc})", host=self.address, username=username) from None

    def select_bucket(self, bucket: str) -> None:
        rsp = self.request(SelectBucket(bucket=bucket))
        if rsp.status == Status.SUCCESS:
            self.bucket = bucket
            return
        if rsp.status in (Status.KEY_ENOENT, Status.NO_BUCKET):
            raise UnknownBucketError(f"bucket '{bucket}' not found on {self.address}",
                                     host=self.address, bucket=bucket,
                                     hint="check the bucket name given with -b/--bucket")
        if rsp.status == Status.EACCESS:
            raise UnknownBucketError(
                f"user '{self.username}' may not use bucket '{bucket}' on {self.address}",
                host=self.address, bucket=bucket)
        raise RequestFailed(f"selecting bucket '{bucket}' on {self.address} failed: "
                            f"{status_name(rsp.status)}", host=self.address, status=rsp.status,
                            opcode=Opcode.SELECT_BUCKET)

    # ------------------------------------------------------------------ I/O

    def next_opaque(self) -> int:
        return next(self._opaques) & 0xFFFFFFFF

    def send(self, msg: Request | Response) -> None:
        self.send_bytes(msg.encode())

    def send_bytes(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self.sock.sendall(data)
        except (socket.timeout, TimeoutError):
            raise ClientTimeout(f"sending to {self.address} timed out after {self.timeout:g}s",
                                host=self.address) from None
        except OSError as exc:
            raise ConnectionClosed(f"connection to {self.address} broke while sending: "
                                   f"{exc.strerror or exc}", host=self.address) from None

    def request(self, msg: Request, *, timeout: float | None = ...) -> Response:
        """Send `msg` with a fresh opaque and return the decoded response that matches it."""
        opaque = self.next_opaque()
        frame = msg.to_frame()
        frame.opaque = opaque
        self.send_bytes(frame.encode())
        rsp = self.wait_response(opaque, timeout=timeout)
        return decode_response(rsp, self.address)

    def call(self, msg: Request, what: str, *, vbucket: int | None = None,
             errors: "ErrorMap | None" = None) -> Response:
        """Send `msg` and return its response when it succeeded; otherwise raise the error
        `raise_for_status` names for it (`errors`: the caller's own reading of a failure,
        consulted first)."""
        return raise_for_status(self.request(msg), what, address=self.address,
                                vbucket=vbucket, errors=errors)

    def wait_response(self, opaque: int, *, timeout: float | None = ...) -> Frame:
        """Read frames until the response carrying `opaque`; keep the others for later."""
        skipped: list[Frame] = []
        try:
            while True:
                frame = self._read_frame(timeout)
                if frame.magic not in REQUEST_MAGICS and frame.opaque == opaque:
                    return frame
                skipped.append(frame)
        finally:
            self._pending.extend(skipped)

    def recv_frame(self, timeout: float | None = ...) -> Frame:
        """The next frame from the node (timeout: seconds, None = wait forever, default: the
        connection's timeout). Raises ClientTimeout, ConnectionClosed or ProtocolViolation."""
        if self._pending:
            return self._pending.popleft()
        return self._read_frame(timeout)

    def _read_frame(self, timeout: float | None = ...) -> Frame:
        while True:
            try:
                frame, used = decode_frame(self._buf, self._pos)
            except ProtocolError as exc:
                raise ProtocolViolation(f"{self.address} sent bytes that are not a valid frame: "
                                        f"{exc}", host=self.address) from None
            if frame is not None:
                self._pos += used
                if self._pos == len(self._buf):
                    self._buf.clear()
                    self._pos = 0
                return frame
            self._fill(timeout)

    def _fill(self, timeout: float | None = ...) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        data = self.recv_some(_RECV_CHUNK, timeout)
        self._buf += data

    def recv_some(self, n: int = _RECV_CHUNK, timeout: float | None = ...) -> bytes:
        """Raw bytes from the socket (not the internal buffer); at least one byte."""
        if self._closed:
            raise ConnectionClosed(f"connection to {self.address} is closed", host=self.address)
        if timeout is not ...:
            self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(n)
        except (socket.timeout, TimeoutError):
            t = self.timeout if timeout is ... else timeout
            raise ClientTimeout(f"no response from {self.address} within {t:g}s",
                                host=self.address) from None
        except OSError as exc:
            raise ConnectionClosed(f"connection to {self.address} broke: {exc.strerror or exc}",
                                   host=self.address) from None
        finally:
            if timeout is not ...:
                self.sock.settimeout(self.timeout)
        if not data:
            raise ConnectionClosed(f"{self.address} closed the connection", host=self.address)
        return data

    @property
    def has_buffered(self) -> bool:
        """True when bytes or frames were read from the socket but not handed out yet."""
        return bool(self._pending) or self._pos < len(self._buf)

    def take_buffered(self) -> bytes:
        """Hand over the bytes read from the socket but not yet returned as frames.

        A caller that reads the socket itself from here on (the DCP session's fast path)
        must process these first. Pending whole frames are re-encoded in order.
        """
        out = b"".join(f.encode() for f in self._pending)
        self._pending.clear()
        out += bytes(self._buf[self._pos:])
        self._buf.clear()
        self._pos = 0
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Connection {self.address} bucket={self.bucket!r} {state}>"


def decode_response(frame: Frame, address: str = "node") -> Response:
    try:
        return decode_message(frame)  # type: ignore[return-value]
    except ProtocolError as exc:
        raise ProtocolViolation(f"{address} sent a malformed {opcode_name(frame.opcode)} response: "
                                f"{exc}", host=address) from None


#: a caller's own reading of a failed response: (response, what, node address) -> the error
#: to raise, or None for the common one
ErrorMap = Callable[[Response, str, str], "Exception | None"]


def error_context(rsp: Response) -> str | None:
    """The `error.context` text of a failed response's JSON value (None: there is none)."""
    try:
        doc = json.loads(bytes(getattr(rsp, "value", b"") or b"").decode("utf-8"))
        ctx = doc["error"]["context"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    return str(ctx) if ctx else None


def raise_for_status(rsp: Response, what: str, *, address: str = "node",
                     vbucket: int | None = None, errors: ErrorMap | None = None) -> Response:
    """Return `rsp` when it succeeded, else raise the typed error for its status (the one
    `errors` gives for it first, when the caller has its own reading)."""
    st = rsp.status
    if st == Status.SUCCESS:
        return rsp
    if errors is not None:
        exc = errors(rsp, what, address)
        if exc is not None:
            raise exc
    vb = f" vbucket {vbucket}" if vbucket is not None else ""
    if st == Status.NOT_MY_VBUCKET:
        raise NotMyVbucketError(f"{address} does not hold{vb} (NOT_MY_VBUCKET during {what})",
                                host=address, vbucket=vbucket,
                                config=bytes(getattr(rsp, "value", b"") or b""))
    if st in (Status.AUTH_ERROR, Status.EACCESS):
        raise AuthenticationError(f"{address} denied {what}{vb}: {status_name(st)}", host=address)
    if st == Status.NO_BUCKET:
        raise UnknownBucketError(f"no bucket selected on {address} for {what}", host=address)
    raise RequestFailed(f"{what}{vb} on {address} failed: {status_name(st)}",
                        host=address, status=st, opcode=rsp.opcode, vbucket=vbucket)


__all__ = [
    "Connection", "parse_cluster_url", "raise_for_status", "decode_response", "error_context",
    "ErrorMap",
    "DEFAULT_PORT", "DEFAULT_TLS_PORT", "DEFAULT_FEATURES", "GenericResponse",
]
