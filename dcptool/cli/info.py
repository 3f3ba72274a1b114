"""`dcptool info ARCHIVE`: the backups an archive holds. Needs no node.

With -c it also asks the node the archive backs up for its purge seqnos and its high
watermark table, and warns about vbuckets whose next incremental backup would have to
start again from seqno 0 because deletions after the archive's end were purged.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from dcptool.archive import Archive
from dcptool.archive.info import describe_archive
from dcptool.cli.app import app
from dcptool.cli.connopts import PANEL, ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.output import console, human_bytes, plural, print_json, print_table, table_console
from dcptool.cli.prune import (
    KeepDailyOpt,
    KeepHourlyOpt,
    KeepLastOpt,
    KeepMonthlyOpt,
    KeepWeeklyOpt,
    KeepWithinOpt,
    print_rows,
)


manual(
    "info",
    files=(
        ("ARCHIVE/", "The archive (read only); see docs/archive-format.md."),
    ),
    env=("DCPTOOL_GAP_TOLERANCE",),
    see_also=("backup", "verify", "examine", "merge", "prune"),
)


#: info's own -c: it reads no DCPTOOL_CLUSTER, so plain `dcptool info` never needs a node
InfoClusterOpt = Annotated[Optional[str], typer.Option(
    "-c", "--cluster", metavar="URL", rich_help_panel=PANEL,
    help="Also check this node: warn when its purge seqno is above a vbucket's last "
         "backed-up seqno, and show the archive's high watermark there.")]


#: info's own -b: the node's bucket defaults to the archive's
InfoBucketOpt = Annotated[Optional[list[str]], typer.Option(
    "-b", "--bucket", rich_help_panel=PANEL, metavar="NAME", show_default=False,
    help="Bucket on the node (default: the archive's bucket). Of a cluster archive: show "
         "this bucket's full info (repeatable, or a comma list; default: a row per "
         "bucket), checked with -c against the node's bucket of the same name.")]


def _short_time(iso: str | None) -> str:
    """'2026-11-22T10:15:02.123456Z' -> '2026-11-22 10:15:02'."""
    if not iso:
        return "?"
    return iso.replace("T", " ")[:19]


@app.command()
@connection_options(cluster=InfoClusterOpt, bucket=InfoBucketOpt, bucket_default=None,
                    timeout=True)
def info(
    archive: Annotated[str, typer.Argument(
        metavar="ARCHIVE", help="Archive directory, or s3://BUCKET/PREFIX.",
        show_default=False)],
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the description as JSON.")] = False,
    keep_last: KeepLastOpt = 0,
    keep_hourly: KeepHourlyOpt = 0,
    keep_daily: KeepDailyOpt = 0,
    keep_weekly: KeepWeeklyOpt = 0,
    keep_monthly: KeepMonthlyOpt = 0,
    keep_within: KeepWithinOpt = None,
    conn_args: ConnArgs = None,
) -> None:
    """Show the backups an archive holds: id, parent, type, complete or partial, time,
    vbuckets, counts, size on disk and rollbacks.

    With -c CLUSTER it also compares the node's purge seqnos with the archive's last
    backed-up seqnos: where the node already purged deletions the archive has not seen,
    the next incremental backup of that vbucket starts again from seqno 0.

    With --keep-* options (a retention policy, as prune takes) it also shows what prune
    with that policy would do to each backup: keep it (and why), delete it, or merge it
    into the kept backup that depends on it. Nothing is changed.

    It ends with each bucket's restorable window, the times restore --to-time, examine
    --at and export --at can go to: a bar at the terminal's width from its earliest to its
    latest time, the spans when a backup was running drawn full and the gaps (no backup
    running: more than 10 s between two backups, DCPTOOL_GAP_TOLERANCE) drawn light; a full
    or merged backup gives only its end. --json has it as point_in_time: {window:
    {earliest, latest}, gaps: [{from, to}]}. Batch backups give the granularity of their
    snapshot boundaries, with a gap between every two.

    Example: dcptool info /backups/default
    Example: dcptool info /backups/default --keep-daily 7 --keep-weekly 4
    Example: dcptool info /backups/default --keep-within 7d --keep-daily 30
    Example: dcptool info /backups/default -c couchbase://127.0.0.1

    Of a cluster archive (backup --all-buckets) it shows a row per bucket (backups, items,
    size, newest backup, the latest run's status of the bucket), totals and the runs;
    -b NAME shows that bucket's full info as for a bucket archive. With -c each bucket is
    checked against the node's bucket of the same name. --keep-* needs a bucket archive.

    Example: dcptool info /backups/cluster
    Example: dcptool info /backups/cluster -b travel-sample
    """
    from dcptool.archive.retention import Policy, preview, select_prune

    from dcptool.cli.clusterarchive import is_cluster_archive
    from dcptool.cli.passphrase import open_archive

    if is_cluster_archive(archive):
        _cluster_info(archive, as_json, conn_args, keep_last or keep_hourly or keep_daily
                      or keep_weekly or keep_monthly or keep_within)
        return
    arch = open_archive(archive)
    desc = describe_archive(arch)
    window = _add_window(desc, arch)
    desc["continuous"] = _continuous(arch)
    policy = Policy(last=keep_last, hourly=keep_hourly, daily=keep_daily, weekly=keep_weekly,
                    monthly=keep_monthly, within=keep_within)
    if not policy.empty:
        remove, reasons = select_prune(arch, policy)
        _plan, rows = preview(arch, remove, reasons)
        desc["retention"] = {"policy": policy.as_dict(), "backups": rows}
    if conn_args.cluster is not None:
        opts = conn_args.options(bucket=_node_bucket(conn_args.bucket) or arch.bucket)
        desc["node_check"] = node_check(arch, opts)
    if as_json:
        print_json(desc, pretty=True)
        return
    _print_bucket_info(desc, archive)
    _print_windows([(arch.bucket, window)])


def _node_bucket(names: list[str] | None) -> str | None:
    """-b of a bucket archive: the one bucket on the node."""
    from dcptool.archive.clusterread import split_names
    from dcptool.errors import UsageError

    names = split_names(names)
    if len(names) > 1:
        raise UsageError("-b/--bucket: one bucket on the node for a bucket archive, not "
                         f"{len(names)}")
    return names[0] if names else None


def _print_lock(con: Any, locked_by: dict[str, Any] | None) -> None:
    """The archive lock's holder, when a run holds it (`{}`: held, holder unknown)."""
    if locked_by is not None:
        who = locked_by or {}
        con.print(f"[yellow]locked by pid {who.get('pid')} on {who.get('host')} since "
                  f"{who.get('time')} ({who.get('purpose')})[/yellow]")


def _continuous(arch: Any) -> dict[str, Any] | None:
    """A continuous backup of the archive (backup --continuous): running or not, its last
    checkpoint and lag; None when none ever ran."""
    from dcptool.pipeline.continuous import continuous_status

    return continuous_status(arch.path)


def _print_continuous(con: Any, c: dict[str, Any] | None) -> None:
    if c is None:
        return
    if c["running"]:
        lag = "?" if c["lag_seconds"] is None else f"{c['lag_seconds']:.1f} s"
        behind = "?" if c["items_behind"] is None else f"{c['items_behind']:,}"
        con.print(f"continuous backup running: lag {lag} ({behind} items behind), last "
                  f"checkpoint {c['last_checkpoint'] or 'none yet'}, every "
                  f"{c['checkpoint_seconds']:g} s (pid {c['pid']} on {c['host']})"
                  + (f"; failing: {c['failing']}" if c.get("failing") else ""))
    else:
        con.print(f"continuous backup not running (last checkpoint "
                  f"{c['last_checkpoint'] or 'none'})")


def _print_cluster_continuous(con: Any, c: dict[str, Any] | None) -> None:
    """A continuous backup of a cluster archive: running or not, and per bucket how far
    behind the node it is."""
    if c is None:
        return
    if not c["running"]:
        con.print(f"continuous backup not running (last checkpoint "
                  f"{c['last_checkpoint'] or 'none'})")
        return
    con.print(f"continuous backup running since {c['since']}, every "
              f"{c['checkpoint_seconds']:g} s (pid {c['pid']} on {c['host']}):")
    for name, b in (c.get("buckets") or {}).items():
        lag = "?" if b["lag_seconds"] is None else f"{b['lag_seconds']:.1f} s"
        behind = "?" if b["items_behind"] is None else f"{b['items_behind']:,}"
        con.print(f"  bucket {escape(name)}: lag {lag} ({behind} items behind), last "
                  f"checkpoint {b['last_checkpoint'] or 'none yet'}"
                  + (f"; failing: {escape(b['failing'])}" if b.get("failing") else ""))
    for name in c.get("dropped") or ():
        con.print(f"  bucket {escape(name)}: not on the node (its backups are kept)")


def _print_bucket_info(desc: dict[str, Any], archive: str) -> None:
    """A bucket archive's description (describe_archive's), as info prints it."""
    a = desc["archive"]
    con = table_console()
    con.print(f"archive [bold]{a['path']}[/bold]  bucket {a['bucket']}  "
              f"{a['vbuckets']} vbuckets  created {a['created']}  format {a['format']} "
              f"v{a['version']}{'  encrypted' if a.get('encrypted') else ''}  "
              f"{human_bytes(a['size_on_disk'])}")
    _print_lock(con, a["locked_by"])
    _print_continuous(con, desc.get("continuous"))
    backups = desc["backups"]
    if not backups:
        con.print("no backups yet")
        return
    rows = []
    for b in backups:
        if b["state"] == "damaged":
            rows.append([b["id"], "", "", "[red]damaged[/red]", "", "", "", "", "", "",
                         human_bytes(b["size_on_disk"])])
            continue
        state = b["state"] if b["state"] == "complete" else "[yellow]partial[/yellow]"
        vbs = str(b["vbuckets"]) if b["state"] == "complete" else \
            f"{b['vbuckets']} of {_planned(b)}"
        rows.append([b["id"], b["parent"] or "-", b["type"] or "?", state,
                     _short_time(b["started"]), vbs, f"{b['mutations']:,}", f"{b['deletions']:,}",
                     f"{b['expirations']:,}", f"{b['rollbacks']:,}",
                     human_bytes(b["size_on_disk"])])
    # a table where it fits, a block per backup where it does not (80 columns)
    print_table(con, ["backup", "parent", "type", "state", "time", "vbuckets", "mutations",
                      "deletions", "expirations", "rollbacks", "size on disk"], rows,
                right=("vbuckets", "mutations", "deletions", "expirations", "rollbacks",
                       "size on disk"),
                optional=("time",))  # a backup's id is the time it began
    for b in backups:
        if b["state"] == "partial":
            con.print(f"[yellow]{b['id']} is partial[/yellow]: {b['vbuckets']} of "
                      f"{_planned(b)} vbuckets complete; the next backup resumes it; "
                      "--purge-partial discards it")
        elif b["state"] == "damaged":
            con.print(f"[red]{b['id']}: {b['error']}[/red]"
                      + (f" (hint: {b['hint']})" if b.get("hint") else ""))
        if b.get("merged_from"):
            ids = b["merged_from"]
            con.print(f"{b['id']}: merged from {plural(len(ids), 'backup')} ({ids[0]} .. {ids[-1]})")
        for r in b.get("rollback_records", []):
            con.print(f"{b['id']}: vbucket {r['vbucket']} rolled back to seqno {r['seqno']} "
                      f"(uuid {r['vbucket_uuid']})")
    if "retention" in desc:
        pol = " ".join(f"--keep-{k} {v}" for k, v in desc["retention"]["policy"].items() if v)
        con.print(f"prune {pol} would:")
        print_rows(desc["retention"]["backups"])
    if "node_check" in desc:
        _print_node_check(desc["node_check"], archive)


def _planned(b: dict[str, Any]) -> str:
    """Of how many vbuckets a partial backup's complete ones are: those it will hold, or
    (begun by an older dcptool, which did not record them) those it started."""
    if b.get("vbuckets_planned") is not None:
        return str(b["vbuckets_planned"])
    return f"{b['vbuckets_started']} started"


def node_check(arch: Archive, opts) -> dict[str, Any]:
    """What the node says about this archive: purge seqno warnings and its watermark row."""
    from dcptool.archive.info import purge_warnings
    from dcptool.client.watermark import (
        WatermarkUnsupported,
        get_purge_seqnos,
        list_watermarks,
    )
    from dcptool.pipeline.backup import archive_watermark

    name, instance, ends, _meta = archive_watermark(arch)
    with opts.connect() as conn:
        purge = get_purge_seqnos(conn)
        try:
            rows = list_watermarks(conn, name, instance).get("entries", [])
            support = True
        except WatermarkUnsupported:
            rows, support = [], False
    row = rows[0] if rows else None
    return {
        "node": opts.address, "warnings": purge_warnings(ends, purge),
        "watermark": {"name": name, "instance": instance, "supported": support,
                      "state": row["state"] if row else None,
                      "expires_at": row["expires_at"] if row else None,
                      "lowest_seqno": row["lowest_seqno"] if row else None},
    }


def _print_node_check(check: dict[str, Any], archive: Path) -> None:
    import time

    con = console()
    if "error" in check:  # a cluster archive's bucket the node could not be asked about
        con.print(f"[yellow]node {check['node']}: {escape(check['error'])}[/yellow]")
        return
    wm = check["watermark"]
    if not wm["supported"]:
        con.print(f"node {check['node']}: no high watermark table (its purger does not wait "
                  "for backups)")
    elif wm["state"] is None:
        con.print(f"[yellow]node {check['node']}: no high watermark registered for this archive"
                  f"[/yellow] ({wm['name']})")
    else:
        exp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(wm["expires_at"]))
        color = "green" if wm["state"] == "ok" else "yellow"
        con.print(f"node {check['node']}: high watermark {wm['name']} [{color}]{wm['state']}"
                  f"[/{color}], expires {exp}")
    warnings = check["warnings"]
    if not warnings:
        con.print(f"node {check['node']}: no deletion the archive still needs was purged")
        return
    err = console(stderr=True)
    vbs = [w["vbucket"] for w in warnings]
    shown = ", ".join(str(v) for v in vbs[:10]) + (" ..." if len(vbs) > 10 else "")
    w0 = warnings[0]
    err.print(f"dcptool: warning: the node purged deletions this archive has not backed up in "
              f"{plural(len(vbs), 'vbucket')} ({shown}; e.g. vbucket {w0['vbucket']}: backed up to seqno "
              f"{w0['backed_up_seqno']}, purge seqno {w0['purge_seqno']}): the next incremental "
              f"backup reads them again from seqno 0", markup=False, soft_wrap=True)
    err.print("dcptool: hint: back up more often than the node's purge age, and keep the "
              "archive's high watermark registered (backup does it unless --no-watermark; "
              f"'dcptool watermark register --archive {archive}' does it by hand)",
              markup=False, soft_wrap=True)


