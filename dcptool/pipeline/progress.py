"""How far a Spark command is, for the progress bar of `restore`, `export`, `merge`,
`prune`, `remove` and `verify --against` (and the files `backup`'s tasks report through).

A command that draws a bar installs a sink (`reporting`); the pipeline then reports its
stages (`stage`) and, while Spark runs the command's tasks, how far they are (phase
`WORK`): in records when the tasks can report to the driver, else in tasks.

Records: each task rewrites a small JSON file of its counts (`TaskReporter`; at most every
`interval` seconds and once at its end) in a directory the driver and the executors share,
and the driver sums the files every `interval` seconds (`poll_files`, `watch_files`). A
file, not a Spark accumulator (whose updates reach the driver only when a task ends, so a
bar would move per task) nor a socket to the driver (executors of a cluster may not reach
it). With a local master the directory is a temporary one of this machine; with another
master it is in the directory the command writes (`near`: a merge's staging directory,
which every executor reaches); a command that only reads the archive (restore, export,
verify --against) writes nothing into it, and with another master, or when the driver
cannot make the directory, the bar counts tasks. The task side is `counting` (installed
by `run_tasks` around a task when the driver watches files) and `add`: a task that runs
without one reports nothing and pays nothing. The interval is DCPTOOL_PROGRESS_INTERVAL
seconds (default 0.25). `backup`'s tasks write such files too, in the backup's directory
(its `TaskProgress` is a TaskReporter), and its own bar sums them.

Tasks: how many of the job's tasks are done out of how many (`watch_tasks`, which polls
Spark's status tracker in a thread): a task is counted done when Spark says it is, so the
bar moves as tasks finish.

Without a sink every call here does nothing, so scripts and `--json` pay nothing.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

Sink = Callable[[dict[str, Any]], None]

#: the phase of the counted work (a command's bar shows its label with the count)
WORK = "work"

#: seconds between a task's writes of its progress file and between the driver's polls
DEFAULT_INTERVAL = 0.25

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
def watch_tasks(spark, phase: str = WORK, tasks: int | None = None,
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


# -- progress files: the tasks' side -------------------------------------------------------------


def interval() -> float:
    """Seconds between progress writes and polls: DCPTOOL_PROGRESS_INTERVAL, default 0.25."""
    try:
        v = float(os.environ.get("DCPTOOL_PROGRESS_INTERVAL", DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return v if v >= 0 else DEFAULT_INTERVAL


class TaskReporter:
    """One task's progress file: `state()` (a dict of counts) written to `path` as JSON, by
    `tick` at most every `interval` seconds and by `write` always. A failed write is
    ignored: progress never fails a task. `add` counts `done` (the subclass of backup
    keeps counts of its own and overrides `state`)."""

    def __init__(self, path, interval: float = DEFAULT_INTERVAL, pause: float = 0.0):
        self.path = path
        self.interval = interval
        self.pause = pause  # after each write (DCPTOOL_FAULT pause-after-progress)
        self.done = 0
        self._next = 0.0

    def state(self) -> dict[str, int]:
        return {"done": self.done}

    def add(self, n: int) -> None:
        self.done += n
        self.tick()

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval
            self.write()

    __call__ = tick

    def write(self) -> None:
        from dcptool.archive import storage
        from dcptool.errors import DcptoolError

        try:
            storage.atomic_write_bytes(self.path, json.dumps(self.state()).encode(),
                                       durable=False)
        except (OSError, DcptoolError):
            pass
        if self.pause:
            time.sleep(self.pause)


def poll_files(where, prefix: str, keys: tuple[str, ...]) -> dict[str, int]:
    """The sums of `keys` over the progress files in directory `where` whose names start
    with `prefix`; a file that is missing, partial or not JSON is left out."""
    from dcptool.archive import storage
    from dcptool.errors import DcptoolError

    out = dict.fromkeys(keys, 0)
    where = storage.location(where)
    try:
        names = [n for n in storage.listdir(where) if n.startswith(prefix)]
    except (OSError, DcptoolError):
        return out
    for n in names:
        try:
            d = json.loads(storage.read_bytes(where / n))
            add = {k: int(d.get(k, 0)) for k in keys}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, DcptoolError):
            continue
        for k, v in add.items():
            out[k] += v
    return out


#: the names of the tasks' files in a ProgressFiles directory (temporary files that an
#: atomic write renames into place start with a dot: never read)
FILE_PREFIX = "task-"


@dataclass(frozen=True)
class ProgressFiles:
    """Where the tasks of one counted run write their progress (picklable: it travels with
    the tasks), and how often."""

    dir: str
    interval: float = DEFAULT_INTERVAL
    #: seconds a task waits after each write (0; DCPTOOL_FAULT pause-after-progress:MS, read
    #: by the driver, for tests that must see a small run between its start and its end)
    pause: float = 0.0

    def reporter(self) -> TaskReporter:
        from dcptool.archive import storage

        where = storage.location(self.dir)
        return TaskReporter(where / f"{FILE_PREFIX}{uuid.uuid4().hex}.json", self.interval,
                            self.pause)

    def poll(self) -> int:
        return poll_files(self.dir, FILE_PREFIX, ("done",))["done"]


_task: TaskReporter | None = None


@contextmanager
def counting(files: ProgressFiles | None) -> Iterator[None]:
    """In a task: `add` counts into a new progress file of `files` for the block (None:
    into nothing); the file is written once more at the end."""
    global _task
    if files is None:
        yield
        return
    before, _task = _task, files.reporter()
    try:
        yield
    finally:
        rep, _task = _task, before
        rep.write()


def add(n: int) -> None:
    """In a task: `n` more done (records), when the driver counts them; else nothing."""
    rep = _task
    if rep is not None and n:
        rep.add(n)


def counted() -> bool:
    """Whether this task's progress is counted (worth computing what `add` takes)."""
    return _task is not None


