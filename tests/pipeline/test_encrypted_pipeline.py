"""An encrypted archive through the Spark pipeline in this process: the backup's tasks, the
data source's readers and the restore's tasks run in Spark's Python workers, which never
see the passphrase: the data key travels with the tasks (docs/archive-format.md, Keys at
run time)."""
from __future__ import annotations

import pytest
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive, crypto
from dcptool.archive.verify import verify_archive
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore
from dcptool.spark import read_archive

VBS = 8
N = 800
PASS = "pipeline passphrase"


@pytest.fixture(autouse=True)
def clean_keys(monkeypatch):
    monkeypatch.delenv(crypto.PASSPHRASE_ENV, raising=False)
    monkeypatch.delenv(crypto.PASSPHRASE_FILE_ENV, raising=False)
    yield


def test_encrypted_backup_read_and_restore_through_spark(spark, tmp_path, monkeypatch):
    path = tmp_path / "archive"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"doc::{i:05d}": {"i": i, "v": 1} for i in range(N)}, VBS)
        run_backup(opts, path, spark=spark, watermark=False, passphrase=PASS)
        with opts.connect() as conn:
            load(conn, {f"doc::{i:05d}": {"i": i, "v": 2} for i in range(100)}, VBS)
            delete(conn, [f"doc::{i:05d}" for i in range(100, 150)], VBS)
        run_backup(opts, path, spark=spark, watermark=False, passphrase=PASS)
        expected = node_documents(opts)
    assert Archive.open(path, passphrase=PASS).encrypted
    for f in path.rglob("*.mpk.zst"):
        assert b"doc::" not in f.read_bytes()

    # a new driver state: only the passphrase opens it, and the workers get the key
    monkeypatch.setenv(crypto.PASSPHRASE_ENV, PASS)
    opened = Archive.open(path)
    monkeypatch.delenv(crypto.PASSPHRASE_ENV)
    assert verify_archive(opened).ok
    df = read_archive(spark, opened, resolved=True)
    rows = df.select("key", "deleted").collect()
    assert len(rows) == N and sum(1 for r in rows if r["deleted"]) == 50
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        res = run_restore(opened, opts_for(dst), spark=spark)
        assert res.as_dict()["failed"] == {"mutation": 0, "deletion": 0, "expiration": 0}
        assert node_documents(opts_for(dst)) == expected
