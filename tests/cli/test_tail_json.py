"""dcptool tail's JSON lines for records (no node needed)."""
from __future__ import annotations

from dcptool.cli.tail import record_json
from dcptool.client import DELETION, MUTATION


def test_record_json_text_and_binary():
    ev = (MUTATION, 3, 10, 2, 99, 0x01000000, 0, 1, b"k1", b'{"a":1}')
    assert record_json(ev, False) == {
        "type": "mutation", "vbucket": 3, "seqno": 10, "rev_seqno": 2, "cas": 99,
        "flags": 0x01000000, "expiry": 0, "datatype": 1, "key": "k1", "value": '{"a":1}'}
    b = record_json((MUTATION, 3, 10, 2, 99, 0, 0, 0, b"k", b"\xff\x00"), False)
    assert b["value"] == "/wA=" and b["value_encoding"] == "base64"
    d = record_json((DELETION, 3, 11, 3, 100, 0, 1700000000, 0, b"k", b""), True)
    assert d["type"] == "deletion" and d["delete_time"] == 1700000000 and "value" not in d
