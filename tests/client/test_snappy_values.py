"""Snappy-compressed values (datatype 0x02) on the client side, without a node: the
session hands every record out decompressed with the bit cleared (tuples, typed messages,
views, the slow path, any split of the bytes), counts what it decompressed, names the
record whose value does not decompress, asks for force_value_compression only on a
connection that negotiated Snappy; ConnOptions negotiates Snappy when told to."""
from __future__ import annotations

import json
import random

import cramjam
import pytest

from dcptool.client import (
    DELETION, EXPIRATION, MUTATION, DcpSession, ProtocolViolation, SessionConfig,
)
from dcptool.client.options import SNAPPY_ENV, ConnOptions, snappy_from_env
from dcptool.errors import UsageError
from dcptool.protocol import ProtocolError, encode_frame
from dcptool.protocol.constants import Feature, Magic, Status
from dcptool.protocol.messages import DcpControl, DcpDeletion, DcpExpiration, DcpMutation
from dcptool.protocol.snappy import compress, decompress, plain

from .test_session import accept, handshake, marker, sent


def doc(i: int) -> bytes:
    """A JSON document with the variety of real ones (names, numbers, nesting, text)."""
    r = random.Random(i)
    words = ["route", "airline", "hotel", "landmark", "review", "free", "breakfast", "parking",
             "the", "of", "near", "city", "centre", "quiet", "friendly", "staff"]
    return json.dumps({
        "id": i, "type": r.choice(["hotel", "airline", "route"]),
        "name": " ".join(r.choice(words).title() for _ in range(r.randint(1, 3))),
        "geo": {"lat": round(r.uniform(-90, 90), 5), "lon": round(r.uniform(-180, 180), 5)},
        "reviews": [{"author": f"user{r.randint(1, 999)}", "rating": r.randint(1, 5),
                     "content": " ".join(r.choice(words) for _ in range(r.randint(5, 25)))}
                    for _ in range(r.randint(0, 3))],
        "public_likes": [f"user{r.randint(1, 999)}" for _ in range(r.randint(0, 4))],
    }).encode()


