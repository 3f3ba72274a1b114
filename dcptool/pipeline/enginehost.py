"""The engine process of `dcptool engine start` (see pipeline/engine.py, the commands' side).

`serve()` builds the SparkSession, warms the Python workers and the JVM's task path, and
serves the engine's socket: commands attach, cancel their jobs, ask for the status, or stop
the engine.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from dcptool import __version__

from . import runtime
from .engine import CANCEL_WAIT, LOG, SOCKET, STATE, JsonLines, send_json, fingerprint, prepare_dir


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
        os.environ["DCPTOOL_ENGINE"] = "off"  # the engine itself never attaches to one
        # a long-lived JVM: the full JIT (the command line's C1-only flag trades its
        # throughput for a faster start); the class-data archive still helps
        runtime.long_lived_jvm()
        self.spark = runtime.get_spark(self.requested_master, app_name="dcptool-engine")
        self.master = self.spark.sparkContext.master
        self._warm()
        self.ready_seconds = time.time() - self.started

    def _warm(self) -> None:
        """Start the Python workers and have them import the task modules, so a command's
        first task does not pay for it."""
        n = 2 * runtime.default_parallelism(self.spark)

        def imports(_rows):
            from dcptool.pipeline.sparkdaemon import import_task_modules

            import_task_modules()
            yield os.getpid()

        # a few rounds of Python tasks, so the JVM has compiled its task path before the
        # first command comes
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
        with self.lock:
            running_now = len(self.attached)
        return {"running": True, "pid": os.getpid(), "master": self.master,
                "parallelism": runtime.default_parallelism(self.spark),
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
        lines = JsonLines(conn)
        try:
            while True:
                try:
                    msg = lines.read()
                except (ValueError, UnicodeDecodeError):
                    send_json(conn, {"ok": False, "why": "bad request"})
                    return
                if msg is None:
                    return
                op = msg.get("op")
                if op == "status":
                    send_json(conn, self.status())
                elif op == "attach" and group is None:
                    group = self._attach(conn, msg)
                elif op == "run":
                    self._run(conn, msg, lines)
                    return
                elif op == "cancel" and group is not None:
                    self.cancel(group)
                    send_json(conn, {"ok": True})
                elif op == "stop":
                    self._stop(bool(msg.get("now")))
                    send_json(conn, {"ok": True})
                else:
                    send_json(conn, {"ok": False, "why": f"unknown request {op!r}"})
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
            send_json(conn, {"ok": False, "why": why})
            return None
        group = f"dcptool-{secrets.token_hex(6)}"
        gp = self.spark.sparkContext._gateway.gateway_parameters
        with self.lock:
            self.attached[group] = time.time()
            self.served += 1
        conf = self.spark.sparkContext.getConf()
        send_json(conn, {"ok": True, "group": group, "master": self.master,
                         "port": gp.port, "secret": gp.auth_token,
                         "parallelism": runtime.default_parallelism(self.spark),
                         "conf": {k: conf.get(k) for k in runtime.KEY_TRANSPORT_CONF}})
        return group

    def _run(self, conn: socket.socket, msg: dict[str, Any], lines: JsonLines) -> None:
        """Run a job an attached command handed over (engine.EngineJobs) in its group and
        send back its pickled result, or the error's text."""
        import pickle

        group = msg.get("group")
        with self.lock:
            known = group in self.attached
        if not known:
            send_json(conn, {"ok": False, "error": "no such attached command"})
            return
        try:
            data, slices, ops = pickle.loads(lines.read_bytes(int(msg["bytes"])))
        except Exception as exc:  # noqa: BLE001 - a bad request is told, not raised
            send_json(conn, {"ok": False, "error": f"bad job: {exc}"})
            return
        sc = self.spark.sparkContext
        try:
            sc.setJobGroup(group, "dcptool command", interruptOnCancel=True)
            rdd = sc.parallelize(data, slices)
            for kind, fn in ops:
                rdd = getattr(rdd, kind)(fn)
            out = pickle.dumps(rdd.collect(), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - the command gets its text (task_failure)
            send_json(conn, {"ok": False, "error": str(exc) or type(exc).__name__})
            return
        conn.sendall(json.dumps({"ok": True, "bytes": len(out)}).encode() + b"\n" + out)

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
