"""The management REST port against real node processes, read with urllib: every endpoint's
shape, Basic auth (401), roles (403), unknown buckets (404), the port in the node's output
and node.json, GET_CLUSTER_CONFIG advertising it, HTTPS with TLS, and a clean stop."""
from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from client.nodeutil import run_cli
from dcptool.node.config import NodeConfig
from dcptool.protocol.constants import Opcode

from .mcbputil import connect

VBS = 8
ADMIN = ("Administrator", "password")
READER = ("rd", "rd-pw-4242")
#: a user whose entry grants no role (an empty role list in users.json)
NOBODY = ("nobody", "nb-pw-1313")
ENDPOINTS = ("/pools", "/pools/default", "/pools/default/nodeServices",
             "/pools/default/buckets", "/pools/default/buckets/default",
             "/pools/default/b/default", "/pools/default/buckets/default/ddocs")


def fetch(url: str, auth: tuple[str, str] | None = ADMIN, *, header: str | None = None,
          context: ssl.SSLContext | None = None):
    """(status, headers, body bytes) of a GET."""
    req = urllib.request.Request(url)
    if header is not None:
        req.add_header("Authorization", header)
    elif auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as rsp:
            return rsp.status, rsp.headers, rsp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers, exc.read()


def get_json(node, path: str, auth=ADMIN):
    status, _, body = fetch(f"http://127.0.0.1:{node.rest_port}{path}", auth)
    assert status == 200, (path, status, body)
    return json.loads(body)


def cluster_config(node) -> dict:
    with connect(node) as c:
        return json.loads(c.call(Opcode.GET_CLUSTER_CONFIG).value)


def add_user(data_dir: Path, user: str, password: str, role: str) -> None:
    r = run_cli("node", "user", "add", user, "--role", role, "--data", str(data_dir),
                env_extra={"DCPTOOL_PASSWORD": password})
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from nodeprocutil import NodeProcess

    # info on stderr: a request logged like aiohttp logs them by default would show there
    n = NodeProcess(tmp_path_factory.mktemp("rest") / "node", vbuckets=VBS,
                    extra_args=("--log-level", "info"))
    n.data_dir.mkdir(parents=True)
    add_user(n.data_dir, *READER, "reader")
    add_user(n.data_dir, *NOBODY, "reader")
    users = n.data_dir / "users.json"
    doc = json.loads(users.read_text())
    doc["users"][NOBODY[0]]["roles"] = []
    users.write_text(json.dumps(doc))
    n.start()
    yield n
    n.stop()


# -- where the port is told ------------------------------------------------------------


def test_rest_port_is_printed_and_in_node_json(node):
    assert node.stdout_lines[-1] == f"rest on http://127.0.0.1:{node.rest_port}"
    assert node.rest_port not in (None, 0, node.port)
    doc = json.loads((node.data_dir / "node.json").read_text())
    assert doc["rest_port"] == node.rest_port and "rest_tls_port" not in doc


def test_default_rest_port_rule():
    def ports(**kw):
        return NodeConfig(data_dir=Path("."), **kw).rest_ports()

    assert ports() == (8091, None)
    assert ports(port=11211) == (0, None) and ports(port=0) == (0, None)
    assert ports(rest_port=9000, port=0) == (9000, None)
    tls = {"tls_cert": Path("c"), "tls_key": Path("k")}
    assert ports(**tls) == (8091, 18091)
    assert ports(port=0, **tls) == (0, 0)
    assert ports(port=0, rest_port=0, rest_tls_port=9443, **tls) == (0, 9443)


def test_without_rest_port_a_node_off_11210_takes_a_free_port(node_factory):
    n = node_factory(vbuckets=4, rest_port=None)
    assert n.rest_port not in (None, 0, 8091, n.port)
    assert get_json(n, "/pools/default/nodeServices")["nodesExt"][0]["services"]["mgmt"] == \
        n.rest_port


