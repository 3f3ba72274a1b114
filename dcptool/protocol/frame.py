"""The 24-byte header, flexible framing extras and an incremental frame decoder.

Sans-I/O: bytes in, `Frame` objects out. No sockets, no clocks.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

from .constants import (
    ALT_MAGICS,
    DEFAULT_MAX_BODY,
    HEADER_LEN,
    REQUEST_MAGICS,
    VALID_MAGICS,
    FrameInfoId,
    Magic,
)
from .errors import ProtocolError

#: magic, opcode, keylen, extlen, datatype, vbucket/status, bodylen, opaque, cas
HEADER = struct.Struct(">BBHBBHIIQ")
#: the same header with the flexible-framing layout (framing extras length, 1-byte key length)
ALT_HEADER = struct.Struct(">BBBBBBHIIQ")


@dataclass(slots=True)
class Frame:
    """One memcached binary protocol packet, split into its sections.

    `specific` is the vbucket id of a request or the status of a response.
    """

    magic: int
    opcode: int
    specific: int = 0
    opaque: int = 0
    cas: int = 0
    datatype: int = 0
    framing: bytes = b""
    extras: bytes = b""
    key: bytes = b""
    value: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.magic in REQUEST_MAGICS

    @property
    def vbucket(self) -> int:
        return self.specific

    @property
    def status(self) -> int:
        return self.specific

    @property
    def size(self) -> int:
        return HEADER_LEN + len(self.framing) + len(self.extras) + len(self.key) + len(self.value)

    def encode(self) -> bytes:
        return encode_frame(
            self.magic, self.opcode, self.specific, self.opaque, self.cas, self.datatype,
            self.framing, self.extras, self.key, self.value,
        )


def encode_frame(
    magic: int,
    opcode: int,
    specific: int = 0,
    opaque: int = 0,
    cas: int = 0,
    datatype: int = 0,
    framing: bytes = b"",
    extras: bytes = b"",
    key: bytes = b"",
    value: bytes = b"",
) -> bytes:
    """Encode one packet. A non-empty `framing` switches 0x80/0x81 to 0x08/0x18."""
    body = len(framing) + len(extras) + len(key) + len(value)
    if framing:
        if magic == Magic.REQUEST:
            magic = Magic.ALT_REQUEST
        elif magic == Magic.RESPONSE:
            magic = Magic.ALT_RESPONSE
    if magic in ALT_MAGICS:
        if len(framing) > 0xFF:
            raise ProtocolError("framing_extras", "longer than 255 bytes")
        if len(key) > 0xFF:
            raise ProtocolError("key", "longer than 255 bytes with flexible framing")
        head = ALT_HEADER.pack(magic, opcode, len(framing), len(key), len(extras), datatype,
                               specific, body, opaque, cas)
    else:
        if len(key) > 0xFFFF:
            raise ProtocolError("key", "longer than 65535 bytes")
        head = HEADER.pack(magic, opcode, len(key), len(extras), datatype, specific, body,
                           opaque, cas)
    return b"".join((head, framing, extras, key, value))


def parse_header(buf, offset: int = 0) -> tuple[int, int, int, int, int, int, int, int, int, int]:
    """Return (magic, opcode, framing_len, keylen, extlen, datatype, specific, bodylen, opaque, cas).

    Raises ProtocolError (framing lost) on an unknown magic.
    """
    magic = buf[offset]
    if magic not in VALID_MAGICS:
        raise ProtocolError("magic", f"unknown magic 0x{magic:02x}", offset=offset, framing_lost=True)
    if magic in ALT_MAGICS:
        m, op, flen, klen, elen, dt, spec, blen, opq, cas = ALT_HEADER.unpack_from(buf, offset)
    else:
        m, op, klen, elen, dt, spec, blen, opq, cas = HEADER.unpack_from(buf, offset)
        flen = 0
    if flen + elen + klen > blen:
        raise ProtocolError(
            "body_length",
            f"body length {blen} is shorter than framing extras {flen} + extras {elen} + key {klen}",
            offset=offset, framing_lost=False,
        )
    return m, op, flen, klen, elen, dt, spec, blen, opq, cas


def decode_frame(buf, offset: int = 0, max_body: int = DEFAULT_MAX_BODY) -> tuple[Frame | None, int]:
    """Decode one frame at `offset`. Returns (frame, bytes consumed) or (None, 0) if incomplete.

    A body whose section lengths do not add up raises ProtocolError with `frame_size`
    set, so a reader can skip the whole packet and go on.
    """
    if len(buf) - offset < HEADER_LEN:
        return None, 0
    try:
        m, op, flen, klen, elen, dt, spec, blen, opq, cas = parse_header(buf, offset)
    except ProtocolError as exc:
        if exc.field == "body_length":
            blen = HEADER.unpack_from(buf, offset)[6]
            exc.frame_size = HEADER_LEN + blen
            exc.opcode = buf[offset + 1]
            exc.opaque = HEADER.unpack_from(buf, offset)[7]
        raise
    if blen > max_body:
        raise ProtocolError(
            "body_length", f"body length {blen} exceeds the limit of {max_body} bytes",
            offset=offset, framing_lost=True, frame_size=HEADER_LEN + blen, opcode=op,
            opaque=opq,
        )
    end = offset + HEADER_LEN + blen
    if len(buf) < end:
        return None, 0
    p = offset + HEADER_LEN
    mv = memoryview(buf)
    framing = bytes(mv[p:p + flen]); p += flen
    extras = bytes(mv[p:p + elen]); p += elen
    key = bytes(mv[p:p + klen]); p += klen
    value = bytes(mv[p:end])
    return Frame(m, op, spec, opq, cas, dt, framing, extras, key, value), HEADER_LEN + blen


def decode_frames(buf, max_body: int = DEFAULT_MAX_BODY) -> tuple[list[Frame], int]:
    """Decode every whole frame in `buf`. Returns (frames, bytes consumed)."""
    frames = []
    off = 0
    n = len(buf)
    while n - off >= HEADER_LEN:
        frame, used = decode_frame(buf, off, max_body)
        if frame is None:
            break
        frames.append(frame)
        off += used
    return frames, off


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, take whole frames out.

    Frames split at any byte boundary decode the same. A declared body above
    `max_body` raises before anything of that body is buffered.
    """

    __slots__ = ("_buf", "max_body")

    def __init__(self, max_body: int = DEFAULT_MAX_BODY) -> None:
        self._buf = bytearray()
        self.max_body = max_body

    def feed(self, data) -> None:
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def next_frame(self) -> Frame | None:
        frame, used = decode_frame(self._buf, 0, self.max_body)
        if frame is None:
            # check the declared length early so an oversized body is refused before buffering
            if len(self._buf) >= HEADER_LEN:
                parse_header(self._buf, 0)
                blen = HEADER.unpack_from(self._buf, 0)[6]
                if blen > self.max_body:
                    raise ProtocolError("body_length",
                                        f"body length {blen} exceeds the limit of {self.max_body} bytes",
                                        framing_lost=True)
            return None
        del self._buf[:used]
        return frame

    def skip(self, n: int) -> None:
        """Drop `n` bytes (a frame whose sections did not add up)."""
        del self._buf[:n]

    def __iter__(self) -> Iterator[Frame]:
        while True:
            frame = self.next_frame()
            if frame is None:
                return
            yield frame


