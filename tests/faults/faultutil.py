"""Helpers of the fault tests: dcptool as a process of its own, a cutting and throttling
TCP proxy, and the "nothing lost" checks."""
from __future__ import annotations

import collections
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cliutil import cli  # noqa: F401  (the fault tests import it from here)

from dcptool.archive import Archive
from dcptool.archive.format import ITEM_TYPES
from dcptool.archive.verify import verify_archive


def docs(n: int, tag: str = "v1", size: int = 40) -> dict[str, dict]:
    return {f"doc::{tag}::{i:05d}": {"i": i, "tag": tag, "body": "x" * (i % size)}
            for i in range(n)}


def random_docs(n: int, size: int, seed: int, tag: str = "r") -> dict[str, bytes]:
    """Incompressible binary values (to fill a disk)."""
    rng = random.Random(seed)
    return {f"{tag}::{i:05d}": rng.randbytes(size) for i in range(n)}


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`dcptool ARGS` in a session of its own (so its whole process group can be killed)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "dcptool", *args], env=e,
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"dcptool did not finish in {timeout}s: {err.decode()[-2000:]}")
    return proc.returncode, out.decode(), err.decode()


def one_error_line(err: str) -> str:
    """The single 'dcptool: error: ...' line of a failed command (no traceback)."""
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("log: ")]
    errors = [ln for ln in lines if ln.startswith("dcptool: error: ")]
    assert "Traceback" not in err, err[-3000:]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


def assert_verifies(archive: Path, partial: int = 0) -> None:
    """Every committed backup verifies; `partial` partial backups are reported as notes."""
    report = verify_archive(archive)
    assert report.ok, [str(p) for p in report.problems]
    assert report.partial_backups == partial, report.notes


def assert_each_seqno_once(archive: Path, node_highs: dict[int, int]) -> None:
    """The archive's chain holds every seqno 1..high of each vbucket exactly once (the node
    was only written to with new keys, so its history has no gaps)."""
    a = Archive.open(archive)
    for vb, high in node_highs.items():
        seqnos = [rec[1] for b in a.chain() for rec in b.records(vb) if rec[0] in ITEM_TYPES]
        assert seqnos == list(range(1, high + 1)), (
            f"vbucket {vb}: {len(seqnos)} items, {len(set(seqnos))} distinct, expected "
            f"1..{high}; missing {sorted(set(range(1, high + 1)) - set(seqnos))[:5]}")


def wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None,
             step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: dcptool exited with {proc.returncode} first: "
                        f"{proc.stderr.read().decode()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of a node.

    `cuts`: how many connections to cut; each connection gets a cut offset drawn (seeded)
    from [cut_min, cut_max] bytes of node-to-client traffic, and once it gets there the
    proxy forwards exactly that many bytes and closes both sides (a connection that never
    carries that much, like a driver's short requests, is never cut). `rate`: bytes per
    second allowed client-to-node on every connection, `down_rate` node-to-client (None:
    no limit); `down_bytes` counts what went node-to-client on all connections.
    """

    def __init__(self, host: str, port: int, *, cuts: int = 0, cut_min: int = 0,
                 cut_max: int = 0, seed: int = 0, rate: float | None = None,
                 down_rate: float | None = None) -> None:
        self.target = (host, port)
        self.rng = random.Random(seed)
        self.cuts_left = cuts
        self.cut_min, self.cut_max = cut_min, cut_max
        self.rate = rate
        self.down_rate = down_rate
        self.down_bytes = 0
        self.cut_at: list[int] = []  # offsets at which connections were cut
        self.connections = 0
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self.listener.getsockname()[:2]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                node = socket.create_connection(self.target, timeout=10)
                node.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                self._socks += [client, node]
                offset = self.rng.randint(self.cut_min, self.cut_max) if self.cuts_left else None
            pair = {"open": True, "node": node}
            threading.Thread(target=self._pump, args=(client, node, None, self.rate, pair),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(node, client, offset, self.down_rate, pair),
                             daemon=True).start()

    def _cut(self, a: socket.socket, b: socket.socket, pair: dict) -> None:
        pair["open"] = False
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _pump(self, src: socket.socket, dst: socket.socket, cut: int | None,
              rate: float | None, pair: dict) -> None:
        sent = 0
        recv = src.recv
        if rate:
            # read ahead into memory and send at `rate`: when `src` goes away (a killed
            # node) what is still queued is dropped, as a reset connection would lose it
            queue: collections.deque[bytes] = collections.deque()
            ended = threading.Event()

            def read_ahead() -> None:
                while pair["open"]:
                    try:
                        chunk = src.recv(16384)
                    except OSError:
                        break
                    if not chunk:
                        break
                    queue.append(chunk)
                ended.set()

            threading.Thread(target=read_ahead, daemon=True).start()

            def recv(_n: int) -> bytes:
                while not queue:
                    if ended.wait(0.01):
                        return b""
                return b"" if ended.is_set() else queue.popleft()

        while pair["open"]:
            try:
                data = recv(16384)
            except OSError:
                break
            if not data:
                break
            if cut is not None and sent + len(data) >= cut:
                with self._lock:
                    go = self.cuts_left > 0
                    if go:
                        self.cuts_left -= 1
                        self.cut_at.append(cut)
                if go:
                    try:
                        dst.sendall(data[:cut - sent])
                    except OSError:
                        pass
                    self._cut(src, dst, pair)
                    return
                cut = None
            try:
                dst.sendall(data)
            except OSError:
                break
            sent += len(data)
            if src is pair["node"]:
                with self._lock:
                    self.down_bytes += len(data)
            if rate:
                time.sleep(len(data) / rate)
        self._cut(src, dst, pair)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
