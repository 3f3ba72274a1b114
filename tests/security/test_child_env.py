"""Secrets stay out of child processes: a password or passphrase given in DCPTOOL_PASSWORD
or DCPTOOL_ARCHIVE_PASSPHRASE never reaches the environment (/proc/PID/environ) of the
Spark JVM, its Python daemon and workers, or the engine; the tasks get the connection
options and the data key in their closures. A --password-command child does not inherit
them either. A data key is not sent to a master that is not local unless Spark's RPC
authentication and network encryption are on."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from security.test_secrets import _descendants

REPO = Path(__file__).resolve().parents[2]
PW = "EnvPw-" + secrets.token_hex(8)
PP = "EnvPass-" + secrets.token_hex(8)

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    from nodeprocutil import NodeProcess

    n = NodeProcess(tmp_path_factory.mktemp("envnode") / "node", vbuckets=4, password=None,
                    env={"DCPTOOL_PASSWORD": PW})
    n.start()
    n.password = PW
    yield n
    n.stop()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DCPTOOL_") and k not in ("PYSPARK_GATEWAY_PORT",
                                                         "PYSPARK_GATEWAY_SECRET")}
    env.update(NO_COLOR="1", **extra)
    return env


def _watch(proc: subprocess.Popen, root_pid: int | None = None) -> tuple[int, set[str]]:
    """Sample the environments of `proc`'s descendants (not `proc` itself, which the
    secrets were given to) until it ends: (samples, names of the programs seen). Fails
    when one holds a secret."""
    root = proc.pid if root_pid is None else root_pid
    samples, seen = 0, set()
    while proc.poll() is None:
        for pid in _descendants(root) - {proc.pid}:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if not cmdline:
                continue
            seen.add(_program(cmdline))
            for secret in (PW, PP):
                assert secret.encode() not in environ, (pid, cmdline[:200])
        samples += 1
        time.sleep(0.05)
    return samples, seen


def _program(cmdline: bytes) -> str:
    argv = cmdline.split(b"\0")
    if b"java" in Path(argv[0].decode()).name.encode():
        return "java"
    text = b" ".join(argv).decode(errors="replace")
    for name in ("sparkdaemon", "pyspark.daemon", "pyspark.worker", "engine"):
        if name in text:
            return name
    return Path(argv[0].decode(errors="replace")).name


def test_spark_jvm_daemon_and_workers_never_see_password_or_passphrase(node, tmp_path):
    archive = tmp_path / "enc"
    env = _env(DCPTOOL_PASSWORD=PW, DCPTOOL_ARCHIVE_PASSPHRASE=PP, DCPTOOL_ENGINE="off")
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", "backup", "-b", "default", "-c",
                             f"{node.host}:{node.port}", str(archive), "--encrypt", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, cwd=REPO)
    try:
        samples, seen = _watch(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert samples >= 3 and "java" in seen, seen
    assert seen & {"sparkdaemon", "pyspark.daemon", "pyspark.worker"} or len(seen) >= 2, seen
    assert PW.encode() not in out + err and PP.encode() not in out + err
    # the tasks had what they needed: the archive is encrypted and verifies, with the
    # passphrase from a command (--passphrase-command, then its variable)
    tool = tmp_path / "vault"
    tool.write_text(f"#!/bin/sh\necho '{PP}'\n")
    tool.chmod(0o700)
    r = subprocess.run([sys.executable, "-m", "dcptool", "verify", str(archive),
                        "--passphrase-command", str(tool)], env=_env(), capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "dcptool", "info", str(archive), "--json"],
                       env=_env(DCPTOOL_ARCHIVE_PASSPHRASE_COMMAND=str(tool)),
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0 and PP not in r.stdout + r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "dcptool", "info", str(archive), "--json",
                        "--passphrase-command", "false"], env=_env(), capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "--passphrase-command: false exited with status 1" in r.stderr


def test_engine_never_holds_a_secret_and_commands_bring_theirs(node, tmp_path):
    """The warm engine is started from a shell holding both secrets: its environment, its
    JVM's and its workers' hold neither; a command attached to it backs up an encrypted
    archive with its own password and passphrase (they travel in the task closures)."""
    edir = tmp_path / "engine"
    base = _env(DCPTOOL_ENGINE_DIR=str(edir), DCPTOOL_PASSWORD=PW,
                DCPTOOL_ARCHIVE_PASSPHRASE=PP)
    r = subprocess.run([sys.executable, "-m", "dcptool", "engine", "start"], env=base,
                       capture_output=True, text=True, cwd=REPO, timeout=240)
    assert r.returncode == 0, r.stderr
    try:
        st = subprocess.run([sys.executable, "-m", "dcptool", "engine", "status", "--json"],
                            env=base, capture_output=True, text=True, cwd=REPO, timeout=60)
        pid = int(re.search(r'"pid":\s*(\d+)', st.stdout).group(1))
        procs = _descendants(pid)
        assert len(procs) >= 2, procs  # the engine and its JVM at least
        _no_secret_in(procs)
        archive = tmp_path / "enc"
        r = subprocess.run([sys.executable, "-m", "dcptool", "backup", "-b", "default", "-c",
                            f"{node.host}:{node.port}", str(archive), "--encrypt", "--json"],
                           env=base, capture_output=True, text=True, cwd=REPO, timeout=240)
        assert r.returncode == 0, r.stderr
        after = json.loads(subprocess.run(
            [sys.executable, "-m", "dcptool", "engine", "status", "--json"], env=base,
            capture_output=True, text=True, cwd=REPO, timeout=60).stdout)
        assert after["commands_served"] >= 1, after  # the backup ran on the engine
        _no_secret_in(_descendants(pid))
        r = subprocess.run([sys.executable, "-m", "dcptool", "verify", str(archive)],
                           env=_env(DCPTOOL_ARCHIVE_PASSPHRASE=PP, DCPTOOL_ENGINE="off"),
                           capture_output=True, text=True, cwd=REPO, timeout=120)
        assert r.returncode == 0, r.stderr
    finally:
        subprocess.run([sys.executable, "-m", "dcptool", "engine", "stop", "--now"], env=base,
                       capture_output=True, text=True, cwd=REPO, timeout=120)


def _no_secret_in(pids) -> None:
    for p in pids:
        try:
            environ = Path(f"/proc/{p}/environ").read_bytes()
        except OSError:  # ended meanwhile
            continue
        assert PW.encode() not in environ and PP.encode() not in environ, p


def test_password_command_child_does_not_inherit_secrets(node, tmp_path):
    script = tmp_path / "secret-manager"
    seen = tmp_path / "seen-env"
    script.write_text(f"#!/bin/sh\nenv > {seen}\necho '{PW}'\necho 'second line ignored'\n")
    script.chmod(0o700)
    env = _env(DCPTOOL_ARCHIVE_PASSPHRASE=PP)
    r = subprocess.run([sys.executable, "-m", "dcptool", "failover-log", "-c",
                        f"{node.host}:{node.port}", "--json", "--password-command",
                        str(script)], env=env, capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert PW not in r.stdout + r.stderr
    assert PP not in seen.read_text() and "DCPTOOL_ARCHIVE_PASSPHRASE" not in seen.read_text()
    # by its variable too; a failing command is one line naming its status, nothing it printed
    r = subprocess.run([sys.executable, "-m", "dcptool", "failover-log", "-c",
                        f"{node.host}:{node.port}", "--json"],
                       env=_env(DCPTOOL_PASSWORD_COMMAND=str(script)), capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho leaked-output\nexit 3\n")
    bad.chmod(0o700)
    r = subprocess.run([sys.executable, "-m", "dcptool", "failover-log", "-c",
                        f"{node.host}:{node.port}", "--password-command", str(bad)],
                       env=_env(), capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "exited with status 3" in r.stderr, r.stderr
    assert "leaked-output" not in r.stderr + r.stdout
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([sys.executable, "-m", "dcptool", "failover-log", "-c",
                        f"{node.host}:{node.port}", "--password-command", str(script),
                        "-p", "x"], env=_env(), capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert r.returncode == 2 and "not both" in r.stderr, r.stderr


SPARK_HOME = Path(importlib.util.find_spec("pyspark").origin).parent


def test_encrypted_archive_refused_on_a_remote_master_without_spark_crypto(node, tmp_path):
    """A standalone master on 127.0.0.1 (no worker is needed: the refusal comes before any
    task): an encrypted backup stops in one line naming the two settings."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "master.log"
    env = _env(SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(tmp_path),
               SPARK_WORKER_DIR=str(tmp_path / "work"))
    with open(log, "ab") as out:
        master = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"),
                                   "org.apache.spark.deploy.master.Master", "--host",
                                   "127.0.0.1", "--port", str(port), "--webui-port", "0"],
                                  stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=env, process_group=0)
    try:
        deadline = time.monotonic() + 90
        while "Starting Spark master" not in log.read_text(errors="replace") \
                or "I have been elected leader" not in log.read_text(errors="replace"):
            assert master.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        archive = tmp_path / "enc"
        r = subprocess.run([sys.executable, "-m", "dcptool", "backup", "-b", "default", "-c",
                            f"{node.host}:{node.port}", str(archive), "--encrypt",
                            "--master", f"spark://127.0.0.1:{port}"],
                           env=_env(DCPTOOL_PASSWORD=PW, DCPTOOL_ARCHIVE_PASSPHRASE=PP,
                                    DCPTOOL_ENGINE="off"),
                           capture_output=True, text=True, cwd=REPO, timeout=240)
        assert r.returncode != 0
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert "spark.authenticate" in r.stderr and "spark.network.crypto.enabled" in r.stderr
        assert "refusing to send" in lines[0] and "Traceback" not in r.stderr, r.stderr
        assert PW not in r.stderr and PP not in r.stderr
    finally:
        os.killpg(master.pid, signal.SIGTERM)
        try:
            master.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(master.pid, signal.SIGKILL)
            master.wait(10)
