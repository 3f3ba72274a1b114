"""`dcptool remove ARCHIVE` and `dcptool prune ARCHIVE`: take backups out of an archive
(what later backups depend on is merged forward, as `merge` does; see
dcptool.archive.retention)."""
from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.options import MasterOpt, NoProgressOpt, PartitionsOpt
from dcptool.cli.manual import manual
from dcptool.errors import UsageError
from dcptool.cli.output import (
    console, plural, print_json, print_table, spark_progress, table_console,
)

POLICY = "Retention policy"

_FILES = (
    ("ARCHIVE/backups/ID/", "The backups removed, and the merged backups that take the place "
                            "of kept ones."),
    ("ARCHIVE/logs/KIND-TIME.log", "The log of each run that changes the archive (mode 0600). "
                                   "The newest 20 are kept (DCPTOOL_LOG_KEEP)."),
)
_EXIT_NOTE = ("A failed or interrupted run leaves a restorable archive; the next remove, prune "
              "or merge finishes what it left.")

_ENV = ("DCPTOOL_LOG_KEEP", "DCPTOOL_PROGRESS_INTERVAL")
manual("remove", exit_codes=(3,), exit_note=_EXIT_NOTE, files=_FILES, env=_ENV,
       see_also=("prune", "merge", "info", "verify"))
manual("prune", exit_codes=(3,), exit_note=_EXIT_NOTE, files=_FILES, env=_ENV,
       see_also=("remove", "merge", "info", "verify"))

KeepLastOpt = Annotated[int, typer.Option(
    "--keep-last", metavar="N", min=0, rich_help_panel=POLICY,
    help="Keep the N newest backups.")]
KeepHourlyOpt = Annotated[int, typer.Option(
    "--keep-hourly", metavar="N", min=0, rich_help_panel=POLICY,
    help="Keep the newest backup of each of the N newest hours that have backups (UTC).")]
KeepDailyOpt = Annotated[int, typer.Option(
    "--keep-daily", metavar="N", min=0, rich_help_panel=POLICY,
    help="Keep the newest backup of each of the N newest days that have backups (UTC).")]
KeepWeeklyOpt = Annotated[int, typer.Option(
    "--keep-weekly", metavar="N", min=0, rich_help_panel=POLICY,
    help="Keep the newest backup of each of the N newest ISO weeks that have backups.")]
KeepMonthlyOpt = Annotated[int, typer.Option(
    "--keep-monthly", metavar="N", min=0, rich_help_panel=POLICY,
    help="Keep the newest backup of each of the N newest months that have backups (UTC).")]
KeepWithinOpt = Annotated[Optional[str], typer.Option(
    "--keep-within", metavar="DURATION", rich_help_panel=POLICY,
    help="Keep every backup within DURATION (s, m, h, d, w: 7d, 36h, 1d12h) of the newest "
         "backup, as restic's --keep-within: a continuous archive keeps every point of "
         "that time, and the other rules thin what is older.")]

ArchiveArg = Annotated[str, typer.Argument(
    metavar="ARCHIVE", help="Archive directory, or s3://BUCKET/PREFIX.", show_default=False)]
DryRunOpt = Annotated[bool, typer.Option(
    "--dry-run", help="Only show what would be kept, deleted and merged; change nothing.")]
