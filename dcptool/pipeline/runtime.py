"""The SparkSession dcptool runs on: `local[*]` by default, any master URL at scale.

Local mode is tuned for a small machine: no UI, no console progress, few shuffle
partitions, and Python workers that run this interpreter (so they can import dcptool).

Under the command line (`set_jvm_output`), Spark stays out of the terminal: the JVM is
started in a process group of its own (Ctrl-C reaches only the driver, which then kills it) with
its stdout and stderr sent to /dev/null or DCPTOOL_SPARK_LOG (the terminal with -vv), so
neither its start-up and shutdown lines nor the Python workers' (they inherit its
descriptors) can appear; a spark:// master is checked before anything is written.

The command line's driver JVM also starts faster: it compiles with C1 only, loads its
classes from a class-data archive that the first run writes (at its exit) into
~/.cache/dcptool, and is started without spark-submit's scripts and launcher JVM once a run
has recorded the java command they built (benchmarks/spark_startup.py measures all three).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from dcptool import procs
from dcptool.errors import DcptoolError, mark_interrupted, was_interrupted

from . import progress

DEFAULT_MASTER = "local[*]"

_lock = threading.Lock()

#: where the JVM's own output goes: None (library use: as PySpark does it), "quiet" (the
#: command line: DCPTOOL_SPARK_LOG or /dev/null), "terminal" (the command line with -vv)
_jvm_output: str | None = None
_jvm_proc: Any = None
_daemon_proc: Any = None

#: the command line's start-up shortcuts (library use has none of them): the driver JVM's
#: flags and its class-data archive; switched off one by one to measure them
#: (benchmarks/spark_startup.py)
_fast = {"jvm_flags": True, "cds": True, "launch": True, "daemon": True}


def long_lived_jvm() -> None:
    """A driver that runs for long (the engine): the full JIT instead of the command line's
    C1-only flag (the class-data archive still helps)."""
    _fast["jvm_flags"] = False


#: C1 only: Spark's start-up runs a lot of code once, which C2 would compile on the same two
#: cores; a serial collector suits the driver's small heap and starts faster
JVM_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
#: the driver's logging set-up: Spark's own lines off the terminal
LOG4J_PROPERTIES = os.path.join(os.path.dirname(__file__), "log4j2.properties")
#: an archive the JVM cannot use (another JDK, another class path) is skipped without a word
_CDS_QUIET = "-Xlog:cds=off,cds+dynamic=off"
_CDS_MAGIC = 0xF00BABA8  # the first four bytes (little-endian) of a complete dynamic archive
_CDS_STALE = 600.0  # seconds after which an unfinished archive's lock is someone's lost run


def interrupted() -> bool:
    """Whether Ctrl-C ended the CLI's JVM: whatever error follows is a consequence of it."""
    return was_interrupted()


def set_jvm_output(mode: str | None) -> None:
    """How a SparkSession started from now on treats the terminal (see the module doc)."""
    global _jvm_output
    if mode not in (None, "quiet", "terminal"):
        raise ValueError(mode)
    _jvm_output = mode
    quiet = mode == "quiet"
    # py4j logs a lost connection (a killed or stopped JVM) and a Ctrl-C in the middle of a
    # call, partly through the root logger (`logging.exception`, which would first give the
    # root logger a stderr handler): a handler that drops them keeps both off the terminal
    for name in ("py4j", ""):
        log = logging.getLogger(name)
        mine = [h for h in log.handlers if getattr(h, "_dcptool_quiet", False)]
        if quiet and not mine:
            h = logging.NullHandler()
            h._dcptool_quiet = True  # type: ignore[attr-defined]
            log.addHandler(h)
        elif not quiet:
            for h in mine:
                log.removeHandler(h)
    logging.getLogger("py4j").propagate = not quiet


def _quiet_env() -> None:
    # Workers must run the interpreter dcptool is installed in, not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


#: the directory this dcptool is imported from (the one that holds the dcptool package)
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_EXECUTOR_ENV = "spark.executorEnv."


