"""SCRAM as kv_engine accepts it, and failed logins in the node's log.

Couchbase's C++ SDK core (under the Python, Node.js and other SDKs) logs in with
SCRAM-SHA512 and a client nonce written as text with spaces (`0x3f 0xffffffc8 ...`).
kv_engine rejects a client nonce only for ',' or a character that is not printable; the
node must accept the same nonces and reject the same ones. The client side of the
exchange below is computed here from RFC 5802 with hashlib, independently of the node.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time

import pytest

from dcptool.node.auth import SaslSession, Users, valid_client_nonce
from dcptool.protocol.constants import Opcode, Status
from .mcbputil import Client

PASSWORD = "password"  # the shared node's Administrator password
HASHES = {"SCRAM-SHA512": "sha512", "SCRAM-SHA256": "sha256", "SCRAM-SHA1": "sha1"}


def sdk_nonce() -> str:
    """A nonce in the shape the C++ SDK core sends: eight signed bytes as hex, spaced."""
    out = []
    for b in os.urandom(8):
        signed = b - 256 if b > 127 else b
        out.append("0x%x" % (signed & 0xFFFFFFFF) if signed < 0 else "0x%x" % signed)
    return " ".join(out)


def scram_login(c: Client, user: str, password: str, nonce: str,
                mech: str = "SCRAM-SHA512") -> tuple[int, int | None]:
    """(status of SASL_AUTH, status of SASL_STEP or None); checks the server signature."""
    h = HASHES[mech]
    bare = f"n={user},r={nonce}"
    f = c.call(Opcode.SASL_AUTH, key=mech.encode(), value=("n,," + bare).encode())
    if f.status != Status.AUTH_CONTINUE:
        return f.status, None
    server_first = f.value.decode()
    attrs = dict(part.split("=", 1) for part in server_first.split(","))
    assert attrs["r"].startswith(nonce) and len(attrs["r"]) > len(nonce)
    salted = hashlib.pbkdf2_hmac(h, password.encode(), base64.b64decode(attrs["s"]),
                                 int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", h).digest()
    stored_key = hashlib.new(h, client_key).digest()
    without_proof = f"c={base64.b64encode(b'n,,').decode()},r={attrs['r']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, h).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    final = f"{without_proof},p={base64.b64encode(proof).decode()}"
    f = c.call(Opcode.SASL_STEP, key=mech.encode(), value=final.encode())
    if f.status == Status.SUCCESS:
        server_key = hmac.new(salted, b"Server Key", h).digest()
        expected = base64.b64encode(hmac.new(server_key, auth_message, h).digest()).decode()
        assert f.value.decode() == f"v={expected}"
    return Status.AUTH_CONTINUE, f.status


def node_log(node) -> str:
    path = node.data_dir / "logs" / "node.log"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if "login failed" in text:
            return text
        time.sleep(0.05)
    return path.read_text(errors="replace") if path.exists() else ""


# -- the rule itself -----------------------------------------------------------------------


@pytest.mark.parametrize("nonce", ["0x3f 0xffffffc8 0x12 0x7f", "abc def", " ", "~!@#$%^&*()"])
def test_printable_nonces_with_spaces_are_valid(nonce):
    assert valid_client_nonce(nonce)


@pytest.mark.parametrize("nonce", ["", "a,b", "tab\there", "bell\x07", "del\x7f", "caf\u00e9",
                                   "new\nline"])
def test_comma_empty_and_unprintable_nonces_are_not(nonce):
    assert not valid_client_nonce(nonce)


def test_session_reports_why_a_message_was_refused(tmp_path):
    users = Users(tmp_path / "users.json")
    users.set_password("u", "pw")
    s = SaslSession(users)
    assert s.start("SCRAM-SHA512", b"n,,n=u,r=bad\x01nonce")[0] == "error"
    assert s.bad_param and "nonce" in s.reason
    s = SaslSession(users)
    assert s.start("SCRAM-SHA512", b"p=tls-unique,,n=u,r=abc")[0] == "error"
    assert s.bad_param and "channel binding" in s.reason
    s = SaslSession(users)
    assert s.start("SCRAM-SHA512", b"n,,n=u,r=abc,x=1")[0] == "error"
    assert s.bad_param
    s = SaslSession(users)
    assert s.start("SCRAM-SHA512", b"n,,n=u,r=0x3f 0xffffffc8")[0] == "continue"


# -- against a running node ----------------------------------------------------------------


@pytest.mark.parametrize("mech", sorted(HASHES))
def test_sdk_shaped_nonce_logs_in(shared_node, mech):
    with Client(shared_node.host, shared_node.port) as c:
        assert scram_login(c, "Administrator", PASSWORD, sdk_nonce(), mech) == (
            Status.AUTH_CONTINUE, Status.SUCCESS)
        assert c.select_bucket().status == Status.SUCCESS


def test_unprintable_nonce_is_refused_and_logged(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        status, _ = scram_login(c, "Administrator", PASSWORD, "0x3f\x01 0x12")
        assert status == Status.EINVAL
        # the connection may try again
        assert scram_login(c, "Administrator", PASSWORD, sdk_nonce()) == (
            Status.AUTH_CONTINUE, Status.SUCCESS)
    text = node_log(shared_node)
    line = next(ln for ln in text.splitlines() if "nonce" in ln and "login failed" in ln)
    assert "SCRAM-SHA512" in line and "Administrator" in line


def test_wrong_password_is_logged_without_secrets(shared_node):
    secret = "not-the-password-5e1f"
    with Client(shared_node.host, shared_node.port) as c:
        assert scram_login(c, "Administrator", secret, sdk_nonce()) == (
            Status.AUTH_CONTINUE, Status.AUTH_ERROR)
        assert c.auth_plain("Administrator", secret + "-plain").status == Status.AUTH_ERROR
    text = node_log(shared_node)
    failed = [ln for ln in text.splitlines() if "login failed" in ln]
    assert any("SCRAM-SHA512" in ln and "wrong password" in ln for ln in failed)
    assert any("PLAIN" in ln and "wrong password" in ln for ln in failed)
    assert secret not in text


def test_unknown_user_fails_at_the_proof_like_a_wrong_password(shared_node):
    with Client(shared_node.host, shared_node.port) as c:
        assert scram_login(c, "nobody", PASSWORD, sdk_nonce()) == (
            Status.AUTH_CONTINUE, Status.AUTH_ERROR)
    assert any("unknown user 'nobody'" in ln for ln in node_log(shared_node).splitlines())
