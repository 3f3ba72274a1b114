"""The reusable CLI helpers: vbucket lists and connection options (no node needed)."""
from __future__ import annotations

import pickle

import pytest

from dcptool.client.options import ConnOptions
from dcptool.cli.tail import _Tracker, record_json
from dcptool.client.vbspec import format_vbuckets, parse_vbuckets
from dcptool.client import DELETION, MUTATION, SNAPSHOT, Position
from dcptool.errors import UsageError


@pytest.mark.parametrize("text,expected", [
    ("0-3,512", [0, 1, 2, 3, 512]),
    ("7", [7]),
    (" 5 , 1-2 ,2", [1, 2, 5]),
    (None, None),
    ("", None),
    ("all", None),
])
def test_parse_vbuckets(text, expected):
    assert parse_vbuckets(text) == expected


@pytest.mark.parametrize("text,words", [
    ("3-1", "backwards"), ("a", "not a vbucket"), ("1,,2", "empty"), ("-1", "not a vbucket"),
    ("70000", "out of range"),
])
def test_parse_vbuckets_errors(text, words):
    with pytest.raises(UsageError, match=words):
        parse_vbuckets(text)


def test_parse_vbuckets_limit():
    with pytest.raises(UsageError, match="0-15"):
        parse_vbuckets("16", limit=16)


def test_format_round_trip():
    vbs = [0, 1, 2, 3, 7, 9, 10, 512]
    assert format_vbuckets(vbs) == "0-3,7,9-10,512"
    assert parse_vbuckets(format_vbuckets(vbs)) == vbs


def test_connopts_defaults_and_secrecy():
    o = ConnOptions.from_cli("couchbases://h", None, "s3cret", "b", None, True)
    assert (o.host, o.port, o.tls, o.username, o.bucket, o.verify) == ("h", 11207, True, "Administrator", "b", False)
    assert "s3cret" not in repr(o)
    assert pickle.loads(pickle.dumps(o)) == o
    ctx = o.ssl_context()
    assert ctx is not None and not ctx.check_hostname


def test_connopts_missing_values(monkeypatch):
    with pytest.raises(UsageError, match="no node"):
        ConnOptions.from_cli(None, "u", "p")
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(UsageError, match="no password"):
        ConnOptions.from_cli("h", "u", None)


def test_connopts_prompts_on_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("getpass.getpass", lambda prompt: "typed")
    assert ConnOptions.from_cli("h:1", "u", None).password == "typed"


def test_record_json_text_and_binary():
    ev = (MUTATION, 3, 10, 2, 99, 0x01000000, 0, 1, b"k1", b'{"a":1}')
    assert record_json(ev, False) == {
        "type": "mutation", "vbucket": 3, "seqno": 10, "rev_seqno": 2, "cas": 99,
        "flags": 0x01000000, "expiry": 0, "datatype": 1, "key": "k1", "value": '{"a":1}'}
    b = record_json((MUTATION, 3, 10, 2, 99, 0, 0, 0, b"k", b"\xff\x00"), False)
    assert b["value"] == "/wA=" and b["value_encoding"] == "base64"
    d = record_json((DELETION, 3, 11, 3, 100, 0, 1700000000, 0, b"k", b""), True)
    assert d["type"] == "deletion" and d["delete_time"] == 1700000000 and "value" not in d


class _FakeConsumer:
    def __init__(self, pos):
        self.pos = pos

    def position(self, vb, consistent=None):
        return self.pos


def test_tracker_stops_mid_batch_without_skipping():
    # the session parsed up to seqno 5, but the tail stopped after printing seqno 3
    session_pos = Position(7, 5, 1, 6, ((7, 0),), ())
    t = _Tracker({0: Position()})
    t.see((SNAPSHOT, 0, 1, 6, 1))
    for s in (1, 2, 3):
        t.see((MUTATION, 0, s, 1, 1, 0, 0, 0, b"k", b"v"))
    p = t.position(_FakeConsumer(session_pos), 0)
    assert (p.uuid, p.seqno, p.snap_start, p.snap_end) == (7, 3, 1, 6)
    # stopped right after a marker with nothing of it printed: the previous snapshot end
    t.see((MUTATION, 0, 6, 1, 1, 0, 0, 0, b"k", b"v"))
    t.see((SNAPSHOT, 0, 7, 9, 1))
    p = t.position(_FakeConsumer(Position(7, 8, 7, 9, ((7, 0),), (6,))), 0)
    assert (p.seqno, p.snap_start, p.snap_end) == (6, 6, 6)
