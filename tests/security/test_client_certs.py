"""Client certificates against a real node: `node start --client-ca` logs a client in as
the user its certificate names (docs/compatibility.md "Client certificates"), a backup runs
with --client-cert/--client-key and no password, a certificate from another CA or naming
no user is refused; and the TLS listeners (KV and REST) offer AEAD suites only."""
from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client.nodeutil import run_cli
from dcptool.client.options import ConnOptions
from dcptool.errors import DcptoolError
from dcptool.protocol.constants import Status
from dcptool.protocol.messages import Get, Set
from dcptool.protocol.vbucket import vbucket_of
from security.x509util import CA

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = CA(d / "ca", "dcptool test CA")
    other = CA(d / "other", "dcptool other CA")
    return {
        "ca": ca,
        "server": ca.issue("server", cn="127.0.0.1", ips=("127.0.0.1",), dns=("localhost",),
                           server=True, rsa_key=True),
        "backup": ca.issue("backup", cn="certbackup"),
        "email": ca.issue("email", cn="not-a-user", emails=("mailuser@example.com",)),
        "nouser": ca.issue("nouser", cn="nobody-here"),
        "enc": ca.issue("enc", cn="certbackup", passphrase=b"key pass"),
        "foreign": other.issue("foreign", cn="certbackup"),
    }


@pytest.fixture(scope="module")
def cnode(tmp_path_factory, pki):
    """A node asking TLS clients for certificates signed by the test CA; the user comes
    from the subject CN, else from a SAN email before its '@'."""
    from nodeprocutil import NodeProcess

    base = tmp_path_factory.mktemp("certnode")
    rules = base / "client-auth.json"
    rules.write_text(json.dumps({"state": "enable", "prefixes": [
        {"path": "san.email", "prefix": "", "delimiter": "@"},
        {"path": "subject.cn", "prefix": "", "delimiter": ""}]}))
    n = NodeProcess(base / "node", vbuckets=4, extra_args=(
        "--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key),
        "--tls-port", "0", "--client-ca", str(pki["ca"].path), "--client-auth", str(rules)))
    n.start()
    doc = json.loads((n.data_dir / "node.json").read_text())
    n.tls_port, n.rest_tls_port = doc["tls_port"], doc["rest_tls_port"]
    for user, role in (("certbackup", "backup"), ("mailuser", "reader")):
        r = run_cli("node", "user", "add", user, "--role", role, "--data", str(n.data_dir),
                    env_extra={"DCPTOOL_PASSWORD": "unused-" + user})
        assert r.returncode == 0, r.stderr
    time.sleep(1.5)  # a running node applies a users change within a second
    r = run_cli("doc", "load", "--count", "300", node=n)
    assert r.returncode == 0, r.stderr
    yield n
    n.stop()


def _opts(node, pki, which: str, **kw) -> ConnOptions:
    return ConnOptions.from_cli(f"couchbases://127.0.0.1:{node.tls_port}", None, None,
                                cacert=pki["ca"].path, client_cert=pki[which].cert,
                                client_key=pki[which].key, prompt=False, **kw)


def _cert_env(node, pki, which: str) -> dict[str, str]:
    return {"DCPTOOL_CLUSTER": f"couchbases://127.0.0.1:{node.tls_port}",
            "DCPTOOL_CLIENT_CERT": str(pki[which].cert),
            "DCPTOOL_CLIENT_KEY": str(pki[which].key)}


def test_certificate_logs_in_as_its_cn_user_with_its_roles(cnode, pki):
    opts = _opts(cnode, pki, "backup")
    assert opts.password == "" and opts.login_password is None
    with opts.connect() as c:
        assert c.mechanism == "certificate"
        key = b"cert-key"
        vb = vbucket_of(key, cnode.vbuckets)
        # the backup role may not write: the certificate's user is who the node serves
        assert c.request(Set(key=key, value=b"x", vbucket=vb)).status == Status.EACCESS
    # a SAN email names the user before the '@' (first rule), with that user's roles
    with _opts(cnode, pki, "email").connect() as c:
        rsp = c.request(Get(key=b"doc-1", vbucket=vbucket_of(b"doc-1", cnode.vbuckets)))
        assert rsp.status in (Status.SUCCESS, Status.KEY_ENOENT)


@pytest.mark.parametrize("which", ["foreign", "nouser"])
def test_wrong_certificate_is_refused(cnode, pki, which):
    # another CA's certificate fails the handshake; a trusted one naming no user is closed
    with pytest.raises(DcptoolError):
        with _opts(cnode, pki, which).connect() as c:
            c.request(Get(key=b"doc-1", vbucket=vbucket_of(b"doc-1", cnode.vbuckets)))
    r = run_cli("failover-log", "--json", "--cacert", str(pki["ca"].path),
                env_extra=_cert_env(cnode, pki, which))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_encrypted_client_key_opens_with_its_passphrase_file(cnode, pki, tmp_path):
    pw = tmp_path / "keypass"
    pw.write_text("key pass\n")
    opts = _opts(cnode, pki, "enc", client_key_passphrase_file=pw)
    with opts.connect() as c:
        assert c.mechanism == "certificate"
    r = run_cli("failover-log", "--json", "--cacert", str(pki["ca"].path),
                env_extra=_cert_env(cnode, pki, "enc"))
    assert r.returncode == 2 and "--client-key-passphrase-file" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2


