"""The sub-document engine as pure functions (dcptool.node.subdoc): paths as kv_engine's
subjson parses them, and each operation's result and error on the document of kv_engine's
SubDocument.md."""
from __future__ import annotations

import json

import pytest

from dcptool.node import subdoc as sd

DOC = {
    "type": "product",
    "pDetails": {"audience": "children"},
    "pDistributors": [
        {"dName": "Going Out of Business Wholesale", "dAdded": ["Feb", 36, 2025]},
        {"dName": "Everything Must Go!", "dAdded": ["May", 72, 1492]},
    ],
    "dot.ted.field": None,
    "back`tick`field": None,
}


def doc():
    return json.loads(json.dumps(DOC))


@pytest.mark.parametrize("path, value", [
    ("type", '"product"'),
    ("pDistributors[0].dName", '"Going Out of Business Wholesale"'),
    ("pDistributors[1].dAdded[2]", "1492"),
    ("pDistributors[-1].dAdded[-1]", "1492"),
    ("`dot.ted.field`", "null"),
    ("`back``tick``field`", "null"),
])
def test_get_follows_the_documented_paths(path, value):
    assert sd.op_get(doc(), sd.parse_path(path)) == value.encode()


@pytest.mark.parametrize("path", ["a.", ".a", "a[", "a[x]", "a..b", "a]", "`a", "a[0]b",
                                  "a[-2]", "a.[0]", "a[]"])
def test_malformed_paths_are_path_einval(path):
    with pytest.raises(sd.SubdocError) as e:
        sd.parse_path(path)
    assert e.value.status == sd.PATH_EINVAL


def test_path_limits_are_path_e2big():
    with pytest.raises(sd.SubdocError) as e:
        sd.parse_path(".".join(["a"] * 33))
    assert e.value.status == sd.PATH_E2BIG
    with pytest.raises(sd.SubdocError) as e:
        sd.parse_path("a" * 1025)
    assert e.value.status == sd.PATH_E2BIG
    assert len(sd.parse_path(".".join(["a"] * 32))) == 32


@pytest.mark.parametrize("path, status", [
    ("pDistributors.count", sd.PATH_MISMATCH),   # a key on an array
    ("type.category", sd.PATH_MISMATCH),         # a key on a string
    ("pDetails[0]", sd.PATH_MISMATCH),           # an index on a dictionary
    ("missing", sd.PATH_ENOENT),
    ("pDistributors[5]", sd.PATH_ENOENT),
])
def test_lookup_errors(path, status):
    with pytest.raises(sd.SubdocError) as e:
        sd.op_get(doc(), sd.parse_path(path))
    assert e.value.status == status


def test_get_count_counts_arrays_and_dictionaries_only():
    assert sd.op_get_count(doc(), sd.parse_path("pDistributors")) == b"2"
    assert sd.op_get_count(doc(), []) == b"5"
    with pytest.raises(sd.SubdocError) as e:
        sd.op_get_count(doc(), sd.parse_path("type"))
    assert e.value.status == sd.PATH_MISMATCH


def test_dict_add_and_upsert():
    d = doc()
    sd.op_dict_add(d, sd.parse_path("pDetails.character"), b'"elmo"', mkdir_p=False)
    assert d["pDetails"]["character"] == "elmo"
    with pytest.raises(sd.SubdocError) as e:
        sd.op_dict_add(d, sd.parse_path("pDetails.character"), b'"x"', mkdir_p=False)
    assert e.value.status == sd.PATH_EEXISTS
    sd.op_dict_add(d, sd.parse_path("pDetails.character"), b'"x"', mkdir_p=False, upsert=True)
    assert d["pDetails"]["character"] == "x"
    with pytest.raises(sd.SubdocError) as e:
        sd.op_dict_add(d, sd.parse_path("pDetails.hazards.radioactive"), b"true",
                       mkdir_p=False)
    assert e.value.status == sd.PATH_ENOENT
    sd.op_dict_add(d, sd.parse_path("pDetails.hazards.radioactive"), b"true", mkdir_p=True)
    assert d["pDetails"]["hazards"] == {"radioactive": True}
    with pytest.raises(sd.SubdocError) as e:
        sd.op_dict_add(d, sd.parse_path("pDetails.y"), b"{not json", mkdir_p=False)
    assert e.value.status == sd.VALUE_CANTINSERT
    with pytest.raises(sd.SubdocError) as e:
        sd.op_dict_add(d, sd.parse_path("pDistributors[0]"), b"1", mkdir_p=False)
    assert e.value.status == sd.PATH_EINVAL


