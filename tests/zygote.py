"""`python -m dcptool` processes for the tests, forked from a warm parent.

Every `python -m dcptool ...` a test starts pays for the interpreter and for importing
dcptool, typer, rich and the rest (about a second of CPU) before it does anything; the
suite starts some hundreds of them (nodes and commands). A zygote is one process per test
process (per xdist worker) that imports all of that once and then forks a child for each
command: the child is a process of its own, with the test's argv, environment, working
directory, umask and standard streams, that runs `dcptool/__main__.py` as `python -m
dcptool` would and exits with its status. Nothing of the test process is shared with it.

    proc = zygote.popen(["node", "start", ...], env=env, stdout=subprocess.PIPE, stderr=f)
    res = zygote.run(["doc", "get", "k"], env=env, cwd=REPO, timeout=60)  # CompletedProcess

Each child starts a session of its own (as `start_new_session=True` would), so a
command's fault injection that kills its process group cannot reach the test. Where a
fresh interpreter matters, the command runs as a real `python -m dcptool` instead: an
environment whose PYTHON* variables (the module path, above all) differ from the ones the
zygote started with, or DCPTOOL_TEST_ZYGOTE=0.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: variables a fresh interpreter reads at its start (or dcptool at import): a command whose
#: environment sets them otherwise than the zygote's runs as a real process
_STARTUP_VARS = ("PYTHON", "DCPTOOL_S3_UPLOAD_MEMORY", "LD_")

# -- the zygote's side -----------------------------------------------------------------------


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _stream(fd: int, write: bool, like):
    """A text stream on `fd` made as Python makes its standard streams at start-up."""
    import io

    raw = io.FileIO(fd, "w" if write else "r", closefd=False)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED")) and write
    tty = raw.isatty()
    if unbuffered:
        buf = raw
    else:
        buf = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
    return io.TextIOWrapper(buf, encoding=like.encoding, errors=like.errors,
                            line_buffering=tty or (write and fd == 2),
                            write_through=unbuffered)


def _child(req: dict, fds: list[int], close: list) -> None:
    """In the forked child: become the command and run it; never returns."""
    code = 1
    try:
        os.setsid()
        for s in close:
            try:
                s.close() if hasattr(s, "close") else os.close(s)
            except OSError:
                pass
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.umask(req["umask"])
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        tempfile.tempdir = None
        sys.path[0] = os.getcwd()  # what `-m` puts first
        sys.stdin = sys.__stdin__ = _stream(0, False, sys.__stdin__ or sys.stdin)
        sys.stdout = sys.__stdout__ = _stream(1, True, sys.__stdout__ or sys.stdout)
        sys.stderr = sys.__stderr__ = _stream(2, True, sys.__stderr__ or sys.stderr)
        import runpy

        main = Path(sys.modules["dcptool"].__file__).parent / "__main__.py"
        sys.argv = [str(main), *req["args"]]
        try:
            runpy.run_module("dcptool", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, 1
            import traceback

            traceback.print_exc()
            code = 1
        # what the interpreter does at its end: wait for threads, run atexit, flush
        try:
            threading._shutdown()  # type: ignore[attr-defined]
        except BaseException:  # noqa: BLE001
            pass
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001
            pass
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:  # noqa: BLE001
                pass
    finally:
        os._exit(code & 0xFF if code >= 0 else 1)


def _warm_up() -> None:
    """What every child would otherwise import (or build) for itself, done once here: all
    of dcptool's commands, the node's REST side (aiohttp, 0.15 s of CPU per node), and the
    parts typer imports while it builds and parses a command line."""
    import importlib
    import runpy  # noqa: F401 - how the child runs dcptool/__main__.py

    import dcptool  # noqa: F401
    import dcptool.cli.app

    for name in ("dcptool.node.server", "dcptool.node.rest", "dcptool.node.restbuckets",
                 "dcptool.node.bucketshare", "dcptool.node.loginguard",
                 "dcptool.node.configpush", "dcptool.pipeline.runtime", "dcptool.runlog",
                 "dcptool.client.routing", "dcptool.client.watermark", "logging.handlers",
                 "zoneinfo", "sysconfig", "typer._adapters", "rich._emoji_codes",
                 # what archive commands import as they go (a cluster archive, a chain's
                 # plan, point-in-time rules), and the pure-Python half of starting Spark
                 # (no native library that starts threads at import: a fork keeps none)
                 "dcptool.archive.cluster", "dcptool.archive.clusterread",
                 "dcptool.cli.clusterarchive", "dcptool.archive.merging",
                 "dcptool.archive.packing", "dcptool.archive.retention",
                 "dcptool.archive.pointintime", "dcptool.cli.timeline",
                 "dcptool.pipeline.tasks", "dcptool.pipeline.plans",
                 "dcptool.pipeline.nodeinfo", "dcptool.pipeline.continuous",
                 "dcptool.pipeline.backup", "dcptool.pipeline.engine", "_strptime",
                 "cloudpickle", "py4j.java_gateway", "pyspark"):
        importlib.import_module(name)

    dcptool.cli.app.register()  # every command's module
    import typer.main

    typer.main.get_command(dcptool.cli.app.app)  # typer's lazy imports (the tree is dropped)
    import typer._click.decorators  # noqa: F401
    from pydantic.plugin import _loader

    _loader.get_plugins()  # pydantic reads every installed distribution's entry points once


def serve(path: str) -> None:
    """The zygote: import dcptool once, then fork a command for each request on the Unix
    socket at `path` and report its exit status on the request's connection."""
    _warm_up()

    parent = os.getppid()
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(64)
    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    conns: dict[int, socket.socket] = {}
    while True:
        try:
            ready, _, _ = select.select([lsock, rfd], [], [], 1.0)
        except InterruptedError:
            ready = []
        if os.getppid() != parent:  # the test process is gone
            return
        if rfd in ready:
            try:
                while os.read(rfd, 512):
                    pass
            except BlockingIOError:
                pass
        while conns:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = conns.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass
                conn.close()
        if lsock in ready:
            conn, _ = lsock.accept()
            try:
                size = struct.unpack("!I", _recv_exact(conn, 4))[0]
                msg, fds, _flags, _addr = socket.recv_fds(conn, size, 3)
                while len(msg) < size:
                    msg += _recv_exact(conn, size - len(msg))
                req = json.loads(msg)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                _child(req, fds, [lsock, rfd, wfd, conn, *conns.values()])
            for fd in fds:
                os.close(fd)
            conn.sendall(struct.pack("!i", pid))
            conns[pid] = conn


