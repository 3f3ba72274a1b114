"""The node is SIGKILLed during a backup and during a restore.

Backup: the run fails with one clear line and keeps its partial backup; with the node
restarted on the same data directory the next run resumes and completes it.
Restore: rerunning it into the restarted node finishes it, the node then holds exactly
the archive's state, and a third run changes nothing (every write skipped).
A throttling proxy in front of the node keeps the run going long enough to be hit."""
from __future__ import annotations

import threading
from dataclasses import replace

from docutil import load, node_documents, opts_for, wait_persisted
from faultutil import (
    Proxy,
    assert_each_seqno_once,
    assert_verifies,
    docs,
    finish,
    one_error_line,
    spawn,
    wait_for,
)
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.pipeline.backup import run_backup
from dcptool.pipeline.restore import run_restore

VBS = 8
N = 6000


def test_node_killed_during_backup_then_rerun_completes(spark, tmp_path):
    archive = tmp_path / "archive"
    node = NodeProcess(tmp_path / "src", vbuckets=VBS).start()
    try:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, docs(N), VBS)
        wait_persisted(opts)  # the kill loses nothing the node acknowledged
        with Proxy(node.host, node.port, down_rate=150_000) as proxy:
            proc = spawn("backup", "-c", f"{proxy.host}:{proxy.port}", str(archive),
                         "--no-progress", "--no-watermark", "--partitions", "2",
                         "--master", "local[2]", env={"DCPTOOL_PASSWORD": node.password})
            wait_for(lambda: proxy.down_bytes > 150_000, 180, "the backup to stream", proc)
            node.kill()
            rc, _out, err = finish(proc)
        assert rc == 1, err[-2000:]
        line = one_error_line(err)
        assert "backup task failed" in line and "could not resume" in line, line
        a = Archive.open(archive)
        assert a.committed_ids() == [] and len(a.partial_ids()) == 1
        assert_verifies(archive, partial=1)

        node.start()  # same data directory, a new port
        opts = opts_for(node)
        res = run_backup(opts, archive, spark=spark, watermark=False)
        assert res.resumed and res.mutations == N
        assert_verifies(archive)
        with opts.connect() as conn:
            assert_each_seqno_once(archive, get_vbucket_seqnos(conn, state=1))
        expected = node_documents(opts)
    finally:
        node.stop()
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == expected


def test_node_killed_during_restore_then_rerun_equals_archive(spark, tmp_path):
    archive = tmp_path / "archive"
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as src:
        with opts_for(src).connect() as conn:
            load(conn, docs(N), VBS)
        run_backup(opts_for(src), archive, spark=spark, watermark=False)
        expected = node_documents(opts_for(src))

    dst = NodeProcess(tmp_path / "dst", vbuckets=VBS).start()
    try:
        errors: list[BaseException] = []

        def restore_slowly(proxy: Proxy) -> None:
            try:
                run_restore(str(archive), replace(opts_for(dst), host=proxy.host,
                                                  port=proxy.port), spark=spark)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                errors.append(exc)

        def restored() -> int:
            with opts_for(dst).connect() as conn:
                return sum(get_vbucket_seqnos(conn, state=1).values())

        with Proxy(dst.host, dst.port, rate=100_000) as proxy:
            t = threading.Thread(target=restore_slowly, args=(proxy,))
            t.start()
            wait_for(lambda: restored() >= 1000, 180, "the restore to write")
            dst.kill()
            t.join(120)
        assert not t.is_alive()
        assert errors and "restore task failed" in str(errors[0]), errors

        dst.start()  # same data directory; what it had not persisted is gone
        assert 0 < len(node_documents(opts_for(dst))) < N
        second = run_restore(str(archive), opts_for(dst), spark=spark).as_dict()
        assert sum(second["failed"].values()) == 0
        assert second["restored"]["mutation"] + second["skipped"]["mutation"] == N
        assert node_documents(opts_for(dst)) == expected

        third = run_restore(str(archive), opts_for(dst), spark=spark).as_dict()
        assert sum(third["restored"].values()) == 0, third
        assert third["skipped"]["mutation"] == N
        assert node_documents(opts_for(dst)) == expected
    finally:
        dst.stop()
