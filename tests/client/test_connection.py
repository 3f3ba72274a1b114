"""The blocking connection: address parsing, mechanism choice, SCRAM proofs, opaque matching,
and the typed errors for refused connections, timeouts and closed sockets."""
from __future__ import annotations

import json
import socket

import pytest

from dcptool.client import (
    AuthenticationError,
    ClientTimeout,
    ConnectError,
    Connection,
    ConnectionClosed,
    NotMyVbucketError,
    ProtocolViolation,
    UnknownBucketError,
    parse_cluster_url,
    raise_for_status,
)
from dcptool.client.errors import RequestFailed
from dcptool.client.topology import (
    CLUSTER_SET_MAP,
    CLUSTER_STATUS,
    REPLICATION_HOLD,
    hold_replication,
    node_status,
    set_map,
)
from dcptool.client.watermark import (
    WatermarkNotFound,
    WatermarkUnsupported,
    list_watermarks,
    remove_watermark,
)
from dcptool.client.connection import _sasl_prep_mechs
from dcptool.protocol import encode_frame
from dcptool.protocol.constants import Feature, Magic, Opcode, Status
from dcptool.protocol.messages import FailoverLogResponse, GetFailoverLog, Noop

from .peerutil import Peer


@pytest.mark.parametrize("url,expected", [
    ("couchbase://node1", ("node1", 11210, False)),
    ("couchbase://node1:12000", ("node1", 12000, False)),
    ("couchbases://node1", ("node1", 11207, True)),
    ("couchbases://node1:1", ("node1", 1, True)),
    ("127.0.0.1:11999", ("127.0.0.1", 11999, False)),
    ("localhost", ("localhost", 11210, False)),
    ("COUCHBASE://h/", ("h", 11210, False)),
    ("couchbase://[::1]:5000", ("::1", 5000, False)),
    ("couchbase://a:1,b:2", ("a", 1, False)),
])
def test_parse_cluster_url(url, expected):
    assert parse_cluster_url(url) == expected


@pytest.mark.parametrize("url", ["", "http://h", "couchbase://", "h:notaport", "h:99999"])
def test_parse_cluster_url_rejects(url):
    with pytest.raises(ConnectError) as exc:
        parse_cluster_url(url)
    assert exc.value.exit_code == 2


def test_mechanism_preference():
    all_ = ["PLAIN", "SCRAM-SHA1", "SCRAM-SHA256", "SCRAM-SHA512"]
    assert _sasl_prep_mechs(all_, tls=False) == ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"]
    assert _sasl_prep_mechs(["SCRAM-SHA1", "PLAIN"], tls=False) == ["SCRAM-SHA1"]
    assert _sasl_prep_mechs(["PLAIN"], tls=False) == ["PLAIN"]
    assert _sasl_prep_mechs(all_, tls=True)[-1] == "PLAIN"
    assert _sasl_prep_mechs(["CRAM-MD5"], tls=False) == []


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_refused_connection_names_host_and_port():
    port = _closed_port()
    with pytest.raises(ConnectError) as exc:
        Connection.open("127.0.0.1", port, username="u", password="p", timeout=2)
    assert f"127.0.0.1:{port}" in str(exc.value)
    assert "refused" in str(exc.value)


@pytest.mark.parametrize("offered,used", [
    ("SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN", "SCRAM-SHA512"),
    ("SCRAM-SHA256 SCRAM-SHA1 PLAIN", "SCRAM-SHA256"),
    ("SCRAM-SHA1 PLAIN", "SCRAM-SHA1"),
    ("PLAIN", "PLAIN"),
])
def test_login_uses_strongest_mechanism(offered, used):
    peer = Peer({}, mechs=offered)
    conn = peer.connection()
    feats = conn.hello([Feature.XERROR, Feature.SELECT_BUCKET], "test")
    assert Feature.XERROR in feats
    assert conn.authenticate("admin", "secret") == used
    assert peer.used_mech == used
    conn.select_bucket("default")
    assert conn.bucket == "default"
    conn.close()
    peer.close()


