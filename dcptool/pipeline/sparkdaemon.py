"""Spark's Python worker daemon, as local Spark runs it for dcptool (`spark.python.daemon.module`).

Spark puts its own `python/lib/pyspark.zip` first on the workers' path. Python keeps no
compiled code for modules imported from a zip: every daemon compiles PySpark's modules from
source, and so does every worker it forks (a worker imports `pyspark.worker` after the fork),
most of a second of a cold command's first job. With the PySpark package installed (pip
installs both, the same version) this daemon imports PySpark from the package instead, and
imports dcptool's task modules once, before it forks its workers; then it is PySpark's daemon.
Anything unexpected and it is PySpark's daemon as Spark would have started it.

A command that starts its own local Spark does not wait for those imports either: while the
JVM starts, the driver starts `python -m dcptool.pipeline.sparkdaemon --prepare SOCKET`, which
imports everything and waits. When Spark then starts this module as its daemon (the driver
gave the JVM SOCKET in DCPTOOL_SPARK_DAEMON), it hands its standard streams, environment,
working directory and path to the prepared process, which becomes the daemon; this process
stays as Spark's handle on it (a SIGTERM is passed on) until it ends. A prepared process
started under other interpreter settings than Spark gives its daemon declines, and this
module is the daemon itself.
"""
from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import sys

#: the socket of a daemon prepared by the driver (in the environment Spark gives the daemon;
#: runtime.PREPARED_DAEMON)
PREPARED = "DCPTOOL_SPARK_DAEMON"
#: what an interpreter takes from its environment when it starts (PYTHONPATH aside: the
#: path is handed over), and what native libraries read when they load
_START_ENV = re.compile(r"PYTHON[A-Z]+$|OMP_NUM_THREADS$")


def _spark_zips() -> list[str]:
    return [p for p in sys.path
            if p.endswith(".zip") and os.path.basename(p).startswith(("pyspark", "py4j"))]


def prefer_installed_pyspark() -> None:
    zips = _spark_zips()
    if not zips:
        return
    kept = list(sys.path)
    sys.path[:] = [p for p in sys.path if p not in zips]
    try:
        import pyspark  # noqa: F401 - from the installed package, or not at all
    except ImportError:
        sys.path[:] = kept
        for name in [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")]:
            del sys.modules[name]


def import_task_modules() -> None:
    """Import the modules whose functions Spark tasks run (backup, restore, merge, verify),
    and numpy, which the archive's block writer imports on its first block (kept out of the
    command line's start): 0.2 s of CPU in every worker's first task otherwise."""
    import numpy  # noqa: F401

    import dcptool.pipeline.backup  # noqa: F401
    import dcptool.pipeline.compare  # noqa: F401
    import dcptool.pipeline.merge  # noqa: F401
    import dcptool.pipeline.restore  # noqa: F401


def warm_imports() -> None:
    try:
        import_task_modules()
    except Exception:  # noqa: BLE001 - the task imports it again and says what is wrong
        pass


def start_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if _START_ENV.match(k) and k != "PYTHONPATH"}


# -- the prepared daemon ------------------------------------------------------------------------

def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return buf


def prepare(path: str) -> None:
    """Import what a daemon and its workers need, wait at `path` for the daemon Spark starts
    (or for the driver to end: our standard input closes), and become that daemon."""
    prefer_installed_pyspark()
    from pyspark.daemon import manager

    warm_imports()
    mine = start_env(dict(os.environ))
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lsock.bind(path)
        lsock.listen(1)
        while True:
            ready = select.select([lsock, 0], [], [])[0]
            if 0 in ready and not os.read(0, 1):
                return  # the driver is gone
            if lsock not in ready:
                continue
            conn, _ = lsock.accept()
            with conn:
                try:
                    conn.settimeout(10)
                    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
                    if len(head) < 4:
                        head += _recv_exact(conn, 4 - len(head))
                    got = json.loads(_recv_exact(conn, int.from_bytes(head, "big")))
                except (OSError, ValueError):
                    continue
                if (len(fds) != 3 or start_env(got["env"]) != mine
                        or got["executable"] != sys.executable):
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(b"n\n")
                    return  # that daemon runs on its own
                for i, fd in enumerate(fds):
                    os.dup2(fd, i)
                    os.close(fd)
                os.environ.clear()
                os.environ.update(got["env"])
                os.chdir(got["cwd"])
                sys.path[:] = got["path"]
                sys.path[:] = [p for p in sys.path if p not in _spark_zips()]
                conn.sendall(b"y %d\n" % os.getpid())
            break
    finally:
        lsock.close()
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass
    manager()


def _stand_in(pid: int) -> None:
    """Stay while the daemon `pid` runs: Spark's handle on it."""
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGTERM))
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    while True:
        try:
            if fd is not None:
                select.select([fd], [], [])
                return
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return
            select.select([], [], [], 0.5)
        except InterruptedError:
            continue
        except OSError:
            return


def hand_over() -> bool:
    """Give this daemon's part to the process the driver prepared, if there is one that
    fits; True once it runs as the daemon (and it has ended)."""
    path = os.environ.pop(PREPARED, None)
    if not path:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(path)
            payload = json.dumps({"env": dict(os.environ), "cwd": os.getcwd(),
                                  "path": sys.path, "executable": sys.executable}).encode()
            socket.send_fds(s, [len(payload).to_bytes(4, "big")], [0, 1, 2])
            s.sendall(payload)
            reply = s.makefile("rb").readline().split()
    except (OSError, ValueError):
        return False
    if len(reply) != 2 or reply[0] != b"y":
        return False
    _stand_in(int(reply[1]))
    return True


if __name__ == "__main__":
    if sys.argv[1:2] == ["--prepare"]:
        prepare(sys.argv[2])
    elif not hand_over():
        prefer_installed_pyspark()
        warm_imports()
        from pyspark.daemon import manager

        manager()
