"""Restore, examine, export and read an archive as of a time, against real nodes.

A node of 8 vbuckets; a writer thread of the test writes (and deletes) documents in a
burst and logs each write with the CAS the node acknowledged it with and the time it was
acknowledged; four backups run during the burst (a full one, then incrementals, so the
vbuckets have many snapshot boundaries), one after it, and, past a gap of the archive (no
backup running for longer than the gap tolerance), one more. Module-scoped: the archive
is built once.

- `restore --to-time T` (T in the middle of the burst) into a second node: each vbucket
  holds exactly the writer's state at its reported cut (from the writer's log, not from
  dcptool's reading), every cut at or before T;
- a time inside the gap is refused in one line naming it; with --nearest it restores;
- `examine KEY --at`, `export --resolved --at` and the Spark source's `asOf` give the
  writer's state at the cut.
"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest
from cliutil import cli
from docutil import node_documents, opts_for
from nodeprocutil import NodeProcess

from dcptool.archive import Archive
from dcptool.archive.pointintime import iso, record_time
from dcptool.pipeline.backup import run_backup
from dcptool.protocol import Delete, Set, vbucket_of
from dcptool.protocol.constants import Status

VBS = 8
KEYS = [f"doc::{i:03d}" for i in range(48)]
#: the gap tolerance of this module's archive (seconds; DCPTOOL_GAP_TOLERANCE)
TOLERANCE = "1"


class Writer(threading.Thread):
    """Writes KEYS round-robin (every ninth write a delete of a live key) until stopped;
    `log` holds (key, value or None for a delete, acknowledged CAS, acknowledged ns)."""

    def __init__(self, opts, start: int = 0):
        super().__init__(daemon=True)
        self.opts = opts
        self.i = start
        self.log: list[tuple[str, bytes | None, int, int]] = []
        self.live: set[str] = set()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def write_one(self, conn) -> None:
        key = KEYS[self.i % len(KEYS)]
        k = key.encode()
        vb = vbucket_of(k, VBS)
        if self.i % 9 == 8 and key in self.live:
            rsp = conn.request(Delete(key=k, vbucket=vb))
            value = None
            self.live.discard(key)
        else:
            value = json.dumps({"key": key, "n": self.i}).encode()
            rsp = conn.request(Set(key=k, value=value, vbucket=vb, datatype=1))
            self.live.add(key)
        assert rsp.status == Status.SUCCESS, (key, rsp.status)
        self.log.append((key, value, rsp.cas, time.time_ns()))
        self.i += 1

    def run(self) -> None:
        try:
            with self.opts.connect() as conn:
                while not self.stop.is_set():
                    self.write_one(conn)
                    time.sleep(0.003)
        except BaseException as exc:  # noqa: BLE001 (reported by the fixture)
            self.error = exc


def state_at(log, cut_ns: int | None, vbucket: int) -> dict[str, bytes]:
    """The writer's live documents of `vbucket` as of CAS time `cut_ns` (None: nothing)."""
    out: dict[str, bytes | None] = {}
    if cut_ns is not None:
        for key, value, cas, _ack in log:
            if vbucket_of(key.encode(), VBS) == vbucket and record_time(cas) <= cut_ns:
                out[key] = value
    return {k: v for k, v in out.items() if v is not None}


