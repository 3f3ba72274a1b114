"""Backup and restore end to end: real node processes, a real local SparkSession, real files."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore
from dcptool.protocol import vbucket_of

VBS = 16
N = 10_000


def _docs(n: int, tag: str = "v1") -> dict[str, dict]:
    return {f"doc::{i:05d}": {"i": i, "tag": tag, "body": "x" * (i % 97)} for i in range(n)}


def _live(docs: dict[bytes, tuple]) -> dict[bytes, tuple]:
    return {k: v for k, v in docs.items() if v[0] == "live"}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A node with 10k documents, then a full backup, then changes, then an incremental."""
    base = tmp_path_factory.mktemp("backup")
    node = NodeProcess(base / "src", vbuckets=VBS).start()
    yield node, base
    node.stop()


def test_full_then_incremental_then_restore(source, spark, tmp_path):
    node, base = source
    opts = opts_for(node)
    with opts.connect() as conn:
        load(conn, _docs(N), VBS, flags=0x02000006)
    archive = base / "archive"
    full = run_backup(opts, archive, spark=spark)
    assert full.type == "full" and full.mutations == N and full.deletions == 0
    state1 = node_documents(opts)
    assert len(_live(state1)) == N

    # changes: 500 updates, 300 deletions, 200 documents given an expiry (an hour away)
    with opts.connect() as conn:
        load(conn, {f"doc::{i:05d}": {"i": i, "tag": "v2"} for i in range(0, 500)}, VBS, flags=7)
        delete(conn, [f"doc::{i:05d}" for i in range(1000, 1300)], VBS)
        load(conn, {f"doc::{i:05d}": {"i": i, "tag": "ttl"} for i in range(2000, 2200)}, VBS,
             expiry=int(time.time()) + 3600)
    incr = run_backup(opts, archive, spark=spark)
    assert incr.type == "incremental"
    # exactly the changes: every changed key once (each snapshot deduplicates)
    assert (incr.mutations, incr.deletions) == (700, 300)
    state2 = node_documents(opts)

    a = Archive.open(archive)
    ids = a.committed_ids()
    assert len(ids) == 2 and a.manifest(ids[1])["parent"] == ids[0]

    # restore the latest state into a fresh node: same documents and metadata
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        res = run_restore(str(archive), opts_for(dst), spark=spark)
        d = res.as_dict()
        assert d["restored"]["mutation"] == N - 300 and d["restored"]["deletion"] == 300
        assert sum(d["failed"].values()) == 0
        got = node_documents(opts_for(dst))
        assert got == state2
        ttl = got[b"doc::02000"]
        assert ttl[5] > time.time() and ttl[3] == state2[b"doc::02000"][3]

    # --backup of the first restores the first state
    with NodeProcess(tmp_path / "dst1", vbuckets=VBS) as dst1:
        run_restore(str(archive), opts_for(dst1), backup=ids[0], spark=spark)
        assert node_documents(opts_for(dst1)) == state1


def test_restore_skips_newer_unless_forced(source, spark, tmp_path):
    node, base = source
    archive = base / "archive"
    if not (archive / "archive.json").exists():
        pytest.skip("needs the archive of the first test")
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        o = opts_for(dst)
        with o.connect() as conn:  # newer versions on the target (higher rev seqno)
            load(conn, {f"doc::{i:05d}": {"i": i, "tag": "newer"} for i in range(5000, 5010)}, VBS)
        newer = node_documents(o)
        res = run_restore(str(archive), o, vbuckets=None, key_filter=r"^doc::050",
                          spark=spark).as_dict()
        assert res["skipped"]["mutation"] == 100 and res["restored"]["mutation"] == 0
        after = node_documents(o)
        assert after[b"doc::05000"] == newer[b"doc::05000"]
        res = run_restore(str(archive), o, key_filter=r"^doc::0500", force=True, spark=spark).as_dict()
        assert res["restored"]["mutation"] == 10
        forced = node_documents(o)
        assert json.loads(forced[b"doc::05000"][1])["tag"] == "v1"