# -- the test's side -------------------------------------------------------------------------


class ZygoteProcess:
    """A command forked by the zygote, as much of subprocess.Popen as the tests use."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, stdout=None):
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = stdout
        self._conn = conn

    def _read_status(self, timeout: float | None) -> bool:
        if self.returncode is not None:
            return True
        r, _, _ = select.select([self._conn], [], [], timeout)
        if not r:
            return False
        try:
            data = _recv_exact(self._conn, 4)
            self.returncode = struct.unpack("!i", data)[0]
        except (OSError, EOFError):
            self.returncode = -signal.SIGKILL  # the zygote went away
        self._conn.close()
        return True

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="dcpzyg-")  # short: a socket path's limit
        self.path = os.path.join(self._dir, "z.sock")
        self.env = {k: v for k, v in os.environ.items() if k != "DCPTOOL_TEST_ZYGOTE"}
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import zygote; zygote.serve({self.path!r})")
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=self.env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the test zygote did not start")
            time.sleep(0.02)

    def fits(self, env: dict[str, str]) -> bool:
        """Whether a command with `env` may be forked (else: a real process)."""
        if env.get("DCPTOOL_TEST_ZYGOTE") == "0":
            return False
        keys = {k for k in set(env) | set(self.env) if k.startswith(_STARTUP_VARS)}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def start(self, args: list[str], env: dict[str, str], cwd, fds: list[int],
              stdout=None) -> ZygoteProcess:
        umask = os.umask(0o22)
        os.umask(umask)
        msg = json.dumps({"args": [str(a) for a in args], "env": env,
                          "cwd": str(cwd or os.getcwd()), "umask": umask}).encode()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        conn.sendall(struct.pack("!I", len(msg)))
        socket.send_fds(conn, [msg], fds)
        pid = struct.unpack("!i", _recv_exact(conn, 4))[0]
        return ZygoteProcess(list(args), conn, pid, stdout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        try:
            os.unlink(self.path)
            os.rmdir(self._dir)
        except OSError:
            pass


_zygote: Zygote | None = None
_lock = threading.Lock()


def _get() -> Zygote | None:
    global _zygote
    if os.environ.get("DCPTOOL_TEST_ZYGOTE") == "0":
        return None
    with _lock:
        if _zygote is None or _zygote.proc.poll() is not None:
            try:
                _zygote = Zygote()
            except (OSError, RuntimeError):
                return None
            atexit.register(_zygote.stop)
        return _zygote


def _fd_of(spec, default: int, mode: str, opened: list[int]) -> int:
    if spec is None:
        return default
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
        opened.append(fd)
        return fd
    if isinstance(spec, int):
        return spec
    return spec.fileno()


def popen(args: list[str], *, env: dict[str, str], cwd=None, stdin=None, stdout=None,
          stderr=None, zygote: Zygote | None = None):
    """`python -m dcptool ARGS` started as subprocess.Popen would (stdin, stdout and
    stderr: None, DEVNULL, PIPE for stdout, or a file), forked by the zygote (this test
    process's, or `zygote`) when it can."""
    z = zygote or _get()
    if z is None or not z.fits(env):
        return subprocess.Popen([sys.executable, "-m", "dcptool", *map(str, args)], env=env,
                                cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr)
    opened: list[int] = []
    out_file = None
    try:
        fd0 = _fd_of(stdin, 0, "r", opened)
        if stdout == subprocess.PIPE:
            r, w = os.pipe()
            opened.append(w)
            out_file = os.fdopen(r, "rb")
            fd1 = w
        else:
            fd1 = _fd_of(stdout, 1, "w", opened)
        fd2 = fd1 if stderr == subprocess.STDOUT else _fd_of(stderr, 2, "w", opened)
        return z.start(list(args), env, cwd, [fd0, fd1, fd2], out_file)
    finally:
        for fd in opened:
            os.close(fd)


def run(args, *, env: dict[str, str], cwd=None, input: str | None = None,
        timeout: float | None = None, zygote: Zygote | None = None
        ) -> subprocess.CompletedProcess:
    """subprocess.run(`python -m dcptool ARGS`, capture_output=True, text=True, stdin
    DEVNULL or `input`), forked by the zygote (this test process's, or `zygote`) when it
    can."""
    args = [str(a) for a in args]
    z = zygote or _get()
    if z is None or not z.fits(env):
        return subprocess.run([sys.executable, "-m", "dcptool", *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL if input is None else None,
                              input=input)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryFile() as inp:
        if input is not None:
            inp.write(input.encode())
            inp.flush()
            inp.seek(0)
        stdin = inp if input is not None else subprocess.DEVNULL
        proc = popen(args, env=env, cwd=cwd, stdin=stdin, stdout=out, stderr=err, zygote=z)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, "-m", "dcptool", *args],
                                           proc.returncode, _text(out.read()), _text(err.read()))


def _text(data: bytes) -> str:
    """As subprocess.run(text=True) reads a stream: UTF-8, universal newlines."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
