"""`dcptool decode` as a user runs it: a real subprocess."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import VECTORS

from dcptool.protocol import DcpMutation, DcpStreamReq, Noop


def run(*args, input_bytes: bytes | None = None):
    return subprocess.run([sys.executable, "-m", "dcptool", "decode", *args], input=input_bytes,
                          capture_output=True, timeout=60)


def test_decode_vector_file_json():
    path = VECTORS / "cbtransfer-drain4vb.requests.hex"
    res = run(str(path), "--json")
    assert res.returncode == 0, res.stderr
    lines = [json.loads(l) for l in res.stdout.decode().splitlines()]
    frames = [l for l in path.read_text().splitlines() if l and not l.startswith("#")]
    assert len(lines) == len(frames)
    reqs = [o for o in lines if o["opcode"] == "DCP_STREAM_REQ"]
    assert len(reqs) == 4
    assert {"start_seqno", "vbucket_uuid", "snap_start_seqno", "end_seqno"} <= set(reqs[0])
    assert [r["end_seqno"] for r in reqs] == [4, 2, 0, 5]
    assert lines[-1]["opcode"] == "DCP_BUFFER_ACK" and lines[-1]["bytes_to_ack"] == 1050


def test_decode_stdin_reports_malformed_and_goes_on():
    good = DcpStreamReq(vbucket=3, opaque=9, start_seqno=5, snap_start_seqno=5, snap_end_seqno=5).encode()
    bad_extras = bytes.fromhex("8053000004000000000000040000000000000000000000000000000a")  # extras 4
    text = f"{good.hex()}  # ok\nzz not hex\n{bad_extras.hex()}\n# comment\n{Noop().encode().hex()}\n"
    res = run("-", "--json", input_bytes=text.encode())
    assert res.returncode == 1
    out = [json.loads(l) for l in res.stdout.decode().splitlines()]
    assert [o.get("opcode") for o in out] == ["DCP_STREAM_REQ", None, None, "NOOP"]
    assert out[1]["line"] == 2 and out[1]["field"] == "hex"
    assert out[2]["line"] == 3 and out[2]["field"] == "extras" and "expected 48" in out[2]["error"]


def test_decode_raw_capture_with_offsets():
    a = DcpMutation(key=b"doc1", value=b'{"a":1}', by_seqno=1, rev_seqno=1, opaque=4).encode()
    b = Noop(opaque=1).encode()
    res = run("--raw", "--json", input_bytes=a + b + b[:10])
    assert res.returncode == 1
    out = [json.loads(l) for l in res.stdout.decode().splitlines()]
    assert out[0]["offset"] == 0 and out[0]["key"] == "doc1" and out[0]["by_seqno"] == 1
    assert out[1]["offset"] == len(a) and out[1]["opcode"] == "NOOP"
    assert out[2]["offset"] == len(a) + len(b) and "truncated" in out[2]["error"]


def test_decode_table_output_and_missing_file(tmp_path):
    res = run(str(VECTORS / "pydcp-rollback.requests.hex"), "--table")
    assert res.returncode == 0 and b"DCP_STREAM_REQ" in res.stdout
    res = run(str(tmp_path / "nope.hex"))
    assert res.returncode == 2
    err = res.stderr.decode().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dcptool: error: no such file")