def worker_env(master: str) -> dict[str, str]:
    """The Spark settings that make the Python workers import the dcptool this driver runs,
    whatever the current directory. Spark starts its workers (`python -m` the daemon module)
    in the driver's directory, and Python puts that directory first on a `-m` module's path:
    a folder named dcptool there (the parent of a clone) would be imported instead.
    PYTHONSAFEPATH (Python 3.11+) leaves it off; on a local master, whose workers share this
    machine, the directory this dcptool comes from goes on their path when it is not one
    of the interpreter's own (site-packages): an editable install, a PYTHONPATH, a clone."""
    env = {f"{_EXECUTOR_ENV}PYTHONSAFEPATH": "1"}
    if master.startswith("local"):
        import site

        own = {os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
        if os.path.realpath(PACKAGE_ROOT) not in own:
            env[f"{_EXECUTOR_ENV}PYTHONPATH"] = PACKAGE_ROOT
    return env


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a standalone master URL (spark://h1:p1,h2:p2); [] for
    any other kind of master."""
    if not master.startswith("spark://"):
        return []
    out = []
    for part in master[len("spark://"):].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise DcptoolError(f"bad Spark master URL {master!r}",
                               hint="a standalone master is spark://HOST:PORT[,HOST:PORT]",
                               exit_code=2)
        out.append((host.strip("[]"), int(port)))
    return out


def check_master(master: str | None, timeout: float = 5.0) -> None:
    """Fail in one line when no address of a spark:// master accepts a connection (Spark
    itself would retry for a minute, then fail in a hundred lines)."""
    master = master or os.environ.get("DCPTOOL_SPARK_MASTER") or DEFAULT_MASTER
    addrs = master_addresses(master)
    why = ""
    for host, port in addrs:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            return
        except OSError as exc:
            why = exc.strerror or str(exc) or type(exc).__name__
    if addrs:
        raise DcptoolError(f"cannot reach the Spark master {master}: {why}",
                           hint="check --master (or DCPTOOL_SPARK_MASTER) and that the master runs")


def _kill_jvm() -> None:
    proc = _jvm_proc
    if proc is None or proc.poll() is not None:
        return
    try:  # the JVM leads a process group of its own
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except Exception:  # noqa: BLE001 - nothing more to do at this point
        pass


def _on_interrupt(signum, frame):  # noqa: ARG001 - a signal handler's signature
    # the CLI's Ctrl-C: the JVM (and with it its tasks and Python workers) goes first, so no
    # task writes on once the archive's lock is released; on an engine, this command's tasks
    # (the engine waits until they have ended); then the usual KeyboardInterrupt (py4j may
    # turn it into a connection error on its way out: `interrupted()` says why)
    if was_interrupted():  # a second Ctrl-C while the first is being dealt with
        raise KeyboardInterrupt
    mark_interrupted()
    _kill_jvm()
    from .engine import attachment

    a = attachment()
    if a is not None:
        a.cancel()
    raise KeyboardInterrupt


def interrupt_now(signum, frame) -> None:
    """What Ctrl-C does to a Spark command (the JVM goes, then KeyboardInterrupt), for a
    command with a handler of its own that gives up on a second Ctrl-C."""
    _on_interrupt(signum, frame)


#: where a note for the user goes (the CLI's notes; nothing for library use)
_note_sink: Any = None


def set_note_sink(fn: Any) -> None:
    global _note_sink
    _note_sink = fn


def _engine_session(master: str | None):
    """A running dcptool engine's session, attached, or None (see pipeline/engine.py)."""
    from . import engine

    # the command line's Spark only: a program of the user's (dcptool.spark.get_spark) gets
    # a SparkSession of its own, as PySpark gives it
    if _jvm_output is None or engine.disabled():
        return None
    return engine.attach(master, note=_note_sink)


def engine_available(master: str | None = None) -> bool:
    """Whether a Spark command would attach to a running engine (for the progress bar's
    first phase); cheap when none runs."""
    from . import engine

    if _jvm_output is None or engine.disabled() or _session_active():
        return False
    st = engine.request("status", timeout=2.0)
    master = master or os.environ.get("DCPTOOL_SPARK_MASTER")
    return bool(st) and not st.get("stopping") and (not master or st.get("master") == master)


def _session_active() -> bool:
    """Whether this process has a SparkContext already (its own or an engine's)."""
    if "pyspark" not in sys.modules:
        return False
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


#: what Spark must have on for a data key to travel to executors outside this host
KEY_TRANSPORT_CONF = ("spark.authenticate", "spark.network.crypto.enabled")


def check_key_transport(spark) -> None:
    """Refuse (one line) to send an encrypted archive's data key in task closures to a
    master that is not local unless Spark authenticates its RPC and encrypts its network
    traffic (`spark.authenticate`, `spark.network.crypto.enabled`; docs/spark.md)."""
    sc = context_of(spark)
    master = sc.master or ""
    if master.startswith("local"):
        return
    conf = sc.getConf()
    missing = [k for k in KEY_TRANSPORT_CONF
               if (conf.get(k) or "false").strip().lower() != "true"]
    if missing:
        raise DcptoolError(
            f"refusing to send an encrypted archive's data key to the executors of {master} "
            f"without {' and '.join(missing)}",
            hint="set " + " and ".join(f"{k}=true" for k in missing)
                 + " (with spark.authenticate.secret) in the Spark configuration; "
                   "see docs/spark.md")


def run_tasks(spark, fn, tasks: list, *, total: int | None = None, unit: str = "records",
              near: Any = None) -> list:
    """Run `fn` on each of `tasks`, one Spark task each, and return their results in order
    (a command attached to an engine runs them in its own job group).

    A command's progress bar (see pipeline/progress.py) counts what the tasks report with
    `progress.add` out of `total` `unit` when `total` is given and the tasks can report
    (progress files in a temporary directory, or under `near` for a master that is not
    local); otherwise it counts the tasks done."""
    from .engine import set_job_group

    sc = context_of(spark)
    set_job_group(sc)
    # the data key of an encrypted archive goes with the tasks (inside the opened archive
    # they carry)
    if any(_carries_key(t) for t in tasks):
        check_key_transport(sc)
    if total is not None and progress.active():
        with progress.watch_files(sc, total, unit, near) as files:
            if files is not None:
                return sc.parallelize(tasks, len(tasks)).map(
                    progress.Counted(fn, files)).collect()
    with progress.watch_tasks(sc, progress.WORK, len(tasks)):
        return sc.parallelize(tasks, len(tasks)).map(fn).collect()


#: a local master: local, local[N], local[*], local[N,F], local[*,F]
_LOCAL_MASTER = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")


def barrier_slots(spark) -> int | None:
    """How many tasks one barrier stage of `spark` can run at once (Spark's barrier mode
    starts all of a stage's tasks together, or waits): a local master's slots (its cores
    over spark.task.cpus). None for any other master, whose free slots are not known here
    (a barrier stage larger than them fails only after minutes of retries), and for a
    context that runs no barrier stages (an engine's job runner)."""
    sc = context_of(spark)
    if not hasattr(sc, "_jvm") or not hasattr(sc, "parallelize"):
        return None
    m = _LOCAL_MASTER.fullmatch(str(getattr(sc, "master", "") or ""))
    if m is None:
        return None
    try:
        if m.group(1) is None:
            cores = 1
        elif m.group(1) == "*":  # as Spark counts them: the JVM's processors
            cores = int(sc._jvm.java.lang.Runtime.getRuntime().availableProcessors())
        else:
            cores = int(m.group(1))
        per_task = int(sc.getConf().get("spark.task.cpus") or 1)
    except Exception:  # noqa: BLE001 - no answer from the JVM: no barrier stage
        return None
    return max(0, cores // max(1, per_task))


class _Rendezvous:
    """Where the tasks of a barrier stage of a local master meet (`run_barrier_tasks`): a
    Unix socket of the driver's, in a directory only its user may enter, and a token. Each
    task sends "TOKEN INDEX MESSAGE"; once every task has, each gets every message back
    (a JSON list, by index). Spark's own `BarrierTaskContext.allGather` waits in steps of a
    second; this answers as soon as the last task's message is in. When the driver stops
    it (the job failed), the tasks still waiting read the end of their connection."""

    def __init__(self, n: int):
        self.n = n
        self.dir = tempfile.mkdtemp(prefix="dcptool-sync-")
        self.path = os.path.join(self.dir, "s")
        self.token = secrets.token_hex(16)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(max(1, n))
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, name="dcptool-barrier", daemon=True)
        self.thread.start()

    @property
    def address(self) -> tuple[str, str, int]:
        return (self.path, self.token, self.n)

    def _serve(self) -> None:
        # round after round: a master that retries a failed stage runs its tasks again
        try:
            while True:
                got: dict[int, str] = {}
                conns: list[socket.socket] = []
                while len(got) < self.n:
                    conn, _ = self.sock.accept()
                    self.conns.append(conn)
                    line = conn.makefile("rb").readline().decode("utf-8", "replace")
                    token, _, rest = line.rstrip("\n").partition(" ")
                    index, _, message = rest.partition(" ")
                    if not secrets.compare_digest(token, self.token) or not index.isdigit():
                        conn.close()
                        continue
                    got[int(index)] = message
                    conns.append(conn)
                reply = (json.dumps([got.get(i, "") for i in range(self.n)]) + "\n").encode()
                for conn in conns:
                    try:
                        conn.sendall(reply)
                    except OSError:
                        pass
                    conn.close()
        except OSError:  # stopped
            pass

    def close(self) -> None:
        for s in (self.sock, *self.conns):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def rendezvous_sync(address: tuple[str, str, int], index: int, message: str) -> list[str]:
    """A task's side of `_Rendezvous`: send `message` as task `index`, wait for every
    task's. Raises DcptoolError when the driver cannot be reached or stopped waiting."""
    path, token, _n = address
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(path)
            sock.sendall(f"{token} {index} {message}\n".encode())
            line = sock.makefile("rb").readline()
        except OSError as exc:
            raise DcptoolError(f"a task of the stage cannot reach the driver at {path}: "
                               f"{exc.strerror or exc}") from None
        if not line.endswith(b"\n"):
            raise DcptoolError("the driver stopped waiting for the tasks of the stage")
        return json.loads(line)
    finally:
        sock.close()


class _BarrierPartition:
    """One partition of a barrier stage (`run_barrier_tasks`): its one task given to `fn`
    with a `sync` through the driver's `_Rendezvous`, inside `progress.counting(files)`."""

    def __init__(self, fn: Any, address: tuple[str, str, int], files: Any = None):
        self.fn = fn
        self.address = address
        self.files = files

    def __call__(self, rows):
        from pyspark import BarrierTaskContext

        index = BarrierTaskContext.get().partitionId()
        (task,) = list(rows)

        def sync(message: str) -> list[str]:
            return rendezvous_sync(self.address, index, message)

        with progress.counting(self.files):
            result = self.fn(task, sync)
        yield result


def run_barrier_tasks(spark, fn, tasks: list, *, total: int | None = None,
                      unit: str = "records", near: Any = None,
                      then: Callable[[list], None] | None = None) -> list:
    """`run_tasks` for tasks that run all at once, as one barrier stage (Spark's barrier
    mode starts all of its tasks together, and ends them all when one fails) of a local
    master: each runs `fn(task, sync)`, where `sync(message)` waits until every task of the
    stage has called it and returns their messages (strings), in the tasks' order. The
    caller makes sure the stage fits (`barrier_slots`). `then(results)`, when given, runs
    before the progress reported is made whole: what it raises (e.g. the tasks refused
    their work) leaves the bar where the tasks left it."""
    from .engine import set_job_group

    sc = context_of(spark)
    set_job_group(sc)
    if any(_carries_key(t) for t in tasks):
        check_key_transport(sc)
    meet = _Rendezvous(len(tasks))

    def collected(*extra: Any) -> list:
        results = sc.parallelize(tasks, len(tasks)).barrier().mapPartitions(
            _BarrierPartition(fn, meet.address, *extra)).collect()
        if then is not None:
            then(results)
        return results

    try:
        if total is not None and progress.active():
            with progress.watch_files(sc, total, unit, near) as files:
                if files is not None:
                    return collected(files)
        with progress.watch_tasks(sc, progress.WORK, len(tasks)):
            return collected()
    finally:
        meet.close()


def _carries_key(task: Any) -> bool:
    """Whether a task (or a tuple of its parts) holds an opened encrypted archive."""
    for part in task if isinstance(task, tuple) else (task,):
        if getattr(getattr(part, "archive", None), "key", None) is not None:
            return True
    return False


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dcptool"


def _cds_key(flags: list[str]) -> str:
    """What a class-data archive depends on: the java binary, Spark's jars, the JVM flags."""
    from pyspark import __version__
    from pyspark.find_spark_home import _find_spark_home

    h = hashlib.sha256(f"{__version__}\0{' '.join(flags)}".encode())
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java:
        raise OSError("no java")
    jars = Path(_find_spark_home()) / "jars"
    for f in [Path(os.path.realpath(java))] + sorted(jars.iterdir()):
        st = f.stat()
        h.update(f"\0{f}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    for k in ("SPARK_CONF_DIR", "SPARK_HOME", "SPARK_DIST_CLASSPATH", "HADOOP_CONF_DIR"):
        h.update(f"\0{os.environ.get(k, '')}".encode())
    return h.hexdigest()[:20]


def _complete_archive(path: Path) -> bool:
    # the JVM writes the header (and its magic) last, once the archive is whole
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        return (int.from_bytes(head, "little") == _CDS_MAGIC
                and time.time() - path.stat().st_mtime > 2)
    except OSError:
        return False


def _cds_options(flags: list[str]) -> list[str]:
    """The driver JVM's class-data sharing options: use the archive of an earlier run; if
    there is none, have this JVM write one at its exit (one run at a time); [] on any doubt."""
    try:
        d = _cache_dir() / "spark-cds"
        key = _cds_key(flags)
        final = d / f"{key}.jsa"
        if not final.is_file():
            for tmp in d.glob(f"{key}.*.tmp"):
                if _complete_archive(tmp):
                    os.replace(tmp, final)
                    break
        if final.is_file():
            for f in d.glob(f"{key}.*"):  # a lock, unfinished archives: done with
                if f != final:
                    f.unlink(missing_ok=True)
            return [f"-XX:SharedArchiveFile={final}", _CDS_QUIET]
        d.mkdir(parents=True, exist_ok=True)
        lock = d / f"{key}.lock"
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:  # another run writes it (or died doing so: retry later)
            if time.time() - lock.stat().st_mtime > _CDS_STALE:
                lock.unlink(missing_ok=True)
            return []
        # the JVM dumps its loaded classes when it exits (after the command's last word), and
        # the next run adopts the file once it is complete
        return [f"-XX:ArchiveClassesAtExit={d / f'{key}.{secrets.token_hex(4)}.tmp'}", _CDS_QUIET]
    except (OSError, ValueError, ImportError, RuntimeError):  # RuntimeError: no home
        return []


def _prepare_daemon(sink: Any, settings: dict[str, str]) -> dict[str, str]:
    """Start the Python worker daemon's imports while the JVM starts (see sparkdaemon.py);
    the environment that tells the daemon Spark starts where to find it ({} if none)."""
    global _daemon_proc

    d = tempfile.mkdtemp(prefix="dcptool-daemon-")
    path = os.path.join(d, "s")
    # what Spark gives its daemon: spark-submit's hash seed, unbuffered streams, one thread,
    # the executor environment of the settings (a PYTHONPATH goes before the driver's)
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "YES"}
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in settings.items():
        if k.startswith(_EXECUTOR_ENV):
            name = k[len(_EXECUTOR_ENV):]
            if name == "PYTHONPATH" and env.get(name):
                v = os.pathsep.join([v, env[name]])
            env[name] = v
    try:
        # its standard input stays open while this process runs; it ends when it closes
        _daemon_proc = subprocess.Popen(
            [sys.executable, "-m", "dcptool.pipeline.sparkdaemon", "--prepare", path],
            stdin=subprocess.PIPE, stdout=sink, stderr=sink, env=env, process_group=0)
    except OSError:
        shutil.rmtree(d, ignore_errors=True)
        return {}
    return {PREPARED_DAEMON: path}


# -- starting the driver JVM ----------------------------------------------------------------------
#
# spark-submit is two bash scripts and a JVM (Spark's launcher, org.apache.spark.launcher.Main)
# that print the java command which the scripts then exec: a tenth of a second or more of a
# cold command. The command and the environment the scripts add to it depend only on the
# arguments, the environment and files of Spark's and Java's installation, so dcptool records
# what one run of spark-submit started (its argv and environment, read from /proc) under a key
# made of all of these, and later runs start that java command directly. A spark-env.sh (a
# script: it may say something else on every run) means spark-submit every time; so does a
# recorded command whose JVM ends before it listens (the record is dropped).

#: environment variables that spark-submit's scripts or Spark's launcher read
_LAUNCH_ENV = ("SPARK_", "PYSPARK_", "JAVA_", "_JAVA_", "JDK_", "HADOOP_", "YARN_", "CLASSPATH")
#: set per run (or constant) by the launching side: not part of the key
_PER_RUN_ENV = {"_PYSPARK_DRIVER_CONN_INFO_PATH", "SPARK_CONNECT_MODE"}
#: the shells' own bookkeeping: not recorded
_SHELL_ENV = {"_", "SHLVL", "PWD", "OLDPWD"}
_LAUNCH_RECORDS = 16
#: the variable that tells the daemon Spark starts where the prepared one waits (read by
#: sparkdaemon.py, which imports the task modules and so cannot be imported from here)
PREPARED_DAEMON = "DCPTOOL_SPARK_DAEMON"


def _submit_argv(settings: dict[str, str]) -> list[str]:
    """spark-submit's command line for a PySpark driver with `settings` (as PySpark builds it)."""
    from pyspark.find_spark_home import _find_spark_home

    argv = [os.path.join(_find_spark_home(), "bin", "spark-submit")]
    for k, v in settings.items():
        argv += ["--conf", f"{k}={v}"]
    extra = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    if os.environ.get("SPARK_TESTING"):
        extra = "--conf spark.ui.enabled=false " + extra
    return argv + shlex.split(extra)


def _launch_key(submit: list[str], env: dict[str, str]) -> str | None:
    """What the java command spark-submit builds depends on; None: do not record it."""
    home = Path(submit[0]).parent.parent
    conf_dir = Path(env.get("SPARK_CONF_DIR") or home / "conf")
    if (conf_dir / "spark-env.sh").exists():
        return None
    h = hashlib.sha256("\0".join(submit).encode())
    for k in sorted(env):
        if k.startswith(_LAUNCH_ENV) and k not in _PER_RUN_ENV:
            h.update(f"\0{k}={env[k]}".encode())
    h.update(f"\0PATH={env.get('PATH', '')}".encode())
    java_home = env.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java:
        return None
    files = [Path(os.path.realpath(java)), *sorted((home / "bin").iterdir()),
             *sorted((home / "jars").iterdir())]
    if conf_dir.is_dir():
        files += sorted(conf_dir.iterdir())
    for f in files:
        st = f.stat()
        h.update(f"\0{f}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def _recorded_launch(key: str) -> dict[str, Any] | None:
    try:
        rec = json.loads((_cache_dir() / "spark-launch" / f"{key}.json").read_text())
        if (isinstance(rec.get("argv"), list) and rec["argv"]
                and all(isinstance(a, str) for a in rec["argv"])
                and isinstance(rec.get("env"), dict) and isinstance(rec.get("unset"), list)):
            return rec
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _record_launch(key: str, pid: int, env: dict[str, str]) -> None:
    """Record the java command (and the environment spark-submit's scripts gave it) that the
    running process `pid` was started with."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0")[:-1]]
        with open(f"/proc/{pid}/environ", "rb") as f:
            penv = dict(e.decode().partition("=")[::2] for e in f.read().split(b"\0") if e)
        if (not argv or not os.path.basename(argv[0]).startswith("java")
                or "org.apache.spark.deploy.SparkSubmit" not in argv):
            return
        added = {k: v for k, v in penv.items()
                 if env.get(k) != v and k not in _SHELL_ENV and k not in _PER_RUN_ENV}
        unset = [k for k in env if k not in penv and k not in _SHELL_ENV]
        d = _cache_dir() / "spark-launch"
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{key}.{secrets.token_hex(4)}.tmp"
        tmp.write_text(json.dumps({"argv": argv, "env": added, "unset": unset}))
        os.replace(tmp, d / f"{key}.json")
        # one record per installation and settings: the newest few are kept
        old = sorted(d.glob("*.json"), key=lambda f: f.stat().st_mtime, reverse=True)
        for f in old[_LAUNCH_RECORDS:]:
            f.unlink(missing_ok=True)
    except (OSError, UnicodeError, ValueError):
        pass


def _forget_launch(key: str) -> None:
    try:
        (_cache_dir() / "spark-launch" / f"{key}.json").unlink(missing_ok=True)
    except OSError:
        pass


def _start_jvm(argv: list[str], env: dict[str, str], popen_kwargs: dict[str, Any]):
    """Start PySpark's gateway JVM with `argv`; (process, port, secret), or (process, None,
    None) when it ends before it says where it listens."""
    from pyspark.serializers import UTF8Deserializer, read_int

    info_dir = tempfile.mkdtemp(prefix="dcptool-gateway-")
    try:
        info = os.path.join(info_dir, "info")
        env = {**env, "_PYSPARK_DRIVER_CONN_INFO_PATH": info}
        # no preexec_fn (PySpark's ignores SIGINT in the JVM): its process group of its own
        # keeps the terminal's Ctrl-C away from it, and a preexec_fn runs this process's
        # fork handlers, in which a Ctrl-C is lost
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=env, **popen_kwargs)
        try:
            # the JVM writes the file under another name and renames it: whole once it is there
            while not os.path.isfile(info):
                if proc.poll() is not None:
                    if os.path.isfile(info):
                        break
                    return proc, None, None
                time.sleep(0.01)
            with open(info, "rb") as f:
                return proc, read_int(f), UTF8Deserializer().loads(f)
        except BaseException:
            # Ctrl-C while it starts: a JVM that finds no directory for its file would not
            # end (its main thread fails, py4j's server thread stays)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            raise
    finally:
        shutil.rmtree(info_dir, ignore_errors=True)


def _launch_quiet_gateway(settings: dict[str, str], remember: bool = True,
                          daemon: bool = False) -> None:
    """Start the JVM for the command line (see the module doc) and make it PySpark's."""
    global _jvm_proc
    from pyspark import SparkContext
    from pyspark.errors import PySparkRuntimeError
    from .engine import connect_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    submit = _submit_argv(settings)
    env = {**os.environ, "SPARK_CONNECT_MODE": "0"}
    key = None
    if _fast["launch"] and sys.platform.startswith("linux"):
        try:
            key = _launch_key(submit, env)
        except (OSError, ValueError, RuntimeError):
            key = None
    recorded = _recorded_launch(key) if key else None
    # a process group of its own (not a session: the fault points' kill ends the session)
    kwargs: dict[str, Any] = {"process_group": 0}
    sink = None
    if _jvm_output == "quiet":
        target = os.environ.get("DCPTOOL_SPARK_LOG") or os.devnull
        sink = open(target, "ab")  # noqa: SIM115 - the JVM holds it, we close our copy
        kwargs.update(stdout=sink, stderr=sink)
    try:
        if daemon:
            env.update(_prepare_daemon(sink, settings))
        port = None
        if recorded is not None:
            jenv = {k: v for k, v in env.items() if k not in recorded["unset"]}
            jenv.update(recorded["env"])
            try:
                proc, port, secret = _start_jvm(recorded["argv"], jenv, kwargs)
            except OSError:  # no such java any more
                port = None
            if port is None:  # something changed that the key does not see
                _forget_launch(key)
        if port is None:
            proc, port, secret = _start_jvm(submit, env, kwargs)
            if port is None:
                raise PySparkRuntimeError(errorClass="JAVA_GATEWAY_EXITED", messageParameters={})
            if key and remember:
                _record_launch(key, proc.pid, env)
    finally:
        if sink is not None:
            sink.close()
    _jvm_proc = proc
    try:
        gateway = connect_gateway(port, secret)  # the JVM just started
    except BaseException:
        _kill_jvm()
        raise
    gateway.proc = proc
    SparkContext._ensure_initialized(gateway=gateway)


def get_context(master: str | None = None, app_name: str = "dcptool",
                conf: dict[str, Any] | None = None):
    """The SparkContext of the active session (or of a running engine, on the command line),
    or a new one for `master` (default local[*]), without a SparkSession: the pipeline's
    own jobs (backup, restore, merge, verify --against) are RDD jobs, and building a session
    costs most of a second more (`get_spark` builds one on this context when asked)."""
    _quiet_env()
    from pyspark import SparkConf, SparkContext

    with _lock:
        if SparkContext._active_spark_context is not None:  # an active session's too
            return SparkContext._active_spark_context
        progress.stage("starting Spark")  # for a command's progress bar (none: nothing)
        attached = _engine_session(master or os.environ.get("DCPTOOL_SPARK_MASTER"))
        if attached is not None:
            if _jvm_output is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, _on_interrupt)
            return attached.sparkContext
        master = master or os.environ.get("DCPTOOL_SPARK_MASTER") or DEFAULT_MASTER
        check_master(master)
        settings = {
            "spark.master": master,
            "spark.app.name": app_name,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "8",
            "spark.python.worker.reuse": "true",
            "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{LOG4J_PROPERTIES}",
            **worker_env(master),
        }
        if master.startswith("local"):
            settings["spark.python.unix.domain.socket.enabled"] = "true"
            # workers that import PySpark compiled, and dcptool's task modules before the fork
            settings["spark.python.daemon.module"] = "dcptool.pipeline.sparkdaemon"
            settings["spark.driver.bindAddress"] = "127.0.0.1"
            # else Spark binds the driver to a non-loopback interface and warns about it; on
            # a cluster the executors connect to the driver's address, Spark's choice (the
            # host name's) unless SPARK_LOCAL_IP or spark.driver.host say otherwise
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        cds: list[str] = []
        if _jvm_output is not None:
            flags = JVM_FLAGS if _fast["jvm_flags"] else []
            cds = _cds_options(flags) if _fast["cds"] else []
            settings["spark.driver.extraJavaOptions"] = " ".join(
                [settings["spark.driver.extraJavaOptions"], *flags, *cds])
        settings.update(conf or {})
        settings = {k: str(v).lower() if isinstance(v, bool) else str(v)
                    for k, v in settings.items()}
        # the JVM and the Python daemon and workers it starts never see a password or a
        # passphrase: tasks get the connection options and data keys in their closures
        with procs.secrets_hidden():
            if _jvm_output is not None:
                # a run that writes the class-data archive names a file of its own: its
                # command is not the one the next runs need
                _launch_quiet_gateway(settings, remember=not any(
                    o.startswith("-XX:ArchiveClassesAtExit") for o in cds),
                    daemon=_fast["daemon"] and settings.get("spark.python.daemon.module")
                    == "dcptool.pipeline.sparkdaemon")
            sc = SparkContext.getOrCreate(SparkConf().setAll(list(settings.items())))
        sc.setLogLevel("ERROR")
        if _jvm_output is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _on_interrupt)
        return sc


