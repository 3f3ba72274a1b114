"""The progress files tasks report through and the driver sums (pipeline/progress.py),
without Spark."""
from __future__ import annotations

import json
import threading

from dcptool.pipeline import progress


def test_poll_sums_the_files_and_leaves_out_missing_partial_and_other_files(tmp_path):
    files = progress.ProgressFiles(str(tmp_path), interval=0)
    a, b = files.reporter(), files.reporter()
    assert a.path != b.path
    a.add(5)
    b.add(7)
    a.add(3)
    assert files.poll() == 15
    # a torn file, a file that is not an object, one with a count that is not a number, the
    # temporary file of a write in progress, a stranger's file: none counts
    (tmp_path / f"{progress.FILE_PREFIX}torn.json").write_text('{"done": 1')
    (tmp_path / f"{progress.FILE_PREFIX}list.json").write_text("[1, 2]")
    (tmp_path / f"{progress.FILE_PREFIX}nan.json").write_text('{"done": "many"}')
    (tmp_path / f".{progress.FILE_PREFIX}x.json.123.tmp").write_text('{"done": 100}')
    (tmp_path / "other.json").write_text('{"done": 100}')
    assert files.poll() == 15
    # a directory that is gone (or never made): nothing, no error
    assert progress.ProgressFiles(str(tmp_path / "gone")).poll() == 0
    assert progress.poll_files(tmp_path / "gone", "x", ("done", "items")) == {"done": 0,
                                                                             "items": 0}


def test_poll_files_sums_each_key_and_a_file_without_one_counts_zero(tmp_path):
    (tmp_path / ".p-1.tmp").write_text(json.dumps({"items": 3, "work": 10}))
    (tmp_path / ".p-2.tmp").write_text(json.dumps({"items": 4}))
    assert progress.poll_files(tmp_path, ".p-", ("items", "work")) == {"items": 7, "work": 10}


def test_a_reporter_writes_at_most_every_interval_and_always_when_asked(tmp_path):
    rep = progress.TaskReporter(tmp_path / "task-1.json", interval=3600)
    rep.add(1)  # the first count is written
    rep.add(1)
    rep.add(1)  # within the interval: not yet
    assert json.loads((tmp_path / "task-1.json").read_text()) == {"done": 1}
    rep.write()
    assert json.loads((tmp_path / "task-1.json").read_text()) == {"done": 3}


def test_a_reporter_that_cannot_write_fails_nothing(tmp_path):
    rep = progress.TaskReporter(tmp_path / "no" / "such" / "dir" / "task.json", interval=0)
    rep.add(2)
    rep.write()
    assert rep.state() == {"done": 2}


def test_add_counts_only_inside_counting_and_the_file_is_written_at_its_end(tmp_path):
    files = progress.ProgressFiles(str(tmp_path), interval=3600)
    progress.add(10)  # no reporter: nothing, nowhere
    assert not progress.counted() and files.poll() == 0
    with progress.counting(files):
        assert progress.counted()
        progress.add(4)
        progress.add(6)
    assert not progress.counted()
    assert files.poll() == 10
    with progress.counting(None):
        progress.add(5)
    assert files.poll() == 10
    # Counted: what run_tasks maps over the tasks
    assert progress.Counted(lambda n: progress.add(n) or n * 2, files)(5) == 10
    assert files.poll() == 15


def test_watch_files_reports_the_sum_up_to_the_total_and_ends_at_it(tmp_path, monkeypatch):
    class LocalContext:
        master = "local[2]"

    monkeypatch.setenv("DCPTOOL_PROGRESS_INTERVAL", "0.01")
    seen: list[dict] = []
    got_to = threading.Event()

    def sink(p: dict) -> None:
        seen.append(p)
        if p["done"] == 3:
            got_to.set()

    with progress.reporting(sink):
        with progress.watch_files(LocalContext(), 8, "records") as files:
            assert files is not None and files.interval == 0.01
            with progress.counting(files):
                progress.add(3)
                progress._task.write()
                assert got_to.wait(10)
    assert seen[0] == {"phase": progress.WORK, "done": 0, "total": 8, "unit": "records"}
    assert {"phase": progress.WORK, "done": 3, "total": 8, "unit": "records"} in seen
    assert seen[-1] == {"phase": progress.WORK, "done": 8, "total": 8, "unit": "records"}
    assert all(p["done"] <= 8 for p in seen)
    # the temporary directory goes with the run
    import os
    assert not os.path.exists(files.dir)
    # no sink: no directory, nothing reported (the caller counts tasks)
    with progress.watch_files(LocalContext(), 8) as files:
        assert files is None


def test_watch_files_without_a_place_for_the_files_leaves_the_count_to_tasks(tmp_path):
    class ClusterContext:
        master = "spark://somewhere:7077"

    seen: list[dict] = []
    with progress.reporting(seen.append):
        with progress.watch_files(ClusterContext(), 8) as files:  # no archive to write under
            assert files is None
        with progress.watch_files(ClusterContext(), 8,
                                  near=tmp_path / "a-file" / "x") as files:
            assert files is None
        (tmp_path / "a-file").write_text("")
        with progress.watch_files(ClusterContext(), 8, near=tmp_path / "a-file") as files:
            assert files is None  # the driver cannot make its directory there
        with progress.watch_files(ClusterContext(), 8, near=tmp_path) as files:
            assert files is not None and files.dir.startswith(str(tmp_path))
    assert seen == [{"phase": progress.WORK, "done": 0, "total": 8, "unit": "records"},
                    {"phase": progress.WORK, "done": 8, "total": 8, "unit": "records"}]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".progress-")]


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.delenv("DCPTOOL_PROGRESS_INTERVAL", raising=False)
    assert progress.interval() == progress.DEFAULT_INTERVAL
    for given, want in (("0", 0.0), ("1.5", 1.5), ("-1", progress.DEFAULT_INTERVAL),
                        ("soon", progress.DEFAULT_INTERVAL)):
        monkeypatch.setenv("DCPTOOL_PROGRESS_INTERVAL", given)
        assert progress.interval() == want
