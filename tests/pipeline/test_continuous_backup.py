"""`dcptool backup --continuous` end to end: real node processes, real Spark (the command's
own in a process of its own, or the test session's in this process), real files.

A writer thread changes documents at a steady rate and logs what it wrote; the continuous
backup is killed outright at a random moment, restarted, stopped with Ctrl-C; the archive
must then hold every change exactly once (each vbucket's seqnos strictly increasing along
the chain), verify, and restore to the writer's final state.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cliutil import cli
from continuousutil import ContinuousRun, assert_nothing_twice
from continuousutil import epoch as _epoch
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.pipeline.restore import run_restore

VBS = 16


class Writer(threading.Thread):
    """Sets (and now and then deletes) documents at a steady rate; logs (key, op, time of
    the acknowledgement). Reconnects when the node goes away (a restart)."""

    def __init__(self, node: NodeProcess, rate: float = 40.0, keys: int = 150):
        super().__init__(daemon=True)
        self.node, self.period, self.keys = node, 1.0 / rate, keys
        self.stop = threading.Event()
        self.log: list[tuple[str, str, float]] = []
        self.errors = 0

    def run(self) -> None:
        i = 0
        conn = None
        while not self.stop.is_set():
            key = f"w::{i % self.keys:04d}"
            try:
                if conn is None:
                    conn = opts_for(self.node).connect()
                if i % 11 == 10:  # the key set three steps ago
                    key = f"w::{(i - 3) % self.keys:04d}"
                    delete(conn, [key], VBS)
                    op = "delete"
                else:
                    load(conn, {key: {"i": i, "pad": "x" * (i % 40)}}, VBS)
                    op = "set"
                self.log.append((key, op, time.time()))
                i += 1
            except Exception:  # noqa: BLE001 - the node is restarting: try again
                self.errors += 1
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001
                        pass
                conn = None
                time.sleep(0.2)
                continue
            time.sleep(self.period)
        if conn is not None:
            conn.close()


class Continuous(ContinuousRun):
    """`dcptool backup -b default --continuous --json` as a process of its own."""

    def __init__(self, node: NodeProcess, archive: Path, *extra: str, checkpoint: str = "1s",
                 env: dict | None = None):
        super().__init__(
            [sys.executable, "-m", "dcptool", "backup", "-c", f"{node.host}:{node.port}",
             "-b", "default", str(archive), "--continuous", "--checkpoint", checkpoint,
             "--json", "--master", "local[2]", "--partitions", "2", *extra],
            dict(os.environ, DCPTOOL_PASSWORD=node.password, **(env or {})))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _verify(archive: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "dcptool", "verify", str(archive)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def _restored_equals(archive: Path, expected: dict, spark, where: Path) -> None:
    with NodeProcess(where, vbuckets=VBS) as dst:
        res = run_restore(str(archive), opts_for(dst), spark=spark).as_dict()
        assert sum(res["failed"].values()) == 0
        got = node_documents(opts_for(dst))
    live = {k: v for k, v in expected.items() if v[0] == "live"}
    assert {k: v for k, v in got.items() if v[0] == "live"} == live


def test_kill9_at_random_moments_loses_nothing_and_doubles_nothing(spark, tmp_path):
    """Under a steady writer: kill -9 at a random moment, start again, Ctrl-C; the archive
    holds every change once, verifies, and restores to the writer's final state."""
    rng = random.Random(os.environ.get("PYTEST_SEED", time.time()))
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"base::{i}": {"i": i} for i in range(200)}, VBS)
        archive = tmp_path / "archive"
        writer = Writer(node)
        writer.start()
        run = Continuous(node, archive)
        run.wait_checkpoints(2)
        # info sees it running
        st = json.loads(subprocess.run(
            [sys.executable, "-m", "dcptool", "info", str(archive), "--json"],
            capture_output=True, text=True, timeout=120).stdout)
        assert st["continuous"]["running"] is True
        assert st["continuous"]["pid"] == run.proc.pid
        time.sleep(rng.uniform(0.0, 1.5))  # a random moment: mid-checkpoint or between
        run.kill9()
        time.sleep(rng.uniform(0.0, 1.0))
        run = Continuous(node, archive)
        run.wait_checkpoints(2)
        writer.stop.set()
        writer.join(10)
        stopped = time.time()
        run.wait_caught_up(stopped)
        rc = run.interrupt()
        assert rc == 0, run.err
        assert any("stopping: committing a last checkpoint" in ln for ln in run.err)
        assert run.records[-1]["event"] == "stopped"
        expected = node_documents(opts)
    a = Archive.open(archive)
    assert a.partial_ids() == []
    assert_nothing_twice(archive)
    _verify(archive)
    # every key the writer wrote is in the archive as the node had it
    _restored_equals(archive, expected, spark, tmp_path / "dst")
    assert len(writer.log) > 50
    st = json.loads(subprocess.run(
        [sys.executable, "-m", "dcptool", "info", str(archive), "--json"],
        capture_output=True, text=True, timeout=120).stdout)
    assert st["continuous"]["running"] is False


