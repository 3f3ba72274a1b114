"""Fuzz a live reference node's frame handling with hostile input.

    python benchmarks/fuzz_node.py --inputs 1000000 --seed 1 --connections 8 [--json]

Starts a real node (`dcptool node start`, by default with `--max-body 128KiB` so that
oversized bodies are cheap to send), then sends it inputs made from the captured client
frames in `tests/vectors/` (the seeds): the frames as they are, random bytes,
truncations, bit flips, mutated header fields (magic, opcode, key/extras/body lengths,
datatype, vbucket), rebuilt sections and flexible framing extras, bodies above the limit,
spliced frames, responses nobody asked for, and whole captured conversations replayed in
odd orders (DCP before DCP_OPEN, SASL steps out of order, frames dropped or repeated).

Inputs go out pipelined over `--connections` concurrent connections; each connection
(a session) carries 1 to a few hundred inputs, half of the sessions after a valid login
(so the commands behind authentication are reached too), and is then closed (connection
churn). A session ends with a NOOP whose answer shows that the node went through every
input; the bytes the node still expects to complete a frame are sent first (the harness
follows the node's framing: every frame with a known magic is 24 bytes plus its declared
body). Responses are read as they come and counted by status.

Every second a fresh connection must get answers to NOOP and VERSION and the node
process must be alive; a node that died or stopped answering is a crash (it is restarted
and the run goes on). The node's RSS (VmRSS of /proc/PID/status) is sampled before,
during and after; after the run both node logs are searched for "Traceback".

`run_fuzz` (and `Fuzzer` for an already running node) is what
`tests/security/test_fuzz_slice.py` runs for a short slice.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import struct
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from dcptool.protocol import FrameDecoder, ProtocolError, encode_frame  # noqa: E402
from dcptool.protocol.constants import (  # noqa: E402
    VALID_MAGICS,
    Feature,
    Opcode,
    Status,
    status_name,
)
from dcptool.protocol.frame import encode_frame_info  # noqa: E402

HDR = struct.Struct(">BBHBBHIIQ")
U32 = struct.Struct(">I")
SENTINEL = 0xF0221E57
HEALTH_OPAQUE = 0x4EA17400
DEFAULT_NODE_ARGS = ("--max-body", "128KiB")
MAX_PAD = 1 << 20
KNOWN_OPCODES = sorted(int(o) for o in Opcode)


#: the captured client frames kept with the tests
VECTORS = REPO / "tests" / "vectors"


# -- seeds ----------------------------------------------------------------------------------


@dataclass
class Seeds:
    frames: list[bytes]                      # every captured frame
    sessions: list[list[bytes]]              # captured conversations, one per connection
    login: bytes                             # HELLO + SASL PLAIN + SELECT_BUCKET

    @property
    def dcp(self) -> list[bytes]:
        return [f for f in self.frames if 0x50 <= f[1] <= 0x67]


def load_seeds(vectors: Path | None = None, *, user: str = "Administrator",
               password: str = "password", bucket: str = "default") -> Seeds:
    """The frames of every `*.requests.hex` vector file, plus a few built here."""
    vectors = Path(vectors) if vectors is not None else VECTORS
    frames: list[bytes] = []
    sessions: dict[tuple[str, str], list[bytes]] = {}
    for path in sorted(vectors.glob("*.requests.hex")):
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            hexpart, _, note = line.partition("#")
            raw = bytes.fromhex(hexpart.strip())
            conn = "1"
            for word in note.split():
                if word.startswith("conn="):
                    conn = word[5:]
            frames.append(raw)
            sessions.setdefault((path.name, conn), []).append(raw)
    if not frames:
        raise SystemExit(f"no vector frames found in {vectors}")
    features = b"".join(struct.pack(">H", f) for f in (
        Feature.XERROR, Feature.JSON, Feature.XATTR, Feature.SELECT_BUCKET,
        Feature.MUTATION_SEQNO, Feature.SNAPPY))
    login = b"".join((
        encode_frame(0x80, Opcode.HELLO, opaque=1, key=b"fuzz", value=features),
        encode_frame(0x80, Opcode.SASL_AUTH, opaque=2, key=b"PLAIN",
                     value=b"\x00" + user.encode() + b"\x00" + password.encode()),
        encode_frame(0x80, Opcode.SELECT_BUCKET, opaque=3, key=bucket.encode()),
    ))
    built = [
        encode_frame(0x80, Opcode.NOOP, opaque=9),
        encode_frame(0x80, Opcode.VERSION, opaque=10),
        encode_frame(0x80, Opcode.SASL_LIST_MECHS, opaque=11),
        encode_frame(0x80, Opcode.SASL_STEP, opaque=12, key=b"SCRAM-SHA512", value=b"c=biws"),
        encode_frame(0x80, Opcode.SASL_AUTH, opaque=13, key=b"SCRAM-SHA512",
                     value=b"n,,n=Administrator,r=abcdef"),
        encode_frame(0x80, Opcode.GET, 3, opaque=14, key=b"fuzz-key"),
        encode_frame(0x80, Opcode.SET, 3, opaque=15, extras=b"\x00" * 8, key=b"fuzz-key",
                     value=b'{"a":1}', datatype=1),
        encode_frame(0x80, Opcode.DELETE, 3, opaque=16, key=b"fuzz-key"),
        encode_frame(0x80, Opcode.STAT, opaque=17, key=b"vbucket-seqno"),
        encode_frame(0x80, Opcode.QUIT, opaque=18),
    ]
    return Seeds(frames + built, list(sessions.values()), login)


# -- mutations ------------------------------------------------------------------------------


class Generator:
    """Inputs (bytes, one or a few frames' worth each) from the seeds, drawn from one
    `random.Random(seed)`. With several connections the order in which they draw depends on
    timing, so a seed repeats the mix of inputs but not exactly the same sequence."""

    def __init__(self, seeds: Seeds, rng: random.Random, max_body: int) -> None:
        self.seeds = seeds
        self.rng = rng
        self.max_body = max_body
        self.mutators = [
            (self.seed_frame, 10), (self.random_bytes, 6), (self.truncated, 8),
            (self.bit_flips, 14), (self.header_field, 18), (self.sections, 12),
            (self.framing_extras, 6), (self.oversized, 2), (self.splice, 6),
            (self.response, 4), (self.dcp_frame, 6), (self.big_value, 2),
        ]
        self._names = [m.__name__ for m, _ in self.mutators]
        self._weights = [w for _, w in self.mutators]

    def frame(self) -> bytes:
        return self.rng.choice(self.seeds.frames)

    def one(self) -> tuple[str, bytes]:
        """(mutator name, input bytes)."""
        i = self.rng.choices(range(len(self.mutators)), self._weights)[0]
        return self._names[i], self.mutators[i][0]()

    # each mutator returns the bytes of one input

    def seed_frame(self) -> bytes:
        return self.frame()

    def random_bytes(self) -> bytes:
        r = self.rng
        data = r.randbytes(r.randint(1, 96))
        if r.random() < 0.6:   # keep a known magic so the header is parsed further
            data = bytes([r.choice((0x80, 0x08, 0x81, 0x18, 0x82, 0x83))]) + data[1:]
        return data

    def truncated(self) -> bytes:
        f = self.frame()
        return f[:self.rng.randint(1, max(1, len(f) - 1))]

    def bit_flips(self) -> bytes:
        r = self.rng
        b = bytearray(self.frame())
        for _ in range(r.choice((1, 1, 2, 3, 4, 8))):
            pos = r.randrange(len(b)) if r.random() < 0.5 else r.randrange(min(24, len(b)))
            b[pos] ^= 1 << r.randrange(8)
        return bytes(b)

    def header_field(self) -> bytes:
        r = self.rng
        b = bytearray(self.frame())
        what = r.randrange(9)
        if what == 0:
            b[0] = r.choice((0x80, 0x81, 0x08, 0x18, 0x82, 0x83, r.randrange(256)))
        elif what == 1:
            b[1] = r.choice(KNOWN_OPCODES) if r.random() < 0.7 else r.randrange(256)
        elif what == 2:
            struct.pack_into(">H", b, 2, r.choice((0, 1, 0xFF, 0xFFFF, r.randrange(1 << 16),
                                                   max(0, HDR.unpack_from(b)[2] + r.choice((-1, 1))))))
        elif what == 3:
            b[4] = r.choice((0, 1, 4, 8, 16, 20, 24, 31, 48, 255, r.randrange(256)))
        elif what == 4:
            b[5] = r.randrange(256)                          # datatype
        elif what == 5:
            struct.pack_into(">H", b, 6, r.choice((0, 1, 3, 15, 16, 1023, 1024, 0xFFFF,
                                                   r.randrange(1 << 16))))
        elif what == 6:                                       # body length
            blen = HDR.unpack_from(b)[6]
            struct.pack_into(">I", b, 8, r.choice((0, 1, max(0, blen - 1), blen + 1,
                                                   r.randrange(self.max_body + 1))))
        elif what == 7:
            struct.pack_into(">I", b, 12, r.randrange(1 << 32))  # opaque
        else:
            struct.pack_into(">Q", b, 16, r.randrange(1 << 64))  # cas
        return bytes(b)

    def _parts(self, f: bytes) -> tuple[int, int, int, int, int, bytes, bytes, bytes, bytes]:
        magic, op, klen, elen, dt, vb, blen, opq, cas = HDR.unpack_from(f)
        flen = 0
        if magic in (0x08, 0x18):
            flen, klen = klen >> 8, klen & 0xFF
        body = f[24:]
        framing = body[:flen]
        extras = body[flen:flen + elen]
        key = body[flen + elen:flen + elen + klen]
        value = body[flen + elen + klen:]
        return magic, op, dt, vb, opq, framing, extras, key, value

    def sections(self) -> bytes:
        r = self.rng
        magic, op, dt, vb, opq, framing, extras, key, value = self._parts(self.frame())
        pick = r.randrange(3)
        if pick == 0:
            extras = r.randbytes(r.choice((0, 1, 4, 7, 8, 12, 16, 20, 24, 25, 31, 40, 48)))
        elif pick == 1:
            key = r.randbytes(r.choice((0, 1, 8, 250, 251, 255, r.randrange(300))))
        else:
            value = r.randbytes(r.choice((0, 1, 2, 3, 5, 100, r.randrange(2000))))
        if r.random() < 0.2:
            dt = r.randrange(8)
        return self._build(0x80 if magic not in (0x80, 0x81) else magic, op, vb, opq, dt,
                           framing, extras, key, value)

    def framing_extras(self) -> bytes:
        r = self.rng
        magic, op, dt, vb, opq, _, extras, key, value = self._parts(self.frame())
        infos = []
        for _ in range(r.randint(1, 3)):
            fid = r.choice((0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 14, 15, 16, 17, 30, r.randrange(270)))
            data = r.randbytes(r.choice((0, 1, 2, 3, 8, 14, 15, 16, r.randrange(40))))
            infos.append(encode_frame_info(fid, data))
        framing = b"".join(infos)
        if r.random() < 0.2:
            framing = r.randbytes(r.randint(1, 20))           # not even frame infos
        framing = framing[:255]
        return self._build(0x08 if r.random() < 0.8 else 0x18, op, vb, opq, dt, framing,
                           extras, key[:255], value)

    def _build(self, magic, op, vb, opq, dt, framing, extras, key, value) -> bytes:
        try:
            return encode_frame(magic, op, vb, opq, 0, dt, framing, extras, key, value)
        except ProtocolError:
            return encode_frame(0x80, op, vb, opq, 0, dt, b"", extras, key[:255], value)

    def oversized(self) -> bytes:
        r = self.rng
        op = self.frame()[1]
        if r.random() < 0.15:                                 # announced, never sent
            return HDR.pack(0x80, op, 0, 0, 0, 0, r.randrange(self.max_body + 1, 1 << 32),
                            r.randrange(1 << 32), 0)
        blen = self.max_body + r.randint(1, 64 * 1024)
        body = b"\x00" * blen if r.random() < 0.5 else r.randbytes(blen)
        return HDR.pack(0x80, op, r.randrange(20), r.randrange(32), 0, 0, blen,
                        r.randrange(1 << 32), 0) + body

    def splice(self) -> bytes:
        a, b = self.frame(), self.frame()
        return a[:self.rng.randint(0, len(a))] + b[self.rng.randint(0, len(b)):]

    def response(self) -> bytes:
        r = self.rng
        f = self.frame()
        magic = r.choice((0x81, 0x18, 0x82, 0x83))
        status = r.choice((0, 1, 4, 0x23, 0x81, r.randrange(1 << 16)))
        if magic == 0x18:
            return bytes([0x18, f[1], 0, 0]) + f[4:6] + struct.pack(">H", status) + f[8:]
        return bytes([magic]) + f[1:6] + struct.pack(">H", status) + f[8:]

    def dcp_frame(self) -> bytes:
        f = self.rng.choice(self.seeds.dcp or self.seeds.frames)
        return self.bit_flips() if self.rng.random() < 0.3 else f

    def big_value(self) -> bytes:
        r = self.rng
        key = b"fuzz-big-%d" % r.randrange(64)
        value = r.randbytes(r.randint(1000, max(1000, self.max_body - 300)))
        return encode_frame(0x80, Opcode.SET, r.randrange(16), r.randrange(1 << 32),
                            extras=b"\x00" * 8, key=key, value=value)

    # -- sessions ----------------------------------------------------------------------------

    def session(self) -> tuple[bool, list[tuple[str, bytes]]]:
        """(log in first?, inputs) for one connection."""
        r = self.rng
        login = r.random() < 0.5
        if r.random() < 0.2:
            return login, self.odd_order()
        n = r.choice((1, 1, 2, 3, r.randint(2, 20), r.randint(20, 200), r.randint(100, 600)))
        return login, [self.one() for _ in range(n)]

    def odd_order(self) -> list[tuple[str, bytes]]:
        """A captured conversation replayed out of order (DCP before DCP_OPEN, SASL steps
        out of order, frames dropped and repeated), a few frames mutated."""
        r = self.rng
        conv = list(r.choice(self.seeds.sessions))
        how = r.randrange(4)
        if how == 0:
            r.shuffle(conv)
        elif how == 1:
            conv = [f for f in conv if r.random() < 0.7]
        elif how == 2:
            conv = conv + conv[:r.randint(1, len(conv))]
        else:
            conv.reverse()
        out = []
        for f in conv:
            if r.random() < 0.05:
                b = bytearray(f)
                b[r.randrange(len(b))] ^= 1 << r.randrange(8)
                f = bytes(b)
            out.append(("odd_order", f))
        return out or [("odd_order", self.frame())]


def frame_gap(data: bytes | bytearray, max_pad: int = MAX_PAD) -> bytes | None:
    """Padding that brings the node's framing of `data` to a frame boundary: the node
    reads every frame with a known magic as 24 bytes plus its declared body (answering,
    skipping or discarding it). None when the node will close (unknown magic) or the pad
    would be longer than `max_pad`."""
    buf = bytearray(data)
    pad = bytearray()
    o = 0
    while True:
        n = len(buf)
        if o == n:
            return bytes(pad)
        if n - o < 24:
            extra = 24 - (n - o)
            buf += b"\x00" * extra
            pad += b"\x00" * extra
            continue
        if buf[o] not in VALID_MAGICS:
            return None
        end = o + 24 + U32.unpack_from(buf, o + 8)[0]
        if end > n:
            extra = end - n
            if len(pad) + extra > max_pad:
                return None
            buf += b"\x00" * extra
            pad += b"\x00" * extra
        o = end


# -- driving a live node --------------------------------------------------------------------


def rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Summary:
    inputs: int = 0
    sessions: int = 0
    login_sessions: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    crashes: int = 0
    crash_details: list[str] = field(default_factory=list)
    health_checks: int = 0
    closed_by_node: Counter = field(default_factory=Counter)
    statuses: Counter = field(default_factory=Counter)
    mutators: Counter = field(default_factory=Counter)
    session_timeouts: int = 0
    bad_node_output: int = 0
    rss_before: int = 0
    rss_max: int = 0
    rss_after: int = 0
    tracebacks: int = 0
    first_traceback: str = ""
    node_log_bytes: int = 0
    node_stats: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "inputs": self.inputs, "sessions": self.sessions,
            "login_sessions": self.login_sessions, "bytes_sent": self.bytes_sent,
            "seconds": round(self.seconds, 2),
            "inputs_per_second": round(self.inputs / self.seconds) if self.seconds else 0,
            "crashes": self.crashes, "crash_details": self.crash_details,
            "health_checks": self.health_checks,
            "closed_by_node": dict(self.closed_by_node),
            "statuses": {status_name(k): v for k, v in sorted(self.statuses.items())},
            "mutators": dict(self.mutators), "session_timeouts": self.session_timeouts,
            "bad_node_output": self.bad_node_output,
            "rss_before": self.rss_before, "rss_max": self.rss_max, "rss_after": self.rss_after,
            "tracebacks": self.tracebacks, "first_traceback": self.first_traceback,
            "node_log_bytes": self.node_log_bytes, "node_stats": self.node_stats,
        }


class Fuzzer:
    """Fuzz `node` (a tests/nodeprocutil.NodeProcess, running) with `inputs` inputs."""

    def __init__(self, node, *, inputs: int, seed: int = 1, connections: int = 8,
                 max_body: int = 128 * 1024, vectors: Path | None = None,
                 session_timeout: float = 20.0, health_interval: float = 1.0,
                 health_timeout: float = 20.0, restart_on_crash: bool = True,
                 progress=None) -> None:
        self.node = node
        self.target = inputs
        self.connections = connections
        self.max_body = max_body
        self.max_pad = max(256 * 1024, 2 * max_body)
        self.seeds = load_seeds(vectors, password=node.password or "password")
        self.gen = Generator(self.seeds, random.Random(seed), max_body)
        self.session_timeout = session_timeout
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.restart_on_crash = restart_on_crash
        self.progress = progress
        self.s = Summary()
        self._stop = False

    # -- sessions ------------------------------------------------------------------------

    def _session_bytes(self, login: bool, inputs: list[tuple[str, bytes]]) -> tuple[bytes, bool]:
        """The bytes of a session, and whether the node is expected to answer its end.

        Mostly each input is followed by the padding that completes the frame the node
        reads from it, so that every input is seen on its own; an input after which the
        node cannot frame the stream any more ends the session. One session in six runs
        its inputs together as one stream (desynchronised framing on purpose).
        """
        s = self.s
        data = bytearray(self.seeds.login if login else b"")
        aligned = self.gen.rng.random() < 5 / 6
        used = 0
        for name, raw in inputs:
            used += 1
            s.mutators[name] += 1
            data += raw
            if aligned:
                pad = frame_gap(raw, self.max_pad)
                if pad is None:
                    break
                data += pad
        s.inputs += used
        s.sessions += 1
        s.login_sessions += login
        return bytes(data), aligned

    async def _session(self, login: bool, inputs: list[tuple[str, bytes]]) -> None:
        s = self.s
        data, _ = self._session_bytes(login, inputs)
        pad = frame_gap(data, self.max_pad)
        abandon = pad is None or self.gen.rng.random() < 0.05   # some just hang up
        if not abandon:
            data += pad + encode_frame(0x80, Opcode.NOOP, opaque=SENTINEL)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.node.host, self.node.port), 10)
        except (OSError, asyncio.TimeoutError):
            s.closed_by_node["connect_failed"] += 1
            return
        done = asyncio.get_running_loop().create_future()
        read_task = asyncio.create_task(self._read(reader, done))
        try:
            for i in range(0, len(data), 65536):
                writer.write(bytes(data[i:i + 65536]))
                await asyncio.wait_for(writer.drain(), self.session_timeout)
            s.bytes_sent += len(data)
            if abandon:
                await asyncio.sleep(0)
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(done), self.session_timeout)
                except asyncio.TimeoutError:
                    s.session_timeouts += 1
        except (ConnectionError, OSError):
            s.closed_by_node["while_sending"] += 1
        except asyncio.TimeoutError:
            s.session_timeouts += 1
        finally:
            read_task.cancel()
            writer.transport.abort()
            try:
                await read_task
            except (asyncio.CancelledError, Exception):
                pass
        if done.done():
            kind = done.result()
            if kind != "sentinel":
                s.closed_by_node[kind] += 1

    async def _read(self, reader: asyncio.StreamReader, done: asyncio.Future) -> None:
        dec = FrameDecoder(max_body=1 << 31)
        statuses = self.s.statuses
        try:
            while True:
                chunk = await reader.read(1 << 18)
                if not chunk:
                    if not done.done():
                        done.set_result("eof")
                    return
                dec.feed(chunk)
                while True:
                    try:
                        f = dec.next_frame()
                    except ProtocolError:
                        self.s.bad_node_output += 1
                        if not done.done():
                            done.set_result("bad_output")
                        return
                    if f is None:
                        break
                    if f.magic in (0x81, 0x18):
                        statuses[f.specific] += 1
                        if f.opaque == SENTINEL and f.opcode == Opcode.NOOP and not done.done():
                            done.set_result("sentinel")
        except ConnectionResetError:
            if not done.done():
                done.set_result("reset")
        except asyncio.CancelledError:
            raise

    async def _worker(self) -> None:
        while not self._stop and self.s.inputs < self.target:
            login, inputs = self.gen.session()
            inputs = inputs[:max(1, self.target - self.s.inputs)]
            await self._session(login, inputs)

    # -- health ----------------------------------------------------------------------------

    async def _health_once(self) -> str | None:
        """None when the node answers NOOP and VERSION on a fresh connection, else why not."""
        if not self.node.running():
            return f"node process exited ({self.node.proc.poll() if self.node.proc else '?'})"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.node.host, self.node.port), self.health_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            return f"cannot connect: {exc!r}"
        try:
            writer.write(encode_frame(0x80, Opcode.NOOP, opaque=HEALTH_OPAQUE)
                         + encode_frame(0x80, Opcode.VERSION, opaque=HEALTH_OPAQUE + 1))
            dec = FrameDecoder()
            got = {}
            deadline = time.monotonic() + self.health_timeout
            while len(got) < 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "no answer to NOOP/VERSION"
                chunk = await asyncio.wait_for(reader.read(65536), left)
                if not chunk:
                    return "closed without answering NOOP/VERSION"
                dec.feed(chunk)
                for f in dec:
                    got[f.opaque] = f
            if got[HEALTH_OPAQUE].status != Status.SUCCESS or not got[HEALTH_OPAQUE + 1].value:
                return "wrong answer to NOOP/VERSION"
            return None
        except (OSError, asyncio.TimeoutError) as exc:
            return f"health check failed: {exc!r}"
        finally:
            writer.transport.abort()

    async def _health_loop(self) -> None:
        last_report = time.monotonic()
        while not self._stop:
            await asyncio.sleep(self.health_interval)
            await self._check()
            if self.progress is not None and time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                self.progress(self.s)

    async def _check(self) -> None:
        s = self.s
        s.rss_max = max(s.rss_max, rss_of(self.node.pid) if self.node.pid else 0)
        problem = await self._health_once()
        s.health_checks += 1
        if problem is None:
            return
        s.crashes += 1
        s.crash_details.append(f"after {s.inputs} inputs: {problem}; stderr: "
                               f"{self.node.stderr()[-1500:]}")
        if not self.restart_on_crash:
            self._stop = True
            return
        await asyncio.get_running_loop().run_in_executor(None, self._restart)

    def _restart(self) -> None:
        try:
            self.node.kill()
        finally:
            self.node.start()

    # -- the run ---------------------------------------------------------------------------

    async def _run(self) -> None:
        health = asyncio.create_task(self._health_loop())
        workers = [asyncio.create_task(self._worker()) for _ in range(self.connections)]
        await asyncio.gather(*workers)
        self._stop = True
        health.cancel()
        try:
            await health
        except asyncio.CancelledError:
            pass
        await self._check()   # a last one after everything was sent

    def run(self) -> Summary:
        s = self.s
        s.rss_before = rss_of(self.node.pid)
        s.rss_max = s.rss_before
        t0 = time.monotonic()
        asyncio.run(self._run())
        s.seconds = time.monotonic() - t0
        time.sleep(1.0)   # let the node settle (closed connections, flusher)
        s.rss_after = rss_of(self.node.pid)
        s.rss_max = max(s.rss_max, s.rss_after)
        s.node_stats = node_stats(self.node)
        self.scan_logs()
        return s

    def scan_logs(self) -> None:
        s = self.s
        s.tracebacks = 0
        for path in (self.node.data_dir / "node.stderr.log",
                     *sorted((self.node.data_dir / "logs").glob("node.log*"))):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if path.name.startswith("node.log"):
                s.node_log_bytes += len(text)
            n = text.count("Traceback")
            s.tracebacks += n
            if n and not s.first_traceback:
                i = text.index("Traceback")
                start = text.rfind("\n", 0, max(0, i - 1)) + 1
                s.first_traceback = f"{path.name}: " + text[start:i + 3000]


def node_stats(node) -> dict:
    """The limit counters from STAT (a logged-in connection), {} when unavailable."""
    from dcptool.protocol import FrameDecoder as Dec

    keys = ("curr_connections", "total_connections", "rejected_conns", "auth_timeouts",
            "conns_closed_stuck", "conns_closed_framing_lost", "conn_output_holds",
            "frames_e2big", "frames_einval", "auth_errors", "curr_items",
            "ep_checkpoint_memory", "ep_checkpoint_memory_budget", "mem_rss")
    try:
        with socket.create_connection((node.host, node.port), timeout=20) as sock:
            sock.sendall(load_seeds(password=node.password or "password").login
                         + encode_frame(0x80, Opcode.STAT, opaque=77))
            dec = Dec(max_body=1 << 30)
            out = {}
            while True:
                f = dec.next_frame()
                if f is None:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return out
                    dec.feed(chunk)
                    continue
                if f.opaque != 77:
                    continue
                if not f.key:
                    return {k: out[k] for k in keys if k in out}
                out[f.key.decode()] = f.value.decode()
    except OSError:
        return {}


def run_fuzz(inputs: int, *, seed: int = 1, connections: int = 8, data_dir: Path | None = None,
             node_args: tuple[str, ...] = DEFAULT_NODE_ARGS, vbuckets: int = 16,
             progress=None, keep: bool = False) -> Summary:
    """Start a node, fuzz it, stop it; the summary."""
    from nodeprocutil import NodeProcess

    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="dcptool-fuzz-")
        data_dir = Path(tmp.name)
    node = NodeProcess(Path(data_dir) / "node", vbuckets=vbuckets, extra_args=tuple(node_args))
    node.start()
    try:
        max_body = 128 * 1024
        args = list(node_args)
        if "--max-body" in args:
            from dcptool.node.config import parse_size
            max_body = parse_size(args[args.index("--max-body") + 1])
        fuzzer = Fuzzer(node, inputs=inputs, seed=seed, connections=connections,
                        max_body=max_body, progress=progress)
        summary = fuzzer.run()
    finally:
        if node.running():
            node.stop(timeout=30)
        if tmp is not None and not keep:
            tmp.cleanup()
    return summary


def print_table(s: Summary, out=sys.stdout) -> None:
    d = s.to_json()
    mb = 1024 * 1024
    rows = [
        ("inputs", f"{d['inputs']:,}"),
        ("sessions (connections)", f"{d['sessions']:,} ({d['login_sessions']:,} logged in)"),
        ("bytes sent", f"{d['bytes_sent'] / mb:,.1f} MiB"),
        ("seconds", f"{d['seconds']:,.1f}"),
        ("inputs/s", f"{d['inputs_per_second']:,}"),
        ("crashes", str(d["crashes"])),
        ("health checks", str(d["health_checks"])),
        ("tracebacks in node logs", str(d["tracebacks"])),
        ("closed by node", ", ".join(f"{k} {v:,}" for k, v in sorted(d["closed_by_node"].items()))
         or "0"),
        ("session timeouts", str(d["session_timeouts"])),
        ("bad node output", str(d["bad_node_output"])),
        ("answers", ", ".join(f"{k} {v:,}" for k, v in d["statuses"].items()
                              if k in ("SUCCESS", "EINVAL", "E2BIG", "UNKNOWN_COMMAND",
                                       "EACCESS", "NOT_MY_VBUCKET", "AUTH_ERROR"))),
        ("RSS before / max / after", f"{d['rss_before'] / mb:.1f} / {d['rss_max'] / mb:.1f} / "
                                     f"{d['rss_after'] / mb:.1f} MiB"),
        ("node.log", f"{d['node_log_bytes'] / 1024:,.0f} KiB"),
        ("node STAT", ", ".join(f"{k}={v}" for k, v in d["node_stats"].items())),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}", file=out)
    for detail in d["crash_details"][:5]:
        print(f"crash: {detail}", file=out)
    if d["first_traceback"]:
        print("first traceback:\n" + d["first_traceback"], file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--connections", type=int, default=8, help="concurrent connections")
    p.add_argument("--vbuckets", type=int, default=16)
    p.add_argument("--node-arg", action="append", default=None,
                   help="an argument for 'dcptool node start' (repeat; default: --max-body "
                        "128KiB)")
    p.add_argument("--data", type=Path, help="node directory (default: a temporary one)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = p.parse_args(argv)
    node_args = tuple(a.node_arg) if a.node_arg else DEFAULT_NODE_ARGS

    def progress(s: Summary) -> None:
        print(f"  {s.inputs:,} inputs, {s.sessions:,} sessions, crashes {s.crashes}, "
              f"RSS max {s.rss_max / 1048576:.1f} MiB", file=sys.stderr, flush=True)

    s = run_fuzz(a.inputs, seed=a.seed, connections=a.connections, data_dir=a.data,
                 node_args=node_args, vbuckets=a.vbuckets, progress=progress, keep=a.data is not None)
    if a.json:
        print(json.dumps(s.to_json(), indent=1))
    else:
        print_table(s)
    return 1 if (s.crashes or s.tracebacks) else 0


if __name__ == "__main__":
    sys.exit(main())