def test_delete_and_replace():
    d = doc()
    sd.op_delete(d, sd.parse_path("pDistributors[0]"))
    assert [x["dName"] for x in d["pDistributors"]] == ["Everything Must Go!"]
    sd.op_replace(d, sd.parse_path("pDistributors[-1].dAdded[0]"), b'"Jun"')
    assert d["pDistributors"][0]["dAdded"][0] == "Jun"
    for op in (lambda: sd.op_delete(d, sd.parse_path("nope")),
               lambda: sd.op_replace(d, sd.parse_path("nope"), b"1")):
        with pytest.raises(sd.SubdocError) as e:
            op()
        assert e.value.status == sd.PATH_ENOENT


def test_array_push_insert_and_add_unique():
    d = {"a": [1, 2]}
    sd.op_array_push(d, ["a"], b"3, 4", first=False, mkdir_p=False)
    sd.op_array_push(d, ["a"], b"0", first=True, mkdir_p=False)
    assert d["a"] == [0, 1, 2, 3, 4]
    sd.op_array_insert(d, sd.parse_path("a[1]"), b'"x"')
    sd.op_array_insert(d, sd.parse_path("a[6]"), b'"end"')   # at the size: appended
    assert d["a"] == [0, "x", 1, 2, 3, 4, "end"]
    for path, status in (("a[9]", sd.PATH_ENOENT), ("a[-1]", sd.PATH_EINVAL),
                         ("a", sd.PATH_EINVAL)):
        with pytest.raises(sd.SubdocError) as e:
            sd.op_array_insert(d, sd.parse_path(path), b"1")
        assert e.value.status == status
    sd.op_array_add_unique(d, ["a"], b"5", mkdir_p=False)
    with pytest.raises(sd.SubdocError) as e:
        sd.op_array_add_unique(d, ["a"], b"5", mkdir_p=False)
    assert e.value.status == sd.PATH_EEXISTS
    sd.op_array_add_unique(d, ["a"], b'"5"', mkdir_p=False)   # "5" is not 5
    with pytest.raises(sd.SubdocError) as e:
        sd.op_array_add_unique(d, ["a"], b"[1]", mkdir_p=False)
    assert e.value.status == sd.VALUE_CANTINSERT
    d["b"] = [{"o": 1}]
    with pytest.raises(sd.SubdocError) as e:
        sd.op_array_add_unique(d, ["b"], b"1", mkdir_p=False)
    assert e.value.status == sd.PATH_MISMATCH
    with pytest.raises(sd.SubdocError) as e:
        sd.op_array_push(d, ["missing"], b"1", first=False, mkdir_p=False)
    assert e.value.status == sd.PATH_ENOENT
    sd.op_array_push(d, sd.parse_path("new.list"), b"1", first=False, mkdir_p=True)
    assert d["new"] == {"list": [1]}


def test_counter():
    d = {"n": 5, "f": 1.5, "s": "x", "big": 2 ** 63 - 1}
    assert sd.op_counter(d, ["n"], b"10", mkdir_p=False) == b"15"
    assert sd.op_counter(d, ["n"], b"-20", mkdir_p=False) == b"-5"
    assert sd.op_counter(d, ["fresh"], b"3", mkdir_p=False) == b"3"  # created at 0 + delta
    for path, delta, status in ((["f"], b"1", sd.PATH_MISMATCH),
                                (["s"], b"1", sd.PATH_MISMATCH),
                                (["big"], b"1", sd.DELTA_ERANGE),
                                (["n"], b"0", sd.DELTA_ERANGE),
                                (["n"], b"1.5", sd.DELTA_ERANGE),
                                (["n"], b"9223372036854775808", sd.DELTA_ERANGE),
                                (["a", "b"], b"1", sd.PATH_ENOENT)):
        with pytest.raises(sd.SubdocError) as e:
            sd.op_counter(d, path, delta, mkdir_p=False)
        assert e.value.status == status, (path, delta)
    d["huge"] = 2 ** 64
    with pytest.raises(sd.SubdocError) as e:
        sd.op_counter(d, ["huge"], b"1", mkdir_p=False)
    assert e.value.status == sd.NUM_ERANGE


def test_documents_that_are_not_json_or_too_deep():
    with pytest.raises(sd.SubdocError) as e:
        sd.parse_document(b"not json")
    assert e.value.status == sd.DOC_NOT_JSON
    deep = b"[" * 40 + b"]" * 40
    with pytest.raises(sd.SubdocError) as e:
        sd.parse_document(deep)
    assert e.value.status == sd.DOC_E2DEEP
