"""Archives and DCP changes as Spark DataFrames: the readers behind `dcptool.spark`.

`read_archive` is `spark.read.format("dcptool")` and `read_changes` is
`spark.readStream.format("dcptool-stream")`; both register the data sources with the
session on first use (`register(spark)` does only that). Users import them from
`dcptool.spark`; jobs inside the pipeline (export) from here. Columns: see docs/spark.md.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from .runtime import get_spark

__all__ = ["get_spark", "register", "read_archive", "read_changes", "ARCHIVE_FORMAT", "STREAM_FORMAT"]

ARCHIVE_FORMAT = "dcptool"
STREAM_FORMAT = "dcptool-stream"


def register(spark) -> None:
    """Register the `dcptool` and `dcptool-stream` data sources with this session (once)."""
    from .datasource import ArchiveDataSource
    from .streamsource import DcpStreamDataSource

    done = getattr(spark, "_dcptool_sources", None)
    if done:
        return
    spark.dataSource.register(ArchiveDataSource)
    spark.dataSource.register(DcpStreamDataSource)
    try:
        spark._dcptool_sources = True
    except AttributeError:  # pragma: no cover - a session object without a __dict__
        pass


def _vbucket_option(vbuckets: str | Iterable[int] | None) -> str | None:
    if vbuckets is None:
        return None
    if isinstance(vbuckets, str):
        return vbuckets
    from dcptool.client.vbspec import format_vbuckets

    return format_vbuckets(int(v) for v in vbuckets)


def read_archive(spark, path: Any, *, backup: str | None = None,
                 vbuckets: str | Iterable[int] | None = None, resolved: bool = False,
                 partitions: int | None = None, values: bool = True, progress_files=None,
                 bucket: str | Iterable[str] | None = None, as_of: str | int | None = None,
                 nearest: bool = False):
    """A DataFrame of an archive's records (one row per mutation, deletion, expiration).

    `backup`: only that backup's records, or with `resolved` the state as of that backup.
    `vbuckets`: a list of numbers or a spec like "0-15,512". `resolved`: the newest
    version of each key as of the backup (default the newest), dead branches skipped and
    tombstones kept: exactly what `dcptool restore` writes. `partitions`: Spark tasks,
    each reading a group of vbuckets (default 2x the session's parallelism).
    `values=False` leaves the value column null (faster when only metadata is needed).
    `path`: where the archive is, or the archive opened (`dcptool.archive.Archive`).
    `progress_files` (a pipeline.progress.ProgressFiles): the tasks count the records they
    read into it, for a progress bar. `as_of` (ISO 8601 with a zone, a relative time such
    as "-15m", or ns since the epoch): the resolved state as of that time, each vbucket at
    its last snapshot boundary at or before it; a time in a gap of the archive is refused
    unless `nearest`.

    A cluster archive (`path`, or a `dcptool.archive.cluster.ClusterArchive`) gives every
    bucket's rows with a `bucket` column last; `bucket` (a name, a comma list or a list)
    reads only those buckets, and `backup` then needs one. A bucket archive's read has no
    `bucket` column (its `bucket` may only name its own bucket).
    """
    from dcptool.archive import Archive
    from dcptool.archive.cluster import ClusterArchive
    from .datasource import check_bucket_option, is_cluster_path
    from .runtime import default_parallelism

    if isinstance(path, ClusterArchive) or (not isinstance(path, Archive)
                                            and is_cluster_path(path)):
        where, secret, names = _cluster_read(path, bucket, backup)
    else:
        archive = Archive.opened(path)  # a clear error now rather than a Spark stack trace later
        if backup is not None:
            archive.manifest(backup)
        check_bucket_option(archive, None if bucket is None else ",".join(
            [bucket] if isinstance(bucket, str) else bucket))
        where, names = archive.path, None
        secret = None
        if archive.encrypted:
            from dcptool.archive import crypto

            secret = crypto.export_key(archive.key)
    register(spark)
    reader = spark.read.format(ARCHIVE_FORMAT)
    opts: dict[str, Any] = {
        "backup": backup,
        "vbuckets": _vbucket_option(vbuckets),
        "resolved": "true" if resolved or as_of is not None else "false",
        "asOf": _as_of_text(as_of),
        "nearest": "true" if nearest else None,
        "partitions": str(partitions or 2 * default_parallelism(spark)),
        "values": "true" if values else "false",
        "bucket": names,
    }
    if secret is not None:  # the data key(s), for the Python workers (never the passphrase)
        from .datasource import SECRET_OPTION
        from .runtime import check_key_transport

        check_key_transport(spark)

        opts[SECRET_OPTION] = secret
    if progress_files is not None:
        import dataclasses
        import json

        from .datasource import PROGRESS_OPTION

        opts[PROGRESS_OPTION] = json.dumps(dataclasses.asdict(progress_files))
    for k, v in opts.items():
        if v is not None:
            reader = reader.option(k, v)
    return reader.load(str(where.absolute()))


def _as_of_text(as_of: str | int | None) -> str | None:
    if as_of is None or isinstance(as_of, str):
        return as_of
    from dcptool.archive.pointintime import iso

    return iso(int(as_of))


def _cluster_read(path: Any, bucket: str | Iterable[str] | None,
                  backup: str | None) -> tuple[Any, str | None, str]:
    """(where the cluster archive is, the secret option of its buckets' keys or None,
    option bucket) of a read of a cluster archive: opened (unlocked) here, the buckets
    checked, `backup` checked in its one bucket, before any Spark work."""
    import json

    from dcptool.archive import crypto
    from dcptool.archive.cluster import ClusterArchive
    from dcptool.archive.clusterread import select_buckets
    from dcptool.archive.errors import ArchiveError
    from dcptool.errors import UsageError

    cluster = path if isinstance(path, ClusterArchive) else ClusterArchive.open(path)
    try:
        names = select_buckets(cluster, bucket, option="bucket")
    except ArchiveError as exc:
        raise UsageError(exc.message) from None
    if backup is not None:
        if len(names) != 1:
            raise UsageError("a backup id is one bucket's: give its bucket too (one of "
                             f"{', '.join(names)})")
        cluster.open_bucket(names[0]).manifest(backup)
    secret = None
    if cluster.encrypted:
        secret = json.dumps({n: crypto.export_key(cluster.open_bucket(n).key) for n in names})
    return cluster.path, secret, ",".join(names)


def read_changes(spark, cluster: str, *, bucket: str = "default",
                 username: str | None = None, password: str | None = None,
                 vbuckets: str | Iterable[int] | None = None, start: str = "beginning",
                 partitions: int | None = None, values: bool = True, **options: Any):
    """A streaming DataFrame of a node's DCP changes (`readStream.format("dcptool-stream")`).

    Offsets are per-vbucket positions kept in the query's checkpoint; `start` is where a
    new query begins ("beginning" or "now"). See dcptool.pipeline.streamsource.
    """
    from .runtime import default_parallelism

    register(spark)
    reader = spark.readStream.format(STREAM_FORMAT).option("cluster", cluster) \
        .option("bucket", bucket).option("start", start) \
        .option("partitions", str(partitions or 2 * default_parallelism(spark))) \
        .option("values", "true" if values else "false")
    if username is not None:
        reader = reader.option("username", username)
    if password is not None:
        reader = reader.option("password", password)
    vbs = _vbucket_option(vbuckets)
    if vbs is not None:
        reader = reader.option("vbuckets", vbs)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()
