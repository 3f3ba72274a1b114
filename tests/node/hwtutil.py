"""Test helpers for the HWT opcodes and COMPACT_DB, over a raw `mcbputil.Client`."""
from __future__ import annotations

import json
import time

from dcptool.protocol import encode_frame, vbucket_of
from dcptool.protocol.constants import Opcode, Status
from dcptool.protocol.messages import CompactDb, HwtRequest


def keys_for(vb: int, vbuckets: int, n: int, prefix: str = "k") -> list[bytes]:
    """`n` keys that hash to vbucket `vb`."""
    out = []
    i = 0
    while len(out) < n:
        k = f"{prefix}{i}".encode()
        if vbucket_of(k, vbuckets) == vb:
            out.append(k)
        i += 1
    return out


def hwt(c, op: int, doc=None):
    """(status, JSON answer) of one HWT request."""
    f = c.call_msg(HwtRequest.make(op, doc, opaque=c.next_opaque()))
    return f.status, (json.loads(f.value) if f.value else None)


def register(c, name: str, instance: str, seqnos: dict[int, int], ttl: float = 3600, **extra):
    st, doc = hwt(c, Opcode.HWT_REGISTER, {"name": name, "instance": instance,
                                          "vbuckets": {str(k): v for k, v in seqnos.items()},
                                          "ttl": ttl, **extra})
    assert st == Status.SUCCESS, doc
    return doc


def listing(c, **sel) -> dict:
    st, doc = hwt(c, Opcode.HWT_LIST, sel or None)
    assert st == Status.SUCCESS, doc
    return doc


def entries(c) -> dict[tuple[str, str], dict]:
    return {(e["name"], e["instance"]): e for e in listing(c)["entries"]}


def compact(c, vb: int, *, before_ts: int = 0, before_seq: int = 0, drop: int = 0,
            timeout: float = 30) -> dict:
    f = c.call_msg(CompactDb(vbucket=vb, db_file_id=vb, purge_before_ts=before_ts,
                             purge_before_seq=before_seq, drop_deletes=drop,
                             opaque=c.next_opaque()), timeout)
    assert f.status == Status.SUCCESS, f
    return json.loads(f.value)


def vb_stats(c, vb: int) -> dict[str, int]:
    st = c.stats(f"vbucket-seqno {vb}")
    return {k.split(":", 1)[1]: int(v) for k, v in st.items() if k.startswith(f"vb_{vb}:")}


def pipeline(c, frames: list[bytes], window: int = 512) -> None:
    """Send requests in windows and check every answer is SUCCESS."""
    for i in range(0, len(frames), window):
        chunk = frames[i:i + window]
        c.send(b"".join(chunk))
        for _ in chunk:
            f = c.recv()
            assert f.status == Status.SUCCESS, f


def set_frame(key: bytes, vb: int, value: bytes = b'{"v":1}') -> bytes:
    return encode_frame(0x80, Opcode.SET, vb, 0, 0, 1, b"", b"\x00" * 8, key, value)


def del_frame(key: bytes, vb: int) -> bytes:
    return encode_frame(0x80, Opcode.DELETE, vb, 0, 0, 0, b"", b"", key, b"")


def next_second() -> int:
    """Sleep into the next whole second; return the second that just ended.

    Delete times are whole seconds: everything deleted before this call has a delete time
    at or below the returned value, everything deleted after it a later one."""
    t = time.time()
    time.sleep(int(t) + 1 - t + 0.01)
    return int(t)
