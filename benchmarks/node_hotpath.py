"""The node's write hot path alone: CPU per document of SET_WITH_META against SET.

    python -m benchmarks.node_hotpath [-n 100000] [--rounds 5] [--key-order] [--json FILE]

N documents of `benchmarks/docs.py` (~256 bytes, keys `order::NNNNNNNNN` in the default
collection, 1024 vbuckets) are encoded twice, before any timing: as a restore sends them
(`MetaWriter`'s windows of 2000 SETQ_WITH_META, each closed by a NOOP, over a connection
with Collections) and as plain SETs (datatype JSON). Both go vbucket by vbucket, as a
restore task writes them; with --key-order in the order of their keys, as the ingest
benchmark sends them (each document to another vbucket than the one before: the node's
per-vbucket tables leave the CPU's caches, ~1.8x the CPU a document). Each
round, for each form, a fresh bucket (value eviction, its flusher not running) takes the
bytes through `dcptool.node.ingest.take_writes` in reads of 256 KiB, as a connection's read
buffer hands them over; a NOOP the hot path leaves is skipped. Reported: the CPU
microseconds per document of `take_writes` (its answers packed, for the SETs; no socket,
no persistence), each round and the medians. To measure another tree's hot path with the
same documents: `PYTHONPATH=OTHER_TREE python benchmarks/node_hotpath.py` (a path, not -m:
with -m the current directory's dcptool comes first).
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # after PYTHONPATH: another tree's dcptool may be measured
    sys.path.append(str(REPO))

import dcptool  # noqa: E402
from benchmarks import docs  # noqa: E402
from benchmarks.results import print_and_keep  # noqa: E402
from dcptool.node.access import Privilege  # noqa: E402
from dcptool.node.bucket import Bucket  # noqa: E402
from dcptool.node.ingest import take_writes  # noqa: E402
from dcptool.pipeline import metawriter as mw  # noqa: E402
from dcptool.protocol import encode_frame, vbucket_of  # noqa: E402
from dcptool.protocol.constants import Opcode  # noqa: E402

VBUCKETS = 1024
VALUE_SIZE = 256
READ = 256 * 1024  # the node's read buffer (connection.READ_BUFFER)
_NOOP = int(Opcode.NOOP)


class _Capture:
    """What a MetaWriter sends, kept instead of sent."""

    collections = True
    address = "hot path"

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)


class _Conn:
    """The parts of a node connection `take_writes` reads: logged in, Collections and JSON
    negotiated, allowed to write with and without meta."""

    authenticated = True
    closing = False
    collections = True
    json = True
    mutation_seqno = False
    peer = "hot path"

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket
        self.out: list[bytes] = []
        self.frames_in = 0
        self.wrote = False
        self.out_bytes = 0
        self.privileges = {Privilege.META_WRITE, Privilege.WRITE}


def encode(n: int, key_order: bool = False) -> tuple[bytes, bytes]:
    """(the restore's windows, the SETs) of the same n documents."""
    records = [(mw.WRITE_MUTATION, b"\x00order::%09d" % i, v, 0, 0, 1, 0x1600000000000000 + i, 1)
               for i, v in enumerate(docs.values(n, VALUE_SIZE))]
    if not key_order:
        records.sort(key=lambda r: vbucket_of(r[1][1:], VBUCKETS))
    cap = _Capture()
    w = mw.MetaWriter(cap, VBUCKETS, prefixed=True)
    for i in range(0, n, w.window):
        w._send(records[i:i + w.window], 0)
    sets = b"".join(encode_frame(0x80, Opcode.SET, vbucket_of(r[1][1:], VBUCKETS), i,
                                 datatype=0x01, extras=b"\x00" * 8, key=r[1], value=r[2])
                    for i, r in enumerate(records))
    return b"".join(cap.sent), sets


def take(data: bytes, work: Path) -> tuple[float, int]:
    """(CPU seconds of take_writes, documents stored) for `data` into a fresh bucket."""
    d = Path(tempfile.mkdtemp(dir=work))
    bucket = Bucket(d, num_vbuckets=VBUCKETS, flush_interval=3600)
    bucket.warm_up()
    try:
        conn = _Conn(bucket)
        buf = bytearray()
        pos = 0
        cpu = 0.0
        gc.disable()  # (the node runs with the collector's thresholds raised, server.py)
        try:
            while True:
                if len(buf) < READ and pos < len(data):
                    buf += data[pos:pos + READ]
                    pos += READ
                c0 = time.process_time()
                used = take_writes(conn, buf, 20 << 20)
                cpu += time.process_time() - c0
                if used:
                    del buf[:used]
                    conn.out.clear()
                elif len(buf) >= 24 and buf[1] == _NOOP:
                    del buf[:24]
                elif pos >= len(data):
                    break
        finally:
            gc.enable()
        if buf:
            raise RuntimeError(f"the hot path left {len(buf)} bytes it should have taken")
        return cpu, sum(len(vb.items) for vb in bucket.vbuckets.values())
    finally:
        bucket.storage.dirty.clear()  # (nothing of it is to be persisted)
        bucket.stop(clean=False)
        shutil.rmtree(d, ignore_errors=True)


def run(n: int = 100_000, rounds: int = 5, key_order: bool = False) -> dict:
    meta, sets = encode(n, key_order)
    work = Path(tempfile.mkdtemp(prefix="dcptool-bench-hot-"))
    res: dict = {"tree": str(Path(dcptool.__file__).resolve().parent.parent),
                 "n": n, "value_size": VALUE_SIZE, "vbuckets": VBUCKETS, "rounds": rounds,
                 "order": "keys" if key_order else "vbuckets",
                 "set_with_meta_us": [], "set_us": []}
    try:
        for _ in range(rounds):
            for name, data in (("set_with_meta_us", meta), ("set_us", sets)):
                cpu, stored = take(data, work)
                if stored != n:
                    raise RuntimeError(f"{name}: {stored} documents stored, not {n}")
                res[name].append(round(1e6 * cpu / n, 3))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in ("set_with_meta_us", "set_us"):
        res["median_" + name] = round(statistics.median(res[name]), 3)
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--key-order", action="store_true",
                    help="documents in the order of their keys, not vbucket by vbucket")
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args(argv)
    res = run(a.n, a.rounds, a.key_order)
    return print_and_keep(res, a.json_out)


if __name__ == "__main__":
    main()