def test_kill9_mid_checkpoint_resumes_its_partial_backup(spark, tmp_path):
    """Killed while a checkpoint streams (its tasks stalled after a few vbuckets): the next
    run resumes the partial backup, keeps what it had and streams the rest once."""
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"d::{i}": {"i": i} for i in range(400)}, VBS)
        archive = tmp_path / "archive"
        run = Continuous(node, archive, env={"DCPTOOL_FAULT": "stall-after-vbuckets:2"})
        deadline = time.monotonic() + 120
        while len(list(archive.glob("backups/*/vb-*.done.json"))) < 2:
            assert run.proc.poll() is None and time.monotonic() < deadline, run.err
            time.sleep(0.1)
        run.kill9()
        a = Archive.open(archive)
        assert a.committed_ids() == [] and len(a.partial_ids()) == 1
        run = Continuous(node, archive)
        first = run.wait_checkpoints(1)[0]
        assert first["resumed"] is True and first["items"] == 400
        assert any(ln.startswith("resuming partial backup") for ln in run.err), run.err
        assert run.interrupt() == 0, run.err
        expected = node_documents(opts)
    assert assert_nothing_twice(archive) == 400
    _verify(archive)
    _restored_equals(archive, expected, spark, tmp_path / "dst")


def test_node_restart_is_retried_and_nothing_is_lost(spark, tmp_path):
    """The node restarts while the continuous backup runs: one line per failed attempt,
    backoff, then the checkpoints go on; what was written after the restart is backed up."""
    port = _free_port()
    with NodeProcess(tmp_path / "src", vbuckets=VBS, extra_args=("--port", str(port))) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"before::{i}": {"i": i} for i in range(100)}, VBS)
        archive = tmp_path / "archive"
        run = Continuous(node, archive)
        run.wait_checkpoints(2)
        node.stop()
        time.sleep(2.5)  # at least one checkpoint finds no node
        node.start()
        assert node.port == port
        with opts_for(node).connect() as conn:
            load(conn, {f"after::{i}": {"i": i} for i in range(100)}, VBS)
        wrote = time.time()
        run.wait_caught_up(wrote)
        assert run.interrupt() == 0, run.err
        retries = [ln for ln in run.err if "checkpoint failed:" in ln]
        assert retries and all("retrying in" in ln for ln in retries), run.err
        assert any(ln.startswith("checkpoint committed again after") for ln in run.err)
        # in --json a line per failed attempt, its lag growing
        rj = [r for r in run.records if r.get("event") == "retry"]
        assert len(rj) == len(retries) and rj[0]["lag"]["default"]["items"] is None
        assert [r["attempt"] for r in rj] == list(range(1, len(rj) + 1))
        expected = node_documents(opts_for(node))
    assert sum(k.startswith(b"after::") for k in expected) == 100
    assert_nothing_twice(archive)
    _verify(archive)
    _restored_equals(archive, expected, spark, tmp_path / "dst")


