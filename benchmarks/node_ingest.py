"""Load N documents of S bytes into a reference node over one and over several connections.

    python benchmarks/node_ingest.py -n 200000 -s 512 --connections 1,4

Starts its own node (a real `dcptool node start` process in a temporary directory)
unless --host/--port are given. Each connection is a separate client process that
sends pre-encoded SET frames with up to --window requests in flight, so the figure is
the node's, not the client's. Reports sets/s and MB/s per run, and the time until the
flusher has persisted everything; with a node of its own, also the CPU time the node
process spent while the documents went in (`node_cpu_s`, and per document
`node_cpu_us_per_set`), a figure a busy machine disturbs less than the wall clock.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.docs import values  # noqa: E402
from dcptool.protocol import FrameDecoder, encode_frame, vbucket_of  # noqa: E402
from dcptool.protocol.constants import Feature, Opcode  # noqa: E402

HDR = struct.Struct(">BBHBBHIIQ")


def _session(host: str, port: int, password: str) -> socket.socket:
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    dec = FrameDecoder()

    def call(op, key=b"", value=b""):
        s.sendall(encode_frame(0x80, op, 0, 1, key=key, value=value))
        while True:
            f = dec.next_frame()
            if f is not None:
                if f.specific:
                    raise RuntimeError(f"opcode {op:#x} failed with {f.specific:#x}")
                return f
            dec.feed(s.recv(65536))

    call(Opcode.HELLO, b"bench", struct.pack(">HHH", Feature.XERROR, Feature.JSON, Feature.TCP_NODELAY))
    call(Opcode.SASL_AUTH, b"PLAIN", b"\x00Administrator\x00" + password.encode())
    call(Opcode.SELECT_BUCKET, b"default")
    return s


def _load(args, barrier=None) -> tuple[int, float, float]:
    host, port, password, start, count, size, vbuckets, window, prefix = args
    s = _session(host, port, password)
    # JSON documents of ~size bytes (benchmarks/docs.py); raw bytes below a JSON's least
    bodies = values(count, size, start=start) if size >= 64 else iter(lambda: b"x" * size, None)
    frames = []
    for i, body in zip(range(start, start + count), bodies):
        key = b"%s%010d" % (prefix, i)
        frames.append(encode_frame(0x80, Opcode.SET, vbucket_of(key, vbuckets), i,
                                   datatype=0x01 if size >= 64 else 0, extras=b"\x00" * 8,
                                   key=key, value=body))
    if barrier is not None:
        barrier.wait()
    t0 = time.perf_counter()
    send_frames(s, frames, window)
    t1 = time.perf_counter()
    s.close()
    return count, t0, t1


def send_frames(s: socket.socket, frames: list[bytes], window: int) -> None:
    """Send `frames` (SETs) with up to `window` in flight; read and check every answer."""
    count = len(frames)
    buf = bytearray()
    received = 0
    sent = 0
    s.setblocking(True)
    chunk = 64
    while received < count:
        while sent < count and sent - received < window:
            n = min(chunk, count - sent, window - (sent - received))
            s.sendall(b"".join(frames[sent:sent + n]))
            sent += n
        data = s.recv(1 << 20)
        if not data:
            raise RuntimeError("node closed the connection")
        buf += data
        off = 0
        while len(buf) - off >= 24:
            magic, op, kl, el, dt, status, bl, opq, cas = HDR.unpack_from(buf, off)
            if len(buf) - off < 24 + bl:
                break
            if status:
                raise RuntimeError(f"SET failed with status {status:#x}")
            off += 24 + bl
            received += 1
        del buf[:off]


def run(host, port, password, n, size, vbuckets, conns, window, prefix) -> dict:
    per = n // conns
    jobs = [(host, port, password, i * per, per if i < conns - 1 else n - per * (conns - 1),
             size, vbuckets, window, prefix) for i in range(conns)]
    if size >= 64:  # the documents, made once here: forked loaders inherit them
        for _ in values(n, size):
            pass
    if conns == 1:
        results = [_load(jobs[0])]
    else:
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(conns)
        q = ctx.Queue()
        procs = [ctx.Process(target=lambda j=j: q.put(_load(j, barrier))) for j in jobs]
        for p in procs:
            p.start()
        results = [q.get() for _ in procs]
        for p in procs:
            p.join()
    # perf_counter is CLOCK_MONOTONIC: comparable across the forked processes
    wall = max(t1 for _, _, t1 in results) - min(t0 for _, t0, _ in results)
    total = sum(c for c, _, _ in results)
    return {"connections": conns, "docs": total, "doc_bytes": size, "seconds": round(wall, 3),
            "sets_per_s": round(total / wall), "MB_per_s": round(total * size / wall / 1e6, 1)}


def wait_persisted(host, port, password, timeout=300.0) -> float:
    s = _session(host, port, password)
    dec = FrameDecoder()
    t0 = time.perf_counter()
    try:
        while time.perf_counter() - t0 < timeout:
            s.sendall(encode_frame(0x80, Opcode.STAT, 0, 9, key=b""))
            stats = {}
            while True:
                f = dec.next_frame()
                if f is None:
                    dec.feed(s.recv(65536))
                    continue
                if not f.key:
                    break
                stats[f.key] = f.value
            if stats.get(b"ep_queue_size") == b"0":
                return time.perf_counter() - t0
            time.sleep(0.05)
    finally:
        s.close()
    return float("nan")


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid` so far."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200_000, help="documents per run")
    ap.add_argument("-s", type=int, default=512, help="document size in bytes")
    ap.add_argument("--connections", default="1,4", help="comma-separated connection counts")
    ap.add_argument("--window", type=int, default=512, help="requests in flight per connection")
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--host", default=None)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--password", default="password")
    ap.add_argument("--node-args", default="", help="extra arguments for 'dcptool node start'")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    node = None
    tmp = None
    host, port = a.host, a.port
    if port is None:
        from nodeprocutil import NodeProcess

        tmp = tempfile.TemporaryDirectory(prefix="dcptool-ingest-")
        node = NodeProcess(Path(tmp.name) / "node", vbuckets=a.vbuckets, password=a.password,
                           extra_args=tuple(a.node_args.split()))
        node.start()
        host, port = node.host, node.port
    out = []
    try:
        for i, conns in enumerate(int(x) for x in a.connections.split(",")):
            cpu0 = _cpu_seconds(node.pid) if node is not None else None
            r = run(host, port, a.password, a.n, a.s, a.vbuckets, conns, a.window,
                    b"ingest-%d-" % i)
            if cpu0 is not None:
                cpu = _cpu_seconds(node.pid) - cpu0
                r["node_cpu_s"] = round(cpu, 2)
                r["node_cpu_us_per_set"] = round(cpu / r["docs"] * 1e6, 2)
            r["persisted_after_s"] = round(wait_persisted(host, port, a.password), 3)
            out.append(r)
            if not a.json:
                print(f"{r['connections']} connection(s): {r['docs']} docs x {r['doc_bytes']} B in "
                      f"{r['seconds']} s = {r['sets_per_s']} sets/s, {r['MB_per_s']} MB/s; "
                      f"all persisted {r['persisted_after_s']} s later"
                      + (f"; node CPU {r['node_cpu_s']} s ({r['node_cpu_us_per_set']} us/set)"
                         if "node_cpu_s" in r else ""), flush=True)
    finally:
        if node is not None:
            node.stop()
            tmp.cleanup()
    if a.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
