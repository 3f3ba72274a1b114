"""End to end: malformed input is answered or the connection closed; the node goes on."""
from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest

from dcptool.protocol import encode_frame
from dcptool.protocol.constants import Opcode, Status

from .mcbputil import Client, connect

HDR = struct.Struct(">BBHBBHIIQ")


def test_garbage_closes_that_connection_while_another_keeps_working(shared_node):
    good = connect(shared_node)
    bad = socket.create_connection((shared_node.host, shared_node.port), timeout=5)
    try:
        bad.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(4096))
        bad.settimeout(5)
        data = b""
        try:
            while True:
                chunk = bad.recv(65536)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        assert data == b"", "framing was lost: closed without an answer"
        assert good.set(b"still-here", b"v").status == Status.SUCCESS
        assert good.get(b"still-here").value == b"v"
    finally:
        bad.close()
        good.close()


def test_frame_with_inconsistent_lengths_gets_einval_and_the_connection_goes_on(shared_node):
    with connect(shared_node) as c:
        # body length 4 but extras length 8 + key length 3: the boundary is known
        c.send(HDR.pack(0x80, Opcode.SET, 3, 8, 0, 0, 4, 0xABCD, 0) + b"\x00" * 4)
        f = c.recv()
        assert (f.status, f.opaque) == (Status.EINVAL, 0xABCD)
        assert c.call(Opcode.NOOP).status == Status.SUCCESS


def test_inconsistent_frame_whose_body_arrives_later_is_skipped_whole(shared_node):
    with connect(shared_node) as c:
        body = b"\xEE" * 5000
        c.send(HDR.pack(0x80, Opcode.GET, 200, 100, 0, 0, len(body) - 4900, 0x77, 0))
        time.sleep(0.05)
        c.send(body[:100])
        f = c.recv()
        assert (f.status, f.opaque) == (Status.EINVAL, 0x77)
        assert c.call(Opcode.NOOP).status == Status.SUCCESS


@pytest.mark.parametrize("opcode,extras,key,value", [
    (Opcode.SET, b"\x00" * 4, b"k", b"v"),          # SET needs 8 bytes of extras
    (Opcode.GET, b"", b"", b""),                     # GET needs a key
    (Opcode.HELLO, b"", b"agent", b"\x00\x01\x02"),  # odd feature list
    (Opcode.SET_WITH_META, b"\x00" * 25, b"k", b"v"),
    (Opcode.GET_META, b"\x07", b"k", b""),
    (Opcode.DELETE, b"\x00" * 4, b"k", b""),
    (Opcode.GET_ALL_VB_SEQNOS, b"\x00" * 3, b"", b""),
    (Opcode.SELECT_BUCKET, b"", b"", b""),
])
def test_malformed_sections_get_einval(shared_node, opcode, extras, key, value):
    with connect(shared_node) as c:
        f = c.call(opcode, extras=extras, key=key, value=value)
        assert f.status == Status.EINVAL
        assert c.call(Opcode.NOOP).status == Status.SUCCESS


def test_oversized_body_gets_e2big_and_the_connection_goes_on(shared_node):
    # the body need not be sent: the header alone is refused (tests/node/test_node_limits.py
    # sends one and checks that it is dropped without being buffered)
    with connect(shared_node) as c:
        c.send(HDR.pack(0x80, Opcode.SET, 1, 8, 0, 0, 64 * 1024 * 1024, 1, 0))
        f = c.recv(timeout=5)
        assert (f.status, f.opaque) == (Status.E2BIG, 1)
    with connect(shared_node) as c:
        assert c.call(Opcode.NOOP).status == Status.SUCCESS


def test_frames_split_at_every_byte_decode_the_same(shared_node):
    with connect(shared_node) as c:
        data = b"".join(encode_frame(0x80, Opcode.SET, c.vb(b"split-%d" % i), 100 + i,
                                     extras=b"\x00" * 8, key=b"split-%d" % i, value=b"v" * 40)
                        for i in range(5))
        for i in range(len(data)):
            c.send(data[i:i + 1])
        for i in range(5):
            f = c.recv()
            assert (f.opcode, f.status, f.opaque) == (Opcode.SET, Status.SUCCESS, 100 + i)


def test_pipelined_requests_are_answered_in_order(shared_node):
    with connect(shared_node) as c:
        batch = []
        for i in range(2000):
            k = b"pipe-%d" % i
            batch.append(encode_frame(0x80, Opcode.SET, c.vb(k), i, extras=b"\x00" * 8, key=k,
                                      value=b"x" * 100))
        c.send(b"".join(batch))
        assert [c.recv().opaque for _ in range(2000)] == list(range(2000))


def test_many_concurrent_connections(shared_node):
    errors = []

    def worker(n: int) -> None:
        try:
            with connect(shared_node) as c:
                for i in range(50):
                    k = b"conc-%d-%d" % (n, i)
                    assert c.set(k, b"v").status == Status.SUCCESS
                    assert c.get(k).value == b"v"
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


def test_a_client_that_disconnects_mid_frame_does_not_disturb_the_node(shared_node):
    for _ in range(5):
        s = socket.create_connection((shared_node.host, shared_node.port), timeout=5)
        s.sendall(HDR.pack(0x80, Opcode.SET, 1, 8, 0, 0, 1000, 1, 0) + b"\x00" * 10)
        s.close()
    with Client(shared_node.host, shared_node.port) as c:
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
