"""dcptool is SIGKILLed while it writes an encrypted archive: with a sealed frame half
written, then with the manifest written but not renamed. The killed backup is a partial
backup (not damage), the next run resumes it (recovery cuts the torn file and seals the
frame it rewrites under a fresh subkey), and the archive restores to the node's documents."""
from __future__ import annotations

import pytest
from docutil import load, node_documents, opts_for, wait_persisted
from faultutil import assert_each_seqno_once, assert_verifies, docs, finish, spawn
from nodeprocutil import NodeProcess

from dcptool.archive import Archive, crypto
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore

VBS = 8
PASS = "killed but sealed"


@pytest.fixture(autouse=True)
def passphrase(monkeypatch):
    monkeypatch.setenv(crypto.PASSPHRASE_ENV, PASS)
    monkeypatch.delenv(crypto.PASSPHRASE_FILE_ENV, raising=False)
    yield


def test_encrypted_backup_killed_mid_file_and_before_the_manifest_resumes(spark, tmp_path):
    archive = tmp_path / "archive"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        for round_, (fault, n) in enumerate([("kill-mid-file:1", 1500),
                                             ("kill-before-manifest-rename", 1500)]):
            with opts.connect() as conn:
                load(conn, docs(n, f"r{round_}"), VBS)
            wait_persisted(opts)
            proc = spawn("backup", "-c", f"{node.host}:{node.port}", str(archive),
                         "--no-progress", "--no-watermark", "--partitions", "2", "--master",
                         "local[2]", *(["--encrypt"] if round_ == 0 else []),
                         env={"DCPTOOL_PASSWORD": node.password, "DCPTOOL_FAULT": fault})
            rc, _out, err = finish(proc)
            assert rc == -9, f"{fault}: expected SIGKILL, got exit {rc}: {err[-2000:]}"
            a = Archive.open(archive)
            assert a.encrypted and len(a.committed_ids()) == round_, fault
            assert len(a.partial_ids()) == 1, fault
            assert_verifies(archive, partial=1)
            res = run_backup(opts, archive, spark=spark, watermark=False)
            assert res.resumed and res.mutations == n, fault
            assert_verifies(archive)
        with opts.connect() as conn:
            highs = get_vbucket_seqnos(conn, state=1)
        assert_each_seqno_once(archive, highs)
        expected = node_documents(opts)
    for f in archive.rglob("*.mpk.zst"):
        assert b"doc" not in f.read_bytes()
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == expected
