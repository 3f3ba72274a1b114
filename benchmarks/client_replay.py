"""Benchmark the DCP client alone: replay a recorded DCP byte stream from a socket.

1. Record (once): stream every vbucket of a node to its high seqno with a DcpConsumer and
   save every byte the node sent (handshake replies, failover logs, markers, mutations,
   noops, stream ends) to a file, with a JSON sidecar describing the session that asked.
   By default the script starts a reference node in a temporary directory, loads
   `--mutations` JSON documents of ~`--value-size` bytes on average (`benchmarks/docs.py`)
   and records from it. `-c HOST:PORT`
   records from a running node instead; `--synthetic` builds the stream with the codec.
2. Replay: a separate sender process writes the file to a loopback socket as fast as the
   kernel allows; this process decodes it
   - with a plain parse loop (header + extras unpack, key/value copies, a tuple) - the baseline,
   - with DcpSession (tuples, values copied),
   - with DcpSession (tuples, values as memoryviews),
   - with DcpSession building typed message objects,
   and reports messages/s for each and the ratio to the baseline (best of --repeat).

    python benchmarks/client_replay.py                       # 1M x 256 B from a fresh node
    python benchmarks/client_replay.py --recording /tmp/r.dcp  # reuse a recording
    python benchmarks/client_replay.py --synthetic --mutations 200000
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.docs import values  # noqa: E402
from dcptool.client import (  # noqa: E402
    ZERO,
    Connection,
    DcpConsumer,
    DcpSession,
    Position,
    SessionConfig,
    get_vbucket_seqnos,
)
from dcptool.protocol import FrameDecoder, decode_message, encode_frame  # noqa: E402
from dcptool.protocol.constants import Feature, Magic, Opcode  # noqa: E402
from dcptool.protocol.messages import (  # noqa: E402
    DcpControl,
    DcpMutation,
    DcpOpen,
    DcpSnapshotMarker,
    DcpStreamEnd,
    DcpStreamReq,
    StreamReqOk,
)

PASSWORD = "bench-password"
USER = "Administrator"


# --------------------------------------------------------------------------- recording

def _config(meta: dict, **kw) -> SessionConfig:
    kw.setdefault("collections", int(Feature.COLLECTIONS) in meta.get("features", ()))
    return SessionConfig(name=meta["name"], buffer_size=meta["buffer_size"],
                         noop_interval=meta["noop_interval"], **kw)


def _plan(meta: dict) -> dict[int, tuple[Position, int]]:
    return {int(vb): (ZERO, int(end)) for vb, end in meta["ends"].items()}


def record_from_node(host: str, port: int, out: Path, *, bucket: str, user: str,
                     password: str) -> dict:
    """Record the session a backup task opens (`backup_consumer_config`, HELLO with
    Collections as `dcptool backup` negotiates it: doc keys, as the task meets them)."""
    from dcptool.client.connection import COLLECTION_FEATURES
    from dcptool.pipeline.backup import backup_consumer_config

    with Connection.open(host, port, username=user, password=password, bucket=bucket) as c:
        seqnos = get_vbucket_seqnos(c, state=1)
    meta = {"name": "bench-replay", "buffer_size": 16 * 1024 * 1024, "noop_interval": 60.0,
            "ends": {str(vb): s for vb, s in sorted(seqnos.items()) if s > 0}}
    conn = Connection.open(host, port, username=user, password=password, bucket=bucket,
                           features=COLLECTION_FEATURES)
    meta["features"] = sorted(int(f) for f in conn.features)
    consumer = DcpConsumer(conn, backup_consumer_config(meta["name"],
                                                        buffer_size=meta["buffer_size"],
                                                        noop_interval=meta["noop_interval"]))
    # record every byte: wrap the socket's recv_into
    sink = open(out, "wb")
    real = conn.sock

    class Recorder:
        def __getattr__(self, name):
            return getattr(real, name)

        def recv_into(self, buf, nbytes=0):
            n = real.recv_into(buf, nbytes) if nbytes else real.recv_into(buf)
            sink.write(buf[:n])
            return n

    conn.sock = Recorder()
    consumer.start()
    consumer.add_streams(_plan(meta))
    mutations = 0
    t0 = time.perf_counter()
    for events in consumer.batches(tick=5):
        for ev in events:
            if ev[0] == Opcode.DCP_MUTATION:
                mutations += 1
    secs = time.perf_counter() - t0
    consumer.close()
    sink.close()
    meta["mutations"] = mutations
    meta["bytes"] = out.stat().st_size
    meta["recorded_from"] = f"{host}:{port}"
    meta["record_seconds"] = round(secs, 2)
    return meta


def record_synthetic(out: Path, mutations: int, value_size: int, vbuckets: int) -> dict:
    meta = {"name": "bench-replay", "buffer_size": 16 * 1024 * 1024, "noop_interval": 60.0}
    per_vb = [mutations // vbuckets + (1 if i < mutations % vbuckets else 0) for i in range(vbuckets)]
    meta["ends"] = {str(vb): n for vb, n in enumerate(per_vb)}
    s = DcpSession(_config(meta))
    s.start()
    s_plan = _plan(meta)
    for vb, (pos, end) in s_plan.items():
        s.add_stream(vb, pos, end_seqno=end)
    dec = FrameDecoder()
    dec.feed(s.data_to_send())
    opaques = {}
    with open(out, "wb") as f:
        for frame in dec:
            m = decode_message(frame)
            if isinstance(m, (DcpOpen, DcpControl)):
                f.write(encode_frame(Magic.RESPONSE, m.opcode, 0, m.opaque))
            elif isinstance(m, DcpStreamReq):
                opaques[m.vbucket] = m.opaque
                f.write(StreamReqOk(opaque=m.opaque, failover_log=((0x1234, 0),)).encode())
        docs = values(mutations, value_size)
        cas = 0x17E2C5A4B1000000
        seq = {vb: 0 for vb in opaques}
        chunk = bytearray()
        snap = 512
        remaining = dict(enumerate(per_vb))
        while remaining:
            for vb in list(remaining):
                left = remaining[vb]
                n = min(snap, left)
                start = seq[vb] + 1
                chunk += DcpSnapshotMarker(vbucket=vb, opaque=opaques[vb], start_seqno=start,
                                           end_seqno=start + n - 1, flags=1).encode()
                for i in range(n):
                    sq = start + i
                    chunk += DcpMutation(vbucket=vb, opaque=opaques[vb], by_seqno=sq, rev_seqno=1,
                                         cas=cas + sq, datatype=1,
                                         key=b"\x00doc::%010d" % (sq * vbuckets + vb),
                                         value=next(docs)).encode()
                seq[vb] += n
                remaining[vb] = left - n
                if remaining[vb] == 0:
                    del remaining[vb]
                    chunk += DcpStreamEnd(vbucket=vb, opaque=opaques[vb], reason=0).encode()
                if len(chunk) > 8 << 20:
                    f.write(chunk)
                    chunk.clear()
        f.write(chunk)
    meta["mutations"] = mutations
    meta["bytes"] = out.stat().st_size
    meta["recorded_from"] = "synthetic"
    # keys are doc keys (the default collection's 0x00 in front): a Collections session's
    meta["features"] = [int(Feature.COLLECTIONS)]
    return meta


# --------------------------------------------------------------------------- node

def start_node_and_load(tmp: Path, mutations: int, value_size: int, vbuckets: int):
    """Start a reference node and load documents with pipelined SETs. Returns (proc, port)."""
    data = tmp / "node"
    cmd = [sys.executable, "-m", "dcptool", "node", "start", "--port", "0", "--data", str(data),
           "--vbuckets", str(vbuckets)]
    env = dict(os.environ, DCPTOOL_PASSWORD=PASSWORD)
    proc = subprocess.Popen(cmd + ["--password", PASSWORD], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    port = None
    deadline = time.time() + 60
    while time.time() < deadline and port is None:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise SystemExit(f"node failed to start: {proc.stderr.read()}")
            continue
        for word in line.replace(",", " ").split():
            if word.startswith("127.0.0.1:"):
                port = int(word.split(":")[1].rstrip("."))
    if port is None:
        proc.kill()
        raise SystemExit("node did not report its port")
    from dcptool.protocol.messages import Set
    from dcptool.protocol.vbucket import vbucket_of

    docs = values(mutations, value_size)
    with Connection.open("127.0.0.1", port, username=USER, password=PASSWORD, timeout=60) as c:
        batch = 2000
        t0 = time.perf_counter()
        for base in range(0, mutations, batch):
            out = bytearray()
            ops = []
            for i, value in zip(range(base, min(mutations, base + batch)), docs):
                key = b"doc::%010d" % i
                frame = Set(key=key, value=value, vbucket=vbucket_of(key, vbuckets),
                            datatype=1).to_frame()
                frame.opaque = c.next_opaque()
                ops.append(frame.opaque)
                out += frame.encode()
            c.send_bytes(out)
            for op in ops:
                rsp = c.wait_response(op)
                if rsp.status != 0:
                    raise SystemExit(f"SET failed with status {rsp.status:#x}")
        print(f"loaded {mutations} documents in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return proc, port


# --------------------------------------------------------------------------- replay

SENDER = r"""
import mmap, socket, sys, threading
path = sys.argv[1]
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
while True:
    c, _ = srv.accept()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    def drain():
        try:
            while c.recv(1 << 20):
                pass
        except OSError:
            pass
    t = threading.Thread(target=drain, daemon=True); t.start()
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        mv = memoryview(mm)
        for off in range(0, len(mv), 1 << 20):
            c.sendall(mv[off:off + (1 << 20)])
        mv.release(); mm.close()
    c.shutdown(socket.SHUT_WR)
    t.join()
    c.close()