def get_task_context(master: str | None = None):
    """`get_context` for a command whose jobs are plain RDD jobs (`run_tasks`,
    `check_executors_see`): on the command line with a running engine and no progress bar
    counting Spark's tasks, the engine runs them on the command's behalf
    (`engine.EngineJobs`: no PySpark, no gateway in this process); else `get_context`."""
    from . import engine

    if (_jvm_output is not None and not engine.disabled() and not _session_active()
            and not progress.active()):
        with _lock:
            jobs = engine.attach_jobs(master or os.environ.get("DCPTOOL_SPARK_MASTER"),
                                      note=_note_sink)
        if jobs is not None:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, _on_interrupt)
            return jobs
    return get_context(master)


def get_spark(master: str | None = None, app_name: str = "dcptool", conf: dict[str, Any] | None = None):
    """Return the active SparkSession or build one for `master` (default local[*]), on
    `get_context`'s SparkContext."""
    from pyspark.sql import SparkSession

    get_context(master, app_name, conf)
    with _lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        return SparkSession.builder.getOrCreate()  # on the SparkContext there is


def context_of(spark):
    """The SparkContext of a SparkSession, or the SparkContext itself."""
    return getattr(spark, "sparkContext", spark)


def default_parallelism(spark) -> int:
    """The default parallelism of a SparkSession's or SparkContext's cluster."""
    return max(1, context_of(spark).defaultParallelism)


