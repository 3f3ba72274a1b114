"""`dcptool verify ARCHIVE --against -c NODE`: the archive's state against the live node."""
from __future__ import annotations

import json

import pytest
from cliutil import cli
from docutil import delete, load, opts_for
from nodeprocutil import NodeProcess

from dcptool.pipeline.backup import run_backup
from dcptool.protocol import vbucket_of

VBS = 16


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with NodeProcess(tmp_path_factory.mktemp("against") / "src", vbuckets=VBS) as n:
        yield n


def test_verify_against_a_fresh_backup_then_a_changed_document(node, spark, tmp_path, capsys,
                                                               monkeypatch):
    monkeypatch.setenv("DCPTOOL_PASSWORD", node.password)
    opts = opts_for(node)
    with opts.connect() as conn:
        load(conn, {f"acct::{i:04d}": {"i": i} for i in range(1000)}, VBS)
        delete(conn, [f"acct::{i:04d}" for i in range(900, 950)], VBS)
    path = tmp_path / "archive"
    run_backup(opts, path, spark=spark)
    target = f"{node.host}:{node.port}"

    rc, out, err = cli(capsys, "verify", path, "--against", "-c", target, "--json")
    assert rc == 0, out + err
    d = json.loads(out)
    assert d["ok"] and d["vbuckets_compared"] == VBS and d["vbuckets_differing"] == []
    assert d["keys_archive"] == d["keys_node"] == 1000  # 950 live + 50 tombstones

    # documents created after the backup are above its seqnos: still a match
    with opts.connect() as conn:
        load(conn, {f"new::{i}": {"i": i} for i in range(30)}, VBS)
    rc, out, err = cli(capsys, "verify", path, "--against", "-c", target)
    assert rc == 0, out + err
    assert out.strip().splitlines()[-1].startswith(f"OK: {VBS} vbuckets (1,000 keys)")

    # one document changed on the node and the archive not re-run
    changed = "acct::0123"
    vb = vbucket_of(changed.encode(), VBS)
    with opts.connect() as conn:
        load(conn, {changed: {"i": 123, "changed": True}}, VBS)
    rc, out, err = cli(capsys, "verify", path, "--against", "-c", target)
    assert rc == 1
    assert f"vbucket {vb} differs" in out
    assert changed in out
    assert out.strip().splitlines()[-1] == f"FAILED: 1 of {VBS} vbuckets differ from {target}: {vb}"

    rc, out, _ = cli(capsys, "verify", path, "--against", "-c", target, "--json")
    d = json.loads(out)
    assert rc == 1 and d["vbuckets_differing"] == [vb]
    bad = next(v for v in d["vbuckets"] if v["vbucket"] == vb)
    assert bad["archive"]["count"] == bad["node"]["count"] + 1
    assert bad["archive"]["hash"] != bad["node"]["hash"]
    (diff,) = bad["differences"]
    assert diff["key"] == changed and diff["node"] is None and diff["archive"]["deleted"] is False
    # one task for the 16 vbuckets: it streams a few at a time (compare.STREAM_WINDOW),
    # each compared as its stream ends; the same answer
    from dcptool.pipeline.compare import STREAM_WINDOW

    assert VBS > STREAM_WINDOW
    rc, out, _ = cli(capsys, "verify", path, "--against", "-c", target, "--json",
                     "--partitions", "1")
    one = json.loads(out)
    assert rc == 1 and one["vbuckets_differing"] == [vb]
    assert [v["vbucket"] for v in one["vbuckets"]] == list(range(VBS))
    assert [(v["archive"], v["node"]) for v in one["vbuckets"]] == \
        [(v["archive"], v["node"]) for v in d["vbuckets"]]

    # a new backup catches up: a match again
    run_backup(opts, path, spark=spark)
    rc, out, err = cli(capsys, "verify", path, "--against", "-c", target, "--vbuckets", str(vb))
    assert rc == 0, out + err
    assert "OK: 1 vbucket (" in out

    # merged into one backup, the archive still matches; the next incremental backup
    # continues from the merged one's end and holds only what changed since
    rc, out, err = cli(capsys, "merge", path, "--json")
    assert rc == 0, err
    with opts.connect() as conn:
        load(conn, {"acct::0007": {"i": 7, "again": True}}, VBS)
    nxt = run_backup(opts, path, spark=spark)
    assert nxt.type == "incremental" and (nxt.mutations, nxt.deletions) == (1, 0)
    rc, out, err = cli(capsys, "verify", path, "--against", "-c", target)
    assert rc == 0, out + err
    rc, out, err = cli(capsys, "verify", path)
    assert rc == 0, out + err


def test_verify_against_user_errors(tmp_path, capsys, monkeypatch, node, spark):
    monkeypatch.delenv("DCPTOOL_CLUSTER", raising=False)
    path = tmp_path / "archive"
    rc, _out, err = cli(capsys, "verify", path, "--against")
    assert rc != 0 and "no archive" in err
    run_backup(opts_for(node), path, spark=spark)
    rc, _out, err = cli(capsys, "verify", path, "--against")
    assert rc == 2 and "no node given" in err and len(err.splitlines()) == 1
    rc, _out, err = cli(capsys, "verify", path, "--vbuckets", "0-3")
    assert rc == 2 and "--against" in err
    # the plain verify keeps working
    rc, out, _err = cli(capsys, "verify", path)
    assert rc == 0 and out.startswith("OK: ")
