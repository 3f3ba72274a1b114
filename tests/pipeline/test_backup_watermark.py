"""Backups register their high watermark; the node's purger keeps what they have not seen.

Real node processes (started with --purge-age 0, so every tombstone is old enough at once
and only the watermark holds the purger back), a real local SparkSession, real archives.
"""
from __future__ import annotations

import json

from docutil import delete, load, node_documents, opts_for, wait_persisted
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.client.watermark import list_watermarks
from dcptool.pipeline.backup import archive_watermark, run_backup
from dcptool.pipeline.restore import run_restore
from dcptool.protocol.constants import Status
from dcptool.protocol.messages import CompactDb

VBS = 16


def _docs(n: int) -> dict[str, dict]:
    return {f"doc::{i:04d}": {"i": i} for i in range(n)}


def _compact_all(opts) -> dict[int, int]:
    """COMPACT_DB every vbucket; {vb: purge seqno after}."""
    out = {}
    with opts.connect() as conn:
        for vb in range(VBS):
            rsp = conn.request(CompactDb(vbucket=vb, db_file_id=vb), timeout=60)
            assert rsp.status == Status.SUCCESS
            out[vb] = json.loads(bytes(rsp.value))["purge_seqno"]
    return out


def _live(docs):
    return {k: v for k, v in docs.items() if v[0] == "live"}


def test_backup_registers_and_the_next_incremental_gets_every_deletion(tmp_path, spark):
    with NodeProcess(tmp_path / "src", vbuckets=VBS, extra_args=("--purge-age", "0")) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, _docs(400), VBS)
            delete(conn, [f"doc::{i:04d}" for i in range(40)], VBS)   # seen by the full
        archive = tmp_path / "archive"
        notes: list[str] = []
        full = run_backup(opts, archive, spark=spark, notice=notes.append)
        assert full.type == "full" and full.deletions == 40
        wm = full.watermark
        assert wm["registered"] and notes == []
        name, instance, seqnos, _meta = archive_watermark(archive)
        assert (wm["name"], wm["instance"]) == (name, instance)
        assert name == "dcptool-backup:archive" and instance == Archive.open(archive).uuid
        with opts.connect() as conn:
            table = list_watermarks(conn)
        [row] = table["entries"]
        assert (row["name"], row["instance"], row["state"]) == (name, instance, "ok")
        assert row["vbuckets"] == {str(vb): s for vb, s in sorted(seqnos.items())}
        assert row["meta"]["backup"] == full.backup_id
        assert 6.9 * 86400 < row["expires_at"] - row["reported_at"] <= 7 * 86400

        # deletions the archive has not seen yet, then compaction of every vbucket
        with opts.connect() as conn:
            delete(conn, [f"doc::{i:04d}" for i in range(100, 160)], VBS)
        wait_persisted(opts)  # so compaction sees them: what keeps them is the watermark
        purge = _compact_all(opts)
        # the tombstones the full backup saw are gone; the new ones are kept
        assert any(purge.values())
        assert all(purge[vb] <= seqnos[vb] for vb in range(VBS))
        incr = run_backup(opts, archive, spark=spark)
        assert incr.type == "incremental"
        assert incr.deletions == 60 and incr.rollbacks == 0
        source = node_documents(opts)
        assert len(_live(source)) == 300

        # the watermark moved to the incremental's end; now those tombstones may go too
        after = archive_watermark(archive)[2]
        assert all(after[vb] >= seqnos[vb] for vb in range(VBS))
        wait_persisted(opts)
        purge2 = _compact_all(opts)
        assert sum(purge2.values()) > sum(purge.values())

    # a restore of the chain does not bring the deleted documents back
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        res = run_restore(str(archive), opts_for(dst), spark=spark)
        assert sum(res.as_dict()["failed"].values()) == 0
        got = node_documents(opts_for(dst))
        assert set(_live(got)) == set(_live(source))
        for i in list(range(40)) + list(range(100, 160)):
            assert got.get(f"doc::{i:04d}".encode(), ("deleted",))[0] == "deleted"


def test_without_a_watermark_the_purger_forces_a_rollback_never_a_silent_miss(tmp_path, spark):
    with NodeProcess(tmp_path / "src", vbuckets=VBS, extra_args=("--purge-age", "0")) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, _docs(200), VBS)
        archive = tmp_path / "archive"
        full = run_backup(opts, archive, spark=spark, watermark=False)
        assert full.watermark is None
        with opts.connect() as conn:
            assert list_watermarks(conn)["entries"] == []
            delete(conn, [f"doc::{i:04d}" for i in range(50)], VBS)
            load(conn, {"doc::late": {"i": -1}}, VBS)
        wait_persisted(opts)
        _compact_all(opts)
        incr = run_backup(opts, archive, spark=spark, watermark=False)
        # every vbucket whose deletions were purged was told to roll back to 0 and read again
        assert incr.rollbacks > 0
        assert all(r["seqno"] == 0 for r in incr.rollback_details)
        source = node_documents(opts)
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        assert set(_live(node_documents(opts_for(dst)))) == set(_live(source))


def test_a_node_without_the_extension_gets_one_notice(tmp_path, spark):
    with NodeProcess(tmp_path / "src", vbuckets=VBS, extra_args=("--no-hwt",)) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, _docs(50), VBS)
        notes: list[str] = []
        res = run_backup(opts, tmp_path / "archive", spark=spark, notice=notes.append)
        assert res.type == "full" and res.mutations == 50
        assert len(notes) == 1 and "no high watermark table support" in notes[0]
        assert res.watermark["registered"] is False and res.watermark["note"] == notes[0]
        log = (tmp_path / "archive" / "logs")
        assert any("no high watermark table support" in p.read_text() for p in log.iterdir())
