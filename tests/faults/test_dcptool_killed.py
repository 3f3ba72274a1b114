"""dcptool is SIGKILLed during a backup (its whole session: driver, JVM, Spark workers) at
three points: mid-stream, with a segment file's frame half written, and with the manifest
written but not yet renamed into place. Each time the archive is not corrupt (the killed
backup is reported as partial, never as damage), the next run completes it, and in the
end the archive holds every seqno once and restores to the node's exact documents."""
from __future__ import annotations

from docutil import load, node_documents, opts_for, wait_persisted
from faultutil import (
    assert_each_seqno_once,
    assert_verifies,
    docs,
    finish,
    spawn,
)
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore

VBS = 8


def _killed_backup(node, archive, fault: str) -> None:
    proc = spawn("backup", "-c", f"{node.host}:{node.port}", str(archive), "--no-progress",
                 "--no-watermark", "--partitions", "2", "--master", "local[2]",
                 env={"DCPTOOL_PASSWORD": node.password, "DCPTOOL_FAULT": fault})
    rc, _out, err = finish(proc)
    assert rc == -9, f"{fault}: expected SIGKILL, got exit {rc}: {err[-2000:]}"


def test_backup_killed_at_three_points_is_never_corrupt_and_completes(spark, tmp_path):
    archive = tmp_path / "archive"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        committed = 0
        for round_, (fault, n) in enumerate([("kill-mid-stream:1500", 4000),
                                             ("kill-mid-file:1", 1500),
                                             ("kill-before-manifest-rename", 1500)]):
            with opts.connect() as conn:
                load(conn, docs(n, f"r{round_}"), VBS)
            wait_persisted(opts)
            _killed_backup(node, archive, fault)
            a = Archive.open(archive)
            assert len(a.committed_ids()) == committed, fault
            assert len(a.partial_ids()) == 1, fault
            partial = a.backup_dir(a.partial_ids()[0])
            assert not (partial / "manifest.json").exists()
            if fault.startswith("kill-mid-file"):
                # the torn frame is on disk: a data file without its vbucket's done file
                done = {p.name[:7] for p in partial.glob("vb-*.done.json")}
                assert any(p.name[:7] not in done for p in partial.glob("vb-*.mpk.zst")), fault
            if fault == "kill-before-manifest-rename":
                assert list(partial.glob(".manifest.json.*.tmp")), "the kill came too early"
                assert len(list(partial.glob("vb-*.done.json"))) == VBS
            # committed backups verify; the killed one is a partial backup, not a problem
            assert_verifies(archive, partial=1)

            res = run_backup(opts, archive, spark=spark, watermark=False)
            committed += 1
            assert res.resumed, fault
            assert res.mutations == n, fault
            if fault == "kill-before-manifest-rename":
                assert res.kept_vbuckets == VBS  # nothing streamed again
            assert_verifies(archive)
            assert len(Archive.open(archive).committed_ids()) == committed

        with opts.connect() as conn:
            highs = get_vbucket_seqnos(conn, state=1)
        assert_each_seqno_once(archive, highs)
        expected = node_documents(opts)
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == expected
