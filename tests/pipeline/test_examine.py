"""`dcptool examine`: the timeline of one key over four backups of a real node."""
from __future__ import annotations

import json

import pytest
from cliutil import cli
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.pipeline.backup import run_backup
from dcptool.protocol import vbucket_of

VBS = 16
KEY = "user::0042"


@pytest.fixture(scope="module")
def archive(tmp_path_factory, spark):
    """KEY written, then updated in the next two backups and deleted in a fourth (other
    documents change alongside); the node's view of KEY after each backup."""
    base = tmp_path_factory.mktemp("examine")
    path = base / "archive"
    seen = []
    with NodeProcess(base / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        others = {f"user::{i:04d}": {"i": i} for i in range(200)}
        for step in range(3):
            with opts.connect() as conn:
                load(conn, {**others, KEY: {"name": "ada", "version": step}}, VBS, flags=step)
            run_backup(opts, path, spark=spark)
            seen.append(node_documents(opts)[KEY.encode()])
        with opts.connect() as conn:
            delete(conn, [KEY], VBS)
            load(conn, {"user::0001": {"i": 1, "later": True}}, VBS)
        run_backup(opts, path, spark=spark)
        seen.append(node_documents(opts)[KEY.encode()])
    return path, seen


def test_examine_shows_every_version(archive, capsys):
    path, seen = archive
    ids = Archive.open(path).committed_ids()
    assert len(ids) == 4
    rc, out, err = cli(capsys, "examine", path, KEY, "--json", "--values")
    assert rc == 0, err
    d = json.loads(out)
    assert d["vbucket"] == vbucket_of(KEY.encode(), VBS)
    versions = d["versions"]
    assert [v["backup"] for v in versions] == ids
    assert [v["type"] for v in versions] == ["mutation"] * 3 + ["deletion"]
    for v, node_view in zip(versions, seen):
        assert (v["cas"], v["rev_seqno"]) == (node_view[2], node_view[3])
    assert [json.loads(v["value"])["version"] for v in versions[:3]] == [0, 1, 2]
    assert [v["flags"] for v in versions[:3]] == [0, 1, 2]
    assert versions[3]["deleted"] and versions[3]["value"] == ""
    seqnos = [v["seqno"] for v in versions]
    assert seqnos == sorted(seqnos) and len(set(seqnos)) == 4
    assert [v["restored"] for v in versions] == [False, False, False, True]
    assert not any(v["dead"] for v in versions)
    assert all(v["size"] == len(v["value"].encode()) for v in versions)

    rc, out, _ = cli(capsys, "examine", path, KEY)
    assert rc == 0
    for bid in ids:
        assert bid in out
    assert "deletion" in out and "would restore" in out

    # only the chain of the second backup
    rc, out, _ = cli(capsys, "examine", path, KEY, "--backup", ids[1], "--json")
    d2 = json.loads(out)
    assert [v["backup"] for v in d2["versions"]] == ids[:2]
    assert d2["versions"][-1]["restored"]


def test_examine_unknown_key_is_one_error_line(archive, capsys):
    path, _seen = archive
    rc, out, err = cli(capsys, "examine", path, "no-such-key")
    assert rc == 1 and out == ""
    assert err.startswith("dcptool: error: ") and "no-such-key" in err and len(err.splitlines()) == 1