# ---------------------------------------------------------------------------
# flexible framing extras (frame infos)

def encode_frame_info(fid: int, data: bytes) -> bytes:
    out = bytearray()
    n = len(data)
    id_nib = fid if fid < 15 else 15
    len_nib = n if n < 15 else 15
    out.append((id_nib << 4) | len_nib)
    if fid >= 15:
        out.append(fid - 15)
    if n >= 15:
        out.append(n - 15)
    out += data
    return bytes(out)


def parse_frame_infos(framing: bytes) -> list[tuple[int, bytes]]:
    out = []
    p = 0
    n = len(framing)
    while p < n:
        b = framing[p]
        p += 1
        fid = b >> 4
        ln = b & 0x0F
        if fid == 15:
            if p >= n:
                raise ProtocolError("framing_extras", "truncated frame info id escape")
            fid = 15 + framing[p]
            p += 1
        if ln == 15:
            if p >= n:
                raise ProtocolError("framing_extras", "truncated frame info length escape")
            ln = 15 + framing[p]
            p += 1
        if p + ln > n:
            raise ProtocolError("framing_extras", f"frame info {fid} longer than the framing extras")
        out.append((fid, bytes(framing[p:p + ln])))
        p += ln
    return out


def encode_stream_id(sid: int) -> bytes:
    return encode_frame_info(FrameInfoId.DCP_STREAM_ID, sid.to_bytes(2, "big"))


def split_stream_id(framing: bytes) -> tuple[int | None, bytes]:
    """Return (stream id or None, the remaining framing bytes) of a frame."""
    if not framing:
        return None, b""
    # fast path: exactly one stream-id frame info
    if len(framing) == 3 and framing[0] == 0x22:
        return int.from_bytes(framing[1:3], "big"), b""
    sid = None
    rest = bytearray()
    for fid, data in parse_frame_infos(framing):
        if fid == FrameInfoId.DCP_STREAM_ID and sid is None:
            if len(data) != 2:
                raise ProtocolError("framing_extras", "DCP stream id must be 2 bytes")
            sid = int.from_bytes(data, "big")
        else:
            rest += encode_frame_info(fid, data)
    return sid, bytes(rest)
