"""The write hot path (`dcptool.node.ingest`): many SET / *_WITH_META requests in one send
are taken straight from the read buffer; anything unusual in the middle of such a run
goes through the generic dispatch. The answers and the stored versions must be the same
as one request at a time."""
from __future__ import annotations

import struct

from dcptool.protocol import HEADER
from dcptool.protocol.constants import Opcode, Status

from .mcbputil import connect
from .test_node_kv import meta_of

WITH_META = struct.Struct(">IIQQ")
WITH_META_OPTS = struct.Struct(">IIQQI")


def frame(op, vb, opaque, extras=b"", key=b"", value=b"", datatype=0, cas=0) -> bytes:
    return HEADER.pack(0x80, op, len(key), len(extras), datatype, vb,
                       len(extras) + len(key) + len(value), opaque, cas) + extras + key + value


def test_a_pipelined_mix_answers_and_stores_like_single_requests(shared_node):
    with connect(shared_node) as c:
        # an existing newer version that the batch must not overwrite
        older = b"ing-held"
        parts = [frame(Opcode.SET_WITH_META, c.vb(older), 1, WITH_META.pack(0, 0, 50, 5000),
                       older, b"newer")]
        c.send(b"".join(parts) + frame(Opcode.NOOP, 0, 2))
        assert c.recv().status == Status.SUCCESS
        assert c.recv().opcode == Opcode.NOOP
        parts = []
        for i in range(400):
            k = b"ing-%04d" % i
            parts.append(frame(Opcode.SETQ_WITH_META, c.vb(k), 100 + i,
                               WITH_META.pack(i, 1_900_000_000 + i, 7 + i, 0x1000 + i),
                               k, b'{"n":%d}' % i, datatype=1))
            if i == 100:  # conflict lost: KEY_EEXISTS with this request's opaque
                parts.append(frame(Opcode.SETQ_WITH_META, c.vb(older), 9001,
                                   WITH_META.pack(0, 0, 3, 1), older, b"older"))
            if i == 200:  # a request of another kind in the middle of the run
                parts.append(frame(Opcode.GET, c.vb(b"ing-0000"), 9002, key=b"ing-0000"))
            if i == 300:  # a malformed one (meta CAS 0): EINVAL, and the run goes on
                parts.append(frame(Opcode.SETQ_WITH_META, c.vb(k), 9003,
                                   WITH_META.pack(0, 0, 1, 0), k, b"x"))
        dk = b"ing-0010"
        parts.append(frame(Opcode.DELQ_WITH_META, c.vb(dk), 9004,
                           WITH_META.pack(0, 1_700_000_000, 100, 0x9000), dk))
        ek = b"ing-0011"
        parts.append(frame(Opcode.DELQ_WITH_META, c.vb(ek), 9005,
                           WITH_META_OPTS.pack(0, 1_700_000_001, 100, 0x9001, 0x10), ek))
        parts.append(frame(Opcode.SET_WITH_META, c.vb(b"ing-loud"), 9006,
                           WITH_META.pack(1, 0, 2, 0x7777), b"ing-loud", b"v"))
        parts.append(frame(Opcode.SETQ, c.vb(b"ing-plain"), 9007, struct.pack(">II", 3, 0),
                           b"ing-plain", b'{"a":1}', datatype=1))
        parts.append(frame(Opcode.SET, c.vb(b"ing-plain2"), 9008, struct.pack(">II", 4, 0),
                           b"ing-plain2", b"raw"))
        c.send(b"".join(parts) + frame(Opcode.NOOP, 0, 0xFFFF))
        got = []
        while True:
            f = c.recv()
            if f.opcode == Opcode.NOOP:
                break
            got.append((f.opaque, f.status))
            if f.opaque == 9006:
                assert f.cas == 0x7777
            if f.opaque == 9002:
                assert f.value == b'{"n":0}'
        assert got == [(9001, Status.KEY_EEXISTS), (9002, Status.SUCCESS),
                       (9003, Status.EINVAL), (9006, Status.SUCCESS), (9008, Status.SUCCESS)]
        st, m = meta_of(c, b"ing-0123")
        assert (m["deleted"], m["flags"], m["expiry"], m["rev"], m["cas"], m["datatype"]) == \
            (0, 123, 1_900_000_123, 130, 0x1000 + 123, 1)
        assert c.get(b"ing-0399").value == b'{"n":399}'
        _, m = meta_of(c, older)
        assert (m["rev"], m["cas"]) == (50, 5000)
        assert c.get(older).value == b"newer"
        _, m = meta_of(c, dk)
        assert (m["deleted"], m["rev"], m["cas"], m["expiry"]) == (1, 100, 0x9000, 1_700_000_000)
        _, m = meta_of(c, ek)
        assert (m["deleted"], m["rev"], m["cas"]) == (1, 100, 0x9001)
        f = c.get(b"ing-plain")
        assert (f.value, struct.unpack(">I", f.extras)[0]) == (b'{"a":1}', 3)
        _, m = meta_of(c, b"ing-plain")
        assert m["rev"] == 1
        # a second SET of the same key is a new revision with a new CAS
        f1 = c.set(b"ing-plain2", b"again")
        _, m = meta_of(c, b"ing-plain2")
        assert m["rev"] == 2 and m["cas"] == f1.cas


