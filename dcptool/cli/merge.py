"""`dcptool merge ARCHIVE`: fold a range of backups into one, as a Spark job."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.options import MasterOpt, NoProgressOpt, PartitionsOpt
from dcptool.cli.manual import manual
from dcptool.cli.output import console, human_bytes, plural, print_json, spark_progress


manual(
    "merge",
    exit_codes=(3,),
    exit_note="A failed or interrupted merge leaves the archive as it was, or is finished by the "
              "next merge.",
    files=(
        ("ARCHIVE/backups/ID/", "The backups merged, and the merged backup."),
        ("ARCHIVE/logs/merge-TIME.log", "The log of each run (mode 0600). The newest 20 are kept "
                                        "(DCPTOOL_LOG_KEEP)."),
    ),
    env=("DCPTOOL_LOG_KEEP", "DCPTOOL_PROGRESS_INTERVAL"),
    see_also=("backup", "info", "verify"),
)


@app.command()
def merge(
    archive: Annotated[str, typer.Argument(
        metavar="ARCHIVE", help="Archive directory, or s3://BUCKET/PREFIX.",
        show_default=False)],
    first: Annotated[Optional[str], typer.Option(
        "--from", metavar="ID", help="First backup of the range (default: the full backup "
                                     "the chain starts with); of a cluster archive, the "
                                     "first run (default: the oldest).")] = None,
    last: Annotated[Optional[str], typer.Option(
        "--to", metavar="ID", help="Last backup of the range (default: the newest); of a "
                                   "cluster archive, the last run.")] = None,
    buckets: Annotated[Optional[list[str]], typer.Option(
        "--bucket", metavar="NAME",
        help="Cluster archives: only this bucket's archive (repeat for more); the run files "
             "are then kept.")] = None,
    level: Annotated[Optional[int], typer.Option(
        "--level", min=1, max=22, help="zstd level of the merged backup (default: the last "
                                       "backup's).")] = None,
    master: MasterOpt = None,
    partitions: PartitionsOpt = None,
    no_progress: NoProgressOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Merge a range of backups of one chain into a single backup.

    The merged backup holds the newest version of each key (deletions kept) and ends where
    the last backup of the range ended, so restores are unchanged and the next incremental
    backup continues from it. The originals are removed only once the merged backup is
    committed and verified; backups taken after the range are re-linked to it.

    A cluster archive ('dcptool backup --all-buckets') merges backup runs: in each
    bucket's archive, the backups from the one the first run names (default: the start of
    the bucket's chain) to the one the last run naming the bucket names are merged; then
    the files of the runs before the last, which the merges leave incomplete, are deleted
    (the last run restores as before, through the merged backups). A bucket dropped and
    created again within the range (two chains) is reported and left as it is.

    Example: dcptool merge /backups/default --to 20261122T101502.123456Z
    Example: dcptool merge /backups/cluster --to 20261122T020000.000000Z
    """
    from dcptool.cli.passphrase import open_archive
    from dcptool.pipeline.merge import run_merge

    from dcptool.cli.prune import cluster_or_none, no_cluster_options

    cluster = cluster_or_none(archive)
    if cluster is not None:
        from dcptool.pipeline.clusterprune import run_cluster_merge

        with spark_progress("merge", disabled=no_progress or json_out):
            d = run_cluster_merge(cluster, first=first, last=last, buckets=buckets,
                                  level=level, partitions=partitions, master=master)
        _report_cluster(d, json_out)
        return
    no_cluster_options(buckets=buckets)
    opened = open_archive(archive)
    with spark_progress("merge", disabled=no_progress or json_out):
        result = run_merge(opened, first=first, last=last, level=level,
                           partitions=partitions, master=master)
    d = result.as_dict()
    if json_out:
        print_json(d)
        return
    con = console()
    if d["finished_earlier"]:
        con.print(f"finished an interrupted merge first: removed "
                  f"{plural(len(d['finished_earlier']), 'backup')} it had replaced")
    con.print(f"merged {plural(len(d['replaced']), 'backup')} "
              f"({d['replaced'][0]} .. {d['replaced'][-1]}) "
              f"into {d['type']} backup [bold]{d['merged_id']}[/bold]")
    con.print(f"  items {d['items_before']:,} -> {d['items_after']:,} "
              f"({d['mutations']:,} mutations, {d['deletions']:,} deletions, "
              f"{d['expirations']:,} expirations; {plural(d['rollbacks'], 'rollback record')} kept)")
    # sizes as `info` gives them: the bytes of the backups' files
    con.print(f"  size {human_bytes(d['size_before'])} -> {human_bytes(d['size_after'])}, "
              f"{d['seconds']:.1f} s")
    for child in d["relinked"]:
        con.print(f"  backup {child} now continues from {d['merged_id']}")


def _report_cluster(d: dict, json_out: bool) -> None:
    if json_out:
        print_json(d)
        return
    con = console()
    con.print(f"runs {d['from']} .. {d['to']} ({plural(len(d['runs']), 'run')})", markup=False)
    for name, b in d["buckets"].items():
        m = b["merge"]
        if b["status"] == "merged":
            con.print(f"bucket {name}: merged {plural(len(m['replaced']), 'backup')} "
                      f"({m['replaced'][0]} .. {m['replaced'][-1]}) into {m['type']} backup "
                      f"{m['merged_id']}, {human_bytes(m['size_before'])} -> "
                      f"{human_bytes(m['size_after'])}", markup=False)
        elif b["status"] == "left":
            con.print(f"bucket {name}: [yellow]left as it is[/yellow]: {b['reason']}")
        else:
            con.print(f"bucket {name}: nothing to merge ({b['reason']})", markup=False)
    if d["deleted_runs"]:
        con.print(f"deleted {plural(len(d['deleted_runs']), 'run')} the merges replaced: "
                  f"{', '.join(d['deleted_runs'])}; run {d['runs'][-1]} restores as before",
                  markup=False)
    con.print(f"{d['seconds']:.1f} s")