def test_rest_port_in_use_is_one_error_line(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        r = run_cli("node", "start", "--data", str(tmp_path / "n"), "--port", "0",
                    "--rest-port", str(port), env_extra={"DCPTOOL_PASSWORD": "pw"})
    finally:
        s.close()
    assert r.returncode != 0 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "--rest-port" in lines[0]


def test_get_cluster_config_advertises_the_rest_port(node):
    cfg = cluster_config(node)
    assert cfg["nodesExt"][0]["services"] == {"kv": node.port, "mgmt": node.rest_port}
    assert cfg["nodes"][0]["hostname"] == f"127.0.0.1:{node.rest_port}"
    assert cfg["nodes"][0]["ports"]["direct"] == node.port


# -- shapes ----------------------------------------------------------------------------


def test_pools(node):
    doc = get_json(node, "/pools")
    assert [p["name"] for p in doc["pools"]] == ["default"]
    assert doc["pools"][0]["uri"].startswith("/pools/default")
    assert doc["isAdminCreds"] is True and doc["implementationVersion"].startswith("7.")
    assert get_json(node, "/pools", READER)["isAdminCreds"] is False


def test_pool_default(node):
    doc = get_json(node, "/pools/default")
    assert doc["name"] == "default"
    (n,) = doc["nodes"]
    assert n["hostname"] == f"127.0.0.1:{node.rest_port}" and n["ports"]["direct"] == node.port
    assert n["thisNode"] is True and n["services"] == ["kv"]
    assert doc["buckets"]["uri"].startswith("/pools/default/buckets")
    assert doc["buckets"]["terseBucketsBase"] == "/pools/default/b/"


def test_bucket(node):
    doc = get_json(node, "/pools/default/buckets/default")
    cfg = cluster_config(node)
    assert doc["name"] == "default" and doc["bucketType"] == "membase"
    assert doc["uuid"] == cfg["uuid"] and len(doc["uuid"]) == 32
    assert isinstance(doc["rev"], int) and doc["nodeLocator"] == "vbucket"
    assert doc["uri"] == f"/pools/default/buckets/default?bucket_uuid={doc['uuid']}"
    assert doc["ddocs"]["uri"] == "/pools/default/buckets/default/ddocs"
    m = doc["vBucketServerMap"]
    assert m["hashAlgorithm"] == "CRC" and m["numReplicas"] == 0
    assert m["serverList"] == [f"127.0.0.1:{node.port}"]
    assert len(m["vBucketMap"]) == VBS and all(chain == [0] for chain in m["vBucketMap"])
    assert doc["numVBuckets"] == VBS and doc["replicaNumber"] == 0
    (n,) = doc["nodes"]
    assert n["hostname"] == f"127.0.0.1:{node.rest_port}" and n["ports"] == {"direct": node.port}
    (ext,) = doc["nodesExt"]
    assert ext["thisNode"] is True
    assert ext["services"] == {"kv": node.port, "mgmt": node.rest_port}
    assert get_json(node, "/pools/default/buckets") == [doc]


def test_terse_bucket_is_what_get_cluster_config_serves(node):
    assert get_json(node, "/pools/default/b/default") == cluster_config(node)


def test_node_services(node):
    doc = get_json(node, "/pools/default/nodeServices")
    assert isinstance(doc["rev"], int)
    (ext,) = doc["nodesExt"]
    assert ext["services"] == {"kv": node.port, "mgmt": node.rest_port}
    assert ext["thisNode"] is True and ext["hostname"] == "127.0.0.1"


def test_ddocs_are_none(node):
    assert get_json(node, "/pools/default/buckets/default/ddocs") == {"rows": []}


def test_reader_role_reads_every_endpoint(node):
    for path in ENDPOINTS:
        get_json(node, path, READER)


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/pools/default/buckets/nope",
                                  "/pools/default/buckets/nope/ddocs",
                                  "/pools/default/b/nope"])
def test_unknown_bucket_is_404(node, path):
    status, _, body = fetch(f"http://127.0.0.1:{node.rest_port}{path}")
    assert status == 404 and b"nope" not in body