def test_ctrl_c_commits_a_last_checkpoint_and_exits_0(tmp_path):
    """With a long interval, what was written after the first checkpoint is committed by
    the last one Ctrl-C asks for, and the command exits 0."""
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"a::{i}": {"i": i} for i in range(50)}, VBS)
        archive = tmp_path / "archive"
        run = Continuous(node, archive, checkpoint="1h")
        first = run.wait_checkpoints(1)[0]
        assert first["type"] == "full" and first["items"] == 50
        with opts.connect() as conn:
            load(conn, {f"b::{i}": {"i": i} for i in range(30)}, VBS)
        # a second continuous backup of the archive is refused in one line
        second = subprocess.run(
            [sys.executable, "-m", "dcptool", "backup", "-c", f"{node.host}:{node.port}", "-b",
             "default", str(archive), "--continuous", "--master", "local[1]"],
            env=dict(os.environ, DCPTOOL_PASSWORD=node.password), capture_output=True,
            text=True, timeout=120)
        assert second.returncode == 3, second.stderr
        assert "a continuous backup of" in second.stderr and "is running already" in \
            second.stderr and "Traceback" not in second.stderr
        assert run.interrupt() == 0, run.err
        cps = run.checkpoints()
        assert len(cps) == 2 and cps[1]["items"] == 30 and cps[1]["type"] == "incremental"
        # the fields docs/json-output.md documents, and no others
        from cliutil import documented_under

        assert set(cps[1]) == set(documented_under("### dcptool backup --continuous"))
        assert cps[1]["lag"]["default"] == {"seconds": 0.0, "items": 0}
    a = Archive.open(archive)
    assert len(a.committed_ids()) == 2 and a.partial_ids() == []


