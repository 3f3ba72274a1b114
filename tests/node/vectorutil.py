"""Reading the captured client requests in `tests/vectors/*.requests.hex`."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dcptool.protocol import decode_frame
from dcptool.protocol.frame import Frame

_CONN = re.compile(r"\bconn=(\d+)\b")


@dataclass
class Captured:
    conn: int
    raw: bytes
    frame: Frame
    note: str


def read_vector(path: Path) -> list[Captured]:
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        hexpart, _, note = line.partition("#")
        raw = bytes.fromhex(hexpart.strip())
        frame, used = decode_frame(raw)
        assert frame is not None and used == len(raw), f"bad vector line: {line[:80]}"
        m = _CONN.search(note)
        out.append(Captured(int(m.group(1)) if m else 1, raw, frame, note.strip()))
    return out


def by_connection(frames: list[Captured]) -> dict[int, list[Captured]]:
    out: dict[int, list[Captured]] = {}
    for f in frames:
        out.setdefault(f.conn, []).append(f)
    return out


def is_dcp_opcode(opcode: int) -> bool:
    return 0x50 <= opcode <= 0x67