def plan_groups(vbuckets: list[int], partitions: int) -> list[list[int]]:
    """Spread vbuckets round-robin over at most `partitions` groups (never one task per vbucket
    unless there are that few vbuckets)."""
    partitions = max(1, min(partitions, len(vbuckets)))
    groups: list[list[int]] = [[] for _ in range(partitions)]
    for i, vb in enumerate(sorted(vbuckets)):
        groups[i % partitions].append(vb)
    return [g for g in groups if g]


# -- the archive as the executors see it ---------------------------------------------------------

PROBE_PREFIX = ".dcptool-probe-"


def _digest(path: Any) -> str:
    from dcptool.archive import storage

    return hashlib.sha256(storage.read_bytes(storage.location(path))).hexdigest()


def probe_failures(spark, directory: str, name: str, digest: str, *, write: bool = False,
                   tasks: int | None = None) -> list[str]:
    """Run `tasks` small Spark tasks (default 2x the parallelism, so every executor gets
    some) that each read DIRECTORY/NAME and compare its SHA-256 with `digest` and, with
    `write`, create and remove a file of their own in DIRECTORY. Returns one
    "HOST: what went wrong" per executor host that failed (sorted, no duplicates)."""
    n = tasks or 2 * default_parallelism(spark)

    def probe(index, _rows):
        from dcptool.archive import storage
        from dcptool.errors import DcptoolError

        host = socket.gethostname()
        root = storage.location(directory)
        path = root / name
        try:
            if _digest(path) != digest:
                yield f"{host}: {path} differs from the driver's"
                return
            if write:
                mine = root / f"{PROBE_PREFIX}{secrets.token_hex(4)}-{index}"
                storage.atomic_write_bytes(mine, b"x")
                storage.unlink(mine)
        except FileNotFoundError as exc:
            if exc.strerror:
                yield f"{host}: {exc.strerror}{' ' + exc.filename if exc.filename else ''}"
            else:  # a missing object
                yield f"{host}: no such object {exc}"
        except OSError as exc:
            yield f"{host}: {exc.strerror or exc}{' ' + exc.filename if exc.filename else ''}"
        except DcptoolError as exc:
            yield f"{host}: {exc.message}"

    from .engine import set_job_group

    sc = context_of(spark)
    set_job_group(sc)
    found = sc.parallelize(range(n), n).mapPartitionsWithIndex(probe).collect()
    return sorted(set(found))