def test_rotation_makes_ordinary_backups(spark, tmp_path, capsys):
    """--rotate folds the checkpoints into one backup: fewer backups than checkpoints with
    data, and info, verify and restore read them as any."""
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        writer = Writer(node, rate=30)
        writer.start()
        archive = tmp_path / "archive"
        try:
            code, out, err = cli(capsys, "backup", "-c", f"{node.host}:{node.port}",
                                 "-u", node.username, "-p", node.password, "-b", "default",
                                 archive, "--continuous", "--checkpoint", "500ms",
                                 "--rotate", "2s", "--stop-after", "7s", "--json")
        finally:
            writer.stop.set()
            writer.join(10)
        assert code == 0, err
        recs = [json.loads(ln) for ln in out.splitlines() if ln.strip()]
        cps = [r for r in recs if r["event"] == "checkpoint"]
        stopped = recs[-1]
        assert stopped["event"] == "stopped" and stopped["rotations"]
        assert "rotated:" in err
        with_data = [c for c in cps if c["backup_id"]]
        a = Archive.open(archive)
        ids = a.committed_ids()
        assert len(ids) < len(with_data)
        from dcptool.archive.chain import merged_from

        merged = [b for b in ids if merged_from(a.manifest(b))]
        assert merged
        # the rotation kept every version (extra.merge.history) and each checkpoint its
        # interval and where its coverage began: a time inside a rotated backup is a point
        # restore --to-time gives, not a gap
        m = a.manifest(merged[0])
        assert m["extra"]["merge"]["history"] is True
        assert m["extra"]["checkpoint_interval"] == 0.5
        spans = m["extra"]["merge"]["covered"]
        assert len(spans) == 1, spans  # the checkpoints followed one another: no gap
        from dcptool.archive.pointintime import iso, parse_time

        a0, a1 = (parse_time(t) for t in spans[0])
        inside = iso((a0 + a1) // 2)
        code, out, err = cli(capsys, "restore", archive, "-c", f"{node.host}:{node.port}",
                             "-u", node.username, "-p", node.password, "--to-time", inside,
                             "--dry-run", "--json")
        assert code == 0, err
        assert json.loads(out)["point_in_time"]["to_time"]
        # a last catch-up backup of what the writer wrote during the last checkpoint
        from dcptool.pipeline.backup import run_backup

        run_backup(opts, archive, spark=spark)
        expected = node_documents(opts)
        code, out, err = cli(capsys, "info", archive, "--json")
        assert code == 0 and json.loads(out)["continuous"]["running"] is False
    assert_nothing_twice(archive)
    code, out, err = cli(capsys, "verify", archive)
    assert code == 0, out + err
    _restored_equals(archive, expected, spark, tmp_path / "dst")


def test_continuous_options_are_checked_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DCPTOOL_PASSWORD", "x")
    monkeypatch.delenv("DCPTOOL_BUCKET", raising=False)
    # without -b a new ARCHIVE is a cluster archive (tests/cluster/test_cluster_continuous.py):
    # a node that does not answer is one line, and no archive is made
    code, out, err = cli(capsys, "backup", "-c", "127.0.0.1:1", tmp_path / "a", "--continuous")
    assert code == 1 and "cannot connect to 127.0.0.1:1" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()
    code, out, err = cli(capsys, "backup", "-c", "127.0.0.1:1", tmp_path / "a", "--continuous",
                         "--vbuckets", "0-3")
    assert code == 2 and "--vbuckets selects vbuckets of one bucket" in err
    code, out, err = cli(capsys, "backup", "-c", "127.0.0.1:1", "-b", "default",
                         tmp_path / "a", "--continuous", "--disable-users")
    assert code == 2 and "are for cluster archives" in err
    code, out, err = cli(capsys, "backup", "-c", "127.0.0.1:1", "-b", "default",
                         tmp_path / "a", "--checkpoint", "5s")
    assert code == 2 and "options of --continuous" in err
    code, out, err = cli(capsys, "backup", "-c", "127.0.0.1:1", "-b", "default",
                         tmp_path / "a", "--continuous", "--full")
    assert code == 2 and "no --full" in err


def test_live_line_on_a_terminal_shows_lag_and_last_checkpoint(tmp_path):
    """On a terminal the run draws one live line: the bucket's lag in seconds and items,
    the last checkpoint's time, items/s; on stdout a summary when it stops."""
    import re

    from termutil import render, run_with_stderr_on_a_terminal

    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        with opts_for(node).connect() as conn:
            load(conn, {f"t::{i}": {"i": i} for i in range(30)}, VBS)
        env = dict(os.environ, DCPTOOL_PASSWORD=node.password, COLUMNS="160")
        env.pop("NO_COLOR", None)
        screen, out = run_with_stderr_on_a_terminal(
            [sys.executable, "-m", "dcptool", "backup", "-c", f"{node.host}:{node.port}",
             "-b", "default", str(tmp_path / "archive"), "--continuous", "--checkpoint", "1s",
             "--stop-after", "4s", "--master", "local[2]", "--no-watermark"], env)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", bytes(screen).decode(errors="replace"))
    assert re.search(r"default +lag \d+\.\d s, \d+ items behind, checkpoint "
                     r"\d\d:\d\d:\d\d, [-\d.,]+ items/s", text), text[-1500:]
    assert render(bytes(screen), 160)  # drawn as a terminal shows it
    assert out.startswith("continuous backup of default stopped after"), out
    # the first checkpoint's backup holds the 30 documents; the last one's, empty, records
    # the idle stretch after it (for restore --to-time) when checkpoints found the node
    # unchanged in between (on a loaded machine the first may take the 4 s)
    m = re.search(r"(\d+) checkpoints \((\d+) wrote a backup\), 30 items", out)
    assert m, out
    assert int(m.group(2)) == (2 if int(m.group(1)) >= 3 else 1), out


def test_unreachable_s3_endpoint_is_retried_and_nothing_is_lost(spark, tmp_path, monkeypatch):
    """An archive on S3 whose endpoint goes away while the continuous backup runs: one line
    per failed checkpoint, backoff, and once the endpoint is back everything written
    meanwhile is committed."""
    import s3util

    first_ports: dict = {}
    real = s3util._free_ports

    def same_ports(n):  # the server comes back at the same address
        return first_ports.setdefault(n, real(n))

    monkeypatch.setattr(s3util, "_free_ports", same_ports)
    server = s3util.S3Server(tmp_path / "s3").start()
    try:
        bucket = server.new_bucket()
        url = f"s3://{bucket}/live"
        for k, v in server.env().items():
            if k.startswith("AWS_"):
                monkeypatch.setenv(k, v)
        monkeypatch.setenv("DCPTOOL_ENGINE", "off")
        with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
            opts = opts_for(node)
            with opts.connect() as conn:
                load(conn, {f"s::{i}": {"i": i} for i in range(100)}, VBS)
            run = Continuous(node, url)
            run.wait_checkpoints(1)
            server.stop()
            with opts.connect() as conn:
                load(conn, {f"gone::{i}": {"i": i} for i in range(50)}, VBS)
            deadline = time.monotonic() + 60
            while not any("checkpoint failed:" in ln for ln in run.err):
                assert run.proc.poll() is None and time.monotonic() < deadline, run.err
                time.sleep(0.2)
            server.start()
            back = time.time()
            run.wait_caught_up(back, timeout=120)
            assert run.interrupt() == 0, run.err
            expected = node_documents(opts)
        fails = [ln for ln in run.err if "checkpoint failed:" in ln]
        assert fails and all("retrying in" in ln and "\n" not in ln for ln in fails)
        from dcptool.archive.stores.s3 import CLIENTS

        CLIENTS.clear()
        assert sum(k.startswith(b"gone::") for k in expected) == 50
        assert_nothing_twice(url)
        code = subprocess.run([sys.executable, "-m", "dcptool", "verify", url],
                              capture_output=True, text=True, timeout=300)
        assert code.returncode == 0, code.stdout + code.stderr
        # (a restore of its own: the test session's Spark workers have no S3 credentials)
        with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
            r = subprocess.run([sys.executable, "-m", "dcptool", "restore", url, "-c",
                                f"{dst.host}:{dst.port}", "-b", "default"],
                               env=dict(os.environ, DCPTOOL_PASSWORD=dst.password),
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            got = node_documents(opts_for(dst))
        assert {k: v for k, v in got.items() if v[0] == "live"} == \
            {k: v for k, v in expected.items() if v[0] == "live"}
    finally:
        server.stop()


def test_an_idle_continuous_backup_keeps_the_window_open(spark, tmp_path, capsys, monkeypatch):
    """Checkpoints that find the node unchanged write no backup; the status file says until
    when the node held the newest backup's state, so the restorable window reaches that
    time (info, restore --to-time) even after a kill -9 that left no last checkpoint."""
    from dcptool.archive.pointintime import parse_time, plan_time
    from dcptool.errors import UsageError

    monkeypatch.setenv("DCPTOOL_GAP_TOLERANCE", "0")  # the tolerance: the 1 s interval
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        with opts_for(node).connect() as conn:
            load(conn, {f"a::{i}": {"i": i} for i in range(40)}, VBS)
        expected = node_documents(opts_for(node))
        archive = tmp_path / "archive"
        run = Continuous(node, archive, checkpoint="1s")
        cps = run.wait_checkpoints(6)
        run.kill9()
    assert cps[0]["type"] == "full" and all(c["backup_id"] is None for c in cps[1:]), cps
    a = Archive.open(archive)
    (only,) = a.committed_ids()
    finished = parse_time(a.manifest(only)["finished"])
    status = json.loads((archive / "continuous.json").read_text())
    assert status["unchanged_backup"] == only
    through = parse_time(status["unchanged_through"])
    assert through - finished >= 3 * 10**9, (status, a.manifest(only)["finished"])
    # info: the window ends when the node was last found unchanged
    rc, out, err = cli(capsys, "info", str(archive), "--json")
    assert rc == 0, err
    assert parse_time(json.loads(out)["point_in_time"]["window"]["latest"]) == through
    # a time in that stretch restores the newest backup's state, without --nearest
    at = through - 10**9
    assert plan_time(a, at).chain == [only]
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        res = run_restore(str(archive), opts_for(dst), spark=spark, to_time=at).as_dict()
        assert sum(res["failed"].values()) == 0
        assert node_documents(opts_for(dst)) == expected
    # without the status the same time is after the window's end
    (archive / "continuous.json").unlink()
    try:
        plan_time(a, at)
    except UsageError as e:
        assert "after the archive's window" in str(e)
    else:
        raise AssertionError("a time past the newest backup was accepted without the status")


def _spark_noise(lines: list[str]) -> list[str]:
    """Lines of Spark, Java or py4j on a command's stderr (none may reach the terminal)."""
    words = ("WARN", "ERROR", "Exception", "Traceback", "py4j", "at org.apache", "log4j",
             "SLF4J", "Stage ")
    return [ln for ln in lines if any(w in ln for w in words)]


def test_checkpoints_are_micro_batches_of_a_streaming_query(spark, tmp_path):
    """Once the run's Structured Streaming query is up, each checkpoint with data is one of
    its micro-batches: while it commits, that query is active on the run's session and the
    record carries its batch id (0, 1, 2, ...: every batch is a checkpoint), and the query's
    progress lists the same ids; the driver's own checkpoints (while the query starts, the
    idle ones, the last) have none. The query's private checkpoint directory is gone when
    the run ends."""
    from dcptool.pipeline.continuous import ContinuousBackup, ContinuousOptions

    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"m::{i}": {"i": i} for i in range(60)}, VBS)
        seen: list[tuple[dict, list, Any, str | None]] = []
        o = ContinuousOptions(checkpoint=1.0, backup={"partitions": 2})
        cb = ContinuousBackup(opts, tmp_path / "archive", o, spark=spark)

        def on_checkpoint(rec):
            seen.append((rec, [a.id for a in spark.streams.active], cb.stream.query,
                         cb.stream.location))
            if sum(1 for r, *_ in seen if r["micro_batch"] is not None and r["items"]) >= 3:
                enough.set()

        o.on_checkpoint = on_checkpoint
        enough = threading.Event()

        def write_more():  # ten changes every 1.5 s, then the run stops (a last checkpoint)
            r = 0
            deadline = time.monotonic() + 150
            while not enough.wait(1.5) and time.monotonic() < deadline:
                with opts.connect() as conn:
                    load(conn, {f"m::{r}:{i}": {"i": i} for i in range(10)}, VBS)
                r += 1
            o.stop.set()

        t = threading.Thread(target=write_more, daemon=True)
        t.start()
        summary = cb.run()
        t.join(30)
        expected = node_documents(opts)
    batches = [(rec, active, q, where) for rec, active, q, where in seen
               if rec["micro_batch"] is not None]
    ids = [rec["micro_batch"] for rec, *_ in batches]
    assert ids == list(range(len(ids))) and len(ids) >= 3, ids
    query = batches[0][2]
    for rec, active, q, where in batches:
        assert q is query and q.id in active  # one query, running while the batch committed
        assert where is not None and "dcptool-continuous-" in where
    assert {p.batchId for p in query.recentProgress} >= set(ids)
    # after the first micro-batch every checkpoint with data is one, but the last
    after = [rec for rec, *_ in seen[seen.index(next(x for x in seen
                                                     if x[0]["micro_batch"] == 0)):-1]]
    assert all(rec["micro_batch"] is not None for rec in after if rec["backup_id"]), after
    assert not query.isActive and not spark.streams.active
    assert not os.path.exists(batches[0][3])
    assert summary["totals"]["checkpoints"] == len(seen)
    # every change is in the archive once
    assert assert_nothing_twice(tmp_path / "archive") == len(expected)


