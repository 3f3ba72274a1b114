"""What anonymous clients can make a reference node hold: idle connections, oversized
pre-login frames, and how long an authenticated client waits during a connection flood.

    python benchmarks/node_preauth_memory.py [--idle 4000] [--oversized 60] [--json]
        [--node-args "--max-unauth-connections 4096 --max-unauth-per-address 4096"]

Starts its own node (a real `dcptool node start` process in a temporary directory) and
measures its resident set (VmRSS) at each step:

1. idle: --idle TCP connections that never send a byte, then after they are closed;
2. oversized: --oversized connections that each send the header of a SET whose body is
   20 MiB - 1 bytes and then that body (minus its last byte), never logging in;
3. flood: --flood connections opened as fast as possible and held by another process
   (closed ones are opened again), while this one connects, logs in (PLAIN) and gets a
   NOOP answered, five times; the time each took.

Every connection goes to 127.0.0.1. The node is `python -m dcptool` run in the current
directory: run the script from the root of the tree to measure (with PYTHONPATH naming
the same tree).
"""
from __future__ import annotations

import argparse
import json
import shlex
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dcptool.protocol import FrameDecoder, encode_frame  # noqa: E402
from dcptool.protocol.constants import Opcode  # noqa: E402

HDR = struct.Struct(">BBHBBHIIQ")
MiB = 1024 * 1024


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def login_and_noop(host: str, port: int, password: str, timeout: float = 60.0) -> float:
    """Seconds from connect to the answer of a NOOP after a PLAIN login."""
    t0 = time.monotonic()
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        dec = FrameDecoder()

        def call(op, key=b"", value=b""):
            s.sendall(encode_frame(0x80, op, 0, 1, key=key, value=value))
            while True:
                f = dec.next_frame()
                if f is not None:
                    if f.specific:
                        raise RuntimeError(f"opcode {op:#x} failed with {f.specific:#x}")
                    return f
                data = s.recv(65536)
                if not data:
                    raise ConnectionError("closed by the node")
                dec.feed(data)

        call(Opcode.SASL_AUTH, b"PLAIN", b"\x00Administrator\x00" + password.encode())
        call(Opcode.NOOP)
        return time.monotonic() - t0
    finally:
        s.close()


def open_idle(host: str, port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        try:
            out.append(socket.create_connection((host, port), timeout=10))
        except OSError:
            break
    return out


def settle(pid: int, seconds: float = 1.5) -> int:
    time.sleep(seconds)
    return rss(pid)


def oversized(host: str, port: int, n: int, pid: int) -> dict:
    """n connections each sending a 20 MiB - 1 SET body, unauthenticated."""
    blen = 20 * MiB - 1
    header = HDR.pack(0x80, Opcode.SET, 1, 8, 0, 0, blen, 7, 0)
    chunk = b"\xAB" * MiB
    sent = [0] * n
    socks: list[socket.socket] = []

    def push(i: int, s: socket.socket) -> None:
        try:
            s.sendall(header)
            left = blen - 1
            while left > 0:
                part = chunk if left >= MiB else chunk[:left]
                s.sendall(part)
                sent[i] += len(part)
                left -= len(part)
        except OSError:
            pass

    t0 = time.monotonic()
    threads = []
    for i in range(n):
        s = socket.create_connection((host, port), timeout=30)
        socks.append(s)
        t = threading.Thread(target=push, args=(i, s), daemon=True)
        t.start()
        threads.append(t)
    peak = 0
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss(pid))
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    peak = max(peak, rss(pid))
    held = rss(pid)
    for s in socks:
        s.close()
    return {"peak_rss": peak, "rss_held": held, "rss_after_close": settle(pid),
            "seconds": round(elapsed, 2), "body_bytes_sent": sum(sent)}


def _attacker(host: str, port: int, n: int, opened, stop) -> None:
    """Hold up to n anonymous connections, reconnecting the ones the node closes."""
    held: list[socket.socket] = []
    while not stop.is_set():
        try:
            held.append(socket.create_connection((host, port), timeout=10))
            opened.value += 1
        except OSError:
            time.sleep(0.01)
        if len(held) >= n:
            alive = []
            for s in held:
                s.setblocking(False)
                try:
                    gone = s.recv(1) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    s.close()
                else:
                    alive.append(s)
            held = alive
            if len(held) >= n:
                time.sleep(0.05)
    for s in held:
        s.close()


def flood(host: str, port: int, password: str, n: int, logins: int = 5) -> dict:
    """Hold up to n anonymous connections from another process (reconnecting closed ones)
    while this one connects, logs in and gets a NOOP answered, `logins` times."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    opened = ctx.Value("l", 0)
    proc = ctx.Process(target=_attacker, args=(host, port, n, opened, stop), daemon=True)
    proc.start()
    while opened.value < n:
        time.sleep(0.05)
    times = []
    for _ in range(logins):
        try:
            times.append(round(login_and_noop(host, port, password, timeout=60), 3))
        except (OSError, RuntimeError) as exc:
            times.append(f"failed: {exc}")
        time.sleep(0.2)
    stop.set()
    proc.join(30)
    return {"connections_opened": opened.value, "login_and_noop_seconds": times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=4000)
    ap.add_argument("--oversized", type=int, default=60)
    ap.add_argument("--flood", type=int, default=4200,
                    help="anonymous connections held during the login (above the node's "
                         "--max-connections 4096 by default)")
    ap.add_argument("--vbuckets", type=int, default=64)
    ap.add_argument("--node-args", default="")
    ap.add_argument("--skip", default="", help="comma-separated steps to skip: "
                                               "idle,oversized,flood")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    from nodeprocutil import NodeProcess

    out: dict = {"idle_connections": args.idle, "oversized_connections": args.oversized,
                 "node_args": args.node_args}
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "node", vbuckets=args.vbuckets,
                           extra_args=tuple(shlex.split(args.node_args)))
        node.start()
        try:
            host, port, pid = node.host, node.port, node.pid
            out["rss_start"] = settle(pid, 1.0)
            if "idle" not in skip:
                socks = open_idle(host, port, args.idle)
                out["idle_opened"] = len(socks)
                out["rss_idle"] = settle(pid, 3.0)
                for s in socks:
                    s.close()
                out["rss_idle_closed"] = settle(pid, 3.0)
            if "oversized" not in skip:
                out["oversized"] = oversized(host, port, args.oversized, pid)
            if "flood" not in skip:
                out["flood"] = flood(host, port, node.password, args.flood)
                out["rss_end"] = settle(pid, 1.0)
        finally:
            node.stop()
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for k, v in out.items():
        if isinstance(v, int) and k.startswith("rss"):
            v = f"{v / MiB:.1f} MiB"
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
