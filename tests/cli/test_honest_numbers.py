"""Numbers and notes that tell the truth (issue 20, section 3): verify --against a restored
node, a resumed backup's items/s, `resumed` as yes/no, one size in backup and info, a partial
backup's vbuckets in info, and the progress bar's phases on a terminal."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from cliutil import cli
from docutil import delete, load, opts_for

from dcptool.archive import Archive
from dcptool.pipeline.restore import run_restore
from dcptool.pipeline.backup import run_backup
from dcptool.protocol import vbucket_of

VBS = 16


def test_verify_against_a_restored_node_says_nothing_but_ok(node_factory, spark, tmp_path,
                                                             capsys, monkeypatch):
    src = node_factory("src", vbuckets=VBS)
    dst = node_factory("dst", vbuckets=VBS)
    monkeypatch.setenv("DCPTOOL_PASSWORD", src.password)
    with opts_for(src).connect() as conn:
        load(conn, {f"h::{i}": {"i": i} for i in range(300)}, VBS)
        load(conn, {f"h::{i}": {"i": i, "v": 2} for i in range(150)}, VBS)  # seqnos > keys
        delete(conn, [f"h::{i}" for i in range(280, 300)], VBS)
    path = tmp_path / "archive"
    run_backup(opts_for(src), path, spark=spark, watermark=False)
    run_restore(str(path), opts_for(dst), spark=spark)
    target = f"{dst.host}:{dst.port}"

    rc, out, err = cli(capsys, "verify", path, "--against", "-c", target)
    assert rc == 0, out + err
    assert err == "" and "note" not in out
    assert out.strip().startswith(f"OK: {VBS} vbuckets (300 keys)")
    rc, out, _err = cli(capsys, "verify", path, "--against", "-c", target, "--json")
    d = json.loads(out)
    assert d["ok"] and {v["history"] for v in d["vbuckets"]} == {"different"}
    assert all(v["notes"] == [] for v in d["vbuckets"])

    # a document changed on the restored node: that vbucket differs, and only it says why
    with opts_for(dst).connect() as conn:
        load(conn, {"h::5": {"changed": True}}, VBS)
    vb = vbucket_of(b"h::5", VBS)
    rc, out, err = cli(capsys, "verify", path, "--against", "-c", target)
    assert rc == 1 and f"vbucket {vb} differs" in out
    assert err.strip().splitlines() == [err.strip().splitlines()[0]]
    assert err.startswith(f"vbucket {vb}: note: different history")
    # -q: no notes
    rc, out, err = cli(capsys, "-q", "verify", path, "--against", "-c", target)
    assert rc == 1 and err == "" and f"vbucket {vb} differs" in out


def _read_pty(fd: int, buf: bytearray, until: float) -> None:
    while time.monotonic() < until:
        r, _, _ = select.select([fd], [], [], 0.1)
        if not r:
            return
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        buf.extend(chunk)


def test_a_killed_then_resumed_backup_reports_what_it_streamed(node_factory, spark, tmp_path,
                                                                capsys, monkeypatch):
    node = node_factory(vbuckets=VBS)
    with opts_for(node).connect() as conn:
        load(conn, {f"r::{i}": {"i": i} for i in range(2000)}, VBS)
    archive = tmp_path / "archive"
    env = dict(os.environ, DCPTOOL_PASSWORD=node.password,
               DCPTOOL_FAULT="stall-after-vbuckets:2", COLUMNS="150")
    master, slave = pty.openpty()
    # stderr on a terminal: the progress bar is drawn there
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", "backup", "-c",
                             f"{node.host}:{node.port}", str(archive), "--partitions", "2",
                             "--master", "local[2]", "--no-watermark"], env=env,
                            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    os.close(slave)
    screen = bytearray()
    try:
        deadline = time.monotonic() + 90
        done = []
        while time.monotonic() < deadline:
            _read_pty(master, screen, deadline)
            done = list(archive.glob("backups/*/vb-*.done.json"))
            if len(done) >= 4 and re.search(rb"[1-9][\d,]* items", screen):
                break
            assert proc.poll() is None, bytes(screen).decode(errors="replace")
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(screen).decode(errors="replace"))
        # the bar's phases: Spark's start-up first, then the backup with its items
        assert "starting Spark" in text
        assert re.search(r"backup .*%\s+[1-9][\d,]* items", text), text[-2000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        os.close(master)
    monkeypatch.setenv("DCPTOOL_PASSWORD", node.password)

    # info on the partial backup: how many of the vbuckets it will hold are complete
    done = list(archive.glob("backups/*/vb-*.done.json"))
    kept_items = sum(json.loads(f.read_text())["counts"]["mutations"] for f in done)
    rc, out, err = cli(capsys, "info", archive)
    assert rc == 0, err
    assert f"{len(done)} of {VBS} vbuckets complete" in " ".join(out.split())

    rc, out, err = cli(capsys, "backup", "-c", f"{node.host}:{node.port}", archive,
                       "--no-watermark", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["resumed"] is True and d["kept_vbuckets"] == len(done)
    # items/s of what this run streamed: not the items the kept vbuckets held
    assert d["mutations"] == 2000 and 0 < d["items_streamed"] <= 2000 - kept_items
    # (seconds is rounded to milliseconds in the JSON)
    # (Spark's start-up left out)
    assert d["items_per_second"] == pytest.approx(
        d["items_streamed"] / (d["seconds"] - d["spark_startup_seconds"]), rel=0.01)

    # human output: resumed is yes/no; the size is named as info names it
    with opts_for(node).connect() as conn:
        load(conn, {"r::1": {"again": True}}, VBS)
    rc, out, err = cli(capsys, "backup", "-c", f"{node.host}:{node.port}", archive,
                       "--no-watermark")
    assert rc == 0, err
    assert re.search(r"resumed\W+no\b", out) and "False" not in out
    assert "size on disk" in out
    rc, out, _ = cli(capsys, "info", archive)
    assert "size on disk" in " ".join(out.split())

    # backup and info agree on the backup's size, under the same name
    rc, out, _ = cli(capsys, "info", archive, "--json")
    first = next(b for b in json.loads(out)["backups"] if b["id"] == d["backup_id"])
    assert first["size_on_disk"] == d["size_on_disk"]
