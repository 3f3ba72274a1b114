"""The SparkSession dcptool runs on: `local[*]` by default, any master URL at scale.

Local mode is tuned for a small machine: no UI, no console progress, few shuffle
partitions, and Python workers that run this interpreter (so they can import dcptool).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any

DEFAULT_MASTER = "local[*]"

_lock = threading.Lock()


def _quiet_env() -> None:
    # Workers must run the interpreter dcptool is installed in, not whatever python3 is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Without this Spark binds the driver to a non-loopback interface and warns about it.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def get_spark(master: str | None = None, app_name: str = "dcptool", conf: dict[str, Any] | None = None):
    """Return the active SparkSession or build one for `master` (default local[*])."""
    _quiet_env()
    from pyspark.sql import SparkSession

    with _lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        master = master or os.environ.get("DCPTOOL_SPARK_MASTER") or DEFAULT_MASTER
        builder = (
            SparkSession.builder.master(master)
            .appName(app_name)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.driver.bindAddress", "127.0.0.1" if master.startswith("local") else "0.0.0.0")
            .config("spark.python.worker.reuse", "true")
        )
        log4j = os.path.join(os.path.dirname(__file__), "log4j2.properties")
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile=file:{log4j}")
        if master.startswith("local"):
            builder = builder.config("spark.python.unix.domain.socket.enabled", "true")
        for k, v in (conf or {}).items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark


def default_parallelism(spark) -> int:
    return max(1, spark.sparkContext.defaultParallelism)


def plan_groups(vbuckets: list[int], partitions: int) -> list[list[int]]:
    """Spread vbuckets round-robin over at most `partitions` groups (never one task per vbucket
    unless there are that few vbuckets)."""
    partitions = max(1, min(partitions, len(vbuckets)))
    groups: list[list[int]] = [[] for _ in range(partitions)]
    for i, vb in enumerate(sorted(vbuckets)):
        groups[i % partitions].append(vb)
    return [g for g in groups if g]
