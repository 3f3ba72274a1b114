"""Backups that dcptool refuses rather than do wrong: another bucket into an existing
archive (another bucket uuid, another history), and --vbuckets naming vbuckets the bucket
or archive does not have (backup, restore, verify --against, tail)."""
from __future__ import annotations

import json
import shutil

import pytest
from cliutil import cli
from docutil import load, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.pipeline.backup import run_backup, shares_history
from dcptool.pipeline.nodeinfo import bucket_uuid

VBS = 16


def _docs(tag: str, n: int = 40) -> dict[str, dict]:
    return {f"{tag}::{i:03d}": {"i": i, "tag": tag} for i in range(n)}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two node processes, each with a bucket 'default' of its own (two uuids)."""
    base = tmp_path_factory.mktemp("two-buckets")
    a = NodeProcess(base / "a", vbuckets=VBS).start()
    b = NodeProcess(base / "b", vbuckets=VBS).start()
    for node, tag in ((a, "a"), (b, "b")):
        with opts_for(node).connect() as conn:
            load(conn, _docs(tag), VBS)
    yield a, b
    b.stop()
    a.stop()


def _error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("dcptool: error: ") and "Traceback" not in err
    return lines[0]


def _backup(capsys, node, archive, *more):
    return cli(capsys, "backup", "-c", f"{node.host}:{node.port}", "-u", node.username,
               "-p", node.password, archive, "--no-progress", "--no-watermark", *more)


def test_another_bucket_is_refused_naming_both_and_full_starts_anew(two_nodes, spark,
                                                                     tmp_path, capsys):
    a, b = two_nodes
    archive = tmp_path / "arch"
    first = run_backup(opts_for(a), archive, spark=spark, watermark=False)
    ua, ub = bucket_uuid(opts_for(a)), bucket_uuid(opts_for(b))
    assert ua and ub and ua != ub
    assert Archive.open(archive).manifest(first.backup_id)["bucket_uuid"] == ua

    rc, _out, err = _backup(capsys, b, archive)
    assert rc == 2
    line = _error_line(err)
    assert ua in line and ub in line and line.count("'default'") == 2
    assert "--full" in line and "new full backup" in line
    assert Archive.open(archive).backup_ids() == [first.backup_id]  # nothing written

    rc, out, err = _backup(capsys, b, archive, "--full", "--json")
    assert rc == 0, err
    assert "a new full backup" in err and ua in err and ub in err  # said, on purpose
    doc = json.loads(out)
    assert doc["type"] == "full" and doc["rollbacks"] == 0
    # the next incremental continues b's full backup: no rollback
    rc, out, err = _backup(capsys, b, archive, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["type"] == "incremental" and doc["rollbacks"] == 0
    # a's backup is still there and still a's
    ar = Archive.open(archive)
    keys = {k for vb in range(VBS) for k, v in ar.resolve_vbucket(vb, backup=first.backup_id)
            .items()}
    assert len(keys) == 40 and all(k.startswith(b"\x00a::") for k in keys)


def test_a_bucket_made_again_with_the_same_name_is_another_bucket(spark, tmp_path, capsys):
    node = NodeProcess(tmp_path / "n", vbuckets=VBS).start()
    try:
        with opts_for(node).connect() as conn:
            load(conn, _docs("old"), VBS)
        archive = tmp_path / "arch"
        run_backup(opts_for(node), archive, spark=spark, watermark=False)
        before = bucket_uuid(opts_for(node))
        node.stop()
        shutil.rmtree(tmp_path / "n")  # the bucket is gone; one of the same name is made
        node.start()
        with opts_for(node).connect() as conn:
            load(conn, _docs("new"), VBS)
        after = bucket_uuid(opts_for(node))
        assert after != before
        rc, _out, err = _backup(capsys, node, archive)
        assert rc == 2
        line = _error_line(err)
        assert before in line and after in line
        assert len(Archive.open(archive).backup_ids()) == 1
    finally:
        node.stop()


def test_history_decides_when_no_uuid_was_recorded():
    # vbucket uuids in common: the same data; none: another bucket; no vbucket in common:
    # nothing to tell
    assert shares_history({0: [[7, 10], [5, 0]]}, {0: [(9, 20), (7, 10)]}) is True
    assert shares_history({0: [[7, 10]], 1: [[8, 0]]}, {0: [(9, 0)], 1: [(3, 0)]}) is False
    assert shares_history({0: [[7, 10]]}, {1: [(7, 0)]}) is None


@pytest.fixture(scope="module")
def archive_of_a(two_nodes, spark, tmp_path_factory):
    a, _b = two_nodes
    archive = tmp_path_factory.mktemp("arch-a") / "arch"
    run_backup(opts_for(a), archive, spark=spark, watermark=False)
    return archive


def test_vbuckets_the_bucket_lacks_are_a_usage_error(two_nodes, archive_of_a, capsys):
    a, _b = two_nodes
    archive = archive_of_a
    conn = ["-c", f"{a.host}:{a.port}", "-u", a.username, "-p", a.password]
    for spec, named in (("5000", "5000"), ("0-5000", "16-5000"), ("3,16", "16")):
        for args in (["backup", archive, "--no-progress", "--no-watermark", *conn],
                     ["restore", archive, *conn, "--dry-run"],
                     ["verify", archive, "--against", *conn],
                     ["tail", *conn, "--from", "beginning", "--until-idle", "1"]):
            rc, out, err = cli(capsys, *args, "--vbuckets", spec)
            assert rc == 2, (args, out, err)
            line = _error_line(err)
            assert f"has {VBS} vbuckets" in line and named in line, line
            assert not out.strip()
    assert len(Archive.open(archive).backup_ids()) == 1
