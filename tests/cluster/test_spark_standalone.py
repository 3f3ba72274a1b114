"""backup, restore and read_archive on a real Spark standalone cluster (issue 20).

The module starts a standalone master and one worker from the PySpark package
(`bin/spark-class`), both on 127.0.0.1 with ports of their choosing, their logs, work and
scratch directories under the test's temporary directory. The dcptool commands run as
subprocesses with `--master spark://...` (the test process has its own local SparkSession,
and a process holds one JVM); their executors run on the worker, so every task reads and
writes the archive as a cluster's executors do. The archive is on the one machine's
filesystem: shared by the driver and the executor, as docs/spark.md requires.

The last tests put the archive on object storage instead (a SeaweedFS server process, see
tests/s3util.py): the driver runs in a directory of its own, the executors in the worker's
work directory, and no file of the archive is on either: backup, restore and read_archive
go through S3 alone, with the credentials each side has in its environment.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from docutil import delete, load, node_documents, opts_for
from noiseutil import assert_no_noise
from nodeprocutil import NodeProcess

from dcptool.pipeline.runtime import JVM_FLAGS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(importlib.util.find_spec("pyspark").origin).parent
VBS = 16
N = 400
DELETED = [f"doc::{i:04d}" for i in range(0, N, 20)]  # 20 tombstones
EXECUTOR_JAVA_OPTIONS = (f'--conf "spark.executor.extraJavaOptions={" ".join(JVM_FLAGS)}" '
                         'pyspark-shell')


class Daemon:
    """A Spark daemon (`spark-class CLASS ARGS`) in a process group of its own; its output
    goes to LOG."""

    def __init__(self, cls: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), cls, *args],
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, process_group=0)

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            text = self.log.read_text(errors="replace")
            m = re.search(pattern, text)
            if m:
                return m
            if self.proc.poll() is not None:
                pytest.fail(f"{self.proc.args[1]} exited with {self.proc.returncode}:\n{text[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"{self.proc.args[1]}: no {pattern!r} within {timeout}s:\n{text[-4000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        try:  # whatever the daemon started (the worker's executors) goes with it
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Cluster:
    def __init__(self, master: str, work: Path) -> None:
        self.master = master
        self.work = work  # the worker's work directory: one app-* directory per application

    def apps(self) -> list[Path]:
        return sorted(p for p in self.work.iterdir() if p.name.startswith("app-"))

    def driver_hosts(self) -> set[str]:
        """The driver addresses the executors the worker launched were told to connect to."""
        text = (self.work.parent / "logs" / "worker.log").read_text(errors="replace")
        return set(re.findall(r'"--driver-url" "spark://CoarseGrainedScheduler@([^"]+):\d+"', text))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3_server):
    base = tmp_path_factory.mktemp("spark-standalone")
    for d in ("conf", "logs", "pids", "local", "work"):
        (base / d).mkdir()
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(base / "conf"),  # empty: no spark-defaults.conf, no spark-env.sh
        "SPARK_LOG_DIR": str(base / "logs"),
        "SPARK_PID_DIR": str(base / "pids"),
        "SPARK_LOCAL_DIRS": str(base / "local"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # no REST submission server (it would take the fixed port 6066)
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        # the executors' Python workers import this checkout's dcptool, as a pip install of
        # it on a real worker machine would let them
        "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    })
    # the executors' own credentials for the object store, as a real cluster's machines have
    env.update({k: v for k, v in s3_server.env().items() if k.startswith("AWS_")})
    master = Daemon("org.apache.spark.deploy.master.Master",
                    ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
                    base / "logs" / "master.log", env)
    worker = None
    try:
        url = master.wait_for(r"Starting Spark master at (spark://127\.0\.0\.1:\d+)",
                              timeout=120).group(1)
        master.wait_for(r"New state: ALIVE")
        worker = Daemon("org.apache.spark.deploy.worker.Worker",
                        ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                         "--cores", "2", "--memory", "2g", "--work-dir", str(base / "work"), url],
                        base / "logs" / "worker.log", env)
        worker.wait_for(r"Successfully registered with master", timeout=120)
        yield Cluster(url, base / "work")
    finally:
        for d in (worker, master):
            if d is not None:
                d.stop()


def run(args: list[str], *, timeout: float = 180, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(env if env is not None else os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["DCPTOOL_PASSWORD"] = "password"
    # the driver's address, which the executors connect to: loopback (a real cluster's
    # driver leaves it to Spark, the host name's address)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    for k in ("DCPTOOL_SPARK_MASTER", "DCPTOOL_SPARK_LOG", "DCPTOOL_FAULT", "NO_COLOR"):
        env.pop(k, None)
    # the executors' JVMs tuned as a small cluster's operator would for short jobs (PySpark's
    # own way to pass spark-submit options): the client compiler only, the serial collector
    env["PYSPARK_SUBMIT_ARGS"] = EXECUTOR_JAVA_OPTIONS
    return subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=env, timeout=timeout, cwd=cwd)


def dcptool(*args: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "dcptool", *args], env=env, cwd=cwd)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    node = NodeProcess(tmp_path_factory.mktemp("standalone-src") / "node", vbuckets=VBS).start()
    opts = opts_for(node)
    with opts.connect() as conn:
        load(conn, {f"doc::{i:04d}": {"i": i, "body": "x" * (i % 61)} for i in range(N)}, VBS,
             flags=0x02000006)
        delete(conn, DELETED, VBS)
    yield node, node_documents(opts)
    node.stop(timeout=15)


@pytest.fixture(scope="module")
def archive(cluster, source, tmp_path_factory):
    node, _ = source
    path = tmp_path_factory.mktemp("standalone-archive") / "archive"
    r = dcptool("backup", "-c", f"{node.host}:{node.port}", str(path), "--master", cluster.master,
                "--json")
    assert r.returncode == 0, r.stderr
    assert_no_noise(r.stdout, r.stderr)
    return path, json.loads(r.stdout)


def test_backup(cluster, archive):
    path, summary = archive
    assert summary["type"] == "full"
    assert (summary["mutations"], summary["deletions"]) == (N - len(DELETED), len(DELETED))
    # the tasks ran on the worker's executor, which reached the driver on loopback
    assert len(cluster.apps()) >= 1
    assert cluster.driver_hosts() <= {"127.0.0.1", "localhost"}, cluster.driver_hosts()
    # the probe of the executors' view of the archive left nothing behind
    assert not [p for p in path.iterdir() if p.name.startswith(".dcptool-probe-")]


def test_restore(cluster, source, archive, tmp_path):
    node, state = source
    path, _ = archive
    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        r = dcptool("restore", str(path), "-c", f"{dst.host}:{dst.port}", "--master",
                    cluster.master, "--json")
        assert r.returncode == 0, r.stderr
        assert_no_noise(r.stdout, r.stderr)
        counts = json.loads(r.stdout)
        assert counts["restored"]["mutation"] == N - len(DELETED)
        assert counts["restored"]["deletion"] == len(DELETED)
        assert sum(counts["failed"].values()) == 0
        # the same documents, values and metadata (cas, rev seqno, flags, expiry), tombstones too
        assert node_documents(opts_for(dst)) == state


READ = textwrap.dedent("""
    import json, sys
    from dcptool.spark import get_spark, read_archive

    spark = get_spark(sys.argv[1], app_name="read-archive")
    rows = read_archive(spark, sys.argv[2], resolved=True).select("key", "deleted").collect()
    conf = spark.sparkContext.getConf()
    print(json.dumps({"master": spark.sparkContext.master,
                      "driver": [conf.get("spark.driver.host"), conf.get("spark.driver.bindAddress")],
                      "live": sorted(r.key for r in rows if not r.deleted),
                      "deleted": sorted(r.key for r in rows if r.deleted)}))
    spark.stop()
