"""Users and SASL: salted SCRAM credentials on disk, SCRAM-SHA* and PLAIN on the wire.

The users file (`DIR/users.json`, mode 0600) holds, per user, its roles (see
`dcptool.node.access`) and, per hash, the SCRAM salt, iteration count, StoredKey and
ServerKey (RFC 5802). The password itself is never written. PLAIN logins are checked by
deriving the StoredKey from the given password with the stored salt and comparing it.

Couchbase spells the mechanisms `SCRAM-SHA512`, `SCRAM-SHA256`, `SCRAM-SHA1`; scramp
uses the IANA names with a hyphen, hence `MECHANISMS`. scramp derives the credentials;
the server side of an exchange is `ScramServer`, which reads the client's messages by
kv_engine's rules (scramp's server applies RFC 5802's stricter nonce rule, which refuses
the nonces Couchbase's own SDKs send).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from dcptool.errors import DcptoolError

from .access import DEFAULT_ROLES, check_roles, privileges_of
from dcptool.logsafe import shown

#: Couchbase's mechanism name -> scramp's
MECHANISMS = {
    "SCRAM-SHA512": "SCRAM-SHA-512",
    "SCRAM-SHA256": "SCRAM-SHA-256",
    "SCRAM-SHA1": "SCRAM-SHA-1",
}
#: what SASL_LIST_MECHS answers, strongest first (as kv_engine lists them)
MECHANISM_LIST = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")

USERS_FILE = "users.json"


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _unb64(s: str) -> bytes:
    return base64.b64decode(s)


def make_credentials(password: str) -> dict[str, dict[str, Any]]:
    """Salted SCRAM credentials for every supported hash."""
    from scramp import ScramMechanism

    out = {}
    for cb_name, scramp_name in MECHANISMS.items():
        salt, stored_key, server_key, iterations = ScramMechanism(scramp_name).make_auth_info(password)
        out[cb_name] = {"salt": _b64(salt), "iterations": iterations,
                        "stored_key": _b64(stored_key), "server_key": _b64(server_key)}
    return out


class Users:
    """The user database of one node directory."""

    def __init__(self, path: Path, users: dict[str, dict[str, Any]] | None = None) -> None:
        self.path = Path(path)
        self.users: dict[str, dict[str, Any]] = users or {}

    @classmethod
    def load(cls, data_dir: Path) -> "Users":
        path = Path(data_dir) / USERS_FILE
        if not path.exists():
            return cls(path)
        try:
            doc = json.loads(path.read_text())
            users = doc["users"]
            if not isinstance(users, dict):
                raise ValueError("users is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DcptoolError(f"cannot read {path}: {exc}") from None
        return cls(path, users)

    def save(self) -> None:
        doc = {"version": 1, "users": self.users}
        tmp = self.path.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, self.path)

    def set_password(self, username: str, password: str) -> None:
        """Create `username` (an admin) or change its password (its roles stay)."""
        roles = self.roles(username) if username in self.users else list(DEFAULT_ROLES)
        self.users[username] = {"scram": make_credentials(password), "roles": roles}

    def add(self, username: str, password: str, roles) -> None:
        """Create or replace `username` with these roles (ValueError for unknown roles)."""
        self.users[username] = {"scram": make_credentials(password), "roles": check_roles(roles)}

    def remove(self, username: str) -> bool:
        return self.users.pop(username, None) is not None

    def roles(self, username: str) -> list[str]:
        """The user's roles (admin for entries written before roles existed)."""
        roles = self.users.get(username, {}).get("roles")
        if roles is None:
            return list(DEFAULT_ROLES)
        return [r for r in roles if isinstance(r, str)]

    def privileges(self, username: str, bucket: str | None = None) -> frozenset:
        if username not in self.users:
            return frozenset()
        return privileges_of(self.roles(username))

    def __bool__(self) -> bool:
        return bool(self.users)

    def check_password(self, username: str, password: str) -> bool:
        """PLAIN: does `password` derive the stored SCRAM key of `username`?"""
        from scramp import ScramMechanism

        cred = self.users.get(username, {}).get("scram", {}).get("SCRAM-SHA512")
        if cred is None:
            return False
        try:
            _salt, stored_key, _server_key, _it = ScramMechanism("SCRAM-SHA-512").make_auth_info(
                password, iteration_count=cred["iterations"], salt=_unb64(cred["salt"]))
        except Exception:
            return False
        return hmac.compare_digest(stored_key, _unb64(cred["stored_key"]))

    def scram_auth_info(self, username: str, mechanism: str) -> tuple[bytes, bytes, bytes, int]:
        """(salt, stored_key, server_key, iterations) for scramp; KeyError for unknown users."""
        cred = self.users[username]["scram"][mechanism]
        return (_unb64(cred["salt"]), _unb64(cred["stored_key"]), _unb64(cred["server_key"]),
                int(cred["iterations"]))