@pytest.mark.parametrize("offered", ["SCRAM-SHA512", "PLAIN"])
def test_wrong_password_names_user_not_password(offered):
    peer = Peer({}, mechs=offered)
    conn = peer.connection()
    with pytest.raises(AuthenticationError) as exc:
        conn.authenticate("admin", "hunter2-wrong")
    msg = str(exc.value)
    assert "'admin'" in msg and "peer:1" in msg
    assert "hunter2" not in msg and "hunter2" not in (exc.value.hint or "")
    conn.close()
    peer.close()


def test_forged_server_signature_is_refused():
    peer = Peer({}, mechs="SCRAM-SHA256", forge_signature=True)
    conn = peer.connection()
    with pytest.raises(AuthenticationError) as exc:
        conn.authenticate("admin", "secret")
    assert "signature" in str(exc.value)
    conn.close()
    peer.close()


def test_no_usable_mechanism():
    peer = Peer({}, mechs="CRAM-MD5 OAUTHBEARER")
    conn = peer.connection()
    with pytest.raises(AuthenticationError, match="no SASL mechanism"):
        conn.authenticate("admin", "secret")
    peer.close()


def test_unknown_bucket():
    peer = Peer({})
    conn = peer.connection()
    with pytest.raises(UnknownBucketError) as exc:
        conn.select_bucket("nope")
    assert "'nope'" in str(exc.value)
    peer.close()


def test_request_matches_opaque_and_keeps_other_frames():
    def failover(p, f):
        # an unrelated server request and a stray response arrive before the answer
        p.send_raw(encode_frame(Magic.REQUEST, Opcode.DCP_NOOP, 0, 77))
        p.send_raw(encode_frame(Magic.RESPONSE, Opcode.NOOP, 0, f.opaque + 1000))
        p.reply(f, value=(5).to_bytes(8, "big") + (0).to_bytes(8, "big"))

    peer = Peer({Opcode.GET_FAILOVER_LOG: failover})
    conn = peer.connection()
    rsp = conn.request(GetFailoverLog(vbucket=3))
    assert isinstance(rsp, FailoverLogResponse)
    assert rsp.entries == ((5, 0),)
    first = conn.recv_frame()
    assert first.opcode == Opcode.DCP_NOOP and first.opaque == 77
    second = conn.recv_frame()
    assert second.opcode == Opcode.NOOP
    peer.close()


def test_timeout_and_close():
    peer = Peer({Opcode.NOOP: lambda p, f: None})  # never answers
    conn = peer.connection(timeout=0.2)
    with pytest.raises(ClientTimeout, match="peer:1"):
        conn.request(Noop())
    peer.close()
    with pytest.raises(ConnectionClosed, match="closed the connection"):
        conn.recv_frame()


def test_garbage_is_a_protocol_violation():
    peer = Peer({Opcode.NOOP: lambda p, f: p.send_raw(b"\x42" * 24)})
    conn = peer.connection()
    with pytest.raises(ProtocolViolation):
        conn.request(Noop())
    peer.close()


def test_not_my_vbucket_names_the_vbucket():
    peer = Peer({Opcode.GET_FAILOVER_LOG: lambda p, f: p.reply(f, status=Status.NOT_MY_VBUCKET)})
    conn = peer.connection()
    rsp = conn.request(GetFailoverLog(vbucket=513))
    with pytest.raises(NotMyVbucketError) as exc:
        raise_for_status(rsp, "GET_FAILOVER_LOG", address=conn.address, vbucket=513)
    assert exc.value.vbucket == 513 and "vbucket 513" in str(exc.value)
    peer.close()


# -- one way to send a request and read its error: Connection.call (raise_for_status), with
# the cluster commands' and the watermark table's own readings passed as errors=

def _answer(status: int, value: bytes = b""):
    return lambda p, f: p.reply(f, status=status, value=value)


def _context(text: str) -> bytes:
    return json.dumps({"error": {"context": text}}).encode()


