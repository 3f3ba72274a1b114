"""Run logs (ARCHIVE/logs/KIND-TIME.log) and the node's log (DIR/logs/node.log)."""
from __future__ import annotations

import logging
import os
import re
import stat

import pytest
from docutil import load, opts_for

from dcptool import runlog
from dcptool.errors import DcptoolError
from dcptool.runlog import RunLog

LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) .+$")


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def _no_echo():
    runlog.set_echo(None)
    yield
    runlog.set_echo(None)


def test_a_run_log_is_private_and_keeps_what_was_said_before_it_opened(tmp_path):
    with RunLog("backup") as rl:
        rl.info("said before the archive existed: %d", 1)
        path = rl.attach(tmp_path)
        rl.warning("vbucket %d: rollback", 7)
    assert path.parent == tmp_path / "logs"
    assert re.fullmatch(r"backup-\d{8}T\d{6}\.\d{6}Z\.log", path.name)
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    lines = path.read_text().splitlines()
    assert all(LINE.match(ln) for ln in lines), lines
    assert "INFO said before the archive existed: 1" in lines[0]
    assert lines[-1].endswith("WARNING vbucket 7: rollback")


def test_a_failed_run_ends_its_log_with_the_error(tmp_path):
    with pytest.raises(DcptoolError):
        with RunLog("restore") as rl:
            rl.attach(tmp_path)
            raise DcptoolError("the node went away", hint="run it again")
    text = rl.path.read_text()
    assert text.splitlines()[-1].endswith("ERROR failed: the node went away (run it again)")


def test_after_ctrl_c_a_run_log_says_interrupted_not_the_error_that_followed(tmp_path,
                                                                              monkeypatch):
    from dcptool import errors

    monkeypatch.setattr(errors, "_interrupted", [False])
    with pytest.raises(ConnectionRefusedError):
        with RunLog("restore") as rl:
            rl.attach(tmp_path)
            errors.mark_interrupted()  # Ctrl-C: the JVM is killed, py4j's next call fails
            raise ConnectionRefusedError(111, "Connection refused")
    assert rl.path.read_text().splitlines()[-1].endswith("ERROR interrupted")
    with pytest.raises(errors.Interrupted):
        with RunLog("backup") as rl:
            rl.attach(tmp_path)
            raise errors.Interrupted("interrupted: partial backup B1 is kept; the next "
                                     "backup of this archive resumes it")
    assert rl.path.read_text().splitlines()[-1].endswith(
        "ERROR interrupted: partial backup B1 is kept; the next backup of this archive resumes it")