#: Couchbase's SCRAM mechanism name -> hashlib's name
SCRAM_HASHES = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}
#: iteration count offered for an unknown user (the exchange fails at the proof, as for a
#: wrong password, so a client cannot tell the two apart)
_DUMMY_ITERATIONS = 15000


class SaslError(Exception):
    """A failed SASL exchange: `reason` is for the node's log (never a password or proof);
    `bad_param` marks a malformed message (EINVAL on the wire, as kv_engine answers
    BAD_PARAM) as opposed to a failed login (AUTH_ERROR)."""

    def __init__(self, reason: str, *, bad_param: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.bad_param = bad_param


def _attributes(message: str) -> dict[str, str]:
    """`k=value,k=value` as kv_engine's SCRAM server reads it: one-character keys, each at
    most once, values up to the next comma."""
    attrs: dict[str, str] = {}
    for part in message.split(","):
        key, eq, value = part.partition("=")
        if not eq:
            raise SaslError("attribute without '='", bad_param=True)
        if len(key) != 1:
            raise SaslError("attribute key is not one character", bad_param=True)
        if key in attrs:
            raise SaslError(f"attribute {shown(key)} given twice", bad_param=True)
        attrs[key] = value
    return attrs


def _decode_username(name: str) -> str:
    """RFC 5802 5.1: ',' and '=' travel as '=2C' and '=3D'; any other '=' is an error."""
    out = []
    i = 0
    while i < len(name):
        c = name[i]
        if c == "=":
            code = name[i + 1:i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise SaslError("invalid '=' escape in the username", bad_param=True)
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def valid_client_nonce(nonce: str) -> bool:
    """kv_engine's rule for a SCRAM client nonce, not RFC 5802's stricter one.

    RFC 5802 allows only printable characters other than ',' and excludes the space;
    kv_engine's cbsasl (cbsasl/scram-sha/scram-sha.cc, `ScramShaBackend::addAttribute`
    for the 'r' attribute) rejects a nonce only for ',' or a character that C's
    `isprint()` refuses, so 0x20-0x7e pass, the space included. Couchbase's C++ SDK core
    (under the Python, Node.js and other SDKs) sends nonces such as
    `0x3f 0xffffffc8 ...`, with spaces, and logs in to Couchbase Server with them.
    """
    return bool(nonce) and all(0x20 <= ord(c) <= 0x7E and c != "," for c in nonce)


class ScramServer:
    """The server side of one SCRAM-SHA exchange (RFC 5802), accepting what kv_engine does.

    The arithmetic is RFC 5802's: ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage)
    must hash to the StoredKey, and the answer carries HMAC(ServerKey, AuthMessage).
    Only the message parsing follows kv_engine: the client-first message must start with
    `n,` (no channel binding), carries exactly the attributes `n` and `r`, and the client
    nonce is checked with `valid_client_nonce`.
    """

    def __init__(self, users: Users, mechanism: str) -> None:
        self.users = users
        self.mechanism = mechanism
        self.hash = SCRAM_HASHES[mechanism]
        self.username: str | None = None
        self.known_user = False
        self._nonce = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._stored_key = b""
        self._server_key = b""

    def first(self, message: str) -> str:
        """The server-first message for the client-first `message` (SaslError otherwise)."""
        if not message.startswith("n,"):
            raise SaslError("the client asks for channel binding (gs2 flag is not 'n')",
                            bad_param=True)
        comma = message.find(",", 2)
        if comma < 0:
            raise SaslError("malformed client-first message", bad_param=True)
        self._gs2_header = message[:comma + 1]
        bare = message[comma + 1:]
        attrs = _attributes(bare)
        unknown = sorted(set(attrs) - {"n", "r"})
        if unknown:
            raise SaslError(f"unsupported attribute {shown(unknown[0])} in client-first message",
                            bad_param=True)
        username, nonce = attrs.get("n", ""), attrs.get("r", "")
        if not username or not nonce:
            raise SaslError("client-first message without username or nonce", bad_param=True)
        self.username = _decode_username(username)
        if not valid_client_nonce(nonce):
            raise SaslError("invalid character in the client nonce", bad_param=True)
        try:
            salt, self._stored_key, self._server_key, iterations = self.users.scram_auth_info(
                self.username, self.mechanism)
            self.known_user = True
        except (KeyError, TypeError, ValueError):
            # kv_engine goes on with a dummy user and fails the proof
            salt, iterations = os.urandom(16), _DUMMY_ITERATIONS
        self._client_first_bare = bare
        self._nonce = nonce + secrets.token_hex(12)
        self._server_first = f"r={self._nonce},s={_b64(salt)},i={iterations}"
        return self._server_first

    def final(self, message: str) -> str:
        """The server-final message (`v=...`) when the proof holds (SaslError otherwise)."""
        attrs = _attributes(message)
        proof_at = message.find(",p=")
        if "p" not in attrs or proof_at < 0:
            raise SaslError("client-final message without a proof", bad_param=True)
        if attrs.get("r") != self._nonce:
            raise SaslError("the client-final nonce is not the one the server sent",
                            bad_param=True)
        try:
            binding = base64.b64decode(attrs.get("c", ""), validate=True)
            proof = base64.b64decode(attrs["p"], validate=True)
        except ValueError:
            raise SaslError("client-final message is not valid base64", bad_param=True) from None
        if binding != self._gs2_header.encode():
            raise SaslError("channel binding does not echo the gs2 header", bad_param=True)
        size = hashlib.new(self.hash).digest_size
        if len(proof) != size:
            raise SaslError("client proof has the wrong length", bad_param=True)
        auth_message = ",".join((self._client_first_bare, self._server_first,
                                 message[:proof_at])).encode()
        if not self.known_user:
            raise SaslError(f"unknown user {shown(self.username, 64)}")
        signature = hmac.new(self._stored_key, auth_message, self.hash).digest()
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.new(self.hash, client_key).digest(),
                                   self._stored_key):
            raise SaslError(f"wrong password for user {shown(self.username, 64)}")
        return "v=" + _b64(hmac.new(self._server_key, auth_message, self.hash).digest())


class SaslSession:
    """One SASL exchange on one connection.

    `start(mechanism, payload)` and `step(mechanism, payload)` return
    (status, response bytes, username or None when not done); status is "ok",
    "continue" or "error". After an error, `reason` says why (for the node's log) and
    `bad_param` whether the message itself was malformed.
    """

    def __init__(self, users: Users) -> None:
        self.users = users
        self.mechanism: str | None = None
        self._server: ScramServer | None = None
        self.username: str | None = None
        self.reason = ""
        self.bad_param = False

    def _fail(self, exc: SaslError) -> tuple[str, bytes, None]:
        self._server = None
        self.reason = exc.reason
        self.bad_param = exc.bad_param
        return "error", b"", None

    def start(self, mechanism: str, payload: bytes) -> tuple[str, bytes, str | None]:
        self.mechanism = mechanism
        self._server = None
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            return self._fail(SaslError("the payload is not UTF-8", bad_param=True))
        if mechanism == "PLAIN":
            parts = text.split("\x00")
            if len(parts) != 3:
                return self._fail(SaslError("malformed PLAIN payload", bad_param=True))
            _authzid, username, password = parts
            self.username = username
            if username not in self.users.users:
                return self._fail(SaslError(f"unknown user {shown(username, 64)}"))
            if self.users.check_password(username, password):
                return "ok", b"", username
            return self._fail(SaslError(f"wrong password for user {shown(username, 64)}"))
        if mechanism not in SCRAM_HASHES:
            return self._fail(SaslError(f"unsupported mechanism {shown(mechanism, 32)}"))
        server = ScramServer(self.users, mechanism)
        try:
            first = server.first(text)
        except SaslError as exc:
            self.username = server.username
            return self._fail(exc)
        self.username = server.username
        self._server = server
        return "continue", first.encode("utf-8"), None

    def step(self, mechanism: str, payload: bytes) -> tuple[str, bytes, str | None]:
        server = self._server
        if server is None or mechanism != self.mechanism:
            return self._fail(SaslError("SASL_STEP without a SCRAM exchange in progress"))
        self._server = None
        try:
            final = server.final(payload.decode("utf-8"))
        except UnicodeDecodeError:
            return self._fail(SaslError("the payload is not UTF-8", bad_param=True))
        except SaslError as exc:
            return self._fail(exc)
        return "ok", final.encode("utf-8"), server.username