def test_call_returns_the_response_or_raises_the_common_error():
    peer = Peer({Opcode.GET_FAILOVER_LOG: _answer(Status.NOT_MY_VBUCKET),
                 Opcode.NOOP: _answer(Status.EACCESS)})
    conn = peer.connection()
    with pytest.raises(NotMyVbucketError) as exc:
        conn.call(GetFailoverLog(vbucket=9), "GET_FAILOVER_LOG", vbucket=9)
    assert exc.value.vbucket == 9 and "vbucket 9" in str(exc.value)
    with pytest.raises(AuthenticationError, match="peer:1 denied NOOP: EACCESS"):
        conn.call(Noop(), "NOOP")
    peer.close()


def test_call_lets_the_caller_read_a_status_first():
    seen = []

    def mine(rsp, what, address):
        seen.append((rsp.status, what, address))
        return ValueError("mine") if rsp.status == Status.EINVAL else None

    peer = Peer({Opcode.NOOP: _answer(Status.EINVAL), Opcode.GET_FAILOVER_LOG:
                 _answer(Status.EBUSY)})
    conn = peer.connection()
    with pytest.raises(ValueError, match="mine"):
        conn.call(Noop(), "NOOP", errors=mine)
    with pytest.raises(RequestFailed, match="GET_FAILOVER_LOG on peer:1 failed: EBUSY"):
        conn.call(GetFailoverLog(vbucket=0), "GET_FAILOVER_LOG", errors=mine)
    assert seen == [(Status.EINVAL, "NOOP", "peer:1"),
                    (Status.EBUSY, "GET_FAILOVER_LOG", "peer:1")]
    peer.close()


def test_cluster_commands_read_every_failure_as_request_failed_with_its_context():
    peer = Peer({CLUSTER_STATUS: _answer(Status.UNKNOWN_COMMAND),
                 CLUSTER_SET_MAP: _answer(Status.EINVAL, _context("no 'this' in the map")),
                 REPLICATION_HOLD: _answer(Status.EACCESS)})
    conn = peer.connection()
    with pytest.raises(RequestFailed, match=r"^CLUSTER_STATUS on peer:1 failed: UNKNOWN_COMMAND: "
                       r"the node does not support clusters \(an older dcptool node\?\)$"):
        node_status(conn)
    with pytest.raises(RequestFailed, match="^CLUSTER_SET_MAP on peer:1 failed: EINVAL: "
                                            "no 'this' in the map$"):
        set_map(conn, {})
    with pytest.raises(RequestFailed, match="^REPLICATION_HOLD on peer:1 failed: EACCESS$"):
        hold_replication(conn, 3, None)
    peer.close()


def test_watermark_commands_read_their_own_statuses_then_the_common_ones():
    answers = iter([_answer(Status.UNKNOWN_COMMAND),
                    _answer(Status.KEY_ENOENT, _context("no row named app")),
                    _answer(Status.KEY_ENOENT),
                    _answer(Status.EINVAL, _context("ttl must be positive")),
                    _answer(Status.EACCESS),
                    _answer(Status.SUCCESS, b"[1]")])
    peer = Peer({Opcode.HWT_LIST: lambda p, f: next(answers)(p, f),
                 Opcode.HWT_REMOVE: lambda p, f: next(answers)(p, f)})
    conn = peer.connection()
    with pytest.raises(WatermarkUnsupported, match="peer:1 has no high watermark table support "
                                                   r"\(it answered UNKNOWN_COMMAND to HWT_LIST\)"):
        list_watermarks(conn)
    with pytest.raises(WatermarkNotFound, match="^no row named app$"):
        remove_watermark(conn, "app")
    with pytest.raises(WatermarkNotFound, match="^HWT_REMOVE: nothing matched$"):
        remove_watermark(conn, "app")
    with pytest.raises(RequestFailed, match="^peer:1 refused HWT_LIST: ttl must be positive$"):
        list_watermarks(conn)
    with pytest.raises(AuthenticationError, match="peer:1 denied HWT_LIST: EACCESS"):
        list_watermarks(conn)
    with pytest.raises(RequestFailed, match="answered HWT_LIST with a value that is not a JSON"):
        list_watermarks(conn)
    peer.close()