def test_pipelined_sets_get_their_answers_in_order_with_seqnos(shared_node):
    with connect(shared_node) as c:
        parts = [frame(Opcode.SET, c.vb(b"ing-s%d" % i), 500 + i, struct.pack(">II", 0, 0),
                       b"ing-s%d" % i, b"v%d" % i) for i in range(300)]
        c.send(b"".join(parts))
        seen = []
        for _ in range(300):
            f = c.recv()
            assert f.status == Status.SUCCESS and f.cas
            assert len(f.extras) == 16  # MUTATION_SEQNO: vbucket uuid and seqno
            seen.append(f.opaque)
        assert seen == list(range(500, 800))
        assert c.get(b"ing-s299").value == b"v299"


def test_a_long_run_of_writes_of_every_size_stores_each_byte_and_its_metadata(shared_node):
    """The hot path slices keys and values from copies of the read buffer made as the run
    reaches them (small at first, then larger): values of 0 bytes to 100 KiB in one send,
    frames across every copy's end, each stored exactly with its metadata; a plain SET and
    a GET in the middle end the run and the next run starts a copy of its own."""
    sizes = [0, 1, 5, 4000, 4100, 17, 16_000, 65_000, 3, 100_000, 250, 70_000, 8]
    with connect(shared_node) as c:
        parts, want = [], {}
        for i in range(600):
            k = b"ing-long-%04d" % i
            v = bytes((i + j) % 251 for j in range(sizes[i % len(sizes)]))
            parts.append(frame(Opcode.SETQ_WITH_META, c.vb(k), i,
                               WITH_META.pack(i * 3, 0, 11 + i, 0x5000 + i), k, v))
            want[k] = (v, i * 3, 11 + i, 0x5000 + i)
            if i == 250:
                parts.append(frame(Opcode.SET, c.vb(b"ing-long-set"), 9100,
                                   struct.pack(">II", 9, 0), b"ing-long-set", b"plain"))
            if i == 400:
                parts.append(frame(Opcode.GET, c.vb(b"ing-long-0007"), 9101,
                                   key=b"ing-long-0007"))
        c.send(b"".join(parts) + frame(Opcode.NOOP, 0, 0xFFFF))
        got = []
        while (f := c.recv()).opcode != Opcode.NOOP:
            got.append((f.opaque, f.status))
            if f.opaque == 9101:
                assert f.value == want[b"ing-long-0007"][0]
        assert got == [(9100, Status.SUCCESS), (9101, Status.SUCCESS)]
        for k, (v, flags, rev, cas) in want.items():
            f = c.get(k)
            assert f.value == v, k
            _, m = meta_of(c, k)
            assert (m["flags"], m["rev"], m["cas"], m["deleted"]) == (flags, rev, cas, 0), k
        assert c.get(b"ing-long-set").value == b"plain"