@pytest.mark.parametrize("auth,header", [
    (None, None),
    (("Administrator", "wrong"), None),
    (("nosuchuser", "password"), None),
    (None, "Basic not-base64!"),
    (None, "Bearer abc"),
])
def test_missing_or_wrong_credentials_are_401(node, auth, header):
    for path in ENDPOINTS + ("/pools/default/buckets/nope",):
        status, headers, body = fetch(f"http://127.0.0.1:{node.rest_port}{path}", auth,
                                      header=header)
        assert status == 401, path
        assert headers["WWW-Authenticate"] == 'Basic realm="Couchbase Server Admin / REST"'
        assert body == b""


def test_user_without_a_role_is_403_and_told_nothing(node):
    cfg = cluster_config(node)
    for path in ENDPOINTS + ("/pools/default/buckets/nope",):
        status, _, body = fetch(f"http://127.0.0.1:{node.rest_port}{path}", NOBODY)
        assert status == 403, path
        text = body.decode()
        assert cfg["uuid"] not in text and str(node.port) not in text
        assert "vBucket" not in text and "default/" not in text


def test_requests_are_not_logged_on_the_terminal(node):
    get_json(node, "/pools/default/buckets/default")
    fetch(f"http://127.0.0.1:{node.rest_port}/pools", None)
    assert "/pools" not in node.stderr()
    assert "/pools" not in (node.data_dir / "logs" / "node.log").read_text()


def test_stop_is_clean_with_a_keep_alive_connection_open(node_factory):
    n = node_factory(vbuckets=4)
    conn = http.client.HTTPConnection("127.0.0.1", n.rest_port, timeout=10)
    token = base64.b64encode(b"Administrator:password").decode()
    conn.request("GET", "/pools", headers={"Authorization": f"Basic {token}"})
    rsp = conn.getresponse()
    assert rsp.status == 200 and rsp.getheader("Connection", "").lower() != "close"
    rsp.read()
    try:
        assert n.stop(timeout=20) == 0
    finally:
        conn.close()
    assert "Traceback" not in n.stderr()


# -- TLS -------------------------------------------------------------------------------


def test_https_with_tls(node_factory, tmp_path):
    from security.certutil import make_certs

    certs = make_certs(tmp_path / "certs")
    n = node_factory(vbuckets=4, extra_args=("--tls-cert", str(certs.cert), "--tls-key",
                                             str(certs.key), "--tls-port", "0"))
    doc = json.loads((n.data_dir / "node.json").read_text())
    tls_port, rest_tls = doc["tls_port"], doc["rest_tls_port"]
    assert rest_tls == n.rest_tls_port and rest_tls not in (n.rest_port, tls_port)
    assert n.stdout_lines[-2:] == [f"rest on http://127.0.0.1:{n.rest_port}",
                                   f"rest on https://127.0.0.1:{rest_tls}"]
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    url = f"https://127.0.0.1:{rest_tls}"
    status, _, body = fetch(url + "/pools/default/nodeServices", context=ctx)
    assert status == 200
    services = {"kv": n.port, "kvSSL": tls_port, "mgmt": n.rest_port, "mgmtSSL": rest_tls}
    assert json.loads(body)["nodesExt"][0]["services"] == services
    assert cluster_config(n)["nodesExt"][0]["services"] == services
    bucket = json.loads(fetch(url + "/pools/default/buckets/default", context=ctx)[2])
    assert bucket["nodes"][0]["ports"] == {"direct": n.port, "httpsMgmt": rest_tls}
    assert fetch(url + "/pools", None, context=ctx)[0] == 401
    # the plain port stays HTTP; the HTTPS one refuses a certificate it cannot trust
    assert get_json(n, "/pools")["pools"][0]["name"] == "default"
    with pytest.raises(urllib.error.URLError) as exc:
        fetch(url + "/pools", context=ssl.create_default_context(cafile=str(certs.other_ca)))
    assert isinstance(exc.value.reason, ssl.SSLError)
    with socket.create_connection(("127.0.0.1", rest_tls), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
