"""Drain N documents of S bytes from a reference node over one DCP connection.

    python benchmarks/node_drain.py -n 1000000 -s 256 --modes disk,memory [--eviction value,full]

Each mode starts its own node (a real `dcptool node start` process), loads the
documents over a few connections, then opens one DCP connection with a stream per
vbucket (start 0, end = the vbucket's high seqno) and reads until every stream ended:

* disk: the node is restarted after loading, so every item comes from disk backfills
  (one SQLite read transaction per vbucket);
* memory: the node runs with the flusher held back and a checkpoint budget large enough
  to keep everything, so every item comes from memory snapshots.

The reading side only walks the 24-byte headers, counts messages and bytes and acks
flow control, so the figure is the node's. Reports items/s and MB/s of wire bytes and
the node's peak RSS (VmHWM; in disk mode that of the restarted node). `--eviction full`
runs the node with full eviction (`--memory-quota`, default 64MiB); `value,full` runs
every mode in both, one after the other.
`--profile` records the node with py-spy while it drains (py-spy must be installed).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import struct
import subprocess
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
STREAM_REQ = struct.Struct(">IIQQQQQ")


def session(host: str, port: int, password: str) -> tuple[socket.socket, callable]:
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    dec = FrameDecoder()

    def call(op, key=b"", value=b"", extras=b"", vb=0):
        s.sendall(encode_frame(0x80, op, vb, 1, extras=extras, key=key, value=value))
        while True:
            f = dec.next_frame()
            if f is not None:
                if f.specific:
                    raise RuntimeError(f"opcode {op:#x} failed with status {f.specific:#x}")
                return f
            dec.feed(s.recv(65536))

    call(Opcode.HELLO, b"bench", struct.pack(">HHH", Feature.XERROR, Feature.JSON, Feature.TCP_NODELAY))
    call(Opcode.SASL_AUTH, b"PLAIN", b"\x00Administrator\x00" + password.encode())
    call(Opcode.SELECT_BUCKET, b"default")
    return s, call


def _load(args) -> None:
    host, port, password, lo, hi, size, vbuckets = args
    s, _ = session(host, port, password)
    bodies = values(hi - lo, size, start=lo)
    window = 1024
    sent = received = 0
    count = hi - lo
    buf = bytearray()
    while received < count:
        if sent < count and sent - received < window:
            n = min(256, count - sent)
            s.sendall(b"".join(
                encode_frame(0x80, Opcode.SET, vbucket_of(b"doc-%09d" % i, vbuckets), 0,
                             datatype=1, extras=b"\x00" * 8, key=b"doc-%09d" % i, value=body)
                for i, body in zip(range(lo + sent, lo + sent + n), bodies)))
            sent += n
            continue
        buf += s.recv(1 << 20)
        off = 0
        while len(buf) - off >= 24:
            bl = HDR.unpack_from(buf, off)[6]
            if len(buf) - off < 24 + bl:
                break
            if buf[off + 7] or buf[off + 6]:
                raise RuntimeError("SET failed")
            off += 24 + bl
            received += 1
        del buf[:off]
    s.close()


def load(host, port, password, n, size, vbuckets, procs=3) -> float:
    # the documents (benchmarks/docs.py), made once in this process: the forked loaders
    # inherit them, and so do the next loads of the same documents
    for _ in values(n, size):
        pass
    t0 = time.perf_counter()
    per = (n + procs - 1) // procs
    jobs = [(host, port, password, i * per, min(n, (i + 1) * per), size, vbuckets)
            for i in range(procs) if i * per < n]
    with mp.get_context("fork").Pool(len(jobs)) as pool:
        pool.map(_load, jobs)
    return time.perf_counter() - t0


def high_seqnos(call) -> dict[int, int]:
    f = call(Opcode.GET_ALL_VB_SEQNOS)
    return {vb: s for vb, s in struct.iter_unpack(">HQ", f.value)}


def drain(host, port, password, highs: dict[int, int], buffer_size: int) -> dict:
    s, call = session(host, port, password)
    call(Opcode.DCP_OPEN, b"bench-drain", extras=struct.pack(">II", 0, 1))
    if buffer_size:
        call(Opcode.DCP_CONTROL, b"connection_buffer_size", str(buffer_size).encode())
    reqs = []
    streams = 0
    for vb, high in sorted(highs.items()):
        if not high:
            continue
        streams += 1
        reqs.append(encode_frame(0x80, Opcode.DCP_STREAM_REQ, vb, 0x10000 + vb,
                                 extras=STREAM_REQ.pack(0, 0, 0, high, 0, 0, 0)))
    t0 = time.perf_counter()
    s.sendall(b"".join(reqs))
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    start = end = 0
    ended = items = markers = nbytes = 0
    unacked = 0
    ack_at = buffer_size // 5 if buffer_size else 0
    unpack = HDR.unpack_from
    first_item = None
    while ended < streams:
        if end == len(buf):
            buf[:end - start] = buf[start:end]
            end -= start
            start = 0
            view = memoryview(buf)
        n = s.recv_into(view[end:])
        if not n:
            raise RuntimeError("the node closed the connection")
        end += n
        while end - start >= 24:
            magic, op, kl, el, dt, spec, bl, opq, cas = unpack(buf, start)
            size = 24 + bl
            if end - start < size:
                if size > len(buf):
                    raise RuntimeError("frame larger than the read buffer")
                break
            start += size
            if magic == 0x81:
                if op == Opcode.DCP_STREAM_REQ and spec:
                    raise RuntimeError(f"stream request failed with {spec:#x}")
                continue
            nbytes += size
            unacked += size
            if op == 0x57 or op == 0x58 or op == 0x59:
                items += 1
                if first_item is None:
                    first_item = time.perf_counter()
            elif op == 0x56:
                markers += 1
            elif op == 0x55:
                ended += 1
            elif op == 0x5C:
                s.sendall(bytes([0x81, 0x5C]) + bytes(buf[start - size + 2:start - size + 24]))
                unacked -= size
                nbytes -= size
        if ack_at and unacked >= ack_at:
            s.sendall(encode_frame(0x80, Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, 0, 0,
                                   extras=struct.pack(">I", unacked)))
            unacked = 0
    elapsed = time.perf_counter() - t0
    s.close()
    return {"items": items, "markers": markers, "streams": streams, "wire_bytes": nbytes,
            "seconds": round(elapsed, 3), "items_per_s": round(items / elapsed),
            "MB_per_s": round(nbytes / elapsed / 1e6, 1),
            "first_item_after_s": round((first_item or time.perf_counter()) - t0, 3)}


def _stat(host, port, password, group=b"") -> dict[bytes, bytes]:
    s = socket.create_connection((host, port))
    s.sendall(encode_frame(0x80, Opcode.SASL_AUTH, 0, 1, key=b"PLAIN",
                           value=b"\x00Administrator\x00" + password.encode()))
    s.sendall(encode_frame(0x80, Opcode.SELECT_BUCKET, 0, 2, key=b"default"))
    s.sendall(encode_frame(0x80, Opcode.STAT, 0, 3, key=group))
    dec = FrameDecoder()
    out = {}
    while True:
        f = dec.next_frame()
        if f is None:
            dec.feed(s.recv(1 << 20))
            continue
        if f.opaque != 3:
            continue
        if not f.key:
            break
        out[f.key] = f.value
    s.close()
    return out


def peak_rss_mb(pid: int | None) -> float | None:
    """The peak resident set (VmHWM) of a running process, in MB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def run_mode(mode: str, a) -> dict:
    from nodeprocutil import NodeProcess

    eviction = getattr(a, "eviction", "value")
    tmp = tempfile.TemporaryDirectory(prefix=f"dcptool-drain-{mode}-")
    extra = ["--checkpoint-memory", a.checkpoint_memory]
    if eviction != "value":
        extra += ["--eviction", eviction,
                  "--memory-quota", getattr(a, "memory_quota", None) or "64MiB"]
    if mode == "memory":
        extra += ["--flush-interval", "3600"]
    node = NodeProcess(Path(tmp.name) / "node", vbuckets=a.vbuckets, extra_args=tuple(extra))
    node.start()
    try:
        t_load = load(node.host, node.port, "password", a.n, a.s, a.vbuckets)
        if mode == "disk":
            t0 = time.monotonic()
            while _stat(node.host, node.port, "password").get(b"ep_queue_size") != b"0":
                time.sleep(0.2)
                if time.monotonic() - t0 > 600:
                    raise RuntimeError("flusher did not catch up")
            t0 = time.perf_counter()
            node.restart(timeout=600)
            t_restart = time.perf_counter() - t0
        else:
            t_restart = 0.0
        s, call = session(node.host, node.port, "password")
        highs = high_seqnos(call)
        s.close()
        spy = None
        if a.profile:
            spy = subprocess.Popen(["py-spy", "record", "-p", str(node.pid), "-o",
                                    f"{a.profile}-{mode}.txt", "-f", "raw", "-r", "250"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        r = drain(node.host, node.port, "password", highs, a.buffer_size)
        r["node_peak_rss_MB"] = peak_rss_mb(node.pid)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        if eviction != "value":
            st = _stat(node.host, node.port, "password")
            r["node_stats"] = {k.decode(): v.decode() for k, v in st.items() if k in (
                b"ep_num_value_ejects", b"ep_bg_fetched", b"ep_kv_size", b"ep_resident_items",
                b"ep_bloom_filter_size")}
        r.update({"mode": mode, "eviction": eviction, "docs": a.n, "doc_bytes": a.s, "vbuckets": a.vbuckets,
                  "load_s": round(t_load, 1), "restart_s": round(t_restart, 1)})
        return r
    finally:
        node.stop(timeout=600)
        tmp.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=1_000_000)
    ap.add_argument("-s", type=int, default=256)
    ap.add_argument("--vbuckets", type=int, default=1024)
    ap.add_argument("--modes", default="disk,memory")
    ap.add_argument("--buffer-size", type=int, default=20 * 1024 * 1024,
                    help="connection_buffer_size (0 = no flow control)")
    ap.add_argument("--checkpoint-memory", default="4GiB")
    ap.add_argument("--eviction", default="value",
                    help="the node's --eviction: value, full, or value,full to run both")
    ap.add_argument("--memory-quota", default="64MiB", help="the node's --memory-quota (full)")
    ap.add_argument("--profile", default=None, help="write py-spy raw profiles to PREFIX-MODE.txt")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = []
    runs = [(m, e) for e in a.eviction.split(",") for m in a.modes.split(",")]
    for mode, eviction in runs:
        a_run = argparse.Namespace(**{**vars(a), "eviction": eviction})
        r = run_mode(mode, a_run)
        results.append(r)
        if not a.json:
            print(f"{mode:6s} ({eviction}): {r['items']} items ({r['docs']} docs x {r['doc_bytes']} B, "
                  f"{r['streams']} streams, {r['markers']} markers) in {r['seconds']} s = "
                  f"{r['items_per_s']} items/s, {r['MB_per_s']} MB/s "
                  f"[load {r['load_s']} s, restart {r['restart_s']} s, "
                  f"node peak RSS {r['node_peak_rss_MB']} MB]", flush=True)
    if a.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