def raw_snappy(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def xattr_value(body: bytes) -> bytes:
    pair = b"_sync\x00" + b'{"rev":"1-abc"}' + b"\x00"
    section = len(pair).to_bytes(4, "big") + pair
    return len(section).to_bytes(4, "big") + section + body


def open_stream(s: DcpSession, vb: int = 5) -> int:
    s.add_stream(vb)
    req = handshake(s)[vb]
    s.feed(accept(req))
    return req.opaque


def stream_bytes(opq: int, vb: int = 5) -> tuple[bytes, list[tuple]]:
    """A snapshot of compressed and plain records, and the tuples expected for them."""
    out = marker(vb, opq, 1, 6)
    want = []
    d1, d2, d3 = doc(1), doc(2), doc(3)
    out += DcpMutation(vbucket=vb, opaque=opq, by_seqno=1, rev_seqno=1, key=b"k1",
                       value=raw_snappy(d1), datatype=0x03, cas=11, flags=7, expiry=0).encode()
    want.append((MUTATION, vb, 1, 1, 11, 7, 0, 0x01, b"k1", d1))
    out += DcpMutation(vbucket=vb, opaque=opq, by_seqno=2, rev_seqno=4, key=b"k2",
                       value=d2, datatype=0x01, cas=12, flags=0, expiry=9).encode()
    want.append((MUTATION, vb, 2, 4, 12, 0, 9, 0x01, b"k2", d2))
    xv = xattr_value(d3)
    out += DcpMutation(vbucket=vb, opaque=opq, by_seqno=3, rev_seqno=2, key=b"k3",
                       value=raw_snappy(xv), datatype=0x07, cas=13, flags=1, expiry=0).encode()
    want.append((MUTATION, vb, 3, 2, 13, 1, 0, 0x05, b"k3", xv))
    tomb = xattr_value(b"")
    out += DcpDeletion(vbucket=vb, opaque=opq, by_seqno=4, rev_seqno=5, key=b"k1",
                       value=raw_snappy(tomb), datatype=0x06, cas=14, delete_time=77).encode()
    want.append((DELETION, vb, 4, 5, 14, 0, 77, 0x04, b"k1", tomb))
    out += DcpExpiration(vbucket=vb, opaque=opq, by_seqno=5, rev_seqno=3, key=b"k2",
                         value=raw_snappy(b"x" * 40), datatype=0x02, cas=15,
                         delete_time=88).encode()
    want.append((EXPIRATION, vb, 5, 3, 15, 0, 88, 0x00, b"k2", b"x" * 40))
    out += DcpDeletion(vbucket=vb, opaque=opq, by_seqno=6, rev_seqno=6, key=b"k4", value=b"",
                       datatype=0x02, cas=16, delete_time=99).encode()
    want.append((DELETION, vb, 6, 6, 16, 0, 99, 0x00, b"k4", b""))
    return out, want


def records(events):
    return [e for e in events if e[0] in (MUTATION, DELETION, EXPIRATION)]


def test_protocol_helpers_round_trip_and_name_the_field():
    d = doc(7)
    c = compress(d)
    assert c == raw_snappy(d) and len(c) < len(d)
    assert decompress(c) == d and decompress(memoryview(c)) == d
    assert decompress(b"") == b""
    assert plain(c, 0x03) == (d, 0x01)
    assert plain(d, 0x05) == (d, 0x05)
    with pytest.raises(ProtocolError) as ei:
        decompress(b"\xff\xff\xff\xff\x0fnot snappy")
    assert ei.value.field == "value"


@pytest.mark.parametrize("copy", [True, False])
def test_records_come_out_decompressed_with_the_bit_cleared(copy):
    s = DcpSession(SessionConfig(copy_values=copy))
    opq = open_stream(s)
    data, want = stream_bytes(opq)
    got = records(s.feed(data))
    assert [e[:9] + (bytes(e[9]),) for e in got] == want
    # decompressed values are bytes; plain ones are as configured
    assert all(type(e[9]) is bytes for e in got if e[2] != 2)
    assert type(got[1][9]) is (bytes if copy else memoryview)
    assert s.values_decompressed == 5  # all but k2's
    assert s.decompressed_bytes == sum(len(w[9]) for w in want) - len(want[1][9])
    assert 0 < s.compressed_bytes < s.decompressed_bytes
    assert s.position(5).seqno == 6


def test_typed_records_are_decompressed():
    s = DcpSession(SessionConfig(typed=True))
    opq = open_stream(s)
    data, want = stream_bytes(opq)
    got = records(s.feed(data))
    assert [(e[0], e[2].by_seqno, e[2].datatype, bytes(e[2].value)) for e in got] == \
        [(w[0], w[2], w[7], w[9]) for w in want]
    assert isinstance(got[0][2], DcpMutation) and got[0][2].flags == 7
    assert got[3][2].delete_time == 77 and got[4][2].delete_time == 88


def test_any_split_gives_the_same_decompressed_records():
    whole = DcpSession(SessionConfig())
    data, want = stream_bytes(open_stream(whole))
    for cut in range(1, len(data), 37):
        s = DcpSession(SessionConfig())
        opq = open_stream(s)
        assert opq == whole.streams[5].opaque
        got = records(s.feed(data[:cut]) + s.feed(data[cut:]))
        assert got == want, cut


def test_a_record_off_the_fast_path_is_decompressed_too():
    """A mutation with flexible framing (a stream id) goes through the codec."""
    s = DcpSession(SessionConfig())
    opq = open_stream(s)
    d = doc(11)
    frame = DcpMutation(vbucket=5, opaque=opq, by_seqno=1, rev_seqno=1, key=b"sid",
                        value=raw_snappy(d), datatype=0x03, cas=5, flags=0, expiry=0,
                        stream_id=1).encode()
    assert frame[0] == 0x08
    got = records(s.feed(marker(5, opq, 1, 1) + frame))
    assert got == [(MUTATION, 5, 1, 1, 5, 0, 0, 0x01, b"sid", d)]
    assert s.values_decompressed == 1


def test_a_value_that_does_not_decompress_names_the_record():
    s = DcpSession(SessionConfig(), address="node-a:11210")
    opq = open_stream(s)
    bad = DcpMutation(vbucket=5, opaque=opq, by_seqno=1, rev_seqno=1, key=b"broken",
                      value=b"\xff\xff\xff\xff\x0fgarbage", datatype=0x03).encode()
    with pytest.raises(ProtocolViolation) as ei:
        s.feed(marker(5, opq, 1, 1) + bad)
    msg = str(ei.value)
    assert "vbucket 5" in msg and "seqno 1" in msg and "'broken'" in msg
    assert "node-a:11210" in msg


def test_plain_values_are_untouched():
    s = DcpSession(SessionConfig())
    opq = open_stream(s)
    d = doc(3)
    got = records(s.feed(marker(5, opq, 1, 1) + DcpMutation(
        vbucket=5, opaque=opq, by_seqno=1, rev_seqno=1, key=b"p", value=d, datatype=0x01,
        cas=1).encode()))
    assert got == [(MUTATION, 5, 1, 1, 1, 0, 0, 0x01, b"p", d)]
    assert s.values_decompressed == 0


def controls(s: DcpSession) -> dict[str, bytes]:
    s.start()
    return {m.key: m.value for m in sent(s) if isinstance(m, DcpControl)}


def test_force_value_compression_only_on_a_snappy_connection():
    assert "force_value_compression" not in controls(DcpSession(SessionConfig()))
    assert controls(DcpSession(SessionConfig(), snappy=True))["force_value_compression"] \
        == b"true"
    assert "force_value_compression" not in controls(
        DcpSession(SessionConfig(force_value_compression=False), snappy=True))


def test_a_refused_force_value_compression_is_not_fatal():
    s = DcpSession(SessionConfig(), snappy=True)
    s.add_stream(0)
    reply = b""
    for m in sent(s):
        status = Status.EINVAL if getattr(m, "key", None) == "force_value_compression" else 0
        if not hasattr(m, "start_seqno"):
            reply += encode_frame(Magic.RESPONSE, m.opcode, status, m.opaque)
    s.feed(reply)
    assert s.control_failures == {"force_value_compression": Status.EINVAL}
    assert s.take_error() is None


def test_conn_options_negotiate_snappy_when_told(monkeypatch):
    monkeypatch.delenv(SNAPPY_ENV, raising=False)
    base = ConnOptions.from_cli("127.0.0.1:1", None, "pw")
    assert base.snappy is False and Feature.SNAPPY not in base.features
    on = ConnOptions.from_cli("127.0.0.1:1", None, "pw", snappy=True)
    assert on.snappy and on.features[-1] == Feature.SNAPPY
    assert set(base.features) < set(on.features)
    monkeypatch.setenv(SNAPPY_ENV, "yes")
    assert ConnOptions.from_cli("127.0.0.1:1", None, "pw").snappy is True
    assert ConnOptions.from_cli("127.0.0.1:1", None, "pw", snappy=False).snappy is False
    monkeypatch.setenv(SNAPPY_ENV, "0")
    assert snappy_from_env() is False
    monkeypatch.setenv(SNAPPY_ENV, "maybe")
    with pytest.raises(UsageError):
        snappy_from_env()