# -- cluster archives -------------------------------------------------------------------------


def _cluster_info(archive: str, as_json: bool, conn_args: ConnArgs, keep: int) -> None:
    """info of a cluster archive: a row per bucket, totals and runs; with -b the full
    info of those buckets. JSON: docs/json-output.md, "dcptool info of a cluster
    archive"."""
    from dcptool.archive.clusterread import describe_cluster
    from dcptool.cli.clusterarchive import open_cluster, pick_buckets, refuse_options

    refuse_options(**{"--keep-*": keep})
    cluster = open_cluster(archive)
    wanted = conn_args.bucket
    desc = describe_cluster(cluster, pick_buckets(cluster, wanted))
    windows = _add_cluster_windows(cluster, desc)
    for name, d in desc["buckets"].items():  # each bucket's entry is its archive's info
        if "error" not in d:
            d["continuous"] = _continuous(cluster.open_bucket(name))
    desc["continuous"] = _continuous(cluster)  # backup --continuous of the cluster archive
    if conn_args.cluster is not None:
        _cluster_node_checks(cluster, desc, conn_args)
    if as_json:
        print_json(desc, pretty=True)
        return
    if wanted:
        for name, d in desc["buckets"].items():
            if "error" in d:
                console().print(f"[red]bucket {name}: {escape(d['error'])}[/red]")
                continue
            table_console().print(f"[bold]bucket {name}[/bold]")
            _print_bucket_info(d, f"{archive}/buckets/{name}")
        _print_windows(windows)
        return
    con = table_console()
    con.print(f"cluster archive [bold]{desc['path']}[/bold]  created {desc['created']}  "
              f"format {desc['format']} v{desc['version']}"
              f"{'  encrypted' if desc['encrypted'] else ''}  "
              f"{plural(len(desc['buckets']), 'bucket')}  {plural(len(desc['runs']), 'run')}")
    _print_lock(con, desc["locked_by"])
    _print_cluster_continuous(con, desc.get("continuous"))
    rows = []
    for name, d in desc["buckets"].items():
        if "error" in d:
            rows.append([name, "", "", "", "", f"[red]{escape(d['error'])}[/red]"])
            continue
        r = d["summary"]
        backups = str(r["backups"]) + (f" (+{r['partial_backups']} partial)"
                                       if r["partial_backups"] else "")
        rows.append([name, backups, f"{r['items']:,}", human_bytes(r["size_on_disk"]),
                     r["newest_backup"] or "-", r["latest_run_status"] or "-"])
    t = desc["totals"]
    rows.append(["(all)", str(t["backups"]), f"{t['items']:,}", human_bytes(t["size_on_disk"]),
                 "", ""])
    print_table(con, ["bucket", "backups", "items", "size on disk", "newest backup",
                      "latest run"], rows, right=("backups", "items", "size on disk"))
    if desc["runs"]:
        rows = []
        for run in desc["runs"]:
            if "error" in run:
                rows.append([run["id"], f"[red]{escape(run['error'])}[/red]", "", ""])
                continue
            rows.append([run["id"], ", ".join(run["backed_up"]) or "-",
                         "-" if run["users"] is None else str(run["users"]),
                         "-" if run["groups"] is None else str(run["groups"])])
        print_table(con, ["run", "buckets backed up", "users", "groups"], rows,
                    wrap=("buckets backed up",), right=("users", "groups"))
    else:
        con.print("no committed run yet")
    _print_windows(windows)
    for name, d in desc["buckets"].items():
        if "node_check" in d:
            con.print(f"[bold]bucket {name}[/bold]")
            _print_node_check(d["node_check"], f"{archive}/buckets/{name}")


