"""Fixtures for the security tests: test-time certificates and a node serving TLS."""
from __future__ import annotations

import json
import time

import pytest

from security.certutil import make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory, certs):
    """A node with a plain and a TLS listener; `tls_port` is read from node.json."""
    from nodeprocutil import NodeProcess

    n = NodeProcess(tmp_path_factory.mktemp("tlsnode") / "node", vbuckets=8,
                    extra_args=("--tls-cert", str(certs.cert), "--tls-key", str(certs.key),
                                "--tls-port", "0"))
    n.start()
    n.tls_port = json.loads((n.data_dir / "node.json").read_text())["tls_port"]
    # the TLS line follows the plain one; start() returns once it saw the plain one
    deadline = time.monotonic() + 10
    while not any(ln.startswith("listening (tls)") for ln in n.stdout_lines):
        assert time.monotonic() < deadline, n.stdout_lines
        time.sleep(0.01)
    yield n
    n.stop()
