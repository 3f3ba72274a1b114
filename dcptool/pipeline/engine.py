"""dcptool's Spark engine: a long-running Spark driver that commands attach to.

A cold command pays for a JVM, a SparkContext and Python workers before its first task runs;
an engine pays once. `dcptool engine start` runs `serve()` in a process of its own: it builds
the SparkSession (local[*] or any master), warms its Python workers (they import the task
modules and stay, `spark.python.worker.reuse`), and listens on a Unix socket in the engine
directory (`engine_dir()`, mode 0700). A command that needs Spark (`runtime.get_spark`) asks
the socket first; when an engine of the same dcptool runs, the command's driver attaches to its
JVM over py4j (`attach()`) and submits its jobs there, under a job group of its own. Everything
else of the command (planning, committing, its output) stays in the command's process.

The socket speaks JSON lines:

    {"op": "attach", "fingerprint": F, "master": M}  -> {"ok": true, "group": G, "port", "secret", ...}
                                                        or {"ok": false, "why": "..."}
    {"op": "cancel"}   (on the attach connection)     -> {"ok": true} once G's tasks have ended
    {"op": "status"}                                  -> the engine's state (no secret)
    {"op": "stop", "now": bool}                       -> {"ok": true}; the engine ends once the
                                                         attached commands have (now: cancels them)

An attach connection stays open for the command's life: when it closes (the command ended,
or died), the engine cancels whatever the command's group still runs, so no task of a dead
command goes on writing into an archive whose lock has been released.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
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
    engine never runs tasks of code older than the command's."""
    import pyspark

    pkg = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    h.update(f"{sys.executable}\0{pyspark.__version__}\0{__version__}\0{pkg}\0".encode())
    for p in sorted(pkg.rglob("*.py")):
        st = p.stat()
        h.update(f"{p.relative_to(pkg)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


# -- the socket's JSON lines ------------------------------------------------------------------

def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


class _Lines:
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
            _send(s, {"op": op, **fields})
            return _Lines(s).read()
        except (OSError, ValueError):
            return None


def running(directory: Path | None = None) -> bool:
    """Whether an engine answers in `directory` (a socket file alone is not enough)."""
    return (directory or engine_dir()).joinpath(SOCKET).exists() and \
        request("status", directory, timeout=2.0) is not None


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
                _send(self.sock, {"op": "cancel"})
                reply = _Lines(self.sock).read()
                return bool(reply and reply.get("ok"))
            except (OSError, ValueError):
                return False


_attachment: Attachment | None = None


def attachment() -> Attachment | None:
    """This process's attachment to an engine, if it made one."""
    return _attachment


def attach(master: str | None, note=None):
    """Attach this process to a running engine and return a SparkSession on its JVM, or None
    (no engine, DCPTOOL_ENGINE=off, another master asked for, or an engine of another dcptool:
    `note` is told why in that case)."""
    global _attachment
    if disabled():
        return None
    directory = engine_dir()
    sock = _connect(directory)
    if sock is None:
        return None
    try:
        sock.settimeout(10.0)
        _send(sock, {"op": "attach", "fingerprint": fingerprint(), "master": master or ""})
        reply = _Lines(sock).read()
    except (OSError, ValueError):
        sock.close()
        return None
    if not reply or not reply.get("ok"):
        sock.close()
        if reply and reply.get("why") and note is not None:
            note(reply["why"])
        return None
    sock.settimeout(None)
    try:
        spark = _session_on(reply)
    except Exception:  # noqa: BLE001 - an engine that cannot be used is no engine
        sock.close()
        return None
    _attachment = Attachment(sock, reply)
    spark.sparkContext.setJobGroup(_attachment.group, "dcptool command", interruptOnCancel=True)
    return spark


def _session_on(reply: dict[str, Any]):
    """A SparkSession of this process on the engine's JVM (its SparkContext, shared)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")}
    os.environ["PYSPARK_GATEWAY_PORT"] = str(reply["port"])
    os.environ["PYSPARK_GATEWAY_SECRET"] = reply["secret"]
    try:
        gateway = launch_gateway()  # connects to the running JVM: nothing is launched
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
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


# -- the engine's side -----------------------------------------------------------------------

class Engine:
    """The engine process: a SparkSession, the socket, and the attached commands."""

    def __init__(self, directory: Path, master: str | None):
        self.directory = directory
        self.requested_master = master
        self.spark: Any = None
        self.fingerprint = fingerprint()
        self.started = time.time()
        self.ready_seconds = 0.0
        self.served = 0
        self.attached: dict[str, float] = {}  # group -> attached at
        self.stopping = False
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.server: socket.socket | None = None

    # the Spark side
    def start_spark(self) -> None:
        from . import runtime

        os.environ["DCPTOOL_ENGINE"] = "off"  # the engine itself never attaches to one
        # a long-lived JVM: the full JIT (the command line's C1-only flag trades its
        # throughput for a faster start); the class-data archive still helps
        runtime._fast["jvm_flags"] = False
        self.spark = runtime.get_spark(self.requested_master, app_name="dcptool-engine")
        self.master = self.spark.sparkContext.master
        self._warm()
        self.ready_seconds = time.time() - self.started

    def _warm(self) -> None:
        """Start the Python workers and have them import the task modules, so a command's
        first task does not pay for it."""
        from .runtime import default_parallelism

        n = 2 * default_parallelism(self.spark)

        def imports(_rows):
            import dcptool.pipeline.backup  # noqa: F401
            import dcptool.pipeline.compare  # noqa: F401
            import dcptool.pipeline.merge  # noqa: F401
            import dcptool.pipeline.restore  # noqa: F401
            yield os.getpid()

        # a few rounds of tasks shaped like a command's (a task spec in, summaries out), so
        # the JVM has compiled its task path before the first command comes
        for _ in range(4):
            self.spark.sparkContext.parallelize(range(4 * n), 4 * n).mapPartitions(imports) \
                .collect()

    def cancel(self, group: str) -> None:
        """Cancel `group`'s jobs and wait (at most CANCEL_WAIT) until none of its tasks runs."""
        sc = self.spark.sparkContext
        sc.cancelJobGroup(group)
        tracker = sc._jsc.sc().statusTracker()
        deadline = time.monotonic() + CANCEL_WAIT
        while time.monotonic() < deadline:
            busy = False
            for job in tracker.getJobIdsForGroup(group):
                info = tracker.getJobInfo(job)
                if info.isEmpty():
                    continue
                for stage in info.get().stageIds():
                    st = tracker.getStageInfo(stage)
                    if not st.isEmpty() and st.get().numActiveTasks() > 0:
                        busy = True
            if not busy:
                return
            time.sleep(0.1)

    def status(self) -> dict[str, Any]:
        from .runtime import default_parallelism

        with self.lock:
            running_now = len(self.attached)
        return {"running": True, "pid": os.getpid(), "master": self.master,
                "parallelism": default_parallelism(self.spark),
                "version": __version__, "started_at": self.started,
                "uptime_s": round(time.time() - self.started, 1),
                "ready_s": round(self.ready_seconds, 2),
                "commands_served": self.served, "commands_running": running_now,
                "stopping": self.stopping, "directory": str(self.directory),
                "log": str(self.directory / LOG)}

    # the socket side
    def serve_forever(self, ready=None) -> None:
        path = self.directory / SOCKET
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            server.bind(str(path))
        finally:
            os.umask(old)
        server.listen(64)
        self.server = server
        _write_state(self.directory, {k: v for k, v in self.status().items()})
        threading.Thread(target=self._accept, daemon=True).start()
        if ready is not None:
            ready(self.status())
        self.stopped.wait()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        group = None
        lines = _Lines(conn)
        try:
            while True:
                try:
                    msg = lines.read()
                except (ValueError, UnicodeDecodeError):
                    _send(conn, {"ok": False, "why": "bad request"})
                    return
                if msg is None:
                    return
                op = msg.get("op")
                if op == "status":
                    _send(conn, self.status())
                elif op == "attach" and group is None:
                    group = self._attach(conn, msg)
                elif op == "cancel" and group is not None:
                    self.cancel(group)
                    _send(conn, {"ok": True})
                elif op == "stop":
                    self._stop(bool(msg.get("now")))
                    _send(conn, {"ok": True})
                else:
                    _send(conn, {"ok": False, "why": f"unknown request {op!r}"})
        except OSError:
            pass
        finally:
            conn.close()
            if group is not None:
                with contextlib.suppress(Exception):  # the JVM may be gone at shutdown
                    self.cancel(group)
                with self.lock:
                    self.attached.pop(group, None)
                self._maybe_end()

    def _attach(self, conn: socket.socket, msg: dict[str, Any]) -> str | None:
        why = None
        if self.stopping:
            why = "the dcptool engine is stopping; this command starts its own Spark"
        elif msg.get("fingerprint") != self.fingerprint:
            why = ("the running dcptool engine runs another dcptool installation or version; "
                   "this command starts its own Spark (restart the engine: dcptool engine stop, "
                   "then dcptool engine start)")
        elif msg.get("master") and msg["master"] != self.master:
            why = ""  # another master asked for on purpose: nothing to say
        if why is not None:
            _send(conn, {"ok": False, "why": why})
            return None
        group = f"dcptool-{secrets.token_hex(6)}"
        gp = self.spark.sparkContext._gateway.gateway_parameters
        with self.lock:
            self.attached[group] = time.time()
            self.served += 1
        _send(conn, {"ok": True, "group": group, "master": self.master,
                     "port": gp.port, "secret": gp.auth_token})
        return group

    def _stop(self, now: bool) -> None:
        self.stopping = True
        if now:
            with self.lock:
                groups = list(self.attached)
            for g in groups:
                with contextlib.suppress(Exception):
                    self.cancel(g)
        self._maybe_end()

    def _maybe_end(self) -> None:
        with self.lock:
            if not self.stopping or self.attached:
                return
        self.stopped.set()

    def shutdown(self) -> None:
        if self.server is not None:
            with contextlib.suppress(OSError):
                self.server.close()
        for name in (SOCKET, STATE):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / name).unlink()
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.stop()


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / (STATE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(tmp, directory / STATE)


def prepare_dir(directory: Path) -> None:
    """Create the engine directory, private to the user (it holds a socket that lets a
    process run code in the engine)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = directory.stat()
    if st.st_uid != os.getuid():
        raise DcptoolError(f"{directory} belongs to another user",
                           hint="set DCPTOOL_ENGINE_DIR to a directory of your own", exit_code=2)
    os.chmod(directory, 0o700)


def serve(directory: Path, master: str | None, ready=None) -> None:
    """Run an engine in this process until it is stopped (`stop` request, SIGTERM or
    SIGINT). `ready(status)` is called once it serves."""
    prepare_dir(directory)
    os.environ.setdefault("DCPTOOL_SPARK_LOG", str(directory / LOG))
    engine = Engine(directory, master)

    def on_signal(signum, frame):  # noqa: ARG001
        engine._stop(now=True)
        engine.stopped.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
    try:
        engine.start_spark()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, on_signal)
        engine.serve_forever(ready)
    finally:
        engine.shutdown()
