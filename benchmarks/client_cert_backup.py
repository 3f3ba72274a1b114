"""A backup that logs in with a client certificate against one that logs in with a
password, same node, same run.

    python -m benchmarks.client_cert_backup [-n 100000] [-s 256] [--vbuckets 256]
                                            [--rounds 5] [--json FILE]

Makes a CA, an RSA server certificate for 127.0.0.1 and a client certificate whose subject
CN is the node's admin user (the `cryptography` package), starts a reference node with
`--tls-cert/--tls-key --client-ca`, loads N documents of S bytes and starts a
`dcptool engine` (so neither side pays Spark's start-up). Then per round, in alternating
order, a full `dcptool backup` over `couchbases://` into a new archive:

* password: SCRAM-SHA512 over TLS, the password in DCPTOOL_PASSWORD;
* certificate: `--client-cert/--client-key` (DCPTOOL_CLIENT_CERT/_KEY), no password, no SASL.

Both sides verify the node's certificate and run the same TLS; what differs is the login
of each connection (the driver's and each task's). Each figure is a whole command's wall
time (a new process, start to exit). Reported: the rounds, the medians and cert/password.
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from benchmarks.backup_restore import report, set_documents  # noqa: E402
from benchmarks.engine_backup import cli, docs  # noqa: E402
from dcptool.client.options import ConnOptions  # noqa: E402
from dcptool.node.launcher import LocalNode  # noqa: E402
from security.x509util import CA  # noqa: E402


def _med(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def run(n: int = 100_000, size: int = 256, vbuckets: int = 256, rounds: int = 5) -> dict:
    import json

    work = Path(tempfile.mkdtemp(prefix="dcptool-bench-cert-"))
    password = secrets.token_urlsafe(10)
    res: dict = {"n": n, "value_size": size, "vbuckets": vbuckets, "rounds": rounds,
                 "load_average_before": round(os.getloadavg()[0], 2)}
    ca = CA(work / "pki", "bench CA")
    server = ca.issue("server", cn="127.0.0.1", ips=("127.0.0.1",), server=True, rsa_key=True)
    client = ca.issue("client", cn="Administrator")
    base = {k: v for k, v in os.environ.items() if not k.startswith("DCPTOOL_")}
    base.update(PYTHONPATH=str(REPO), DCPTOOL_ENGINE_DIR=str(work / "engine"))
    env_pw = dict(base, DCPTOOL_PASSWORD=password)
    env_cert = dict(base, DCPTOOL_CLIENT_CERT=str(client.cert),
                    DCPTOOL_CLIENT_KEY=str(client.key))
    times: dict[str, list[float]] = {"password": [], "certificate": []}
    try:
        node = LocalNode(work / "node", password=password, vbuckets=vbuckets, extra_args=(
            "--tls-cert", str(server.cert), "--tls-key", str(server.key), "--tls-port", "0",
            "--client-ca", str(ca.path)))
        with node:
            tls_port = json.loads((node.data_dir / "node.json").read_text())["tls_port"]
            set_documents(ConnOptions(node.host, node.port, "Administrator", password),
                          docs(n, size), vbuckets)
            cli(["engine", "start", "--json"], env_pw)
            src = ["-c", f"couchbases://127.0.0.1:{tls_port}", "--cacert", str(ca.path),
                   "--json", "--no-watermark"]
            for i in range(rounds):
                sides = [("password", env_pw), ("certificate", env_cert)]
                if i % 2:
                    sides.reverse()
                for kind, env in sides:
                    where = work / f"{kind}-{i}"
                    wall, out = cli(["backup", str(where), *src], env)
                    assert out.get("mutations") == n, out
                    times[kind].append(wall)
                    shutil.rmtree(where, ignore_errors=True)
            cli(["engine", "stop", "--json"], env_pw)
    finally:
        subprocess.run([sys.executable, "-m", "dcptool", "engine", "stop", "--now"],
                       env=env_pw, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    for k, v in times.items():
        res[f"backup_{k}_s"] = [round(x, 2) for x in v]
        res[f"backup_{k}_median_s"] = _med(v)
    res["certificate_vs_password"] = round(_med(times["certificate"]) / _med(times["password"]), 3)
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=100_000)
    p.add_argument("-s", "--size", type=int, default=256)
    p.add_argument("--vbuckets", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    report(run(a.n, a.size, a.vbuckets, a.rounds), a.json)


if __name__ == "__main__":
    main()
