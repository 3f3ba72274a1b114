"""`dcptool engine`: Spark commands attach to a running engine instead of starting Spark.

Each case runs real commands (`python -m dcptool ...`) against real nodes and a real engine
(a background process with its own JVM, in an engine directory of the test's own).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import dcptool
from nodeprocutil import NodeProcess
from noiseutil import assert_no_noise
from test_quiet_spark import assert_kept_and_resumed, env_for, partials, pty_run

DOCS = 600


def cli(*args: str, cwd: Path | None = None, python: str = sys.executable, timeout: float = 240,
        **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "dcptool", *args], cwd=cwd, env=env_for(**extra),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def status(d: str) -> dict:
    r = cli("engine", "status", "--json", DCPTOOL_ENGINE_DIR=d)
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    base = tmp_path_factory.mktemp("engine-nodes")
    src, dst = NodeProcess(base / "src", vbuckets=16), NodeProcess(base / "dst", vbuckets=16)
    src.start()
    dst.start()
    r = cli("doc", "load", "--count", str(DOCS), "-c", f"{src.host}:{src.port}", "-q")
    assert r.returncode == 0, r.stderr
    yield src, dst
    src.stop(timeout=15)
    dst.stop(timeout=15)


@pytest.fixture
def engine_dir():
    # short: a Unix socket's path has a length limit
    d = tempfile.mkdtemp(prefix="dcpeng-")
    yield d
    cli("engine", "stop", "--now", "--timeout", "30", DCPTOOL_ENGINE_DIR=d)
    shutil.rmtree(d, ignore_errors=True)


def test_no_engine_status_stop(engine_dir):
    r = cli("engine", "status", DCPTOOL_ENGINE_DIR=engine_dir)
    assert r.returncode == 1 and r.stdout.strip() == "no engine is running", r
    assert status(engine_dir) == {"running": False}
    r = cli("engine", "stop", DCPTOOL_ENGINE_DIR=engine_dir)
    assert r.returncode == 0 and r.stderr.strip() == "no engine is running", r


@pytest.mark.slow
def test_commands_run_on_the_engine(nodes, tmp_path, engine_dir):
    src, dst = nodes
    env = {"DCPTOOL_ENGINE_DIR": engine_dir}
    r = cli("engine", "start", "--json", **env)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["running"] and st["master"] == "local[*]" and st["commands_served"] == 0
    assert "secret" not in r.stdout and "secret" not in r.stderr
    assert stat.S_IMODE(os.stat(engine_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(Path(engine_dir) / "engine.sock").st_mode) == 0o600
    assert_no_noise(r.stdout, r.stderr)

    # a second start does nothing
    r = cli("engine", "start", **env)
    assert r.returncode == 0 and "already running" in r.stderr, r.stderr
    assert status(engine_dir)["pid"] == st["pid"]

    # a backup into a relative path (the engine's working directory is not the command's)
    r = cli("backup", "-c", f"{src.host}:{src.port}", "arch", "--json", cwd=tmp_path, **env)
    assert r.returncode == 0, r.stderr
    assert_no_noise(r.stdout, r.stderr)
    full = json.loads(r.stdout)
    assert full["type"] == "full" and full["mutations"] == DOCS
    assert (tmp_path / "arch" / "archive.json").is_file()
    assert status(engine_dir)["commands_served"] == 1

    # an incremental one: the changes only
    for i in range(5):
        assert cli("doc", "set", f"changed::{i}", '{"v": 1}', "-c",
                   f"{src.host}:{src.port}").returncode == 0
    r = cli("backup", "-c", f"{src.host}:{src.port}", str(tmp_path / "arch"), "--json", **env)
    assert r.returncode == 0, r.stderr
    inc = json.loads(r.stdout)
    assert inc["type"] == "incremental" and inc["mutations"] == 5
    assert status(engine_dir)["commands_served"] == 2

    # restore and verify --against: on the engine too, and the node holds the documents
    r = cli("restore", str(tmp_path / "arch"), "-c", f"{dst.host}:{dst.port}", "--json", **env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restored"]["mutation"] == DOCS + 5
    # its tasks checked their vbuckets themselves, in one barrier stage on the engine's slots
    (log,) = sorted((tmp_path / "arch" / "logs").glob("restore-*.log"))
    assert "restore tasks, before any wrote" in log.read_text()
    r = cli("verify", str(tmp_path / "arch"), "--against", "-c", f"{dst.host}:{dst.port}",
            "--json", **env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert status(engine_dir)["commands_served"] == 4

    # DCPTOOL_ENGINE=off, and another master asked for: the command starts its own Spark
    r = cli("backup", "-c", f"{src.host}:{src.port}", str(tmp_path / "own"), "--json",
            DCPTOOL_ENGINE="off", **env)
    assert r.returncode == 0, r.stderr
    r = cli("backup", "-c", f"{src.host}:{src.port}", str(tmp_path / "own2"), "--json",
            "--master", "local[1]", **env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # asked for on purpose: nothing to say
    # another dcptool installation (a copy of the package in another directory, first on
    # the path; the same interpreter, however its environment was made): not used, and the
    # command says why
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(Path(dcptool.__file__).parent, elsewhere / "dcptool",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = os.pathsep.join([str(elsewhere), env_for()["PYTHONPATH"]])
    r = cli("backup", "-c", f"{src.host}:{src.port}", str(tmp_path / "own3"), PYTHONPATH=path,
            cwd=elsewhere, **env)  # not the checkout's directory, which `-m` puts first
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("engine runs another dcptool installation") == 1, r.stderr
    assert_no_noise(r.stdout, r.stderr)
    assert status(engine_dir)["commands_served"] == 4

    # a command's plain RDD jobs are handed to the engine: no PySpark in the command, the
    # results come back in order, a failed task's error with its cause
    code = """if True:
        import json, sys
        from dcptool.pipeline import engine, runtime
        runtime.set_jvm_output("quiet")
        sc = runtime.get_task_context(None)
        out = {"kind": type(sc).__name__, "master": sc.master,
               "got": runtime.run_tasks(sc, abs, [-1, -2, 3, -4])}
        try:
            runtime.run_tasks(sc, int, ["not a number"])
        except engine.EngineJobError as exc:
            out["error"] = "invalid literal for int()" in str(exc)
        out["pyspark"] = "pyspark" in sys.modules
        print(json.dumps(out))
    """
    r = subprocess.run([sys.executable, "-c", code], env=env_for(**env), capture_output=True,
                       text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"kind": "EngineJobs", "master": "local[*]",
                                    "got": [1, 2, 3, 4], "error": True, "pyspark": False}
    assert status(engine_dir)["commands_served"] == 5

    # stop: the engine, its socket and its JVM are gone
    r = cli("engine", "stop", "--json", **env)
    assert r.returncode == 0 and json.loads(r.stdout)["stopped"], r.stderr
    assert cli("engine", "status", **env).returncode == 1
    assert not (Path(engine_dir) / "engine.sock").exists()
    assert not running(st["pid"])


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie nobody reaped yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_interrupted_and_killed_commands_are_cancelled(tmp_path, engine_dir):
    src = NodeProcess(tmp_path / "node", vbuckets=16)
    src.start()
    try:
        _interrupted_and_killed(src, tmp_path, engine_dir)
    finally:
        src.stop(timeout=15)


def _interrupted_and_killed(src, tmp_path: Path, engine_dir: str) -> None:
    r = cli("doc", "load", "--count", str(DOCS), "-c", f"{src.host}:{src.port}", "-q")
    assert r.returncode == 0, r.stderr
    cluster = f"{src.host}:{src.port}"
    archive = tmp_path / "arch"
    # the engine's tasks stall once they have streamed a vbucket: commands stay busy
    r = cli("engine", "start", DCPTOOL_ENGINE_DIR=engine_dir,
            DCPTOOL_FAULT="stall-after-vbuckets:1")
    assert r.returncode == 0, r.stderr

    def streaming() -> bool:
        return any(p.name.endswith(".done.json") for b in partials(archive) for p in b.iterdir())

    def idle(timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if status(engine_dir)["commands_running"] == 0:
                return True
            time.sleep(0.3)
        return False

    # Ctrl-C: one line, 130, this command's tasks cancelled, the engine serves on
    rc, before, after = pty_run(["backup", "-c", cluster, str(archive), "--no-progress",
                                 "--partitions", "2"], streaming, DCPTOOL_ENGINE_DIR=engine_dir)
    assert rc == 130, (before, after)
    assert_kept_and_resumed(after, archive)
    assert_no_noise(before, after)
    assert len(partials(archive)) == 1 and not (archive / "lock").exists()
    assert idle()

    # a command killed outright: the engine notices its connection close and cancels
    proc = subprocess.Popen([sys.executable, "-m", "dcptool", "backup", "-c", cluster,
                             str(archive), "--partitions", "2"],
                            env=env_for(DCPTOOL_ENGINE_DIR=engine_dir), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while status(engine_dir)["commands_running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert idle()
    assert status(engine_dir)["commands_served"] == 2

    # the archive resumes (with a Spark of its own: this engine's tasks would stall again)
    r = cli("backup", "-c", cluster, str(archive), "--json", DCPTOOL_ENGINE="off",
            DCPTOOL_ENGINE_DIR=engine_dir)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["resumed"] is True and out["type"] == "full"
    info = json.loads(cli("info", str(archive), "--json").stdout)
    assert [b["mutations"] for b in info["backups"]] == [DOCS]


@pytest.mark.slow
def test_an_engine_without_s3_credentials_is_named_before_any_work(s3_server, warm_engine,
                                                                   tmp_path, engine_dir):
    """An engine started where no S3 credentials are set, commands run where they are: the
    engine's executors are checked before any work, and the one line says to restart the
    engine with them; backup leaves no partial backup, export no traceback, and merge,
    prune, remove (each would merge the archive's two backups) and verify --against leave
    the archive as it was."""
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/arch"
    with_s3 = {k: v for k, v in s3_server.env().items()
               if k.startswith("AWS_")} | {"DCPTOOL_ENGINE_DIR": engine_dir}
    src = NodeProcess(tmp_path / "node", vbuckets=4)
    src.start()
    try:
        cluster = f"{src.host}:{src.port}"
        assert cli("doc", "load", "--count", "50", "-c", cluster, "-q").returncode == 0
        # the archive, made on the test run's warm engine (its executors have the S3
        # server's credentials)
        made_by = dict(with_s3, DCPTOOL_ENGINE_DIR=warm_engine)
        r = cli("backup", "-c", cluster, url, "--json", **made_by)
        assert r.returncode == 0, r.stderr
        # a second backup, of no change (no Spark): a chain of two that merge, prune and
        # remove would merge, every vbucket of it
        r = cli("backup", "-c", cluster, url, "--json", **made_by)
        assert r.returncode == 0, r.stderr
        first = json.loads(cli("info", url, "--json", **with_s3).stdout)["backups"][0]["id"]

        def objects() -> list[str]:
            return sorted(o["Key"] for page in s3_server.client().get_paginator(
                "list_objects_v2").paginate(Bucket=bucket, Prefix="arch/")
                for o in page.get("Contents", []) if "/logs/" not in o["Key"])

        made = objects()
        # changes for the next backup to stream (one with none runs no Spark task)
        assert cli("doc", "load", "--count", "10", "--prefix", "more::", "-c", cluster,
                   "-q").returncode == 0
        # the engine, where no S3 credentials are set
        env = {k: v for k, v in env_for(DCPTOOL_ENGINE_DIR=engine_dir).items()
               if not k.startswith(("AWS_", "DCPTOOL_S3_"))}
        env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                   AWS_EC2_METADATA_DISABLED="true")
        r = subprocess.run([sys.executable, "-m", "dcptool", "engine", "start"], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr
        for args in (["backup", "-c", cluster, url],
                     ["restore", url, "-c", cluster],
                     ["export", url, str(tmp_path / "out"), "--format", "jsonl"],
                     ["merge", url],
                     ["prune", url, "--keep-last", "1"],
                     ["remove", url, "--backup", first],
                     ["verify", url, "--against", "-c", cluster]):
            r = cli(*args, **with_s3)
            assert r.returncode == 1, (args, r.stderr)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1, (args, r.stderr)
            assert lines[0].startswith(f"dcptool: error: the dcptool engine's Spark executors "
                                       f"cannot reach {url} ("), lines[0]
            assert "no S3 credentials found" in lines[0], lines[0]
            assert "restart the engine where the S3 endpoint and credentials are set" in lines[0]
            assert "resume" not in lines[0]
            assert_no_noise(r.stdout, r.stderr)
            # nothing was written (the run logs aside): no backup begun, merged or removed
            assert objects() == made, args
        assert len({k.split("/")[2] for k in made if k.startswith("arch/backups/")}) == 2, made
        assert not (tmp_path / "out").exists()
    finally:
        src.stop(timeout=15)
