"""dcptool's Spark engine: a long-running Spark driver that commands attach to.

A cold command pays for a JVM, a SparkContext and Python workers before its first task runs;
an engine pays once. `dcptool engine start` runs `enginehost.serve()` in a process of its own: it
builds the SparkSession (local[*] or any master), warms its Python workers (they import the task
modules and stay, `spark.python.worker.reuse`), and listens on a Unix socket in the engine
directory (`engine_dir()`, mode 0700). A command that needs Spark (`runtime.get_spark`) asks
the socket first; when an engine of the same dcptool runs, the command's driver attaches to its
JVM over py4j (`attach()`) and submits its jobs there, under a job group of its own; a command
whose jobs are plain RDD jobs (a backup's) hands them to the engine instead (`attach_jobs()`,
`EngineJobs`) and needs neither PySpark nor a gateway of its own. Everything
else of the command (planning, committing, its output) stays in the command's process.

The socket speaks JSON lines:

    {"op": "attach", "fingerprint": F, "master": M}  -> {"ok": true, "group": G, "port", "secret", ...}
                                                        or {"ok": false, "why": "..."}
    {"op": "cancel"}   (on the attach connection)     -> {"ok": true} once G's tasks have ended
    {"op": "run", "group": G, "bytes": N} + N bytes   -> {"ok": true, "bytes": M} + M bytes, or
       (a connection of its own; the bytes: a         {"ok": false, "error": "..."}
       pickled job of `EngineJobs`, its result)
    {"op": "status"}                                  -> the engine's state (no secret)
    {"op": "stop", "now": bool}                       -> {"ok": true}; the engine ends once the
                                                         attached commands have (now: cancels them)

An attach connection stays open for the command's life: when it closes (the command ended,
or died), the engine cancels whatever the command's group still runs, so no task of a dead
command goes on writing into an archive whose lock has been released.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from dcptool import __version__
from dcptool.errors import DcptoolError

SOCKET = "engine.sock"
STATE = "engine.json"
LOG = "engine.log"
#: how long a cancelled command's tasks may take to end (Spark kills a Python worker that
#: does not stop within spark.python.task.killTimeout, 2 s by default)
CANCEL_WAIT = 20.0


def engine_dir() -> Path:
    """Where the engine keeps its socket, state and log: DCPTOOL_ENGINE_DIR, else
    $XDG_RUNTIME_DIR/dcptool-engine, else ~/.cache/dcptool/engine."""
    d = os.environ.get("DCPTOOL_ENGINE_DIR")
    if d:
        return Path(d).expanduser()
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run and os.path.isdir(run):
        return Path(run) / "dcptool-engine"
    return Path.home() / ".cache" / "dcptool" / "engine"


def disabled() -> bool:
    """DCPTOOL_ENGINE=off: commands never attach (each starts its own Spark)."""
    return os.environ.get("DCPTOOL_ENGINE", "").strip().lower() in ("off", "0", "no", "false")


def fingerprint() -> str:
    """What must match for a command to run on an engine: the interpreter, the PySpark and
    dcptool versions, and dcptool's code as installed (every module's size and mtime), so an
    engine never runs tasks of code older than the command's. PySpark's version is read
    from its version.py, without importing PySpark (a command on an engine may never need
    it)."""
    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{_pyspark_version()}\0{__version__}\0{pkg}\0".encode())
    for p in sorted(pkg.rglob("*.py")):
        st = p.stat()
        h.update(f"{p.relative_to(pkg)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def _pyspark_version() -> str:
    """The text of the installed PySpark's version.py ("" without PySpark)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("pyspark")
        where = list(spec.submodule_search_locations or ()) if spec is not None else []
        return (Path(where[0]) / "version.py").read_text() if where else ""
    except (OSError, ImportError, ValueError):
        return ""


# -- the socket's JSON lines ------------------------------------------------------------------

