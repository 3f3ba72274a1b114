"""The disk fills during a backup: the archive lives on a small tmpfs (or, where mounting is
not permitted, the segment writer is made to fail with ENOSPC by DCPTOOL_FAULT). The backup
fails with one clear "no space left" line, commits no manifest, the committed backups still
verify, and once space is freed the next run completes it."""
from __future__ import annotations

import errno
import os
import subprocess

import pytest
from docutil import load, node_documents, opts_for
from faultutil import (
    assert_each_seqno_once,
    assert_verifies,
    cli,
    finish,
    one_error_line,
    random_docs,
    spawn,
)
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.client.ops import get_vbucket_seqnos
from dcptool.pipeline.restore import run_restore

VBS = 8
MIB = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs at tmp_path/disk, or None when this machine does not let us mount."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=0700", "tmpfs", str(disk)],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        yield None
        return
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False, capture_output=True,
                       timeout=30)


def test_disk_full_during_backup(small_disk, spark, tmp_path, capsys, monkeypatch):
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        monkeypatch.setenv("DCPTOOL_PASSWORD", node.password)
        opts = opts_for(node)
        base = ["backup", "-c", f"{node.host}:{node.port}", "--no-progress", "--no-watermark",
                "--partitions", "2"]
        archive = (small_disk or tmp_path) / "archive"
        with opts.connect() as conn:
            load(conn, random_docs(1500, 1000, seed=1, tag="a"), VBS)  # ~1.5 MiB, incompressible
        rc, _out, err = cli(capsys, *base, archive)
        assert rc == 0, err
        first = Archive.open(archive).committed_ids()
        with opts.connect() as conn:
            load(conn, random_docs(2500, 1000, seed=2, tag="b"), VBS)  # ~2.5 MiB more

        if small_disk is not None:
            # leave about 1 MiB free: the incremental backup cannot fit
            filler = small_disk / "filler"
            with open(filler, "wb") as f:
                f.write(b"\0" * (3 * MIB + MIB // 2))
            rc, _out, err = cli(capsys, *base, archive)
        else:  # no mount here: the segment writer fails as a full disk would
            proc = spawn(*base, "--master", "local[2]", str(archive),
                         env={"DCPTOOL_FAULT": "enospc-after-bytes:1000000"})
            rc, _out, err = finish(proc)
        assert rc == 1, err
        line = one_error_line(err)
        assert "no space left on device" in line.lower(), line
        a = Archive.open(archive)
        assert a.committed_ids() == first
        assert len(a.partial_ids()) == 1
        assert not (a.backup_dir(a.partial_ids()[0]) / "manifest.json").exists()
        assert_verifies(archive, partial=1)

        if small_disk is not None:
            # not a byte left: now the driver's own writes (run log, lock, intent) fail
            full = small_disk / "filler2"
            fd = os.open(full, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                while True:
                    os.write(fd, b"\0" * 65536)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            finally:
                os.close(fd)
            rc, _out, err = cli(capsys, *base, archive)
            assert rc == 1, err
            assert "no space left on device" in one_error_line(err).lower(), err
            assert Archive.open(archive).committed_ids() == first
            assert_verifies(archive, partial=1)
            filler.unlink()  # space freed
            full.unlink()
        rc, _out, err = cli(capsys, *base, archive)
        assert rc == 0, err
        a = Archive.open(archive)
        assert len(a.committed_ids()) == 2 and a.partial_ids() == []
        assert a.manifest(a.committed_ids()[1])["extra"]["resumed"] is True
        assert_verifies(archive)
        with opts.connect() as conn:
            assert_each_seqno_once(archive, get_vbucket_seqnos(conn, state=1))
        expected = node_documents(opts)
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        run_restore(str(archive), opts_for(dst), spark=spark)
        assert node_documents(opts_for(dst)) == expected


def test_disk_full_in_a_task_names_the_file_not_a_java_frame(small_disk, tmp_path):
    """`dcptool backup` as the user runs it (its own process, its own Spark): the task's
    ENOSPC is the one line, naming the file it could not write, and the run log says the
    same; the partial backup is kept for the next run."""
    if small_disk is None:
        pytest.skip("this machine does not let us mount a tmpfs")
    with NodeProcess(tmp_path / "src", vbuckets=4) as node:
        with opts_for(node).connect() as conn:
            load(conn, random_docs(1500, 1000, seed=3, tag="c"), 4)  # ~1.5 MiB, incompressible
        with open(small_disk / "filler", "wb") as f:  # leave about 0.5 MiB
            f.write(b"\0" * (5 * MIB + MIB // 2))
        archive = small_disk / "archive"
        proc = spawn("backup", "-c", f"{node.host}:{node.port}", "--no-progress",
                     "--no-watermark", "--master", "local[2]", str(archive),
                     env={"DCPTOOL_PASSWORD": node.password})
        rc, _out, err = finish(proc)
    assert rc == 1, err
    line = one_error_line(err)
    assert line.startswith(f"dcptool: error: backup task failed: No space left on device: "
                           f"{archive}/"), line
    assert "java" not in err.lower(), err
    assert "free some space" in line and "the partial backup is kept" in line, line
    logs = sorted((archive / "logs").glob("backup-*.log"))
    assert logs, "no run log"
    failed = [ln for ln in logs[-1].read_text().splitlines() if " ERROR " in ln]
    assert failed and f"No space left on device: {archive}/" in failed[-1], failed
    assert "java" not in failed[-1].lower(), failed
    a = Archive.open(archive)
    assert a.committed_ids() == [] and len(a.partial_ids()) == 1
