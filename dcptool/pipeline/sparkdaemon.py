"""Spark's Python worker daemon, as local Spark runs it for dcptool (`spark.python.daemon.module`).

Spark puts its own `python/lib/pyspark.zip` first on the workers' path. Python keeps no
compiled code for modules imported from a zip: every daemon compiles PySpark's modules from
source, and so does every worker it forks (a worker imports `pyspark.worker` after the fork),
most of a second of a cold command's first job. With the PySpark package installed (pip
installs both, the same version) this daemon imports PySpark from the package instead, and
imports dcptool's task modules once, before it forks its workers; then it is PySpark's daemon.
Anything unexpected and it is PySpark's daemon as Spark would have started it.
"""
from __future__ import annotations

import os
import sys


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
    """Import the modules whose functions Spark tasks run (backup, restore, merge, verify)."""
    import dcptool.pipeline.backup  # noqa: F401
    import dcptool.pipeline.compare  # noqa: F401
    import dcptool.pipeline.merge  # noqa: F401
    import dcptool.pipeline.restore  # noqa: F401


def warm_imports() -> None:
    try:
        import_task_modules()
    except Exception:  # noqa: BLE001 - the task imports it again and says what is wrong
        pass


if __name__ == "__main__":
    prefer_installed_pyspark()
    warm_imports()
    from pyspark.daemon import manager

    manager()
