"""Start a reference node as a child process and wait until it accepts connections.

Used by `dcptool quickstart` (and benchmarks) to run local nodes; the node itself is
`dcptool node start` in its own process, exactly as a user would run it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from dcptool.errors import DcptoolError


class LocalNode:
    """A `dcptool node start --port 0` child process on 127.0.0.1."""

    def __init__(self, data_dir: str | os.PathLike[str], *, password: str, vbuckets: int = 1024,
                 bucket: str = "default", username: str = "Administrator",
                 extra_args: tuple[str, ...] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.password = password
        self.vbuckets = vbuckets
        self.bucket = bucket
        self.username = username
        self.extra_args = tuple(extra_args)
        self.host = "127.0.0.1"
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> "LocalNode":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, DCPTOOL_PASSWORD=self.password)  # never on the command line
        cmd = [sys.executable, "-m", "dcptool", "node", "start", "--data", str(self.data_dir),
               "--host", self.host, "--port", "0", "--vbuckets", str(self.vbuckets),
               "--bucket", self.bucket, "--username", self.username, *self.extra_args]
        log = open(self.data_dir / "node.stderr.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                     env=env)
        log.close()
        found: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("listening on "):
                    found.append(line[len("listening on "):])
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or not found:
            self.stop()
            tail = (self.data_dir / "node.stderr.log").read_text(errors="replace")[-500:]
            raise DcptoolError(f"the local node in {self.data_dir} did not start: {tail.strip()}")
        host, _, port = found[0].rpartition(":")
        self.host, self.port = host, int(port)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> "LocalNode":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
