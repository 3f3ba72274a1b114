"""The export job: an archive's records (or resolved documents) as Parquet or JSON lines.

It is the `dcptool` data source written out by Spark, so the output has the columns of
docs/spark.md. OUT is a directory of part files, as Spark writes them (JSON lines ones
named `part-*.jsonl`). In JSON lines the
binary columns (`value`, `xattrs`) are base64 strings, as Spark's JSON writer encodes them.
"""
from __future__ import annotations

import functools
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcptool.archive import Archive
from dcptool.archive.cluster import ClusterArchive
from dcptool.errors import DcptoolError, UsageError

from .tasks import task_failure

FORMATS = ("parquet", "jsonl")


@dataclass
class ExportResult:
    out: str
    format: str
    rows: int
    backup: str | None
    resolved: bool
    #: the time of --at (ISO 8601), None for none
    at: str | None
    files: int
    bytes: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"out": self.out, "format": self.format, "rows": self.rows,
                "backup": self.backup, "resolved": self.resolved, "at": self.at,
                "files": self.files,
                "bytes": self.bytes, "seconds": round(self.seconds, 3)}


def run_export(archive_path: str | os.PathLike[str] | Archive | ClusterArchive,
               out: str | os.PathLike[str], *,
               fmt: str = "parquet", backup: str | None = None, resolved: bool = False,
               vbuckets: list[int] | None = None, overwrite: bool = False,
               partitions: int | None = None, master: str | None = None,
               spark=None, buckets: list[str] | None = None, at: int | None = None,
               nearest: bool = False) -> ExportResult:
    """Export a bucket archive, or the buckets of an opened cluster archive (`buckets`,
    default all) into one output whose rows carry a `bucket` column. `at` (ns since the
    epoch, with `resolved`): the state as of that time (see archive/pointintime.py)."""
    from .dataframes import read_archive
    from .datasource import plan_cluster_scan, plan_scan, unit_records
    from . import progress
    from .runtime import check_executors_see, get_spark

    t0 = time.monotonic()
    if fmt not in FORMATS:
        raise UsageError(f"--format must be parquet or jsonl, not {fmt!r}")
    if isinstance(archive_path, ClusterArchive):
        archive = archive_path
        keys = _cluster_checks(archive, buckets, backup)
        plan = functools.partial(plan_cluster_scan, archive, buckets=buckets, keys=keys)
        read = functools.partial(read_archive, bucket=buckets)
        key_travels = archive.encrypted
    else:
        archive = Archive.opened(archive_path)
        if backup is not None:
            archive.manifest(backup)  # a clear error before Spark starts
        elif not archive.committed_ids():
            raise UsageError(f"archive {archive.path} holds no committed backup to export")
        plan = functools.partial(plan_scan, archive)
        read = read_archive
        key_travels = archive.key is not None
    if at is not None:
        if not resolved:
            raise UsageError("--at goes with --resolved")
        if backup is not None:
            raise UsageError("--at and --backup exclude each other")
        _check_time(archive, buckets, at, nearest)
        plan = functools.partial(plan, at=at, nearest=nearest, at_option="--at",
                                 nearest_option="--nearest")
        read = functools.partial(read, as_of=at, nearest=nearest)
    out = Path(out).absolute()
    if out.exists() and not overwrite:
        if not out.is_dir() or any(out.iterdir()):
            raise UsageError(f"{out} already exists", hint="choose a new directory or use "
                                                            "--overwrite")
    if out == archive.path.absolute() or archive.path.absolute() in out.parents:
        raise UsageError("the output directory must not be inside the archive")
    spark = spark or get_spark(master)
    check_executors_see(spark, archive.path, name="archive.json", key_travels=key_travels)
    try:
        # a command's progress bar, if it draws one: the records the tasks read out of
        # the archive's (those of the entries read), else the tasks done (the archive is
        # only read: no progress files in it for a master that is not local)
        total = 0
        if progress.active():
            total = sum(sum(unit_records(p)) for p in plan(
                backup=backup, vbuckets=vbuckets, resolved=resolved, partitions=1))
        with progress.watch_files(spark, total, "records") as files:
            df = read(spark, archive, backup=backup, resolved=resolved,
                      vbuckets=vbuckets, partitions=partitions, progress_files=files)
            writer = df.write.mode("overwrite" if (overwrite or out.exists())
                                   else "errorifexists")
            with progress.watch_tasks(spark) if files is None else nullcontext():
                if fmt == "parquet":
                    writer.parquet(str(out))
                else:
                    writer.json(str(out))
    except DcptoolError:
        raise
    except Exception as exc:  # a Spark job failed: its cause, in one line
        raise task_failure(exc, "export", None) from None
    progress.stage("counting rows")
    rows = files = size = 0
    suffix = ".parquet" if fmt == "parquet" else ".jsonl"
    if fmt == "jsonl":
        _jsonl_names(out)
    parts = sorted(f for f in out.iterdir() if f.name.startswith("part-") and f.name.endswith(suffix))
    for f in parts:
        files += 1
        size += f.stat().st_size
        if fmt == "jsonl":
            with open(f, "rb") as fh:
                rows += sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    if fmt == "parquet":
        rows = spark.read.parquet(str(out)).count()  # from the footers
    return ExportResult(str(out), fmt, rows, backup, resolved,
                        None if at is None else _iso(at), files, size, time.monotonic() - t0)


def _iso(ns: int) -> str:
    from dcptool.archive.pointintime import iso

    return iso(ns)


def _check_time(archive: Any, buckets: list[str] | None, at: int, nearest: bool) -> None:
    """--at checked against the archive's (each bucket's) coverage before Spark starts."""
    from dcptool.archive.pointintime import plan_time

    if isinstance(archive, ClusterArchive):
        from dcptool.archive.clusterread import select_buckets

        for name in select_buckets(archive, buckets):
            plan_time(archive.open_bucket(name), at, nearest=nearest,
                      option=f"--at (bucket {name})")
    else:
        plan_time(archive, at, nearest=nearest, option="--at")


def _cluster_checks(cluster: ClusterArchive, buckets: list[str] | None,
                    backup: str | None) -> dict[str, Any]:
    """The export of a cluster archive's buckets checked before Spark starts (a backup
    id is one bucket's; something to export); {bucket: data key} of its buckets."""
    from dcptool.archive.clusterread import select_buckets

    names = select_buckets(cluster, buckets)
    opened = {n: cluster.open_bucket(n) for n in names}
    if backup is not None:
        if len(names) != 1:
            raise UsageError("--backup names a backup of one bucket: give --bucket NAME too")
        opened[names[0]].manifest(backup)
    elif not any(a.committed_ids() for a in opened.values()):
        raise UsageError(f"cluster archive {cluster.path} holds no committed backup to export")
    return {n: a.key for n, a in opened.items() if a.key is not None}


def _jsonl_names(out: Path) -> None:
    """Spark's JSON writer names its part files `.json`; JSON lines are `.jsonl` (each part
    file's checksum file, `.NAME.crc`, follows its file)."""
    for f in list(out.iterdir()):
        if f.name.startswith("part-") and f.name.endswith(".json"):
            f.rename(f.with_name(f.name + "l"))
            crc = out / f".{f.name}.crc"
            if crc.exists():
                crc.rename(out / f".{f.name}l.crc")