def test_backup_with_a_client_certificate_and_no_password(cnode, pki, tmp_path):
    env = dict(os.environ)
    for k in ("DCPTOOL_PASSWORD", "DCPTOOL_PASSWORD_FILE", "DCPTOOL_USERNAME"):
        env.pop(k, None)
    env.update(_cert_env(cnode, pki, "backup"), NO_COLOR="1")
    archive = tmp_path / "archive"
    r = subprocess.run([sys.executable, "-m", "dcptool", "backup", str(archive), "--json",
                        "--cacert", str(pki["ca"].path)], capture_output=True, text=True,
                       env=env, cwd=REPO, stdin=subprocess.DEVNULL, timeout=240)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["mutations"] == 300, r.stdout
    r = run_cli("verify", str(archive))
    assert r.returncode == 0, r.stderr


def test_rest_accepts_a_client_certificate(cnode, pki):
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(pki["ca"].path))
    ctx.load_cert_chain(str(pki["backup"].cert), str(pki["backup"].key))
    url = f"https://127.0.0.1:{cnode.rest_tls_port}/pools/default/buckets/default"
    with urllib.request.urlopen(url, context=ctx, timeout=10) as rsp:
        assert rsp.status == 200 and json.loads(rsp.read())["name"] == "default"
    anon = ssl.create_default_context(cafile=str(pki["ca"].path))
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(url, context=anon, timeout=10)
    assert exc.value.code == 401


def _handshake(port: int, cafile: Path, ciphers: str) -> str:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(cafile))
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(ciphers)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            return s.cipher()[0]


@pytest.mark.parametrize("listener", ["kv", "rest"])
def test_tls12_offers_aead_suites_only(cnode, pki, listener):
    port = cnode.tls_port if listener == "kv" else cnode.rest_tls_port
    for cbc in ("ECDHE-RSA-AES128-SHA256", "ECDHE-RSA-AES256-SHA384", "ECDHE-RSA-AES128-SHA",
                "AES128-SHA256", "AES128-GCM-SHA256"):
        with pytest.raises(ssl.SSLError):
            _handshake(port, pki["ca"].path, cbc)
    for aead in ("ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384",
                 "ECDHE-RSA-CHACHA20-POLY1305"):
        assert _handshake(port, pki["ca"].path, aead) == aead


def test_mapping_rules_follow_path_prefix_and_delimiter():
    """The rules alone, on certificates as the TLS layer hands them over (getpeercert())."""
    from dcptool.errors import UsageError
    from dcptool.node.tlsconfig import ClientAuth

    cert = {"subject": ((("countryName", "DE"),), (("commonName", "www.alice.example"),)),
            "subjectAltName": (("DNS", "node7.backup.example"), ("email", "bob@example.com"),
                               ("email", "carol@example.com"),
                               ("URI", "spiffe://example/dave"))}
    rules = lambda *p: ClientAuth.parse({"prefixes": list(p)})  # noqa: E731
    assert ClientAuth().user_of(cert) == "www.alice.example"
    assert rules({"path": "subject.cn", "prefix": "www.", "delimiter": "."}).user_of(cert) \
        == "alice"
    assert rules({"path": "san.email", "delimiter": "@"}).user_of(cert) == "bob"
    assert rules({"path": "san.uri", "prefix": "spiffe://example/"}).user_of(cert) == "dave"
    assert rules({"path": "san.dnsname", "delimiter": ".-"}).user_of(cert) == "node7"
    # a prefix that does not match skips the rule: the next rule decides
    assert rules({"path": "san.email", "prefix": "x-"},
                 {"path": "subject.cn", "prefix": "www."}).user_of(cert) == "alice.example"
    # nothing left after the prefix is no name; no certificate is no name
    assert rules({"path": "subject.cn", "prefix": "www.alice.example"}).user_of(cert) is None
    assert ClientAuth().user_of({}) is None
    assert ClientAuth.parse({"state": "mandatory"}).state == "mandatory"
    for bad in ({"state": "sometimes"}, {"prefixes": []}, {"prefixes": [{"path": "cn"}]},
                {"prefixes": [{"path": "subject.cn", "delimiter": 1}]}, []):
        with pytest.raises(UsageError):
            ClientAuth.parse(bad)


def test_mandatory_state_refuses_a_client_without_a_certificate(tmp_path, pki):
    """state mandatory: a TLS client without a certificate fails the handshake, even with
    the right password; one with a certificate logs in."""
    from nodeprocutil import NodeProcess

    rules = tmp_path / "client-auth.json"
    rules.write_text(json.dumps({"state": "mandatory"}))
    n = NodeProcess(tmp_path / "node", vbuckets=2, extra_args=(
        "--tls-cert", str(pki["server"].cert), "--tls-key", str(pki["server"].key),
        "--tls-port", "0", "--client-ca", str(pki["ca"].path), "--client-auth", str(rules)))
    n.start()
    try:
        n.tls_port = json.loads((n.data_dir / "node.json").read_text())["tls_port"]
        admin = pki["ca"].issue("admin", cn=n.username)
        with pytest.raises(DcptoolError):
            with ConnOptions("127.0.0.1", n.tls_port, n.username, n.password, tls=True,
                             cacert=str(pki["ca"].path)).connect() as c:
                c.request(Get(key=b"k", vbucket=0))
        opts = ConnOptions("127.0.0.1", n.tls_port, n.username, "", tls=True,
                           cacert=str(pki["ca"].path), client_cert=str(admin.cert),
                           client_key=str(admin.key))
        with opts.connect() as c:
            assert c.mechanism == "certificate"
            assert c.request(Set(key=b"k", value=b"v", vbucket=vbucket_of(b"k", 2))).status \
                == Status.SUCCESS
        # the plain listener is not TLS: passwords still log in there
        with ConnOptions("127.0.0.1", n.port, n.username, n.password).connect() as c:
            assert c.mechanism.startswith("SCRAM")
    finally:
        n.stop()