class Counted:
    """`fn` run inside `counting(files)`: what run_tasks maps over the tasks."""

    def __init__(self, fn: Callable[[Any], Any], files: ProgressFiles):
        self.fn = fn
        self.files = files

    def __call__(self, task: Any) -> Any:
        with counting(self.files):
            return self.fn(task)


# -- progress files: the driver's side -----------------------------------------------------------


def _files_dir(sc, near) -> str | None:
    """A new directory the tasks of `sc` can write to and the driver read: a temporary one
    for a local master, else one under `near` (the archive); None when none can be made."""
    from dcptool.archive import storage
    from dcptool.errors import DcptoolError

    master = str(getattr(sc, "master", "") or "")
    try:
        if master.startswith("local"):
            return tempfile.mkdtemp(prefix="dcptool-progress-")
        if near is None:
            return None
        where = storage.location(near) / f".progress-{uuid.uuid4().hex}.tmp"
        storage.make_dir(where)
        storage.atomic_write_bytes(where / ".probe", b"", durable=False)
        return str(storage.absolute(where))
    except (OSError, DcptoolError, ValueError):
        return None


@contextmanager
def watch_files(spark, total: int, unit: str = "records",
                near=None) -> Iterator[ProgressFiles | None]:
    """While the block runs tasks that count into the ProgressFiles it is given, report
    `WORK` as their sum (at most `total`) out of `total` `unit`, and `total` of `total`
    when the block returns. It is given None (and reports nothing) without a sink or when
    no directory can be made: the caller counts tasks instead."""
    if _sink is None:
        yield None
        return
    from dcptool.archive import storage

    sc = getattr(spark, "sparkContext", spark)
    where = _files_dir(sc, near)
    if where is None:
        yield None
        return
    from dcptool.faults import progress_pause

    files = ProgressFiles(where, interval(), progress_pause())
    stop = threading.Event()

    def poll() -> None:
        last = -1
        while not stop.wait(files.interval or 0.01):
            done = min(files.poll(), total)
            if done != last:
                last = done
                stage(WORK, done, total, unit)

    stage(WORK, 0, total, unit)
    watcher = threading.Thread(target=poll, name="dcptool-progress", daemon=True)
    watcher.start()
    try:
        yield files
    finally:
        stop.set()
        watcher.join(timeout=2)
        try:
            storage.remove_tree(storage.location(where))
        except Exception:  # noqa: BLE001 - a leftover temporary directory fails nothing
            pass
    # the block returned (a failure raised past this line): all of it is done
    stage(WORK, total, total, unit)
