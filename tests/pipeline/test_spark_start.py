"""How the command line starts its own local Spark (issue 20): the recorded java command
(no spark-submit scripts, no launcher JVM) and the Python daemon prepared while the JVM
starts. Each case is a fresh Python process (a cold JVM), as a command runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, os, sys
from dcptool.pipeline import runtime
runtime.set_jvm_output("quiet")
runtime._fast.update(json.loads(sys.argv[1]))
sc = runtime.get_context()

def task(i):
    import os
    parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\0")
    return {"parent": [a.decode() for a in parent if a], "hash": hash("dcptool"),
            "reuse": os.environ.get("SPARK_REUSE_WORKER"),
            "prepared": os.environ.get("DCPTOOL_SPARK_DAEMON"), "cwd": os.getcwd(),
            "backup": "dcptool.pipeline.backup" in sys.modules}

jvm = runtime._jvm_proc
print(json.dumps({"tasks": sc.parallelize(range(4), 4).map(task).collect(),
                  "jvm_argv0": open(f"/proc/{jvm.pid}/cmdline", "rb").read().split(b"\0")[0].decode()}))
"""


def probe(cache: Path, cwd: Path, **fast: bool) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for k in ("DCPTOOL_SPARK_MASTER", "DCPTOOL_SPARK_LOG", "PYSPARK_SUBMIT_ARGS"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-c", PROBE, json.dumps(fast)], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # nothing of Spark's, Java's or the daemon's on the terminal
    return json.loads(p.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_recorded_launch_and_prepared_daemon(tmp_path):
    cache = tmp_path / "cache"
    # the class-data archive stays out of it (its first run names a file of its own)
    first = probe(cache, tmp_path, cds=False)
    records = list((cache / "dcptool" / "spark-launch").glob("*.json"))
    assert len(records) == 1
    rec = json.loads(records[0].read_text())
    assert os.path.basename(rec["argv"][0]).startswith("java")
    assert "org.apache.spark.deploy.SparkSubmit" in rec["argv"]
    assert rec["env"].get("PYTHONHASHSEED") == "0"  # what spark-submit's scripts add
    # the first run went through spark-submit: the JVM was exec'd by its scripts all the same
    assert os.path.basename(first["jvm_argv0"]).startswith("java")

    recorded_at = records[0].stat().st_mtime_ns
    second = probe(cache, tmp_path, cds=False)
    assert second["jvm_argv0"] == rec["argv"][0]
    # started from the record (a run through spark-submit records its command again)
    assert records[0].stat().st_mtime_ns == recorded_at
    for run in (first, second):
        for t in run["tasks"]:
            # the workers are children of the prepared daemon, which took Spark's environment
            assert "--prepare" in t["parent"], t
            assert t["reuse"] == "1" and t["prepared"] is None
            assert t["cwd"] == str(tmp_path)
            assert t["backup"]  # imported before the fork
        # the hash seed spark-submit gives the daemon: the same in every worker
        assert len({t["hash"] for t in run["tasks"]}) == 1
    base = probe(cache, tmp_path, cds=False, daemon=False)
    assert {t["hash"] for t in base["tasks"]} == {t["hash"] for t in second["tasks"]}
    assert all("--prepare" not in t["parent"] for t in base["tasks"])

    # a record that no longer works (its java is gone) is dropped: spark-submit, recorded anew
    rec["argv"][0] = str(tmp_path / "no-such-java")
    records[0].write_text(json.dumps(rec))
    third = probe(cache, tmp_path, cds=False)
    assert os.path.basename(third["jvm_argv0"]).startswith("java")
    assert json.loads(records[0].read_text())["argv"][0] != rec["argv"][0]


def test_the_prepared_daemons_variable_is_one_name():
    """runtime cannot import sparkdaemon (it imports the task modules): both name it."""
    from dcptool.pipeline import runtime, sparkdaemon

    assert runtime.PREPARED_DAEMON == sparkdaemon.PREPARED
