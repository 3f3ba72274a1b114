"""End to end: the node's limits (`dcptool node start --max-body, --max-connections,
--max-pending-output, --stuck-timeout, --auth-timeout`) against real node processes.

Memory is the node process's resident set (VmRSS in /proc/PID/status); each bound below is
far under what the node would hold without the limit.
"""
from __future__ import annotations

import socket
import struct
import time

import pytest

from dcptool.protocol import encode_frame
from dcptool.protocol.constants import Opcode, Status

from .dcputil import DcpClient
from .mcbputil import Client, connect, wait_persisted

HDR = struct.Struct(">BBHBBHIIQ")
MiB = 1024 * 1024


def rss(pid: int) -> int:
    """The resident set of process `pid` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def stats(node) -> dict[str, str]:
    with connect(node) as c:
        return c.stats()


def wait_for(cond, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def closed_by_peer(sock: socket.socket, timeout: float = 20.0) -> bool:
    """Read until EOF or reset (True) or the timeout (False)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 20):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


# -- --max-body -----------------------------------------------------------------------------


def test_body_above_max_body_gets_e2big_is_dropped_unbuffered_and_the_connection_goes_on(
        node_factory):
    node = node_factory(extra_args=("--max-body", "1MiB"))
    other = connect(node)
    with connect(node) as c:
        before = rss(node.pid)
        big = 64 * MiB
        c.send(HDR.pack(0x80, Opcode.SET, 1, 8, 0, 0, big, 0xB16, 0))
        f = c.recv(timeout=10)
        assert (f.opcode, f.status, f.opaque) == (Opcode.SET, Status.E2BIG, 0xB16)
        chunk = b"\xAB" * MiB
        peak = before
        for i in range(big // MiB):
            c.send(chunk)
            if i % 8 == 0:
                peak = max(peak, rss(node.pid))
                # another connection is served while the body streams in
                assert other.call(Opcode.NOOP).status == Status.SUCCESS
        # the same connection goes on with the next frame after the dropped body
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
        assert c.set(b"after-big", b"v").status == Status.SUCCESS
        peak = max(peak, rss(node.pid))
        # 64 MiB went through; the node held at most a few reads of it
        assert peak - before < 16 * MiB, (before, peak)
        # a body at the limit is still accepted
        assert c.set(b"at-limit", b"x" * (MiB - 64)).status == Status.SUCCESS
        assert c.stats()["frames_e2big"] == "1"
    other.close()


# -- --max-connections ----------------------------------------------------------------------


def test_connections_above_max_connections_are_closed_at_once_and_counted(node_factory):
    node = node_factory(extra_args=("--max-connections", "3"))
    clients = [connect(node) for _ in range(3)]
    try:
        extra = socket.create_connection((node.host, node.port), timeout=10)
        try:
            assert closed_by_peer(extra, timeout=10), "the 4th connection stayed open"
        finally:
            extra.close()
        # the admitted ones keep working
        for c in clients:
            assert c.call(Opcode.NOOP).status == Status.SUCCESS
        st = clients[0].stats()
        assert st["rejected_conns"] == "1"
        assert st["max_connections"] == "3"
        assert st["curr_connections"] == "3"
        # a freed slot admits a new connection
        clients.pop().close()
        wait_for(lambda: clients[0].stats()["curr_connections"] == "2", what="slot freed")
        clients.append(connect(node))
        assert clients[-1].call(Opcode.NOOP).status == Status.SUCCESS
    finally:
        for c in clients:
            c.close()


# -- --max-pending-output, --stuck-timeout --------------------------------------------------


def _pipeline_gets(c: Client, key: bytes, n: int) -> None:
    get = encode_frame(0x80, Opcode.GET, c.vb(key), 7, key=key)
    c.sock.settimeout(30)
    c.send(get * n)


def test_a_client_that_does_not_read_its_replies_is_held_back_then_served(node_factory):
    node = node_factory(extra_args=("--max-pending-output", "1MiB", "--stuck-timeout", "30s"))
    value = b"v" * (64 * 1024)
    with connect(node) as w:
        assert w.set(b"big", value).status == Status.SUCCESS
    n = 2000   # 2000 x 64 KiB = 125 MiB of replies if the node did not stop reading
    c = Client(node.host, node.port, vbuckets=node.vbuckets, rcvbuf=16 * 1024).setup()
    try:
        before = rss(node.pid)
        _pipeline_gets(c, b"big", n)
        st = wait_for(lambda: (s := stats(node)) and s["conn_output_holds"] != "0" and s,
                      what="the node to hold the connection back")
        time.sleep(1.0)  # give an unbounded node the time to buffer everything
        grown = rss(node.pid) - before
        assert grown < 32 * MiB, grown
        assert st["conns_closed_stuck"] == "0"
        # nothing was lost: every reply arrives once the client reads
        for _ in range(n):
            f = c.recv(timeout=30)
            assert (f.opcode, f.status, len(f.value)) == (Opcode.GET, Status.SUCCESS, len(value))
        assert c.call(Opcode.NOOP).status == Status.SUCCESS
    finally:
        c.close()


def test_a_client_stuck_without_reading_is_closed_after_the_stuck_timeout(node_factory):
    node = node_factory(extra_args=("--max-pending-output", "1MiB", "--stuck-timeout", "1s"))
    with connect(node) as w:
        assert w.set(b"big", b"v" * (64 * 1024)).status == Status.SUCCESS
    c = Client(node.host, node.port, vbuckets=node.vbuckets, rcvbuf=16 * 1024).setup()
    try:
        _pipeline_gets(c, b"big", 2000)
        st = wait_for(lambda: (s := stats(node)) and s["conns_closed_stuck"] == "1" and s,
                      what="the stuck connection to be closed")
        assert st["curr_connections"] == "1"   # the one asking for the stats
        assert closed_by_peer(c.sock)
    finally:
        c.close()
    with connect(node) as other:
        assert other.call(Opcode.NOOP).status == Status.SUCCESS


# -- --auth-timeout -------------------------------------------------------------------------


def test_unauthenticated_connections_are_closed_after_the_auth_timeout(node_factory):
    node = node_factory(extra_args=("--auth-timeout", "1s"))
    idle = socket.create_connection((node.host, node.port), timeout=10)
    chatty = Client(node.host, node.port)   # talks, but never authenticates
    authed = connect(node)
    try:
        t0 = time.monotonic()
        for _ in range(10):
            assert chatty.call(Opcode.NOOP).status == Status.SUCCESS
            time.sleep(0.05)
        assert closed_by_peer(idle, timeout=20)
        assert 0.9 < time.monotonic() - t0 < 20
        with pytest.raises(ConnectionError):
            for _ in range(200):
                chatty.call(Opcode.NOOP, timeout=10)
                time.sleep(0.05)
        time.sleep(0.5)
        # an authenticated connection idle for longer than the timeout stays
        assert authed.call(Opcode.NOOP).status == Status.SUCCESS
        assert authed.stats()["auth_timeouts"] == "2"
    finally:
        idle.close()
        chatty.close()
        authed.close()


# -- slow DCP readers -----------------------------------------------------------------------


def test_a_dcp_consumer_that_stops_reading_cannot_grow_the_node_memory(node_factory):
    node = node_factory(vbuckets=4, extra_args=("--max-pending-output", "1MiB"))
    docs = 1500
    value = b"d" * (32 * 1024)   # 1500 x 32 KiB = 47 MiB of stream, read back from disk
    with connect(node) as w:
        w.set_many([(b"doc-%05d" % i, value) for i in range(docs)])
        wait_persisted(w)
    time.sleep(0.5)
    before = rss(node.pid)
    c = DcpClient(node.host, node.port, vbuckets=4, rcvbuf=4096)   # no flow control
    try:
        c.setup()
        assert c.open("slow-reader").status == Status.SUCCESS
        for vb in range(4):
            assert c.stream_req(vb).status == Status.SUCCESS
        peak = before
        for _ in range(30):   # 3 s of not reading
            time.sleep(0.1)
            peak = max(peak, rss(node.pid))
        # the producer pauses at half of --max-pending-output (512 KiB) and each backfill
        # holds at most one fetch (256 KiB) of rows; with the backfills' SQLite page caches
        # and the allocator's slack the bound is 24 MiB, half of the 47 MiB of the stream
        # (a node that read the backfill ahead or did not pause grew by 60-100 MiB here)
        assert peak - before < 24 * MiB, (before, peak)
        with connect(node) as other:
            assert other.call(Opcode.NOOP).status == Status.SUCCESS
        # the stream is intact once the consumer reads
        got = 0
        while got < docs:
            msg = c.next_message(timeout=30)
            if type(msg).__name__ == "DcpMutation":
                got += 1
        assert got == docs
    finally:
        c.close()


@pytest.mark.parametrize("args,message", [
    (("--max-body", "12"), "--max-body must be between 1KiB and 4GiB-1"),
    (("--max-connections", "0"), "--max-connections must be between 1 and 1000000"),
    (("--max-pending-output", "1k"), "--max-pending-output must be between 64KiB and 4GiB"),
    (("--auth-timeout", "soon"), "--auth-timeout 'soon' is not a duration"),
    (("--stuck-timeout", "0"), "--stuck-timeout must be between 50ms and 1 day, or off"),
])
def test_bad_limit_options_are_one_line_errors(tmp_path, args, message):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "dcptool", "node", "start", "--data",
                        str(tmp_path / "n"), "--password", "p", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith(f"dcptool: error: {message}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