def test_rotation_keeps_the_newest_logs_of_each_kind(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(25):
        (logs / f"backup-2020010{i // 10}T0000{i % 10:02d}.000000Z.log").write_text("old\n")
    (logs / "restore-20200101T000000.000000Z.log").write_text("other kind\n")
    (logs / "notes.txt").write_text("not a log\n")
    with RunLog("backup") as rl:
        rl.attach(tmp_path)
    names = sorted(p.name for p in logs.iterdir())
    backups = [n for n in names if n.startswith("backup-")]
    assert len(backups) == runlog.DEFAULT_KEEP
    assert rl.path.name in backups                      # the new one is kept
    assert "backup-20200100T000000.000000Z.log" not in names   # the oldest went
    assert "restore-20200101T000000.000000Z.log" in names and "notes.txt" in names
    monkeypatch.setenv("DCPTOOL_LOG_KEEP", "3")
    with RunLog("backup") as rl2:
        rl2.attach(tmp_path)
    assert len([p for p in logs.iterdir() if p.name.startswith("backup-")]) == 3


def test_two_runs_started_in_the_same_microsecond_get_two_files(tmp_path):
    a, b = RunLog("merge"), RunLog("merge")
    b.started = a.started
    pa, pb = a.attach(tmp_path), b.attach(tmp_path)
    a.close()
    b.close()
    assert pa != pb and pa.exists() and pb.exists()


def test_an_unwritable_log_does_not_fail_the_run(tmp_path, capsys):
    (tmp_path / "logs").write_text("a file where the directory should be")
    with RunLog("backup") as rl:
        assert rl.attach(tmp_path) is None
        rl.info("the run goes on")
    assert "cannot write a backup log" in capsys.readouterr().err


def test_verbose_mode_echoes_the_log_on_stderr(tmp_path, capsys):
    runlog.set_echo("INFO")
    with RunLog("backup") as rl:
        rl.attach(tmp_path)
        rl.debug("only in the file")
        rl.info("vbucket 3: seqno 0 -> 10")
    err = capsys.readouterr().err
    assert "backup: vbucket 3: seqno 0 -> 10" in err and "only in the file" not in err
    assert "only in the file" in rl.path.read_text()


def test_node_log_handler_rotates_private_files(tmp_path):
    handler = runlog.node_log_handler(tmp_path, max_bytes=200, backups=2)
    log = logging.Logger("t")
    log.addHandler(handler)
    for i in range(30):
        log.warning("line %d of the node log", i)
    handler.close()
    files = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert files == ["node.log", "node.log.1", "node.log.2"]
    assert all(mode(tmp_path / "logs" / f) == 0o600 for f in files)


def test_the_node_logs_to_its_directory(node_factory):
    node = node_factory(vbuckets=4)
    node.stop()
    path = node.data_dir / "logs" / "node.log"
    assert mode(path) == 0o600
    text = path.read_text()
    assert re.search(r"INFO dcptool\.node: starting: pid \d+, data .*, bucket default, 4 vbuckets", text)
    assert "exited" in text or "stopped" in text
    assert "starting" not in node.stderr()  # stderr keeps its own level (warning)


# -- backup and restore runs against a real node ----------------------------------------------


def test_backup_and_restore_runs_are_logged_per_vbucket(node_factory, spark, tmp_path):
    from dcptool.pipeline.backup import run_backup
    from dcptool.protocol import vbucket_of
    from dcptool.pipeline.restore import run_restore

    node = node_factory(vbuckets=8)
    opts = opts_for(node)
    with opts.connect() as conn:
        load(conn, {f"log::{i}": {"i": i} for i in range(200)}, 8)
    archive = tmp_path / "archive"
    r1 = run_backup(opts, archive, spark=spark)
    with opts.connect() as conn:
        load(conn, {"log::1": {"i": "changed"}}, 8)
    r2 = run_backup(opts, archive, spark=spark)
    changed = vbucket_of(b"log::1", 8)
    for r, logged in ((r1, range(8)), (r2, [changed])):
        assert r.log and r.as_dict()["log"] == r.log
        text = open(r.log).read()
        # the incremental streams only the vbucket that changed (the others cost nothing)
        others = 8 - len(logged)
        assert f"{others} unchanged since the parent, {len(logged)} to stream" in text, text
        for vb in logged:
            assert re.search(rf"INFO vbucket {vb}: seqno \d+ -> \d+ \(uuid 0x[0-9a-f]+\), \d+ "
                             r"mutations, \d+ deletions, \d+ expirations, .*; stream opened 1x, "
                             r"0 retries, \d+\.\d{3} s", text), (vb, text)
        assert f"committed {r.type} backup {r.backup_id}" in text
        assert re.search(r"spark local\[\d\]: \d+ tasks", text)
    assert "parent none" in open(r1.log).read()
    assert f"parent {r1.backup_id}" in open(r2.log).read()
    rr = run_restore(str(archive), None, dry_run=True, spark=spark)
    text = open(rr.log).read()
    assert sum(f"vbucket {vb}: would write" in text for vb in range(8)) == 8
    assert "dry run of backup" in text and rr.log.startswith(str(archive / "logs"))
    names = sorted(os.listdir(archive / "logs"))
    assert [n.split("-")[0] for n in names] == ["backup", "backup", "restore"]

    from dcptool.pipeline.merge import run_merge

    m = run_merge(archive, spark=spark)
    assert m.log and m.as_dict()["log"] == m.log and m.log.startswith(str(archive / "logs"))
    text = open(m.log).read()
    assert sum(bool(re.search(rf"INFO vbucket {vb}: \d+ mutations, \d+ deletions", text))
               for vb in range(8)) == 8
    assert f"into {m.merged_id} (full, parent None)" in text
    assert f"{r1.backup_id}, {r2.backup_id}" in text


def test_a_backup_refused_by_the_lock_says_so_in_its_log(node_factory, spark, tmp_path):
    from dcptool.archive import Archive
    from dcptool.archive.errors import ArchiveLockedError
    from dcptool.pipeline.backup import run_backup

    node = node_factory(vbuckets=4)
    archive = tmp_path / "archive"
    Archive.create(archive, bucket="default", vbuckets=4)
    with Archive.open(archive).lock("another run"):
        with pytest.raises(ArchiveLockedError):
            run_backup(opts_for(node), archive, spark=spark)
    (log,) = (archive / "logs").iterdir()
    assert "ERROR failed:" in log.read_text().splitlines()[-1]


def test_vbucket_lines_carry_rollbacks_and_retries():
    """What the driver writes for a summary a task sent back (rollbacks, retries, resumes)."""
    from dcptool.pipeline.backup import _log_vbucket

    class Capture(RunLog):
        def __init__(self):
            super().__init__("backup")
            self.lines = []

        def info(self, msg, *args):
            self.lines.append(("INFO", msg % args))

        def warning(self, msg, *args):
            self.lines.append(("WARNING", msg % args))

    summary = {"vbucket": 5, "start": {"uuid": 1, "seqno": 90}, "end": {"uuid": 0xAB, "seqno": 120},
               "counts": {"mutations": 20, "deletions": 1, "expirations": 0, "snapshots": 2},
               "bytes": {"files": 4096}, "files": [{}], "rollbacks": [{"seqno": 80,
                                                                      "vbucket_uuid": 0xAB}],
               "task_rollbacks": [{"vbucket": 5, "node_seqno": 85, "seqno": 80, "uuid": 0xAB}]}
    rl = Capture()
    _log_vbucket(rl, summary, {"opens": 2, "retries": 1, "resumed": True, "seconds": 0.5})
    _log_vbucket(rl, {**summary, "rollbacks": [], "task_rollbacks": []}, None)
    assert rl.lines[0] == ("INFO", "vbucket 5: seqno 90 -> 120 (uuid 0xab), 20 mutations, 1 "
                                   "deletions, 0 expirations, 2 snapshots, 4096 bytes in 1 files; "
                                   "resumed; stream opened 2x, 1 retries, 0.500 s")
    assert rl.lines[1] == ("WARNING", "vbucket 5: rollback to seqno 80 (uuid 0xab) recorded")
    assert "asked for seqno 85" in rl.lines[2][1]
    assert rl.lines[3][1].endswith("kept from the partial backup")