def check_executors_see(spark, directory: str | os.PathLike[str], *, write: bool = False,
                        name: str | None = None, always: bool = False,
                        key_travels: bool = False) -> None:
    """Fail in one line unless Spark's executors see `directory` as the driver does: the
    archive must be on a filesystem the driver and every executor share. Reads file `name`
    of the directory (with `write`, or without `name`: a probe file the driver writes and
    removes). Local masters share the driver's machine and are not checked unless `always`.
    `key_travels`: an encrypted archive's data key is about to go to the executors."""
    from dcptool.archive import storage

    from .engine import attachment

    if key_travels:  # an encrypted archive: its data key is about to travel (not local)
        check_key_transport(spark)
    root = storage.location(directory)
    # an engine's executors are the engine's processes, with the engine's environment: an
    # object store's endpoint and credentials are those the engine was started with
    on_engine = attachment() is not None
    if (not always and context_of(spark).master.startswith("local")
            and not (on_engine and storage.store_of(root).needs_credentials)):
        return
    root = storage.absolute(root)
    own = None
    if name is None or write:
        name = f"{PROBE_PREFIX}{secrets.token_hex(8)}"
        own = root / name
        storage.atomic_write_bytes(own, secrets.token_bytes(16))
    try:
        failures = probe_failures(spark, str(root), name, _digest(root / name), write=write)
    finally:
        if own is not None:
            try:
                storage.unlink(own)
            except (OSError, DcptoolError):
                pass
    if failures:
        raise not_shared(str(root), failures, engine=on_engine)