LevelOpt = Annotated[Optional[int], typer.Option(
    "--level", min=1, max=22, help="zstd level of merged backups (default: the kept backup's).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
BucketsOpt = Annotated[Optional[list[str]], typer.Option(
    "--bucket", metavar="NAME",
    help="Cluster archives: only this bucket's archive (repeat for more); the run files are "
         "then kept.")]

_ACTION = {"keep": "keep", "delete": "[red]delete[/red]", "merge": "[yellow]merge[/yellow]",
           "merge-into": "keep (merged)"}


def print_rows(rows: list[dict[str, Any]]) -> None:
    """The backups and what happens to each (prune --dry-run, remove, info --keep-*)."""
    rows_out = []
    for r in rows:
        why = "; ".join(r["reasons"])
        if r["action"] == "merge":
            why = f"merged into {r['merged_into']}" + (f"; {why}" if why else "")
        elif r["action"] == "merge-into":
            why = (why + "; " if why else "") + "the removed backups it depends on are merged " \
                                                "into it"
        rows_out.append([r["id"], r["type"], _ACTION[r["action"]], why])
    print_table(table_console(), ["backup", "type", "action", "why"], rows_out, wrap=("why",))


def _report(d: dict[str, Any], json_out: bool) -> None:
    if json_out:
        print_json(d)
        return
    con = console()
    print_rows(d["backups"])
    if d["finished_earlier"]:
        con.print(f"finished an interrupted run first: removed "
                  f"{plural(len(d['finished_earlier']), 'backup')} it had taken out")
    verb = "would" if d["dry_run"] else "did"
    n_merged = sum(len(m["replaced"]) - 1 for m in d["merges"])
    con.print(f"{'dry run: ' if d['dry_run'] else ''}keep {plural(len(d['kept']), 'backup')}, "
              f"remove {len(d['removed']):,} ({len(d['deleted']):,} deleted, {n_merged:,} merged "
              f"into {plural(len(d['merges']), 'kept backup')})"
              + ("" if d["dry_run"] else f" in {d['seconds']:.1f} s"))
    for old, new in d["renamed"].items():
        con.print(f"  backup {old} is now {new} (merged)")
    if d["dry_run"] and not d["removed"]:
        con.print(f"nothing {verb} change")


def cluster_or_none(archive: str) -> Any:
    """The cluster archive at `archive`, opened (a wrong passphrase stops here), or None
    when it is not one."""
    from dcptool.archive.cluster import ClusterArchive, archive_kind
    from dcptool.cli.passphrase import passphrase_source

    if archive_kind(archive) != "cluster":
        return None
    return ClusterArchive.open(archive, passphrase=passphrase_source())


def no_cluster_options(**given: Any) -> None:
    for name, value in given.items():
        if value:
            raise UsageError(f"--{name.rstrip('s')} is for cluster archives",
                             hint="this archive holds one bucket")


def _report_cluster(d: dict[str, Any], json_out: bool) -> None:
    """prune / remove of a cluster archive: the runs, then per bucket its backups."""
    if json_out:
        print_json(d)
        return
    con = console()
    print_table(table_console(), ["run", "action", "why"],
                [[r["id"], "keep" if r["action"] == "keep" else "[red]drop[/red]",
                  "; ".join(r["reasons"])] for r in d["runs"]], wrap=("why",),
                title="runs")
    for name, b in d["buckets"].items():
        changes = b["removed"]
        n_merged = sum(len(m["replaced"]) - 1 for m in b["merges"])
        if d["dry_run"]:
            con.print(f"bucket {name}:", markup=False)
            print_rows(b["backups"])
        verb = "would remove" if d["dry_run"] else "removed"
        con.print(f"bucket {name}: {verb} {plural(len(changes), 'backup')} "
                  f"({len(b['deleted']):,} deleted, {n_merged:,} merged into "
                  f"{plural(len(b['merges']), 'kept backup')})", markup=False)
        for old, new in b["renamed"].items():
            con.print(f"  backup {old} is now {new} (merged)", markup=False)
    verb = "dry run: would drop" if d["dry_run"] else "dropped"
    con.print(f"{verb} {plural(len(d['dropped_runs']), 'run')}, kept "
              f"{len(d['kept_runs']):,}" + ("" if d["dry_run"] else
                                           f" in {d['seconds']:.1f} s"))
    if d["dropped_runs"] and not d["deleted_runs"] and not d["dry_run"]:
        con.print("the run files are kept (--bucket)")
    for rid, gone in d["incomplete_runs"].items():
        con.print(f"run {rid} is incomplete: " + ", ".join(f"{b}'s backup {i} is gone"
                                                            for b, i in gone.items()),
                  markup=False)


@app.command()
def remove(
    archive: ArchiveArg,
    backups: Annotated[Optional[list[str]], typer.Option(
        "--backup", metavar="ID", help="A backup to remove (repeat for more).")] = None,
    runs: Annotated[Optional[list[str]], typer.Option(
        "--run", metavar="RUN-ID",
        help="Cluster archives: a backup run to remove (repeat for more).")] = None,
    older: Annotated[Optional[str], typer.Option(
        "--older-than", metavar="DURATION",
        help="Remove the backups older than this (s, m, h, d, w: 30d, 12h, 1d12h), by the "
             "time in their ids.")] = None,
    keep_within: KeepWithinOpt = None,
    buckets: BucketsOpt = None,
    dry_run: DryRunOpt = False,
    level: LevelOpt = None,
    master: MasterOpt = None,
    partitions: PartitionsOpt = None,
    no_progress: NoProgressOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Remove backups from an archive, keeping every other backup restorable.

    A backup no remaining backup depends on is deleted. The backups a remaining later
    backup depends on are merged into it (as merge does: the newest version of each key,
    deletions kept), and the merged backup takes its place: same data, same restore, its id
    a microsecond later; a removed full backup makes the next remaining one full. Each
    merge is committed and verified before anything is deleted, and a run killed midway
    leaves a restorable archive that the next remove, prune or merge tidies.

    The newest backup is never removed: the next incremental backup and the archive's high
    watermark on the node go by its end, which so never moves backwards. --older-than
    leaves it out; naming it with --backup is an error. A backup that two remaining
    backups on separate branches depend on cannot be removed.

    A backup whose manifest is damaged (truncated, say) blocks the backups after it;
    --backup ID removes it, even the newest, and touches nothing else: no merge (the
    backups that continue from it must be named too). The next backup then continues from
    the newest readable one.

    A cluster archive ('dcptool backup --all-buckets') removes backup runs: --run RUN-ID,
    or --older-than by the time in the run ids (the newest run is never removed). In each
    bucket's archive the backups only the removed runs name are removed as above (merged
    forward where a kept backup depends on them), then the runs' files are deleted; a
    kept run restores exactly as before. --bucket NAME works on those buckets only and
    keeps the run files.

    --keep-within DURATION never removes the backups (runs) within DURATION of the newest
    one: --older-than leaves them out, and naming one with --backup (--run) is an error.

    Example: dcptool remove /backups/default --older-than 90d --dry-run
    Example: dcptool remove /backups/default --older-than 1d --keep-within 7d
    Example: dcptool remove /backups/default --backup 20261122T101502.123456Z
    Example: dcptool remove /backups/cluster --run 20261120T020000.000000Z
    """
    from dcptool.cli.passphrase import open_archive
    from dcptool.pipeline.prune import run_remove

    cluster = cluster_or_none(archive)
    if cluster is not None:
        if backups:
            raise UsageError("--backup names a backup of one bucket's archive",
                             hint="a cluster archive removes runs: --run RUN-ID")
        from dcptool.pipeline.clusterprune import run_cluster_remove

        with spark_progress("remove", disabled=no_progress or json_out or dry_run):
            d = run_cluster_remove(cluster, runs or (), older=older, buckets=buckets,
                                   dry_run=dry_run, level=level, partitions=partitions,
                                   master=master, keep_within=keep_within)
        _report_cluster(d, json_out)
        return
    no_cluster_options(runs=runs, buckets=buckets)
    opened = open_archive(archive)
    with spark_progress("remove", disabled=no_progress or json_out or dry_run):
        d = run_remove(opened, backups or (), older=older, dry_run=dry_run, level=level,
                       partitions=partitions, master=master, keep_within=keep_within)
    _report(d, json_out)


@app.command()
def prune(
    archive: ArchiveArg,
    keep_last: KeepLastOpt = 0,
    keep_hourly: KeepHourlyOpt = 0,
    keep_daily: KeepDailyOpt = 0,
    keep_weekly: KeepWeeklyOpt = 0,
    keep_monthly: KeepMonthlyOpt = 0,
    keep_within: KeepWithinOpt = None,
    buckets: BucketsOpt = None,
    dry_run: DryRunOpt = False,
    level: LevelOpt = None,
    master: MasterOpt = None,
    partitions: PartitionsOpt = None,
    no_progress: NoProgressOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Remove the backups a retention policy does not keep (as restic's forget decides).

    Backups are placed in time by the UTC timestamp in their ids (when they began; a merged
    backup keeps its original's). --keep-last N keeps the N newest; --keep-hourly, -daily,
    -weekly and -monthly N keep, going back from the newest, the newest backup of each hour
    (day, ISO week, month) that has backups, for N such hours (days, weeks, months);
    --keep-within DURATION keeps every backup within DURATION of the newest (restic's
    --keep-within). A backup any rule keeps is kept, and the newest backup always is. At
    least one rule is needed.

    With --keep-within 7d --keep-daily 30 a continuous archive keeps every checkpoint of
    its last 7 days (restore --to-time to any second of them) and one backup a day before:
    the removed ones are merged into the kept ones, which keep only their end as a point
    to restore to, so 'dcptool info' shows gaps between them.

    The others are removed as remove removes them: what a kept backup depends on is merged
    into it, the rest is deleted; a run killed midway leaves a restorable archive. 'dcptool
    info ARCHIVE --keep-daily 7 ...' shows what a policy would keep without changing
    anything.

    A cluster archive ('dcptool backup --all-buckets') is pruned by its backup runs: the
    policy chooses among the runs (placed in time by their ids), and in each bucket's
    archive the backups that only the dropped runs name are removed as above (merged
    forward into the backups of kept runs that depend on them; a bucket's newest backup
    and backups no run names are kept); the dropped runs' files are deleted last. Every
    kept run restores exactly as before. --bucket NAME prunes those buckets' archives only
    and keeps the run files.

    Example: dcptool prune /backups/default --keep-last 3 --keep-daily 7 --keep-weekly 4 --keep-monthly 12
    Example: dcptool prune /backups/default --keep-hourly 24 --dry-run
    Example: dcptool prune /backups/default --keep-within 7d --keep-daily 30
    Example: dcptool prune /backups/cluster --keep-daily 7 --dry-run
    """
    from dcptool.archive.retention import Policy
    from dcptool.pipeline.prune import run_prune

    policy = Policy(last=keep_last, hourly=keep_hourly, daily=keep_daily, weekly=keep_weekly,
                    monthly=keep_monthly, within=keep_within)
    from dcptool.cli.passphrase import open_archive

    cluster = cluster_or_none(archive)
    if cluster is not None:
        from dcptool.pipeline.clusterprune import run_cluster_prune

        with spark_progress("prune", disabled=no_progress or json_out or dry_run):
            d = run_cluster_prune(cluster, policy, buckets=buckets, dry_run=dry_run,
                                  level=level, partitions=partitions, master=master)
        _report_cluster(d, json_out)
        return
    no_cluster_options(buckets=buckets)
    opened = open_archive(archive)
    with spark_progress("prune", disabled=no_progress or json_out or dry_run):
        d = run_prune(opened, policy, dry_run=dry_run, level=level, partitions=partitions,
                      master=master)
    _report(d, json_out)
