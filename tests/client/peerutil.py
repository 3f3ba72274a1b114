"""A scripted peer on the far end of a socketpair, for unit tests of the connection's
handshake logic (SCRAM proofs, mechanism choice, opaque matching) that an honest node
cannot exercise. End-to-end behaviour is tested against the real node process."""
from __future__ import annotations

import socket
import threading
from typing import Callable

import scramp

from dcptool.client.connection import Connection
from dcptool.protocol import FrameDecoder, encode_frame
from dcptool.protocol.constants import Magic, Opcode, Status

Handler = Callable[["Peer", object], None]


class Peer:
    """Answers requests from `handlers[opcode](peer, frame)`; unknown opcodes get UNKNOWN_COMMAND."""

    def __init__(self, handlers: dict[int, Handler], *, mechs: str = "SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN",
                 users: dict[str, str] | None = None, forge_signature: bool = False) -> None:
        self.client_sock, self.sock = socket.socketpair()
        self.handlers = dict(handlers)
        self.mechs = mechs
        self.users = users or {"admin": "secret"}
        self.forge = forge_signature
        self.seen: list[int] = []
        self.used_mech: str | None = None
        self._scram = None
        self.handlers.setdefault(Opcode.HELLO, lambda p, f: p.reply(f, value=f.value))
        self.handlers.setdefault(Opcode.SASL_LIST_MECHS, lambda p, f: p.reply(f, value=p.mechs.encode()))
        self.handlers.setdefault(Opcode.SASL_AUTH, Peer._sasl_auth)
        self.handlers.setdefault(Opcode.SASL_STEP, Peer._sasl_step)
        self.handlers.setdefault(Opcode.SELECT_BUCKET,
                                 lambda p, f: p.reply(f, status=Status.SUCCESS if f.key == b"default"
                                                      else Status.KEY_ENOENT))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def connection(self, timeout: float = 5.0) -> Connection:
        return Connection(self.client_sock, "peer", 1, timeout=timeout)

    def reply(self, frame, *, status: int = 0, value: bytes = b"", extras: bytes = b"",
              opaque: int | None = None) -> None:
        self.sock.sendall(encode_frame(Magic.RESPONSE, frame.opcode, status,
                                       frame.opaque if opaque is None else opaque, 0, 0, b"",
                                       extras, b"", value))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _sasl_auth(self, frame) -> None:
        mech = frame.key.decode()
        self.used_mech = mech
        if mech == "PLAIN":
            _, user, pw = frame.value.split(b"\x00")
            ok = self.users.get(user.decode()) == pw.decode()
            self.reply(frame, status=Status.SUCCESS if ok else Status.AUTH_ERROR)
            return
        name = {"SCRAM-SHA512": "SCRAM-SHA-512", "SCRAM-SHA256": "SCRAM-SHA-256",
                "SCRAM-SHA1": "SCRAM-SHA-1"}[mech]
        m = scramp.ScramMechanism(name)
        infos = {u: m.make_auth_info(p, iteration_count=4096) for u, p in self.users.items()}
        self._scram = m.make_server(lambda u: infos[u])
        self._scram.set_client_first(frame.value.decode())
        self.reply(frame, status=Status.AUTH_CONTINUE, value=self._scram.get_server_first().encode())

    def _sasl_step(self, frame) -> None:
        try:
            self._scram.set_client_final(frame.value.decode())
        except scramp.ScramException:
            self.reply(frame, status=Status.AUTH_ERROR)
            return
        final = self._scram.get_server_final()
        if self.forge:
            final = "v=" + "A" * 88
        self.reply(frame, value=final.encode())

    def _run(self) -> None:
        dec = FrameDecoder()
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return
                dec.feed(data)
                for frame in dec:
                    self.seen.append(frame.opcode)
                    h = self.handlers.get(frame.opcode)
                    if h is None:
                        self.reply(frame, status=Status.UNKNOWN_COMMAND)
                    else:
                        h(self, frame)
        except OSError:
            return

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