# -- the restorable window (point in time) ---------------------------------------------------


def _add_window(desc: dict[str, Any], arch: Archive) -> Any:
    """desc["point_in_time"]: the archive's restorable window and gaps (JSON); returns what
    _print_windows draws."""
    from dcptool.cli.timeline import public, timeline_info

    window = timeline_info(arch)
    desc["point_in_time"] = public(window)
    return window


def _add_cluster_windows(cluster: Any, desc: dict[str, Any]) -> list[tuple[str, Any]]:
    """Each described bucket's window (its `point_in_time`), for _print_windows."""
    from dcptool.errors import DcptoolError

    out = []
    for name, d in desc["buckets"].items():
        if "error" in d:
            continue
        try:
            out.append((name, _add_window(d, cluster.open_bucket(name))))
        except DcptoolError:
            continue
    return out


def _print_windows(windows: list[tuple[str, Any]]) -> None:
    """A timeline bar per bucket at the terminal's width; piped without COLUMNS, 80
    columns (a bar has no natural width, and 80 reads in any pager or mail)."""
    import os

    from dcptool.cli.timeline import timeline_lines

    con = console()
    if not con.is_terminal and not os.environ.get("COLUMNS"):
        con.width = 80
    unicode = (con.encoding or "").lower().replace("-", "").startswith("utf")
    for line in timeline_lines(windows, con.width, unicode=unicode):
        con.print(line, markup=False, highlight=False)


def _cluster_node_checks(cluster, desc: dict[str, Any], conn_args: ConnArgs) -> None:
    """-c of a cluster archive: each described bucket's node check against the node's
    bucket of the same name (`node_check` in its description; `{"node", "error"}` when
    the node cannot be asked, e.g. it has no such bucket)."""
    from dcptool.errors import DcptoolError

    for name, d in desc["buckets"].items():
        if "error" in d:
            continue
        opts = conn_args.options(bucket=name)
        try:
            d["node_check"] = node_check(cluster.open_bucket(name), opts)
        except DcptoolError as exc:
            d["node_check"] = {"node": opts.address, "error": exc.message}
