"""Users and SASL: salted SCRAM credentials on disk, SCRAM-SHA* and PLAIN on the wire.

The users file (`DIR/users.json`, mode 0600) holds, per user, its roles (see
`dcptool.node.access`) and, per hash, the SCRAM salt, iteration count, StoredKey and
ServerKey (RFC 5802). The password itself is never written. PLAIN logins are checked by
deriving the StoredKey from the given password with the stored salt and comparing it.

Couchbase spells the mechanisms `SCRAM-SHA512`, `SCRAM-SHA256`, `SCRAM-SHA1`; scramp
uses the IANA names with a hyphen, hence `MECHANISMS`.
"""
from __future__ import annotations

import base64
import hmac
import json
import os
from pathlib import Path
from typing import Any

from dcptool.errors import DcptoolError

from .access import DEFAULT_ROLES, check_roles, privileges_of

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

    def privileges(self, username: str) -> frozenset:
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


class SaslSession:
    """One SASL exchange on one connection.

    `start(mechanism, payload)` and `step(mechanism, payload)` return
    (status, response bytes, username or None when not done); status is "ok",
    "continue" or "error".
    """

    def __init__(self, users: Users) -> None:
        self.users = users
        self.mechanism: str | None = None
        self._server = None
        self._username: str | None = None

    def start(self, mechanism: str, payload: bytes) -> tuple[str, bytes, str | None]:
        self.mechanism = mechanism
        self._server = None
        if mechanism == "PLAIN":
            parts = payload.split(b"\x00")
            if len(parts) != 3:
                return "error", b"", None
            _authzid, user, password = parts
            try:
                username = user.decode("utf-8")
                pw = password.decode("utf-8")
            except UnicodeDecodeError:
                return "error", b"", None
            if self.users.check_password(username, pw):
                return "ok", b"", username
            return "error", b"", None
        scramp_name = MECHANISMS.get(mechanism)
        if scramp_name is None:
            return "error", b"", None
        from scramp import ScramMechanism

        users = self.users

        def auth_fn(username: str):
            self._username = username
            return users.scram_auth_info(username, mechanism)

        try:
            server = ScramMechanism(scramp_name).make_server(auth_fn)
            server.set_client_first(payload.decode("utf-8"))
            first = server.get_server_first()
        except Exception:
            return "error", b"", None
        self._server = server
        return "continue", first.encode("utf-8"), None

    def step(self, mechanism: str, payload: bytes) -> tuple[str, bytes, str | None]:
        server = self._server
        if server is None or mechanism != self.mechanism:
            return "error", b"", None
        self._server = None
        try:
            server.set_client_final(payload.decode("utf-8"))
            final = server.get_server_final()
        except Exception:
            return "error", b"", None
        return "ok", final.encode("utf-8"), self._username
