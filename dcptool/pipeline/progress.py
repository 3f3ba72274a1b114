"""How far a Spark command is, for the progress bar of `restore`, `export`, `merge`,
`prune`, `remove` and `verify --against`.

A command that draws a bar installs a sink (`reporting`); the pipeline then reports its
stages (`stage`) and, while Spark runs a job of this command, how many of the job's tasks
are done out of how many (`watch_tasks`, which polls Spark's status tracker in a thread).
Without a sink every call here does nothing, so scripts and `--json` pay nothing.

The counts are Spark's own: a task is counted done when Spark says it is, so the bar moves
as tasks finish and reaches its total only when every task has. (`backup` reports per
item through files the tasks write; see `pipeline/backup.py:TaskProgress`.)
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

Sink = Callable[[dict[str, Any]], None]

_sink: Sink | None = None


@contextmanager
def reporting(sink: Sink | None) -> Iterator[None]:
    """Send this process's progress reports to `sink` (called with a dict: `phase`, `done`,
    `total` (None while unknown), `unit`) for the duration of the block."""
    global _sink
    before, _sink = _sink, sink
    try:
        yield
    finally:
        _sink = before


def active() -> bool:
    return _sink is not None


def stage(phase: str, done: int = 0, total: int | None = None, unit: str = "") -> None:
    """Report a stage (`starting Spark`, `checking files`, ...), with a count when known."""
    sink = _sink
    if sink is not None:
        try:
            sink({"phase": phase, "done": done, "total": total, "unit": unit})
        except Exception:  # noqa: BLE001 - a bar never fails a command
            pass


def _group(sc) -> str | None:
    """The job group the calling thread's jobs run under (an engine's), or None."""
    return sc.getLocalProperty("spark.jobGroup.id") or None


def _task_counts(tracker, jobs: set[int]) -> tuple[int, int]:
    """(tasks done, tasks in all) of the stages of `jobs`."""
    done = total = 0
    for jid in jobs:
        info = tracker.getJobInfo(jid)
        if info is None:
            continue
        for sid in info.stageIds:
            st = tracker.getStageInfo(sid)
            if st is not None:
                done += st.numCompletedTasks
                total += st.numTasks
    return done, total


@contextmanager
def watch_tasks(spark, phase: str, tasks: int | None = None,
                interval: float = 0.25) -> Iterator[None]:
    """While the block runs Spark jobs, report `phase` with the tasks of the jobs it started
    done out of `tasks` (or out of what the jobs' stages hold, when `tasks` is None)."""
    if _sink is None:
        yield
        return
    sc = getattr(spark, "sparkContext", spark)
    try:
        tracker = sc.statusTracker()
        group = _group(sc)
        before = set(tracker.getJobIdsForGroup(group))
    except Exception:  # noqa: BLE001 - no tracker: the stage alone
        stage(phase, 0, tasks, "tasks")
        yield
        return
    stop = threading.Event()
    last = {"done": 0, "total": tasks}

    def poll() -> None:
        while not stop.wait(interval):
            try:
                jobs = set(tracker.getJobIdsForGroup(group)) - before
                done, total = _task_counts(tracker, jobs)
            except Exception:  # noqa: BLE001 - the JVM went away: the command says why
                return
            total = tasks if tasks is not None else (total or None)
            if total is not None:
                done = min(done, total)
            last.update(done=done, total=total)
            stage(phase, done, total, "tasks")

    stage(phase, 0, tasks, "tasks")
    watcher = threading.Thread(target=poll, name="dcptool-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=2)
    # the block returned (a failure raised past this line): every task it ran is done
    total = last["total"] if last["total"] is not None else last["done"]
    stage(phase, total, total, "tasks")