def _cli(*args, env=None, **kw):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "dcptool", *args], env=e, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_backup_killed_mid_run_resumes(spark, tmp_path):
    """SIGKILL the whole backup process (driver, JVM, workers) mid-run; the next run resumes."""
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, _docs(3000), VBS)
        archive = tmp_path / "archive"
        env = {"DCPTOOL_PASSWORD": node.password, "DCPTOOL_FAULT": "stall-after-vbuckets:2"}
        proc = _cli("backup", "-c", f"{node.host}:{node.port}", str(archive), "--no-progress",
                    "--partitions", "2", "--master", "local[2]", env=env)
        backups = archive / "backups"
        deadline = time.monotonic() + 120
        done = []
        while time.monotonic() < deadline:
            done = list(backups.glob("*/vb-*.done.json")) if backups.exists() else []
            if len(done) >= 4:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)
        assert len(done) >= 4, "the backup made no progress"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        a = Archive.open(archive)
        assert a.committed_ids() == [] and len(a.partial_ids()) == 1

        res = run_backup(opts, archive, spark=spark)
        assert res.resumed and res.kept_vbuckets >= 4 and res.mutations == 3000
        assert Archive.open(archive).partial_ids() == []
        expected = node_documents(opts)
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == expected


def test_unclean_restart_between_backups_rolls_back(spark, tmp_path):
    """Backed-up items the node never persisted are lost in an unclean restart: the node
    starts a new history branch, and the next backup must roll back and record it."""
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, _docs(2000), VBS)
        archive = tmp_path / "archive"
        first = run_backup(opts, archive, spark=spark)
        # a clean restart with the flusher held back: what comes next stays in memory only
        node.extra_args = ("--flush-interval", "3600")
        node.restart()
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"late::{i}": {"i": i} for i in range(200)}, VBS)
        second = run_backup(opts, archive, spark=spark)
        assert second.mutations == 200 and second.rollbacks == 0
        node.kill()  # the 200 late documents were never persisted
        node.extra_args = ()
        node.start()
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"after::{i}": {"i": i} for i in range(100)}, VBS)
        third = run_backup(opts, archive, spark=spark)
        # every vbucket that got late documents was ahead of the node's new branch
        late_vbs = {vbucket_of(f"late::{i}".encode(), VBS) for i in range(200)}
        assert {r["vbucket"] for r in third.rollback_details} == late_vbs
        ends = Archive.open(archive).manifest(first.backup_id)["vbuckets"]
        first_end = {e["vbucket"]: e["end"]["seqno"] for e in ends}
        for r in third.rollback_details:
            assert r["seqno"] == first_end[r["vbucket"]]
        expected = node_documents(opts)
        assert not any(k.startswith(b"late::") for k in expected)
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == expected


def test_large_documents_back_up_and_restore_whole(spark, tmp_path):
    """Documents from 64 KiB to 4 MiB (larger than the node's sending quantum and than a
    block, some larger than a restore window's byte budget together) among small ones."""
    big = {f"big::{i}": {"i": i, "pad": chr(65 + i) * ((64 << 10) << i)} for i in range(7)}
    small = {f"small::{i}": {"i": i} for i in range(200)}
    with NodeProcess(tmp_path / "src", vbuckets=4) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {**big, **small}, 4)
        want = node_documents(opts)
        archive = tmp_path / "archive"
        b = run_backup(opts, archive, spark=spark)
        assert b.mutations == len(big) + len(small)
    with NodeProcess(tmp_path / "dst", vbuckets=4) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        got = node_documents(opts_for(dst))
    assert got == want
    assert json.loads(got[b"big::6"][1])["pad"] == "G" * (4 << 20)


def test_verify_names_a_flipped_byte(spark, tmp_path):
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, _docs(500), VBS)
        archive = tmp_path / "archive"
        run_backup(opts, archive, spark=spark)
    ok = subprocess.run([sys.executable, "-m", "dcptool", "verify", str(archive)], capture_output=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    data = sorted((archive / "backups").glob("*/vb-*.mpk.zst"))[3]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    data.write_bytes(bytes(raw))
    bad = subprocess.run([sys.executable, "-m", "dcptool", "verify", str(archive)], capture_output=True)
    assert bad.returncode == 1
    assert data.name in (bad.stdout + bad.stderr).decode()