"""


class Sender:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SENDER, str(path)],
                                     stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


HDR = struct.Struct(">BBHBBHIIQ")
MUT = struct.Struct(">QQIIIHB")


def run_baseline(sender: Sender, total_bytes: int) -> tuple[int, float]:
    """A plain loop: recv_into, header + extras unpack, bytes key/value (slices of a bytes
    copy of each chunk), a tuple per mutation."""
    sock = sender.connect()
    buf = bytearray(1 << 20)
    mv = memoryview(buf)
    have = 0
    got = 0
    msgs = 0
    hdr = HDR.unpack_from
    mut = MUT.unpack_from
    t0 = time.perf_counter()
    while got < total_bytes:
        n = sock.recv_into(mv[have:])
        if not n:
            break
        got += n
        end_all = have + n
        pos = 0
        out = []
        append = out.append
        data = bytes(mv[:end_all])  # slices of bytes are bytes made in one step
        while end_all - pos >= 24:
            magic, op, klen, elen, dt, vb, blen, opq, cas = hdr(data, pos)
            end = pos + 24 + blen
            if end > end_all:
                break
            if op == 0x57:
                seq, rev, flags, exp, lt, nm, nru = mut(data, pos + 24)
                k = pos + 24 + elen
                v = k + klen
                append((0x57, vb, seq, rev, cas, flags, exp, dt, data[k:v], data[v:end]))
            pos = end
        msgs += len(out)
        rest = end_all - pos
        if rest:
            mv[:rest] = bytes(mv[pos:end_all])
        have = rest
    secs = time.perf_counter() - t0
    sock.close()
    return msgs, secs


def run_receive(sender: Sender, total_bytes: int) -> tuple[int, float]:
    """Limit 1a: receive every byte into a reused buffer, nothing else. Returns (bytes, s)."""
    sock = sender.connect()
    buf = bytearray(1 << 20)
    mv = memoryview(buf)
    got = 0
    t0 = time.perf_counter()
    while got < total_bytes:
        n = sock.recv_into(mv)
        if not n:
            break
        got += n
    secs = time.perf_counter() - t0
    sock.close()
    return got, secs


def run_headers(sender: Sender, total_bytes: int) -> tuple[int, float]:
    """Limit 1b: receive and walk the 24-byte headers (precompiled Struct on a memoryview)."""
    sock = sender.connect()
    buf = bytearray(1 << 20)
    mv = memoryview(buf)
    have = got = msgs = 0
    hdr = HDR.unpack_from
    t0 = time.perf_counter()
    while got < total_bytes:
        n = sock.recv_into(mv[have:])
        if not n:
            break
        got += n
        end_all = have + n
        pos = 0
        while end_all - pos >= 24:
            end = pos + 24 + hdr(mv, pos)[6]
            if end > end_all:
                break
            msgs += 1
            pos = end
        rest = end_all - pos
        if rest:
            mv[:rest] = bytes(mv[pos:end_all])
        have = rest
    secs = time.perf_counter() - t0
    sock.close()
    return msgs, secs


def run_pack_zstd(sender: Sender, total_bytes: int, out_path: Path, level: int = 3,
                  block: int = 1 << 20) -> tuple[int, float, int]:
    """Limit 1c: parse, build a record tuple, msgpack it into one buffer, zstd-`level` each
    ~1 MiB block and write it to a file. The plain-Python ceiling for a backup task (keys
    and values are slices of a bytes copy of each chunk: cheaper than bytes(view[a:b])).
    Returns (records, seconds, bytes of the file)."""
    import msgpack
    import zstandard

    sock = sender.connect()
    buf = bytearray(1 << 20)
    mv = memoryview(buf)
    have = got = msgs = 0
    hdr = HDR.unpack_from
    mut = MUT.unpack_from
    pack = msgpack.Packer().pack
    cctx = zstandard.ZstdCompressor(level=level)
    out = bytearray()
    t0 = time.perf_counter()
    with open(out_path, "wb") as f:
        while got < total_bytes:
            n = sock.recv_into(mv[have:])
            if not n:
                break
            got += n
            end_all = have + n
            pos = 0
            data = bytes(mv[:end_all])  # slices of bytes are bytes made in one step
            while end_all - pos >= 24:
                magic, op, klen, elen, dt, vb, blen, opq, cas = hdr(data, pos)
                end = pos + 24 + blen
                if end > end_all:
                    break
                if op == 0x57:
                    seq, rev, flags, exp, lt, nm, nru = mut(data, pos + 24)
                    k = pos + 24 + elen
                    v = k + klen
                    out += pack((3, seq, rev, cas, flags, exp, dt, data[k:v], data[v:end], None))
                    msgs += 1
                    if len(out) >= block:
                        f.write(cctx.compress(out))
                        out.clear()
                pos = end
            rest = end_all - pos
            if rest:
                mv[:rest] = bytes(mv[pos:end_all])
            have = rest
        if out:
            f.write(cctx.compress(out))
    secs = time.perf_counter() - t0
    sock.close()
    return msgs, secs, out_path.stat().st_size


#: seconds of the last run_backup_task's filesystem sync (part of its seconds)
last_sync_seconds = 0.0


def run_backup_task(sender: Sender, meta: dict, scratch: Path, **kw) -> tuple[int, float, int]:
    """dcptool's backup task loop (`dcptool.pipeline.backup.write_events`, the code a Spark
    task runs) on the replayed stream, into a fresh archive under `scratch`.
    Returns (records written, seconds, archive bytes)."""
    from dcptool.archive import Archive, FULL, VBucketWriter
    from dcptool.archive.format import sync_filesystem
    from dcptool.pipeline.backup import backup_consumer_config, write_events
    from dcptool.pipeline.plans import VBucketPlan

    shutil.rmtree(scratch, ignore_errors=True)
    plan = _plan(meta)
    archive = Archive.create(scratch, bucket="default", vbuckets=max(plan) + 1)
    bw = archive.begin_backup(FULL)
    # as backup_task does: no fsync per vbucket, one filesystem sync at the end (timed)
    writers = {vb: VBucketWriter(archive, bw.id, vb,
                                 {"uuid": 0, "seqno": 0, "snap_start": 0, "snap_end": 0}, (),
                                 sync=False)
               for vb in plan}
    run = {vb: {"opens": 0, "retries": 0, "first_open": None} for vb in plan}
    sock = sender.connect()
    conn = replay_connection(sock, sender, meta)
    config = backup_consumer_config(meta["name"], buffer_size=meta["buffer_size"],
                                    noop_interval=meta["noop_interval"], **kw)
    consumer = DcpConsumer(conn, config)
    consumer.start()
    consumer.add_streams(plan)
    summaries: list = []
    t0 = time.perf_counter()
    pending = write_events(consumer, writers, {vb: VBucketPlan(vb, p, end) for vb, (p, end) in plan.items()},
                           {vb: p for vb, (p, _) in plan.items()},
                           run, summaries, time.monotonic(), tick=30)
    ts = time.perf_counter()
    sync_filesystem(scratch)
    global last_sync_seconds
    last_sync_seconds = time.perf_counter() - ts
    secs = time.perf_counter() - t0
    consumer.close()
    if pending:
        raise RuntimeError(f"replay ended without stream ends for {sorted(pending)[:8]}")
    entries = [s.entry for s in summaries]
    items = sum(s["counts"]["mutations"] + s["counts"]["deletions"] + s["counts"]["expirations"]
                for s in entries)
    size = sum(s["bytes"]["files"] for s in entries)
    bw.abort()
    shutil.rmtree(scratch, ignore_errors=True)
    return items, secs, size


def replay_connection(sock: socket.socket, sender: Sender, meta: dict) -> Connection:
    """A connection on the replay's socket that negotiated what the recorded one did
    (Collections: the stream's keys are doc keys)."""
    conn = Connection(sock, "replay", sender.port, timeout=30)
    conn.features = frozenset(meta.get("features", ()))
    return conn


def run_session(sender: Sender, meta: dict, **kw) -> tuple[int, float]:
    sock = sender.connect()
    conn = replay_connection(sock, sender, meta)
    consumer = DcpConsumer(conn, _config(meta, **kw))
    consumer.start()
    consumer.add_streams(_plan(meta))
    records = 0
    t0 = time.perf_counter()
    for events in consumer.batches(tick=30):
        records += len(events)
    secs = time.perf_counter() - t0
    consumer.close()
    return records, secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutations", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=256)
    ap.add_argument("--vbuckets", type=int, default=16)
    ap.add_argument("--recording", type=Path, help="use (or create) this recording file")
    ap.add_argument("--synthetic", action="store_true", help="build the stream with the codec")
    ap.add_argument("-c", "--cluster", help="record from this running node (HOST:PORT)")
    ap.add_argument("--bucket", default="default")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="dcptool-replay-"))
    node = None
    try:
        rec = args.recording or tmp / "stream.dcp"
        meta_path = Path(str(rec) + ".json")
        if rec.exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text())
        else:
            if args.synthetic:
                meta = record_synthetic(rec, args.mutations, args.value_size, args.vbuckets)
            elif args.cluster:
                host, _, port = args.cluster.rpartition(":")
                meta = record_from_node(host, int(port), rec, bucket=args.bucket, user=USER,
                                        password=os.environ.get("DCPTOOL_PASSWORD", PASSWORD))
            else:
                node, port = start_node_and_load(tmp, args.mutations, args.value_size, args.vbuckets)
                meta = record_from_node("127.0.0.1", port, rec, bucket=args.bucket, user=USER,
                                        password=PASSWORD)
            meta_path.write_text(json.dumps(meta))
        if node is not None:
            node.terminate()
            node.wait(30)
            node = None
        print(f"recording: {meta['mutations']} mutations, {meta['bytes'] / 1e6:.1f} MB, "
              f"from {meta['recorded_from']}", file=sys.stderr, flush=True)
        sender = Sender(rec)
        results: dict[str, dict] = {}
        modes = [
            ("plain loop (baseline)", lambda: run_baseline(sender, meta["bytes"])),
            ("session, tuples, values copied", lambda: run_session(sender, meta)),
            ("session, tuples, memoryview values", lambda: run_session(sender, meta, copy_values=False)),
            ("session, typed message objects", lambda: run_session(sender, meta, typed=True)),
        ]
        try:
            for _ in range(args.repeat):
                for name, fn in modes:
                    n, secs = fn()
                    r = results.setdefault(name, {"messages": n, "seconds": secs})
                    if secs < r["seconds"]:
                        r["seconds"] = secs
        finally:
            sender.close()
        # every mode decodes the same bytes: rates are mutations per second of wall time
        base_rate = meta["mutations"] / results["plain loop (baseline)"]["seconds"]
        rows = []
        for name, r in results.items():
            rate = meta["mutations"] / r["seconds"]
            rows.append({"mode": name, "events": r["messages"], "seconds": round(r["seconds"], 3),
                         "messages_per_s": round(rate), "MB_per_s": round(meta["bytes"] / r["seconds"] / 1e6, 1),
                         "ratio_to_baseline": round(rate / base_rate, 3)})
        if args.json:
            print(json.dumps({"recording": meta | {"ends": len(meta["ends"])}, "results": rows}, indent=2))
        else:
            print(f"{'mode':<38} {'events':>9} {'seconds':>8} {'msgs/s':>10} {'MB/s':>7} {'ratio':>6}")
            for r in rows:
                print(f"{r['mode']:<38} {r['events']:>9} {r['seconds']:>8.3f} {r['messages_per_s']:>10} "
                      f"{r['MB_per_s']:>7} {r['ratio_to_baseline']:>6.2f}")
    finally:
        if node is not None:
            node.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
