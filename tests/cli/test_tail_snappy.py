"""`dcptool tail --snappy` against a real node process: every value arrives compressed and
is printed readable (JSON lines hold the documents' JSON text with datatype JSON, the
table shows the text), the same as without Snappy; `doc get --snappy` prints JSON."""
from __future__ import annotations

import json

import pytest
from client.nodeutil import json_lines, run_cli
from docutil import opts_for
from snappyutil import documents, write_compressed

ENV_OFF = {"DCPTOOL_SNAPPY": "0"}


@pytest.fixture(scope="module")
def loaded(shared_node):
    docs = documents(90, "tz::", seed=11)
    write_compressed(opts_for(shared_node), docs, shared_node.vbuckets)
    return shared_node, docs


def _values(stdout: str) -> dict[bytes, dict]:
    return {d["key"].encode(): d for d in json_lines(stdout)
            if d["type"] == "mutation" and d["key"].startswith("tz::")}


def test_tail_prints_compressed_values_as_json(loaded):
    node, docs = loaded
    r = run_cli("tail", "--from", "beginning", "--until-idle", "2", "--json", "--snappy", "-v",
                node=node, env_extra=ENV_OFF)
    assert r.returncode == 0, r.stderr
    got = _values(r.stdout)
    assert set(got) == set(docs)
    for key, d in got.items():
        assert d["datatype"] == 1 and "value_encoding" not in d
        assert json.loads(d["value"]) == json.loads(docs[key])
        assert d["value"] == docs[key].decode()
    assert "values arrived snappy-compressed" in r.stderr, r.stderr
    shown = int(r.stderr.split(" values arrived snappy-compressed")[0].rsplit(" ", 1)[1])
    assert shown >= len(docs)

    # the same output without Snappy, and nothing arrived compressed
    r2 = run_cli("tail", "--from", "beginning", "--until-idle", "2", "--json", "-v",
                 node=node, env_extra=ENV_OFF)
    assert r2.returncode == 0, r2.stderr
    assert _values(r2.stdout) == got
    assert "snappy-compressed" not in r2.stderr


def test_tail_table_shows_the_text_of_compressed_values(loaded):
    node, docs = loaded
    r = run_cli("tail", "--from", "beginning", "--until-idle", "2", "--filter", "^tz::000[0-2]$",
                node=node, env_extra={"DCPTOOL_SNAPPY": "1"})
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if " tz::000" in ln]
    assert len(lines) == 3
    for ln in lines:
        where, key = ln.split(" mutation ")[1].split()[:2]  # scope.collection, then the key
        assert where == "_default._default"
        key = key.encode()
        assert docs[key].decode()[:60] in ln
        assert "binary" not in ln


def test_doc_get_with_snappy_prints_json(loaded):
    node, docs = loaded
    r = run_cli("doc", "get", "tz::0004", "--snappy", "--json", node=node, env_extra=ENV_OFF)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["value"] == json.loads(docs[b"tz::0004"]) and out["datatype"] == 1