def send_json(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


class JsonLines:
    """JSON objects read off a socket, one per line."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""

    def read(self) -> dict[str, Any] | None:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
            if len(self.buf) > 1 << 20:
                raise ValueError("line too long")
        line, _, self.buf = self.buf.partition(b"\n")
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("not an object")
        return obj

    def read_bytes(self, n: int) -> bytes:
        """The next `n` bytes after the lines read (a payload that follows its header)."""
        parts, have = [self.buf[:n]], min(n, len(self.buf))
        self.buf = self.buf[n:]
        while have < n:
            chunk = self.sock.recv(min(n - have, 1 << 20))
            if not chunk:
                raise ValueError("payload cut short")
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts)


def _connect(directory: Path, timeout: float = 2.0) -> socket.socket | None:
    path = directory / SOCKET
    if not path.exists():
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
    except OSError:
        s.close()
        return None
    return s


def request(op: str, directory: Path | None = None, timeout: float = 10.0,
            **fields: Any) -> dict[str, Any] | None:
    """One request to the engine in `directory`; None when no engine answers there."""
    s = _connect(directory or engine_dir())
    if s is None:
        return None
    with s:
        s.settimeout(timeout)
        try:
            send_json(s, {"op": op, **fields})
            return JsonLines(s).read()
        except (OSError, ValueError):
            return None


# -- a command's side ------------------------------------------------------------------------

class Attachment:
    """A command's hold on an engine: the open socket, its job group, and the cancel."""

    def __init__(self, sock: socket.socket, reply: dict[str, Any]):
        self.sock, self.reply = sock, reply
        self.group: str = reply["group"]
        self.master: str = reply["master"]
        self._lock = threading.Lock()

    def cancel(self, timeout: float = CANCEL_WAIT + 5) -> bool:
        """Cancel this command's jobs and wait until their tasks have ended."""
        with self._lock:
            try:
                self.sock.settimeout(timeout)
                send_json(self.sock, {"op": "cancel"})
                reply = JsonLines(self.sock).read()
                return bool(reply and reply.get("ok"))
            except (OSError, ValueError):
                return False


_attachment: Attachment | None = None


def attachment() -> Attachment | None:
    """This process's attachment to an engine, if it made one."""
    return _attachment


#: the engine refused this process once (another dcptool, stopping, another master): it
#: would again, and the command said why already
_refused = False


def _attach_socket(master: str | None, note=None) -> tuple[socket.socket, dict[str, Any]] | None:
    """(the attach connection, the engine's reply), or None (see `attach`)."""
    global _refused
    if disabled() or _refused:
        return None
    directory = engine_dir()
    sock = _connect(directory)
    if sock is None:
        return None
    try:
        sock.settimeout(10.0)
        send_json(sock, {"op": "attach", "fingerprint": fingerprint(), "master": master or ""})
        reply = JsonLines(sock).read()
    except (OSError, ValueError):
        sock.close()
        return None
    if not reply or not reply.get("ok"):
        sock.close()
        if reply is not None:
            _refused = True
        if reply and reply.get("why") and note is not None:
            note(reply["why"])
        return None
    sock.settimeout(None)
    return sock, reply


def attach(master: str | None, note=None):
    """Attach this process to a running engine and return a SparkSession on its JVM, or None
    (no engine, DCPTOOL_ENGINE=off, another master asked for, or an engine of another dcptool:
    `note` is told why in that case)."""
    global _attachment
    got = _attach_socket(master, note)
    if got is None:
        return None
    sock, reply = got
    try:
        spark = _session_on(reply)
    except Exception:  # noqa: BLE001 - an engine that cannot be used is no engine
        sock.close()
        return None
    _attachment = Attachment(sock, reply)
    spark.sparkContext.setJobGroup(_attachment.group, "dcptool command", interruptOnCancel=True)
    return spark


_jobs: EngineJobs | None = None


def attach_jobs(master: str | None, note=None) -> EngineJobs | None:
    """Attach this process to a running engine for jobs the engine runs on its behalf
    (`EngineJobs`): no PySpark, no py4j gateway in this process. None as for `attach`."""
    global _attachment, _jobs
    if _jobs is not None:
        return _jobs
    got = _attach_socket(master, note)
    if got is None:
        return None
    _attachment = Attachment(*got)
    _jobs = EngineJobs(_attachment)
    return _jobs


class EngineJobError(Exception):
    """A job the engine ran for this command failed: the text of Spark's error (which
    carries a failed task's cause, see pipeline/tasks.py)."""


class _Conf:
    def __init__(self, values: dict[str, Any]):
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class EngineJobs:
    """What a command's RDD jobs need of a SparkContext (`master`, `defaultParallelism`,
    `parallelize(...).map(...).collect()`, `mapPartitions`, `mapPartitionsWithIndex`),
    run by the engine: a job and its functions go to the engine pickled on a connection of
    their own (`{"op": "run", "group": G, "bytes": N}` and N bytes), the engine runs it in
    the command's job group and sends back the pickled result (or the error's text). A
    command that uses it never imports PySpark nor builds a SparkContext of its own."""

    def __init__(self, attachment: Attachment):
        self.attachment = attachment
        self.group = attachment.group
        self.master: str = attachment.master
        self.defaultParallelism: int = int(attachment.reply.get("parallelism") or 1)
        self._conf = _Conf(attachment.reply.get("conf") or {})

    def getConf(self) -> _Conf:  # noqa: N802 - SparkContext's name
        return self._conf

    def setJobGroup(self, *args: Any, **kwargs: Any) -> None:  # noqa: N802
        pass  # every job runs in the attachment's group

    def getLocalProperty(self, key: str) -> str | None:  # noqa: N802
        return self.group if key == "spark.jobGroup.id" else None

    def parallelize(self, data: Any, numSlices: int | None = None) -> _EngineRDD:  # noqa: N803
        return _EngineRDD(self, list(data), numSlices or self.defaultParallelism, ())

    def run(self, data: list, slices: int, ops: tuple) -> list:
        import pickle

        import cloudpickle

        payload = cloudpickle.dumps((data, slices, ops), protocol=pickle.HIGHEST_PROTOCOL)
        sock = _connect(engine_dir(), timeout=10.0)
        if sock is None:
            raise EngineJobError("the dcptool engine went away")
        with sock:
            sock.sendall(json.dumps({"op": "run", "group": self.group,
                                     "bytes": len(payload)}).encode() + b"\n" + payload)
            sock.settimeout(None)
            lines = JsonLines(sock)
            reply = lines.read()
            if reply is None:
                raise EngineJobError("the dcptool engine went away during the job")
            if not reply.get("ok"):
                raise EngineJobError(str(reply.get("error") or reply.get("why") or "failed"))
            return pickle.loads(lines.read_bytes(int(reply["bytes"])))


class _EngineRDD:
    def __init__(self, jobs: EngineJobs, data: list, slices: int, ops: tuple):
        self.jobs, self.data, self.slices, self.ops = jobs, data, slices, ops

    def _then(self, kind: str, fn: Any) -> _EngineRDD:
        return _EngineRDD(self.jobs, self.data, self.slices, (*self.ops, (kind, fn)))

    def map(self, fn: Any) -> _EngineRDD:
        return self._then("map", fn)

    def mapPartitions(self, fn: Any) -> _EngineRDD:  # noqa: N802
        return self._then("mapPartitions", fn)

    def mapPartitionsWithIndex(self, fn: Any) -> _EngineRDD:  # noqa: N802
        return self._then("mapPartitionsWithIndex", fn)

    def collect(self) -> list:
        return self.jobs.run(self.data, self.slices, self.ops)


def connect_gateway(port: int, secret: str):
    """PySpark's py4j gateway to a JVM that is already running and listening at `port`
    (PySpark connects instead of launching when its PYSPARK_GATEWAY_* variables are set;
    they are set for this call only)."""
    from pyspark.java_gateway import launch_gateway

    saved = {k: os.environ.get(k) for k in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    os.environ["PYSPARK_GATEWAY_PORT"] = str(port)
    os.environ["PYSPARK_GATEWAY_SECRET"] = secret
    try:
        return launch_gateway()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _session_on(reply: dict[str, Any]):
    """A SparkSession of this process on the engine's JVM (its SparkContext, shared)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = connect_gateway(reply["port"], reply["secret"])
    jvm = gateway.jvm
    jsc = jvm.org.apache.spark.api.java.JavaSparkContext.fromSparkContext(
        jvm.org.apache.spark.SparkContext.getOrCreate())
    sc = SparkContext(gateway=gateway, jsc=jsc)
    return SparkSession(sc, jvm.org.apache.spark.sql.SparkSession.active())


def set_job_group(spark) -> None:
    """Put the calling thread's next jobs in this command's group (job groups belong to a
    thread); nothing without an attachment."""
    a = _attachment
    if a is not None:
        sc = getattr(spark, "sparkContext", spark)  # a SparkSession or a SparkContext
        sc.setJobGroup(a.group, "dcptool command", interruptOnCancel=True)


def prepare_dir(directory: Path) -> None:
    """Create the engine directory, private to the user (it holds a socket that lets a
    process run code in the engine)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = directory.stat()
    if st.st_uid != os.getuid():
        raise DcptoolError(f"{directory} belongs to another user",
                           hint="set DCPTOOL_ENGINE_DIR to a directory of your own", exit_code=2)
    os.chmod(directory, 0o700)