@pytest.fixture(scope="module")
def pit(tmp_path_factory, spark):
    """(archive path, writer log, src node, dst node, T in the burst, a time in the gap)."""
    base = tmp_path_factory.mktemp("pit")
    path = base / "archive"
    old = os.environ.get("DCPTOOL_GAP_TOLERANCE")
    os.environ["DCPTOOL_GAP_TOLERANCE"] = TOLERANCE
    src = NodeProcess(base / "src", vbuckets=VBS).start()
    dst = NodeProcess(base / "dst", vbuckets=VBS).start()
    try:
        opts = opts_for(src)
        w = Writer(opts)
        w.start()
        time.sleep(0.1)
        run_backup(opts, path, spark=spark)
        full_done = time.time_ns()
        for _ in range(3):
            run_backup(opts, path, spark=spark)
        last_done = time.time_ns()
        w.stop.set()
        w.join()
        assert w.error is None, w.error
        run_backup(opts, path, spark=spark)
        # T: the middle of the writes acknowledged while the incrementals ran
        burst = [ack for *_x, ack in w.log if full_done < ack < last_done]
        assert len(burst) > 50
        t_mid = burst[len(burst) // 2]
        time.sleep(float(TOLERANCE) * 2.5)  # a gap: no backup running
        gap_time = time.time_ns() - int(float(TOLERANCE) * NS_HALF)
        with opts.connect() as conn:
            for _ in range(20):
                w.write_one(conn)
        run_backup(opts, path, spark=spark)
        yield path, w.log, src, dst, t_mid, gap_time
    finally:
        src.stop()
        dst.stop()
        if old is None:
            os.environ.pop("DCPTOOL_GAP_TOLERANCE", None)
        else:
            os.environ["DCPTOOL_GAP_TOLERANCE"] = old


NS_HALF = 500_000_000


@pytest.fixture
def login(pit, monkeypatch):
    monkeypatch.setenv("DCPTOOL_USERNAME", pit[3].username)
    monkeypatch.setenv("DCPTOOL_PASSWORD", pit[3].password)


def _restore(capsys, path, dst, *args):
    return cli(capsys, "restore", path, "-c", f"{dst.host}:{dst.port}", "--json", *args)


def test_restore_to_a_time_in_the_burst_is_the_writers_state_at_each_cut(pit, login, capsys):
    path, log, _src, dst, t_mid, _gap = pit
    assert len(Archive.open(path).committed_ids()) == 6
    rc, out, err = _restore(capsys, path, dst, "--to-time", iso(t_mid))
    assert rc == 0, err
    d = json.loads(out)
    pit_d = d["point_in_time"]
    at = pit_d["to_time"]
    assert at == iso(t_mid)
    cuts = {c["vbucket"]: c for c in pit_d["vbuckets"]}
    assert sorted(cuts) == list(range(VBS))
    held = node_documents(opts_for(dst))
    restored = {k.decode(): v[1] for k, v in held.items() if v[0] == "live"}
    nonempty = 0
    for vb, c in cuts.items():
        assert c["time_ns"] is None or c["time_ns"] <= t_mid
        want = state_at(log, c["time_ns"], vb)
        got = {k: v for k, v in restored.items() if vbucket_of(k.encode(), VBS) == vb}
        assert got == want, f"vbucket {vb} cut {c}"
        nonempty += bool(want)
        # nothing the writer wrote between the cut and T was restored, and the cut is
        # the newest boundary: its lag is what the summary reports
        at_ns = t_mid // 1000 * 1000  # TIME as given: to the microsecond
        assert c["lag_seconds"] == pytest.approx((at_ns - c["time_ns"]) / 1e9, abs=1e-6)
        # an exact cut is the writer's state at T itself: no write between its cut and T
        if c["exact"]:
            assert state_at(log, at_ns, vb) == want
            assert not any(c["time_ns"] < record_time(cas) <= at_ns
                           for key, _v, cas, _a in log if vbucket_of(key.encode(), VBS) == vb)
    assert nonempty == VBS
    lags = sorted(c["lag_seconds"] for c in cuts.values())
    assert pit_d["lag"]["worst_seconds"] == pytest.approx(lags[-1], abs=1e-6)
    assert pit_d["lag"]["median_seconds"] == pytest.approx((lags[3] + lags[4]) / 2, abs=1e-6)
    # the writer's state at T is not its final state: the restore is of the middle
    final = record_time(log[-1][2])
    assert any(state_at(log, c["time_ns"], vb) != state_at(log, final, vb)
               for vb, c in cuts.items())


def test_a_time_in_a_gap_is_refused_and_nearest_restores(pit, login, capsys):
    path, log, _src, dst, _t, gap_time = pit
    rc, out, err = _restore(capsys, path, dst, "--to-time", iso(gap_time))
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "gap" in lines[0] and "--nearest" in lines[0]
    rc, out, _err = cli(capsys, "info", path, "--json")
    gap = json.loads(out)["point_in_time"]["gaps"][0]
    assert f"from {gap['from']} to {gap['to']}" in lines[0]
    rc, out, err = _restore(capsys, path, dst, "--to-time", iso(gap_time), "--nearest",
                            "--dry-run")
    assert rc == 0, err
    d = json.loads(out)["point_in_time"]
    assert d["gap"] is not None and d["nearest"]
    burst_end = max(record_time(c) for _k, _v, c, ack in log if ack < gap_time)
    for c in d["vbuckets"]:
        assert c["time_ns"] <= burst_end


def test_bad_times_are_usage_errors(pit, login, capsys):
    path, _log, _src, dst, _t, _gap = pit
    for bad in ("2026-11-28T14:03:00", "2999-01-01T00:00:00Z", "2001-01-01T00:00:00Z",
                "yesterday"):
        rc, out, err = _restore(capsys, path, dst, "--to-time", bad)
        assert rc == 2 and out == "", bad
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def _writer_state(log, cuts) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for vb, t in cuts.items():
        out.update(state_at(log, t, vb))
    return out


def test_examine_at_marks_the_version_of_that_time(pit, login, capsys):
    path, log, _src, dst, t_mid, _gap = pit
    at = iso(t_mid)
    rc, out, err = _restore(capsys, path, dst, "--to-time", at, "--dry-run")
    cuts = {c["vbucket"]: c for c in json.loads(out)["point_in_time"]["vbuckets"]}
    want = _writer_state(log, {vb: c["time_ns"] for vb, c in cuts.items()})
    for key in KEYS:
        rc, out, err = cli(capsys, "examine", path, key, "--at", at, "--json", "--values")
        assert rc == 0, err
        d = json.loads(out)
        cut = cuts[d["vbucket"]]
        assert (d["at"]["seqno"], d["at"]["time_ns"]) == (cut["seqno"], cut["time_ns"])
        current = [v for v in d["versions"] if v["as_of"]]
        assert len(current) <= 1
        live = [v for v in current if not v["deleted"]]
        if key in want:
            assert live and live[0]["value"].encode() == want[key], key
            assert d["at"]["exists"]
        else:
            assert not live and not d["at"]["exists"], key
    rc, out, err = cli(capsys, "examine", path, KEYS[0], "--at", at)
    assert rc == 0 and f"as of {at}" in out


def test_export_resolved_at_writes_the_state_of_that_time(pit, login, capsys, tmp_path):
    import base64

    path, log, _src, dst, t_mid, gap_time = pit
    at = iso(t_mid)
    rc, out, err = _restore(capsys, path, dst, "--to-time", at, "--dry-run")
    cuts = {c["vbucket"]: c["time_ns"] for c in json.loads(out)["point_in_time"]["vbuckets"]}
    rc, out, err = cli(capsys, "export", path, tmp_path / "out", "--resolved", "--at", at,
                       "--format", "jsonl", "--json", "--no-progress")
    assert rc == 0, err
    assert json.loads(out)["at"] == at
    rows = [json.loads(line) for f in sorted((tmp_path / "out").glob("part-*.jsonl"))
            for line in f.read_text().splitlines()]
    got = {r["key"]: base64.b64decode(r["value"]) for r in rows if not r["deleted"]}
    assert got == _writer_state(log, cuts)
    # a time in the gap: refused in one line, before Spark
    rc, out, err = cli(capsys, "export", path, tmp_path / "gap", "--resolved", "--at",
                       iso(gap_time), "--format", "jsonl")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "gap" in err


def test_spark_source_as_of(pit, login, capsys, spark):
    path, log, _src, dst, t_mid, _gap = pit
    at = iso(t_mid)
    rc, out, err = _restore(capsys, path, dst, "--to-time", at, "--dry-run")
    cuts = {c["vbucket"]: c["time_ns"] for c in json.loads(out)["point_in_time"]["vbuckets"]}
    from dcptool.pipeline.dataframes import register

    register(spark)
    df = spark.read.format("dcptool").option("asOf", at).load(str(path))
    rows = df.where("NOT deleted").select("key", "value").collect()
    assert {r["key"]: bytes(r["value"]) for r in rows} == _writer_state(log, cuts)
    # the newest state differs (the burst went on after T)
    newest = spark.read.format("dcptool").option("resolved", "true").load(str(path))
    assert newest.where("NOT deleted").count() != len(rows) or {
        r["key"]: bytes(r["value"]) for r in newest.where("NOT deleted").collect()} != {
        r["key"]: bytes(r["value"]) for r in rows}


def test_info_shows_the_window_and_its_gap(pit, capsys, monkeypatch):
    path, _log, _src, _dst, t_mid, gap_time = pit
    rc, out, err = cli(capsys, "info", path, "--json")
    assert rc == 0, err
    p = json.loads(out)["point_in_time"]
    ids = Archive.open(path).committed_ids()
    assert p["window"]["earliest"] <= iso(t_mid) <= p["window"]["latest"]
    assert p["window"]["latest"] > iso(gap_time)
    assert len(p["gaps"]) == 1
    g = p["gaps"][0]
    assert g["from"] < iso(gap_time) < g["to"]
    # the gap ends when the last backup began
    assert g["to"][:19].replace("-", "").replace(":", "") == ids[-1][:15]
    monkeypatch.setenv("COLUMNS", "80")
    rc, out, err = cli(capsys, "info", path)
    assert rc == 0, err
    bars = [line for line in out.splitlines() if "█" in line and "░" in line]
    assert len(bars) == 1 and len(bars[0]) <= 80, out
    assert bars[0].startswith("default ") and g["from"][:10] in bars[0]
    assert all(len(line) <= 80 for line in out.splitlines()[-4:])
    assert "1 gap" in out
    # piped with no COLUMNS: the bar keeps to 80 columns (tables take 200 there)
    monkeypatch.delenv("COLUMNS")
    rc, out, err = cli(capsys, "info", path)
    assert rc == 0, err
    bars = [line for line in out.splitlines() if "█" in line and "░" in line]
    assert len(bars) == 1 and 60 < len(bars[0]) <= 80, out


def test_keep_within_keeps_the_recent_backups(pit, capsys):
    path, *_rest = pit
    rc, out, err = cli(capsys, "info", path, "--keep-within", "1h", "--json")
    assert rc == 0, err
    rows = json.loads(out)["retention"]["backups"]
    assert json.loads(out)["retention"]["policy"]["within"] == "1h"
    assert len(rows) == 6 and all(r["action"] == "keep" for r in rows)
    assert all(any(x.startswith("within 1h") for x in r["reasons"]) for r in rows)
    # within 2 s of the newest: the newest alone (the gap before it is longer)
    rc, out, err = cli(capsys, "prune", path, "--keep-within", "2s", "--dry-run", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["kept"] == [Archive.open(path).committed_ids()[-1]]
    rc, out, err = cli(capsys, "remove", path, "--older-than", "0s", "--keep-within", "1h",
                       "--dry-run", "--json")
    assert rc == 0, err
    assert json.loads(out)["removed"] == []


def test_a_history_keeping_merge_keeps_every_point_in_time(pit, login, capsys, spark,
                                                            tmp_path):
    """A continuous backup's rotation merges its checkpoints keeping every version
    (`run_merge(..., history=True)`): the merged archive cuts every vbucket for T where the
    originals did, and restores the writer's state there; a plain merge of the same range
    keeps each key's newest version only, and T inside it is no longer in the window (the
    range began with the full backup: the window begins at the merged backup's end)."""
    import shutil

    from dcptool.pipeline.merge import run_merge

    path, log, _src, dst, t_mid, _gap = pit
    at = iso(t_mid)

    def cuts_of(archive) -> dict[int, tuple]:
        rc, out, err = _restore(capsys, archive, dst, "--to-time", at, "--dry-run")
        assert rc == 0, err
        return {c["vbucket"]: (c["seqno"], c["time_ns"], c["exact"])
                for c in json.loads(out)["point_in_time"]["vbuckets"]}

    before = cuts_of(path)
    ids = Archive.open(path).committed_ids()
    kept, plain = tmp_path / "history", tmp_path / "plain"
    shutil.copytree(path, kept)
    shutil.copytree(path, plain)
    res = run_merge(kept, first=ids[0], last=ids[3], spark=spark, history=True)
    assert res.replaced == ids[:4]
    merged = Archive.open(kept).manifest(res.merged_id)
    assert merged["extra"]["merge"]["history"] is True
    # every version of the range is still there: as many items as the originals held
    assert res.items_after == res.items_before
    assert cuts_of(kept) == before
    rc, out, err = cli(capsys, "export", kept, tmp_path / "out", "--resolved", "--at", at,
                       "--format", "jsonl", "--json", "--no-progress")
    assert rc == 0, err
    import base64

    rows = [json.loads(line) for f in sorted((tmp_path / "out").glob("part-*.jsonl"))
            for line in f.read_text().splitlines()]
    got = {r["key"]: base64.b64decode(r["value"]) for r in rows if not r["deleted"]}
    assert got == _writer_state(log, {vb: c[1] for vb, c in before.items()})
    # the plain merge: fewer items, and T is no longer a point the archive can give
    res = run_merge(plain, first=ids[0], last=ids[3], spark=spark)
    assert res.items_after < res.items_before
    rc, out, err = _restore(capsys, plain, dst, "--to-time", at, "--dry-run")
    assert rc == 2 and "before the archive's window" in err, err
