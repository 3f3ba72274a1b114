"""Run `dcptool node start` as a real subprocess for tests and benchmarks.

    with NodeProcess(tmp_path / "node", vbuckets=16) as node:
        talk_to(node.host, node.port)

`start()` waits for the `listening on HOST:PORT` line and the `rest on http://HOST:PORT`
line of the management REST port (`--rest-port 0`: a free one; `rest_port`, and with TLS
`rest_tls_port`, hold the ports); `stop()` sends SIGTERM (clean shutdown) and falls back
to SIGKILL; `kill()` is an unclean stop; `restart()` stops and starts again on the same
directory (new ports). The node's stderr goes to `DIR/node.stderr.log` so a failing test
can show it.

Unless the test passes `--auth-failure-delay` itself, the node runs with
`--auth-failure-delay 10ms` (TEST_AUTH_FAILURE_DELAY): failed logins are still counted and
slowed down, but a test that tries many wrong passwords, or that logs in after one, does not
wait out the default's doubling delays up to 5 s. The tests of the delays themselves
(tests/security/test_node_attacker.py) give their own.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

DEFAULT_PASSWORD = "password"
DEFAULT_USER = "Administrator"
#: the nodes' --auth-failure-delay unless a test gives one (the smallest the node takes)
TEST_AUTH_FAILURE_DELAY = "10ms"
#: what starts `python -m dcptool ARGS` (args, env=, stdin=, stdout=, stderr=) -> a Popen-like
#: object; None: subprocess.Popen. The test suite sets tests/zygote.py's `popen`.
LAUNCH = None


class NodeStartError(RuntimeError):
    pass


class NodeProcess:
    def __init__(self, data_dir, *, vbuckets: int = 16, bucket: str = "default",
                 username: str = DEFAULT_USER, password: str | None = DEFAULT_PASSWORD,
                 host: str = "127.0.0.1", extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, rest_port: int | None = 0) -> None:
        self.data_dir = Path(data_dir)
        self.vbuckets = vbuckets
        self.bucket = bucket
        self.username = username
        self.password = password
        self.host = host
        self.port: int | None = None
        #: --rest-port to pass (None: none, the node's default rule); then the REST port
        self.rest_port_arg = rest_port
        self.rest_port: int | None = None
        self.rest_tls_port: int | None = None
        self.extra_args = tuple(extra_args)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.stdout_lines: list[str] = []
        self._reader: threading.Thread | None = None
        self.returncode: int | None = None

    # -- lifecycle -------------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "dcptool", "node", "start", "--data", str(self.data_dir),
               "--host", self.host, "--port", "0", "--vbuckets", str(self.vbuckets),
               "--bucket", self.bucket, "--username", self.username]
        if self.rest_port_arg is not None:
            cmd += ["--rest-port", str(self.rest_port_arg)]
        if self.password is not None:
            cmd += ["--password", self.password]
        if "--auth-failure-delay" not in self.extra_args:
            cmd += ["--auth-failure-delay", TEST_AUTH_FAILURE_DELAY]
        return cmd + list(self.extra_args)

    def start(self, timeout: float = 60.0) -> "NodeProcess":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.pop("DCPTOOL_PASSWORD", None)
        if self.env:
            env.update(self.env)
        err = open(self.data_dir / "node.stderr.log", "ab")
        if LAUNCH is not None:
            self.proc = LAUNCH(self.command()[3:], env=env, stdout=subprocess.PIPE, stderr=err,
                               stdin=subprocess.DEVNULL)
        else:
            self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=err,
                                         stdin=subprocess.DEVNULL, env=env)
        err.close()
        found = threading.Event()
        lines = self.stdout_lines = []
        # the last line the node prints before it serves
        last = "rest on https://" if "--tls-cert" in self.extra_args else "rest on http://"

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                lines.append(line)
                if line.startswith(last):
                    found.set()
            found.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not found.wait(0.05):
            if time.monotonic() > deadline:
                self.kill()
                raise NodeStartError(f"node did not start within {timeout}s: {self.stderr()}")
        listening = [ln for ln in lines if ln.startswith("listening on ")]
        if not listening:
            self.proc.wait(10)
            self.returncode = self.proc.returncode
            raise NodeStartError(f"node exited with {self.proc.returncode}: {self.stderr()}")
        hostport = listening[-1][len("listening on "):]
        host, _, port = hostport.rpartition(":")
        self.host, self.port = host, int(port)
        self.rest_port = self.rest_tls_port = None
        for line in lines:
            for prefix, attr in (("rest on http://", "rest_port"),
                                 ("rest on https://", "rest_tls_port")):
                if line.startswith(prefix):
                    setattr(self, attr, int(line.rpartition(":")[2]))
        return self

    def stderr(self) -> str:
        try:
            return (self.data_dir / "node.stderr.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait (clean shutdown); SIGKILL if it does not exit in time."""
        if self.proc is None:
            return self.returncode or 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self._finish()

    def kill(self) -> int:
        """SIGKILL: an unclean stop."""
        if self.proc is None:
            return self.returncode or 0
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        return self._finish()

    def _finish(self) -> int:
        assert self.proc is not None
        self.returncode = self.proc.returncode
        if self._reader is not None:
            self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None
        return self.returncode

    def restart(self, timeout: float = 60.0) -> "NodeProcess":
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> "NodeProcess":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
