"""`dcptool export ARCHIVE OUT`: records or resolved documents as Parquet or JSON lines."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.options import MasterOpt, NearestOpt, NoProgressOpt, PartitionsOpt, point_in_time
from dcptool.cli.manual import manual
from dcptool.cli.output import backup_id_arg, console, human_bytes, plural, print_json, spark_progress
from dcptool.client.vbspec import parse_vbuckets


manual(
    "export",
    files=(
        ("ARCHIVE/", "The archive (read only)."),
        ("OUT/", "The Parquet or JSON lines part files written."),
    ),
    env=("DCPTOOL_PROGRESS_INTERVAL", "DCPTOOL_GAP_TOLERANCE"),
    see_also=("info", "examine"),
)


@app.command()
def export(
    archive: Annotated[str, typer.Argument(
        metavar="ARCHIVE", help="Archive directory, or s3://BUCKET/PREFIX.",
        show_default=False)],
    out: Annotated[Path, typer.Argument(help="Output directory (Spark writes part files "
                                             "into it).", show_default=False)],
    fmt: Annotated[str, typer.Option("--format", metavar="parquet|jsonl",
                                     help="Output format.")] = "parquet",
    backup_id: Annotated[Optional[str], typer.Option(
        "--backup", metavar="ID", help="Only this backup's records; with --resolved, the state "
                                       "as of this backup (its id or an unambiguous "
                                       "beginning of it).")] = None,
    resolved: Annotated[bool, typer.Option(
        "--resolved", help="The newest version of each key (what restore writes) instead of "
                           "every record.")] = False,
    at: Annotated[Optional[str], typer.Option(
        "--at", metavar="TIME",
        help="With --resolved: the state as of this time (ISO 8601 with a zone, or "
             "relative: -15m), each vbucket at its last snapshot boundary at or before "
             "it, as restore --to-time.")] = None,
    nearest: NearestOpt = False,
    vbuckets: Annotated[Optional[str], typer.Option("--vbuckets", metavar="LIST",
                                                    help="Only these vbuckets, e.g. 0-15,512.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace OUT if it exists.")] = False,
    master: MasterOpt = None,
    partitions: PartitionsOpt = None,
    no_progress: NoProgressOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    bucket: Annotated[Optional[list[str]], typer.Option(
        "-b", "--bucket", metavar="NAME", show_default=False,
        help="Of a cluster archive: only this bucket (repeatable, or a comma list; default: "
             "every bucket).")] = None,
) -> None:
    """Write an archive's records (or resolved documents) as Parquet or JSON lines.

    The columns are those of the dcptool Spark data source (see docs/spark.md); binary
    columns are base64 in JSON lines.

    Of a cluster archive (backup --all-buckets) it writes every bucket's rows (-b: those
    buckets') into OUT, each with a bucket column; --backup then needs one -b NAME.

    --resolved --at TIME writes the documents as they were at TIME (what 'restore
    --to-time TIME' writes); a time in a gap of the archive (no backup running) is refused
    unless --nearest.

    Example: dcptool export /backups/default /tmp/docs --format parquet --resolved
    Example: dcptool export /backups/default /tmp/then --resolved --at 2026-11-28T14:03:00Z
    Example: dcptool export /backups/cluster /tmp/all --format jsonl -b travel-sample
    """
    from dcptool.cli.clusterarchive import is_cluster_archive
    from dcptool.pipeline.export import run_export

    vbs = parse_vbuckets(vbuckets) if vbuckets else None
    when = point_in_time(at, nearest, "--at")
    if is_cluster_archive(archive):
        opened, names, backup_id = _cluster_export_source(archive, bucket, backup_id)
    else:
        from dcptool.cli.clusterarchive import open_bucket_archive

        opened, names = open_bucket_archive(archive, bucket), None  # -b: its bucket only
        backup_id = backup_id_arg(opened, backup_id)
    with spark_progress("export", disabled=no_progress or json_out):
        result = run_export(opened, out, fmt=fmt.lower(), backup=backup_id, resolved=resolved,
                            vbuckets=vbs, overwrite=overwrite, partitions=partitions,
                            master=master, buckets=names, at=when, nearest=nearest)
    d = result.as_dict()
    if json_out:
        print_json(d)
        return
    what = "resolved documents" if resolved else "records"
    if d.get("at"):
        what += f" as of {d['at']}"
    console().print(f"exported {d['rows']:,} {what} to {d['out']} ({d['format']}, "
                    f"{plural(d['files'], 'file')}, {human_bytes(d['bytes'])}) in {d['seconds']:.1f} s")


def _cluster_export_source(archive: str, bucket, backup_id):
    """(the cluster archive opened, the buckets -b names (all when none), the --backup id
    in its one bucket)."""
    from dcptool.cli.clusterarchive import open_cluster, pick_buckets
    from dcptool.errors import UsageError

    cluster = open_cluster(archive)
    names = pick_buckets(cluster, bucket)
    if backup_id is not None:
        if len(names) != 1:
            raise UsageError("--backup names a backup of one bucket: give -b NAME too "
                             f"(one of {', '.join(names)})")
        backup_id = backup_id_arg(cluster.open_bucket(names[0]), backup_id)
    return cluster, names, backup_id
