"""TLS against a real node: `node start --tls-cert/--tls-key/--tls-port` serves a second,
TLS-only listener; `couchbases://` verifies the node's certificate against --cacert, and
--no-verify works only when asked, with a warning. Certificates are made at test time."""
from __future__ import annotations

import ssl
import warnings

import pytest

from client.nodeutil import json_lines, run_cli
from dcptool.client import Connection
from dcptool.client.options import ConnOptions
from dcptool.protocol.constants import Status
from dcptool.protocol.messages import Get, Set
from dcptool.protocol.vbucket import vbucket_of


def _tls_env(node, cacert=None) -> dict:
    return {"DCPTOOL_CLUSTER": f"couchbases://127.0.0.1:{node.tls_port}",
            "DCPTOOL_USERNAME": node.username, "DCPTOOL_PASSWORD": node.password}


def _one_error_line(r) -> str:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_announces_tls_listener_after_the_plain_one(tls_node):
    lines = [ln for ln in tls_node.stdout_lines if ln.startswith("listening")]
    assert lines[0] == f"listening on 127.0.0.1:{tls_node.port}"
    assert lines[1] == f"listening (tls) on 127.0.0.1:{tls_node.tls_port}"
    assert tls_node.tls_port != tls_node.port


def test_failover_log_over_tls_with_cacert_matches_plain(tls_node, certs):
    plain = run_cli("failover-log", "--json", node=tls_node)
    assert plain.returncode == 0, plain.stderr
    r = run_cli("failover-log", "--json", "--cacert", str(certs.ca), env_extra=_tls_env(tls_node))
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == ""
    assert json_lines(r.stdout) == json_lines(plain.stdout)


def test_kv_round_trip_over_tls_with_scram(tls_node, certs):
    opts = ConnOptions("127.0.0.1", tls_node.tls_port, tls_node.username, tls_node.password,
                       tls=True, cacert=str(certs.ca))
    key = b"tls-key"
    vb = vbucket_of(key, tls_node.vbuckets)
    with opts.connect() as c:
        assert c.tls and c.mechanism.startswith("SCRAM")
        assert c.sock.version() in ("TLSv1.2", "TLSv1.3")
        assert c.request(Set(key=key, value=b"over tls", vbucket=vb)).status == Status.SUCCESS
    with opts.connect() as c:
        rsp = c.request(Get(key=key, vbucket=vb))
        assert rsp.status == Status.SUCCESS and bytes(rsp.value) == b"over tls"


def test_plain_sasl_is_allowed_over_tls(tls_node, certs):
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    with Connection.open("127.0.0.1", tls_node.tls_port, username=tls_node.username,
                         password=tls_node.password, tls=ctx, mechanisms=["PLAIN"]) as c:
        assert c.mechanism == "PLAIN"
        key = b"plain-over-tls"
        vb = vbucket_of(key, tls_node.vbuckets)
        assert c.request(Set(key=key, value=b"1", vbucket=vb)).status == Status.SUCCESS


@pytest.mark.parametrize("which", ["none", "other"])
def test_untrusted_certificate_is_one_clear_line(tls_node, certs, which):
    args = ["failover-log", "--json"]
    if which == "other":
        args += ["--cacert", str(certs.other_ca)]
    line = _one_error_line(run_cli(*args, env_extra=_tls_env(tls_node)))
    assert "certificate" in line and "not trusted" in line
    assert f"127.0.0.1:{tls_node.tls_port}" in line


def test_no_verify_works_and_warns(tls_node):
    r = run_cli("failover-log", "--json", "--no-verify", env_extra=_tls_env(tls_node))
    assert r.returncode == 0, r.stderr
    assert len(json_lines(r.stdout)) == 1
    warnings = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(warnings) == 1 and "warning" in warnings[0] and "--no-verify" in warnings[0]
    assert tls_node.password not in r.stderr + r.stdout


def test_no_verify_is_silent_without_tls(tls_node):
    r = run_cli("failover-log", "--json", "--no-verify", node=tls_node)
    assert r.returncode == 0 and r.stderr.strip() == ""


def test_tls_below_1_2_is_refused(tls_node, certs):
    import socket

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(certs.ca))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except (ValueError, ssl.SSLError):
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with socket.create_connection(("127.0.0.1", tls_node.tls_port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, OSError)):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    # the listener still serves TLS 1.2
    ctx12 = ssl.create_default_context(cafile=str(certs.ca))
    ctx12.maximum_version = ssl.TLSVersion.TLSv1_2
    with Connection.open("127.0.0.1", tls_node.tls_port, username=tls_node.username,
                         password=tls_node.password, tls=ctx12) as c:
        assert c.sock.version() == "TLSv1.2"


def test_bad_tls_files_fail_start_with_one_line(tmp_path, certs):
    r = run_cli("node", "start", "--data", str(tmp_path / "n"), "--port", "0", "--tls-port", "0",
                "--tls-cert", str(certs.cert), "--tls-key", str(certs.ca),
                env_extra={"DCPTOOL_PASSWORD": "pw"}, timeout=60)
    line = _one_error_line(r)
    assert "--tls-cert" in line
    r = run_cli("node", "start", "--data", str(tmp_path / "n"), "--port", "0",
                "--tls-cert", str(certs.cert), env_extra={"DCPTOOL_PASSWORD": "pw"})
    assert "--tls-key" in _one_error_line(r)
