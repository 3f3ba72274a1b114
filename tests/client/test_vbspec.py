"""Vbucket lists such as 0-15,512 (dcptool.client.vbspec; no node needed)."""
from __future__ import annotations

import pytest

from dcptool.client.vbspec import format_vbuckets, parse_vbuckets
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