def test_restart_after_kill9_begins_from_the_archive_not_sparks_checkpoint(spark, tmp_path):
    """A kill -9 leaves the query's Spark checkpoint behind; the next run does not read it
    (it removes it and its query starts at batch 0) and begins where the archive ends, even
    when the archive is behind what that old checkpoint recorded (its newest backup deleted
    here): the changes of the deleted backup are streamed again, once."""
    import glob
    import shutil
    import tempfile

    def query_dirs(pid):
        return glob.glob(os.path.join(tempfile.gettempdir(), f"dcptool-continuous-{pid}-*"))

    def batch_with(run, items):
        return run.wait(lambda: next((c for c in run.checkpoints() if c["items"] == items
                                      and c["micro_batch"] is not None), None),
                        f"no micro-batch of {items} changes")

    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        opts = opts_for(node)
        with opts.connect() as conn:
            load(conn, {f"a::{i}": {"i": i} for i in range(100)}, VBS)
        archive = tmp_path / "archive"
        run = Continuous(node, archive)
        run.wait(lambda: any(c["micro_batch"] is not None for c in run.checkpoints()),
                 "no micro-batch")
        with opts.connect() as conn:
            load(conn, {f"b::{i}": {"i": i} for i in range(50)}, VBS)
        second = batch_with(run, 50)
        old = query_dirs(run.proc.pid)
        assert len(old) == 1 and os.path.isdir(os.path.join(old[0], "offsets"))
        run.kill9()
        assert os.path.isdir(old[0])  # left behind by the kill
        # the archive now ends before what the old Spark checkpoint recorded
        shutil.rmtree(archive / "backups" / second["backup_id"])
        assert second["backup_id"] not in Archive.open(archive).committed_ids()
        run = Continuous(node, archive)
        again = run.wait_checkpoints(1)[0]
        assert again["type"] == "incremental" and again["items"] == 50
        run.wait(lambda: any(c["micro_batch"] is not None for c in run.checkpoints()),
                 "no micro-batch")
        first_batch = next(c for c in run.checkpoints() if c["micro_batch"] is not None)
        assert first_batch["micro_batch"] == 0  # a query of its own, not the old one's
        assert not os.path.exists(old[0])  # the dead run's checkpoint: removed, unread
        mine = query_dirs(run.proc.pid)
        assert len(mine) == 1
        with opts.connect() as conn:
            load(conn, {f"c::{i}": {"i": i} for i in range(20)}, VBS)
        batch_with(run, 20)
        assert run.interrupt() == 0, run.err
        assert not os.path.exists(mine[0])
        assert _spark_noise(run.err) == [], run.err
        expected = node_documents(opts)
    assert assert_nothing_twice(archive) == 170
    _verify(archive)
    _restored_equals(archive, expected, spark, tmp_path / "dst")
