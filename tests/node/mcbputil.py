"""A small blocking memcached-protocol client for the node's end-to-end tests.

Raw sockets plus `dcptool.protocol`: the tests see exactly the bytes the node sends.
"""
from __future__ import annotations

import itertools
import socket
import struct
import time
from collections import deque

from dcptool.protocol import Frame, FrameDecoder, decode_message, encode_frame, vbucket_of
from dcptool.protocol.constants import Feature, Opcode, Status

DEFAULT_FEATURES = (Feature.XERROR, Feature.XATTR, Feature.JSON, Feature.SELECT_BUCKET,
                    Feature.TCP_NODELAY, Feature.MUTATION_SEQNO)
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")


class Client:
    def __init__(self, host: str, port: int, *, timeout: float = 10.0, vbuckets: int = 16,
                 rcvbuf: int | None = None) -> None:
        if rcvbuf is None:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(timeout)
            self.sock.connect((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.decoder = FrameDecoder()
        self.backlog: deque[Frame] = deque()
        self._opaque = itertools.count(0x1000)
        self.vbuckets = vbuckets
        self.closed = False

    # -- raw -------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_opaque(self) -> int:
        return next(self._opaque)

    def recv(self, timeout: float | None = None) -> Frame:
        """The next frame from the node (TimeoutError if none arrives in time)."""
        if self.backlog:
            return self.backlog.popleft()
        return self._read_frame(timeout)

    def _read_frame(self, timeout: float | None = None) -> Frame:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            f = self.decoder.next_frame()
            if f is not None:
                return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the node")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                raise TimeoutError("no frame from the node") from None
            if not data:
                self.closed = True
                raise ConnectionError("the node closed the connection")
            self.decoder.feed(data)

    def request(self, opcode: int, *, key: bytes = b"", value: bytes = b"", extras: bytes = b"",
                vbucket: int = 0, cas: int = 0, datatype: int = 0, opaque: int | None = None,
                framing: bytes = b"", magic: int = 0x80) -> int:
        if opaque is None:
            opaque = self.next_opaque()
        self.send(encode_frame(magic, opcode, vbucket, opaque, cas, datatype, framing, extras,
                               key, value))
        return opaque

    def wait_response(self, opaque: int, timeout: float | None = None) -> Frame:
        """The response with `opaque`; other frames are kept for `recv`."""
        skipped = []
        try:
            while True:
                f = self._read_frame(timeout)
                if f.magic in (0x81, 0x18) and f.opaque == opaque:
                    return f
                skipped.append(f)
        finally:
            self.backlog.extend(skipped)

    def call(self, opcode: int, **kw) -> Frame:
        timeout = kw.pop("timeout", None)
        return self.wait_response(self.request(opcode, **kw), timeout)

    def send_msg(self, msg) -> None:
        self.send(msg.encode())

    def call_msg(self, msg, timeout: float | None = None) -> Frame:
        self.send(msg.encode())
        return self.wait_response(msg.opaque, timeout)

    # -- session ----------------------------------------------------------------------

    def hello(self, *features: int, agent: bytes = b"dcptool-tests") -> list[int]:
        f = self.call(Opcode.HELLO, key=agent, value=b"".join(U16.pack(x) for x in features))
        assert f.status == Status.SUCCESS, f
        return [x for (x,) in U16.iter_unpack(f.value)]

    def auth_plain(self, user: str, password: str) -> Frame:
        return self.call(Opcode.SASL_AUTH, key=b"PLAIN",
                         value=b"\x00" + user.encode() + b"\x00" + password.encode())

    def auth_scram(self, user: str, password: str, mech: str = "SCRAM-SHA512") -> Frame:
        from scramp import ScramClient

        name = {"SCRAM-SHA512": "SCRAM-SHA-512", "SCRAM-SHA256": "SCRAM-SHA-256",
                "SCRAM-SHA1": "SCRAM-SHA-1"}[mech]
        c = ScramClient([name], user, password)
        f = self.call(Opcode.SASL_AUTH, key=mech.encode(), value=c.get_client_first().encode())
        if f.status != Status.AUTH_CONTINUE:
            return f
        c.set_server_first(f.value.decode())
        f = self.call(Opcode.SASL_STEP, key=mech.encode(), value=c.get_client_final().encode())
        if f.status == Status.SUCCESS:
            c.set_server_final(f.value.decode())  # raises if the server signature is wrong
        return f

    def select_bucket(self, name: str = "default") -> Frame:
        return self.call(Opcode.SELECT_BUCKET, key=name.encode())

    def setup(self, user: str = "Administrator", password: str = "password",
              bucket: str = "default", features=DEFAULT_FEATURES) -> "Client":
        if features:
            self.hello(*features)
        f = self.auth_plain(user, password)
        assert f.status == Status.SUCCESS, f
        if bucket:
            f = self.select_bucket(bucket)
            assert f.status == Status.SUCCESS, f
        return self

    # -- kv ------------------------------------------------------------------------------

    def vb(self, key: bytes) -> int:
        return vbucket_of(key, self.vbuckets)

    def set(self, key: bytes, value: bytes, *, flags: int = 0, expiry: int = 0, cas: int = 0,
            datatype: int = 0, vbucket: int | None = None, opcode: int = Opcode.SET) -> Frame:
        return self.call(opcode, key=key, value=value, extras=struct.pack(">II", flags, expiry),
                         cas=cas, datatype=datatype,
                         vbucket=self.vb(key) if vbucket is None else vbucket)

    def set_many(self, docs, *, window: int = 256) -> list[Frame]:
        """Pipelined SETs of (key, value) or (key, value, vbucket); returns the responses."""
        out = []
        pending = []
        ext = struct.pack(">II", 0, 0)

        def collect(n):
            for _ in range(n):
                f = self._read_frame()
                assert f.status == Status.SUCCESS, f
                out.append(f)

        buf = []
        for d in docs:
            key, value = d[0], d[1]
            vb = d[2] if len(d) > 2 else self.vb(key)
            buf.append(encode_frame(0x80, Opcode.SET, vb, 0, 0, 0, b"", ext, key, value))
            if len(buf) >= window:
                self.send(b"".join(buf))
                pending.append(len(buf))
                buf = []
                if len(pending) > 1:
                    collect(pending.pop(0))
        if buf:
            self.send(b"".join(buf))
            pending.append(len(buf))
        for n in pending:
            collect(n)
        return out

    def get(self, key: bytes, *, vbucket: int | None = None) -> Frame:
        return self.call(Opcode.GET, key=key, vbucket=self.vb(key) if vbucket is None else vbucket)

    def delete(self, key: bytes, *, cas: int = 0, vbucket: int | None = None) -> Frame:
        return self.call(Opcode.DELETE, key=key, cas=cas,
                         vbucket=self.vb(key) if vbucket is None else vbucket)

    def stats(self, group: str = "") -> dict[str, str]:
        opaque = self.request(Opcode.STAT, key=group.encode())
        out = {}
        while True:
            f = self.wait_response(opaque)
            if f.status != Status.SUCCESS:
                raise AssertionError(f"STAT {group!r} failed with status {f.status:#x}")
            if not f.key:
                return out
            out[f.key.decode()] = f.value.decode()

    def decode(self, frame: Frame):
        return decode_message(frame)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(node, *, features=DEFAULT_FEATURES, setup: bool = True, timeout: float = 10.0) -> Client:
    c = Client(node.host, node.port, timeout=timeout, vbuckets=node.vbuckets)
    if setup:
        c.setup(features=features)
    return c


def wait_persisted(client: Client, timeout: float = 10.0) -> dict[str, str]:
    """Wait until every vbucket's persisted seqno equals its high seqno."""
    deadline = time.monotonic() + timeout
    while True:
        st = client.stats("vbucket-seqno")
        lagging = [k for k in st if k.endswith(":high_seqno")
                   and st[k] != st[k.replace(":high_seqno", ":last_persisted_seqno")]]
        if not lagging:
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"not persisted: {lagging[:5]}")
        time.sleep(0.02)
