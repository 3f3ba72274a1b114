"""dcptool's Spark engine: a long-running Spark driver that commands attach to.

A cold command pays for a JVM, a SparkContext and Python workers before its first task runs;
an engine pays once. `dcptool engine start` runs `enginehost.serve()` in a process of its own: it
builds the SparkSession (local[*] or any master), warms its Python workers (they import the task
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
        send_json(sock, {"op": "attach", "fingerprint": fingerprint(), "master": master or ""})
        reply = JsonLines(sock).read()
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
