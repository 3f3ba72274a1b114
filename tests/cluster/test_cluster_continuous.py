"""`dcptool backup ARCHIVE --continuous` of a cluster archive: every bucket of a node in one
checkpoint loop, one process, one Spark start-up.

A real node with two buckets (default and other), a writer on each that logs what it
wrote and when the node acknowledged it; the continuous backup runs as a process of its
own (`--json`), is killed outright at a random moment, started again and stopped with
Ctrl-C. Then each bucket archive holds every change of its bucket once, the cluster archive
verifies, `info` draws both windows, and restores (to the end, and to a time while the
writers paused) equal the writers' logs. A bucket that fails (its archive locked by another
writer, then the bucket dropped on the node) does not stop the other, and a bucket created
meanwhile is picked up.
"""
from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from continuousutil import ContinuousRun, assert_nothing_twice
from continuousutil import epoch as _epoch
from docutil import delete, load, node_documents, opts_for
from nodeprocutil import NodeProcess
from restutil import rest_request

from dcptool.archive import Archive
from dcptool.archive.cluster import ClusterArchive

VBS = 8
BUCKETS = ("default", "other")


def _create_bucket(node: NodeProcess, name: str) -> None:
    status, body = rest_request(node, "POST", "/pools/default/buckets",
                                {"name": name, "ramQuota": "100", "numVBuckets": str(VBS)})
    assert status == 202, (status, body)


class Writer(threading.Thread):
    """Sets (and now and then deletes) documents of one bucket at a steady rate; logs
    (key, op, value, time of the acknowledgement). `hold` pauses it."""

    def __init__(self, node: NodeProcess, bucket: str, rate: float = 25.0, keys: int = 80):
        super().__init__(daemon=True)
        self.node, self.bucket, self.period, self.keys = node, bucket, 1.0 / rate, keys
        self.stop = threading.Event()
        self.hold = threading.Event()
        self.log: list[tuple[str, str, int, float]] = []

    def run(self) -> None:
        i = 0
        with opts_for(self.node, self.bucket).connect() as conn:
            while not self.stop.is_set():
                if self.hold.is_set():
                    time.sleep(0.02)
                    continue
                key = f"{self.bucket}::{i % self.keys:03d}"
                if i % 9 == 8:
                    key = f"{self.bucket}::{(i - 4) % self.keys:03d}"
                    delete(conn, [key], VBS)
                    self.log.append((key, "delete", i, time.time()))
                else:
                    load(conn, {key: {"i": i}}, VBS)
                    self.log.append((key, "set", i, time.time()))
                i += 1
                time.sleep(self.period)

    def state(self, until: float | None = None) -> dict[bytes, int]:
        """{key: value i} of the live documents after the writes acknowledged by `until`."""
        out: dict[bytes, int] = {}
        for key, op, i, t in self.log:
            if until is not None and t > until:
                break
            if op == "set":
                out[key.encode()] = i
            else:
                out.pop(key.encode(), None)
        return out


class Continuous(ContinuousRun):
    """`dcptool backup ARCHIVE --continuous --json` (no -b) as a process of its own."""

    def __init__(self, node: NodeProcess, archive: Path, *extra: str, checkpoint: str = "1s"):
        env = dict(os.environ, DCPTOOL_PASSWORD=node.password)
        env.pop("DCPTOOL_BUCKET", None)
        super().__init__(
            [sys.executable, "-m", "dcptool", "backup", "-c", f"{node.host}:{node.port}",
             str(archive), "--continuous", "--checkpoint", checkpoint, "--json",
             "--master", "local[2]", "--partitions", "2", *extra], env)

    def wait_caught_up(self, after: float, buckets=BUCKETS, timeout: float = 120.0) -> dict:
        return super().wait_caught_up(after, buckets, timeout)