""")


def test_read_archive(cluster, source, archive):
    _, state = source
    path, _ = archive
    r = run([sys.executable, "-c", READ, cluster.master, str(path)])
    assert r.returncode == 0, r.stderr
    # a program of one's own starts Spark as PySpark does (its start-up lines on stderr), but
    # nothing goes wrong on the way
    assert_no_noise(r.stdout)
    assert not re.search(r"Traceback|^\s+at [a-z]+\.|(WARN|ERROR) ", r.stderr, re.M), r.stderr
    got = json.loads(r.stdout)
    assert got["master"] == cluster.master
    # the driver listens where SPARK_LOCAL_IP says (not on every interface)
    host, bind = got["driver"]
    assert host in ("127.0.0.1", "localhost") and bind in (None, "127.0.0.1", "localhost"), got["driver"]
    assert got["live"] == sorted(k.decode() for k, v in state.items() if v[0] == "live")
    assert got["deleted"] == sorted(DELETED)
    assert cluster.driver_hosts() <= {"127.0.0.1", "localhost"}, cluster.driver_hosts()


# -- the archive on object storage: no shared filesystem ----------------------------------------


def _files_under(d: Path) -> set[str]:
    return {p.name for p in d.rglob("*") if p.is_file()}


def test_backup_restore_and_read_archive_through_s3(cluster, source, s3_server, tmp_path):
    node, state = source
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/cluster-archive"
    env = s3_server.env()
    driver = tmp_path / "driver"  # the driver's working directory, not the worker's
    driver.mkdir()
    before = _files_under(cluster.work)
    r = dcptool("backup", "-c", f"{node.host}:{node.port}", url, "--master", cluster.master,
                "--json", env=env, cwd=driver)
    assert r.returncode == 0, r.stderr
    assert_no_noise(r.stdout, r.stderr)
    summary = json.loads(r.stdout)
    assert (summary["mutations"], summary["deletions"]) == (N - len(DELETED), len(DELETED))
    # nothing of the archive landed on a filesystem: not beside the driver, not in the
    # worker's work directory (which holds only the executors' own files)
    assert list(driver.iterdir()) == []
    new = _files_under(cluster.work) - before
    assert not [n for n in new if n.endswith((".mpk.zst", ".json"))], new
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(
        Bucket=bucket, Prefix="cluster-archive/backups/")["Contents"]]
    # the executors packed their vbuckets (docs/archive-format.md, "Packs")
    names = [k.rsplit("/", 1)[1] for k in keys]
    assert [n for n in names if n.startswith("pack-")] and \
        [n for n in names if n.startswith("done-")], names
    assert not [n for n in names if n.startswith("vb-")], names
    assert not [k for k in keys if ".dcptool-probe-" in k]  # the reachability probe cleaned up

    with NodeProcess(tmp_path / "dst", vbuckets=VBS) as dst:
        r = dcptool("restore", url, "-c", f"{dst.host}:{dst.port}", "--master", cluster.master,
                    "--json", env=env, cwd=driver)
        assert r.returncode == 0, r.stderr
        assert_no_noise(r.stdout, r.stderr)
        assert node_documents(opts_for(dst)) == state

    r = run([sys.executable, "-c", READ, cluster.master, url], env=env, cwd=driver)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["live"] == sorted(k.decode() for k, v in state.items() if v[0] == "live")
    assert got["deleted"] == sorted(DELETED)
