"""A short slice of the node fuzz harness (`benchmarks/fuzz_node.py`) against a real node.

Hostile input never crashes the node: mutated, truncated, oversized and out-of-order
frames made from the captured client vectors are answered (EINVAL, E2BIG, ...) or close
only their own connection; the node keeps answering fresh connections, logs no
traceback, does not grow without bound, and serves a normal client afterwards.
"""
from __future__ import annotations

import sys
from pathlib import Path

from dcptool.protocol.constants import Opcode, Status

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.fuzz_node import Fuzzer, frame_gap  # noqa: E402

MiB = 1024 * 1024


def test_frame_gap_follows_the_node_framing():
    hdr = bytes([0x80, 0x0A, 0, 0, 0, 0, 0, 0]) + (10).to_bytes(4, "big") + bytes(12)
    assert frame_gap(hdr + b"x" * 10) == b""
    assert frame_gap(hdr + b"x" * 4) == b"\x00" * 6
    assert frame_gap(hdr[:5]) == b"\x00" * 19 + b"\x00" * 0   # header completed, body 0
    assert frame_gap(b"\x42" + hdr[1:]) is None               # unknown magic: closed
    big = bytes([0x80, 1, 0, 0, 0, 0, 0, 0]) + (5 << 20).to_bytes(4, "big") + bytes(12)
    assert frame_gap(big, max_pad=1 << 20) is None


def test_fuzz_slice_never_crashes_the_node(node_factory, vectors_dir):
    node = node_factory("fuzz", vbuckets=16, extra_args=("--max-body", "128KiB"))
    fuzzer = Fuzzer(node, inputs=15_000, seed=20261122, connections=6, max_body=128 * 1024,
                    vectors=vectors_dir, restart_on_crash=False)
    s = fuzzer.run()
    detail = s.to_json()
    assert s.inputs == 15_000
    assert s.crashes == 0, detail["crash_details"]
    assert s.tracebacks == 0, s.first_traceback
    assert s.bad_node_output == 0
    assert node.running()
    # the slice reached the paths it is about
    assert s.statuses[Status.EINVAL] > 0 and s.statuses[Status.E2BIG] > 0, detail["statuses"]
    assert s.closed_by_node["eof"] > 0
    assert s.health_checks >= 2
    # bounded memory: the slice stores a few documents at most (values below 128 KiB)
    assert s.rss_max - s.rss_before < 96 * MiB, (s.rss_before, s.rss_max)
    assert s.rss_after - s.rss_before < 64 * MiB, (s.rss_before, s.rss_after)

    # and a normal client is served as before
    from node.mcbputil import connect

    with connect(node) as c:
        assert c.set(b"after-fuzz", b'{"ok":true}', datatype=1).status == Status.SUCCESS
        assert c.get(b"after-fuzz").value == b'{"ok":true}'
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
        st = c.stats()
        assert int(st["frames_einval"]) > 0 and int(st["frames_e2big"]) > 0


def test_stat_dcp_with_a_connection_name_that_is_not_utf8(shared_node):
    """Found by the fuzz harness: STAT dcp answered EINTERNAL (and logged a traceback)
    once a DCP connection had a name that is not valid UTF-8."""
    from node.dcputil import DcpClient
    from node.mcbputil import connect

    name = b"fuzz-\xe1\x9b-name"
    c = DcpClient(shared_node.host, shared_node.port, vbuckets=shared_node.vbuckets)
    try:
        c.setup()
        f = c.call(Opcode.DCP_OPEN, extras=(0).to_bytes(4, "big") + (1).to_bytes(4, "big"),
                   key=name)
        assert f.status == Status.SUCCESS
        with connect(shared_node) as s:
            opaque = s.request(Opcode.STAT, key=b"dcp")
            keys = []
            while True:
                r = s.wait_response(opaque)
                assert r.status == Status.SUCCESS, hex(r.status)
                if not r.key:
                    break
                keys.append(r.key)
            assert b"eq_dcpq:" + name + b":type" in keys
    finally:
        c.close()
    assert "Traceback" not in shared_node.stderr()


def test_getq_meta_is_read_like_get_meta(shared_node):
    """Found by the fuzz harness: GETQ_META (0xa1) answered EINTERNAL (and logged a
    traceback) because it was handed to GET_META's handler without GET_META's layout."""
    from node.mcbputil import connect

    with connect(shared_node) as c:
        assert c.set(b"getq-meta", b'{"a":1}', datatype=1).status == Status.SUCCESS
        vb = c.vb(b"getq-meta")
        f = c.call(Opcode.GETQ_META, key=b"getq-meta", extras=b"\x02", vbucket=vb)
        assert f.status == Status.SUCCESS and len(f.extras) == 21 and f.extras[20] == 1
        f = c.call(Opcode.GETQ_META, key=b"getq-meta", vbucket=vb)
        assert f.status == Status.SUCCESS and len(f.extras) == 20
        # malformed: GET_META's rules apply (EINVAL, not EINTERNAL)
        assert c.call(Opcode.GETQ_META, key=b"getq-meta", extras=b"\x07",
                      vbucket=vb).status == Status.EINVAL
        assert c.call(Opcode.GETQ_META, key=b"", vbucket=vb).status == Status.EINVAL
        # quiet: a miss is not answered (the NOOP's answer comes first)
        c.request(Opcode.GETQ_META, key=b"no-such-key", vbucket=c.vb(b"no-such-key"))
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
        assert not c.backlog, c.backlog
    assert "Traceback" not in shared_node.stderr()