def _dcptool(*args: str, node: NodeProcess | None = None, timeout: float = 300):
    env = dict(os.environ)
    env.pop("DCPTOOL_BUCKET", None)
    if node is not None:
        env["DCPTOOL_PASSWORD"] = node.password
    return subprocess.run([sys.executable, "-m", "dcptool", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _info(archive: Path) -> dict:
    r = _dcptool("info", archive, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _live_values(opts) -> dict[bytes, int]:
    return {k: json.loads(v[1])["i"] for k, v in node_documents(opts).items()
            if v[0] == "live"}


def _restore_into_fresh_node(archive: Path, where: Path, *args: str) -> dict[str, dict]:
    """`dcptool restore ARCHIVE` of the cluster archive into a new node (the buckets
    created); each bucket's live documents {key: i}."""
    with NodeProcess(where, vbuckets=VBS) as dst:
        r = _dcptool("restore", archive, "-c", f"{dst.host}:{dst.port}",
                     "--auto-create-buckets", *args, node=dst)
        assert r.returncode == 0, r.stdout + r.stderr
        return {b: _live_values(opts_for(dst, b)) for b in BUCKETS}


def test_every_bucket_continuously_through_kill9_and_ctrl_c(tmp_path):
    """Two buckets under writers, rotating every 3 s: kill -9 at a random moment, start
    again, a pause of the writers, Ctrl-C. Every write of both buckets is in the archive once, it verifies,
    info shows both windows (and, while it ran, the run and each bucket's lag), and
    restores to the end and to the pause equal the writers' logs."""
    rng = random.Random(os.environ.get("PYTEST_SEED", time.time()))
    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        _create_bucket(node, "other")
        writers = {b: Writer(node, b) for b in BUCKETS}
        for w in writers.values():
            w.start()
        archive = tmp_path / "cluster"
        run = Continuous(node, archive, "--rotate", "3s")
        first = run.wait_checkpoints(2)[0]
        assert set(first["lag"]) == set(BUCKETS)
        assert {first["buckets"][b]["type"] for b in BUCKETS} == {"full"}
        st = _info(archive)
        assert st["continuous"]["running"] is True and st["continuous"]["pid"] == run.proc.pid
        assert set(st["continuous"]["buckets"]) == set(BUCKETS)
        for b in BUCKETS:
            assert st["continuous"]["buckets"][b]["lag_seconds"] is not None
            assert st["buckets"][b]["continuous"]["running"] is True
        time.sleep(rng.uniform(0.0, 1.5))  # a random moment: mid-checkpoint or between
        run.kill9()
        before = ClusterArchive.open(archive).run_ids()
        run = Continuous(node, archive, "--rotate", "3s")
        run.wait_checkpoints(2)
        # the run record the killed run wrote last is replaced, not kept beside
        runs = ClusterArchive.open(archive).run_ids()
        assert before and len(runs) == len(before) and before[-1] not in runs, (before, runs)
        # a pause of both writers: a time in it is restored to exactly the logs' state
        for w in writers.values():
            w.hold.set()
        held = time.time()
        time.sleep(1.6)  # a checkpoint (1 s) runs in the pause
        at = held + 0.8
        for w in writers.values():
            w.hold.clear()
        run.wait_checkpoints(len(run.checkpoints()) + 2)
        for w in writers.values():
            w.stop.set()
            w.join(10)
        run.wait_caught_up(time.time())
        assert run.interrupt() == 0, run.err
        assert any("stopping: committing a last checkpoint" in ln for ln in run.err)
        stopped = run.records[-1]
        assert stopped["event"] == "stopped" and set(stopped["buckets"]) == set(BUCKETS)
        # each bucket's checkpoints were rotated in its own archive (the pause among them)
        assert all(stopped["buckets"][b]["rotations"] for b in BUCKETS), stopped
        final = {b: _live_values(opts_for(node, b)) for b in BUCKETS}
    for b, w in writers.items():
        assert len(w.log) > 40
        assert final[b] == w.state()  # the node holds what the writer's log says
        a = Archive.open(archive / "buckets" / b)
        assert a.partial_ids() == []
        assert_nothing_twice(archive / "buckets" / b)
    r = _dcptool("verify", archive)
    assert r.returncode == 0, r.stdout + r.stderr
    st = _info(archive)
    assert st["continuous"]["running"] is False
    for b in BUCKETS:  # each bucket's window reaches the end of the run
        window = st["buckets"][b]["point_in_time"]["window"]
        assert _epoch(window["latest"]) >= at
    r = _dcptool("info", archive)
    assert "restorable window" in r.stdout and all(f"{b} " in r.stdout for b in BUCKETS)
    # every write of both buckets, as of the end and as of the pause
    assert _restore_into_fresh_node(archive, tmp_path / "end") == \
        {b: w.state() for b, w in writers.items()}
    from dcptool.archive.pointintime import iso, NS

    when = iso(int(at * NS))
    then = {b: w.state(until=at) for b, w in writers.items()}
    assert _restore_into_fresh_node(archive, tmp_path / "pause", "--to-time", when) == then
    # export --at and examine --at read the same state
    r = _dcptool("export", archive, tmp_path / "then", "--format", "jsonl", "--resolved",
                 "--at", when)
    assert r.returncode == 0, r.stderr
    exported: dict[str, dict[bytes, int]] = {b: {} for b in BUCKETS}
    for part in (tmp_path / "then").glob("*.jsonl"):
        for line in part.read_text().splitlines():
            d = json.loads(line)
            if not d["deleted"]:
                exported[d["bucket"]][d["key"].encode()] = \
                    json.loads(base64.b64decode(d["value"]))["i"]
    assert exported == then
    for b, w in writers.items():  # a key live at the time and one that was not
        keys = sorted({k for k, *_ in w.log})
        live = next(k for k in keys if k.encode() in then[b])
        gone = next((k for k in keys if k.encode() not in then[b]), None)
        for key in filter(None, (live, gone)):
            r = _dcptool("examine", archive, key, "-b", b, "--at", when, "--json")
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["at"]["exists"] is (key == live), (b, key)


def test_a_failing_bucket_does_not_stop_the_others(tmp_path):
    """The archive of `other` is locked by another writer: one line per attempt, a retry
    with backoff, while `default` goes on; unlocked, it commits again. A bucket created on
    the node meanwhile is picked up; `other` dropped on the node is reported once and let
    go; Ctrl-C still exits 0 with every remaining bucket committed."""
    from dcptool.archive.lock import ArchiveLock

    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        _create_bucket(node, "other")
        for b in BUCKETS:
            with opts_for(node, b).connect() as conn:
                load(conn, {f"{b}::{i}": {"i": i} for i in range(10)}, VBS)
        archive = tmp_path / "cluster"
        run = Continuous(node, archive)
        run.wait_checkpoints(1)
        lock = ArchiveLock(archive / "buckets" / "other", "another writer").acquire()
        try:
            with opts_for(node, "other").connect() as conn:
                load(conn, {"other::late": {"i": 99}}, VBS)
            run.wait(lambda: sum("bucket other: checkpoint failed:" in ln
                                 for ln in run.err) >= 2, "no retries")
            with opts_for(node).connect() as conn:
                load(conn, {"default::meanwhile": {"i": 98}}, VBS)
            wrote = time.time()
            rec = run.wait_caught_up(wrote, buckets=("default",))
            assert rec["lag"]["other"]["items"] is None and "other" in rec["failing"]
            st = _info(archive)["continuous"]
            assert st["running"] and "is locked" in st["buckets"]["other"]["failing"]
        finally:
            lock.release()
        run.wait_caught_up(time.time())
        fails = [ln for ln in run.err if "checkpoint failed:" in ln]
        assert all(ln.startswith("bucket other: ") and "retrying in" in ln for ln in fails)
        retries = [r for r in run.records if r.get("event") == "retry"]
        assert retries and {r["bucket"] for r in retries} == {"other"}
        assert any(ln.startswith("bucket other: checkpoint committed again after")
                   for ln in run.err), run.err
        # a bucket created while it runs is picked up; one dropped is let go
        _create_bucket(node, "third")
        with opts_for(node, "third").connect() as conn:
            load(conn, {f"third::{i}": {"i": i} for i in range(5)}, VBS)
        run.wait_caught_up(time.time(), buckets=("default", "other", "third"))
        status, _ = rest_request(node, "DELETE", "/pools/default/buckets/other")
        assert status == 200
        run.wait(lambda: any("bucket other is no longer on" in ln for ln in run.err),
                 "the dropped bucket not reported")
        rec = run.wait_caught_up(time.time(), buckets=("default", "third"))
        assert "other" not in rec["lag"]
        assert run.interrupt() == 0, run.err
    assert any("bucket third is new on" in ln for ln in run.err)
    assert sum("bucket other is no longer on" in ln for ln in run.err) == 1
    assert run.records[-1]["dropped"] == ["other"]
    for b, n in (("default", 11), ("other", 11), ("third", 5)):
        assert assert_nothing_twice(archive / "buckets" / b) == n, b
    # the newest run names the buckets still backed up, and other as dropped
    record = ClusterArchive.open(archive).run()
    assert record["buckets"]["other"] == {"status": "dropped"}
    assert sorted(b for b, e in record["buckets"].items() if e.get("backup")) == \
        ["default", "third"]
    assert record["continuous"]["pid"] == run.proc.pid
    # the fields docs/json-output.md documents, and no others
    from cliutil import documented_under

    doc = documented_under("### dcptool backup --continuous of a cluster archive")
    assert all(set(c) == set(doc) for c in run.checkpoints())


def test_live_lines_one_per_bucket_within_80_columns(tmp_path):
    """On an 80-column terminal the run draws a line per bucket: its lag in seconds and
    items, its last checkpoint's time, items/s, whole; a summary of the buckets on stdout
    when it stops."""
    import re

    from termutil import render, run_with_stderr_on_a_terminal

    with NodeProcess(tmp_path / "src", vbuckets=VBS) as node:
        _create_bucket(node, "other")
        for b in BUCKETS:
            with opts_for(node, b).connect() as conn:
                load(conn, {f"{b}::{i}": {"i": i} for i in range(10)}, VBS)
        env = dict(os.environ, DCPTOOL_PASSWORD=node.password, COLUMNS="80")
        env.pop("NO_COLOR", None)
        env.pop("DCPTOOL_BUCKET", None)
        screen, out = run_with_stderr_on_a_terminal(
            [sys.executable, "-m", "dcptool", "backup", "-c", f"{node.host}:{node.port}",
             str(tmp_path / "cluster"), "--continuous", "--checkpoint", "1s",
             "--stop-after", "3s", "--master", "local[2]", "--no-watermark"], env)
    lines = render(bytes(screen), 80)
    for b in BUCKETS:
        line = re.compile(rf"^{b} +lag \d+\.\d s/\d+ items, at \d\d:\d\d:\d\d, [-\d.,k]+ "
                          r"items/s +\d+:\d\d:\d\d$")
        assert any(line.match(ln.rstrip()) for ln in lines), "\n".join(lines[-12:])
    assert all(len(ln.rstrip()) <= 80 for ln in lines)
    assert out.startswith("continuous backup of 2 buckets (default, other) stopped after"), out