def not_shared(directory: str, failures: list[str], *, engine: bool = False) -> DcptoolError:
    """The one-line error for executors that do not see `directory` (see probe_failures);
    `engine`: they are a running dcptool engine's."""
    from dcptool.archive import storage

    more = f", and {len(failures) - 1} more hosts" if len(failures) > 1 else ""
    # a store reached with an endpoint and credentials (S3): the executors need those
    remote = storage.store_of(directory).needs_credentials
    if engine and remote:
        return DcptoolError(
            f"the dcptool engine's Spark executors cannot reach {directory} ({failures[0]}"
            f"{more}): they have the object store's endpoint and credentials the engine was "
            "started with, not this command's",
            hint="restart the engine where the S3 endpoint and credentials are set "
                 "('dcptool engine stop', then 'dcptool engine start'), or run this command "
                 "without it (DCPTOOL_ENGINE=off); nothing was written")
    if remote:
        return DcptoolError(
            f"the Spark executors cannot reach {directory} ({failures[0]}{more}): every "
            "executor needs the object store's endpoint and credentials",
            hint="see 'Archives on S3' in docs/spark.md")
    return DcptoolError(
        f"the Spark executors do not see {directory} as the driver does ({failures[0]}{more}): "
        "the archive must be on a filesystem shared by the driver and every executor",
        hint="see 'Clusters' in docs/spark.md")
