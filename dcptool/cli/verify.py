"""`dcptool verify ARCHIVE`: prove every file and record of an archive sound; with
`--against`, compare the archive's state with the live node it came from."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from dcptool.archive.verify import verify_archive
from dcptool.cli.app import app
from dcptool.cli.options import MasterOpt, NoProgressOpt, PartitionsOpt
from dcptool.cli.connopts import PANEL, ConnArgs, connection_options
from dcptool.cli.manual import manual
from dcptool.cli.output import backup_id_arg, human_bytes, note, plural, print_json, spark_progress
from dcptool.client.privileges import DCP_PRODUCER, check_privileges


manual(
    "verify",
    exit_note="1 when the archive has a problem (or, with --against, when the node's data "
              "differs); each problem is printed, naming the file or vbucket. With --against, "
              "1 when the user lacks the DcpProducer privilege (before Spark starts). 2 when "
              "--vbuckets names vbuckets the archive does not have.",
    files=(
        ("ARCHIVE/", "The archive (read only); see docs/archive-format.md."),
    ),
    env=("DCPTOOL_PROGRESS_INTERVAL",),
    see_also=("backup", "info", "restore"),
)


#: verify's -b: the node's bucket of --against (a bucket archive), or the buckets of a
#: cluster archive to verify
VerifyBucketOpt = Annotated[Optional[list[str]], typer.Option(
    "-b", "--bucket", envvar="DCPTOOL_BUCKET", rich_help_panel=PANEL, metavar="NAME",
    show_default=False,
    help="With --against: the bucket on the node (default: default). Of a cluster "
         "archive: verify only this bucket (repeatable, or a comma list; default: every "
         "bucket), compared with the node's bucket of the same name.")]


@app.command()
@connection_options(bucket=VerifyBucketOpt, bucket_default=None)
def verify(
    archive: Annotated[str, typer.Argument(
        metavar="ARCHIVE", help="Archive directory, or s3://BUCKET/PREFIX.",
        show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    checksums_only: Annotated[bool, typer.Option(
        "--checksums-only", help="Check manifests, sizes and SHA-256 only; do not "
                                 "decode records.")] = False,
    against: Annotated[bool, typer.Option(
        "--against", help="Compare the archive's state as of its last backup with the "
                          "node given by -c (per vbucket: count and hash of key, rev seqno, "
                          "cas, deleted).")] = False,
    backup_id: Annotated[Optional[str], typer.Option(
        "--backup", metavar="ID", help="With --against: compare the state as of this "
                                       "backup (its id or an unambiguous beginning of "
                                       "it; default: the newest).")] = None,
    vbuckets: Annotated[Optional[str], typer.Option(
        "--vbuckets", metavar="LIST", help="With --against: only these vbuckets.")] = None,
    conn_args: ConnArgs = None,
    master: MasterOpt = None,
    partitions: PartitionsOpt = None,
    no_progress: NoProgressOpt = False,
) -> None:
    """Check every backup of an archive: manifests, each file's size and SHA-256, every record,
    seqno order inside snapshots, and that each backup starts where its parent ended.

    Prints what is wrong, naming the file, and exits 1 if anything is; 0 otherwise.

    With --against -c CLUSTER it instead compares, for each vbucket, the archive's resolved
    state with the node's current data up to the seqno the last backup reached (a keys-only
    DCP pass), and names the vbuckets that differ with their first differing keys. A node
    with a history of its own (one the archive was restored into) is compared document by
    document, all it holds. A node with another vbucket count than the archive is compared
    by key whatever the two counts are: each archive vbucket against every document of the
    node whose key maps to it. Notes go to stderr (-q drops them).

    Example: dcptool verify /backups/default
    Example: dcptool verify /backups/default --against -c couchbase://127.0.0.1

    Of a cluster archive (backup --all-buckets) it verifies each bucket archive (-b: only
    those) and that every run file opens and names backups its bucket archives hold (or
    merged); with --against each bucket is compared with the node's bucket of the same
    name.

    Example: dcptool verify /backups/cluster -b travel-sample
    Example: dcptool verify /backups/cluster --against -c couchbase://127.0.0.1
    """
    from dcptool.cli.clusterarchive import given_on_command_line, is_cluster_archive

    if is_cluster_archive(archive):
        buckets = conn_args.bucket if given_on_command_line("bucket") else None
        if against:
            _cluster_verify_against(archive, buckets, as_json, backup_id, vbuckets, conn_args,
                                    master, partitions, no_progress)
        else:
            _cluster_verify(archive, buckets, as_json, checksums_only, backup_id, vbuckets)
        return
    if against:
        _verify_against(archive, as_json, backup_id, vbuckets, conn_args, master, partitions,
                        no_progress)
        return
    if backup_id or vbuckets:
        from dcptool.errors import UsageError

        raise UsageError("--backup and --vbuckets only apply with --against")
    from dcptool.cli.passphrase import open_archive

    report = verify_archive(open_archive(archive), records=not checksums_only)
    if as_json:
        print_json(report.to_json(), pretty=True)
    else:
        for p in report.problems:
            typer.echo(f"{p.path}: {p.message}")
        for note in report.notes:
            typer.echo(f"note: {note}")
        what = _checked(report, checksums_only)
        if report.ok:
            typer.echo(f"OK: {what} verified")
        else:
            typer.echo(f"FAILED: {len(report.problems)} problem"
                       f"{'s' if len(report.problems) != 1 else ''} in {what}")
    if not report.ok:
        raise typer.Exit(1)


def _checked(report, checksums_only: bool) -> str:
    """What a verify report checked, in words."""
    # the size as `info` gives it: the bytes of the backups' files
    what = (f"{plural(report.backups_checked, 'backup')} "
            f"({human_bytes(report.size_on_disk)}), "
            f"{plural(report.files_checked, 'file')}")
    if not checksums_only:
        what += f", {report.records_checked:,} records"
    return what


def _verify_against(archive, as_json, backup_id, vbuckets, conn_args: ConnArgs, master,
                    partitions, no_progress: bool = False) -> None:
    from dcptool.cli.passphrase import open_archive
    from dcptool.client.vbspec import parse_vbuckets
    from dcptool.pipeline.compare import run_verify_against

    # a clear error for a missing or foreign directory (or backup id) before connecting
    opened = open_archive(archive)
    backup_id = backup_id_arg(opened, backup_id)
    vbs = parse_vbuckets(vbuckets, limit=opened.vbucket_count, whose="the archive") \
        if vbuckets else None
    opts = conn_args.options(bucket=_node_bucket(conn_args.bucket))
    check_privileges(opts, "verify an archive against", DCP_PRODUCER)  # before Spark starts
    with spark_progress("compare", disabled=no_progress or as_json):
        report = run_verify_against(opened, opts, backup=backup_id, vbuckets=vbs,
                                    partitions=partitions, master=master)
    if as_json:
        print_json(report.to_json(), pretty=True)
    else:
        _print_against(report)
    if not report.ok:
        raise typer.Exit(1)


def _node_bucket(names) -> str:
    """-b of a bucket archive's --against: the one bucket on the node (default: default)."""
    from dcptool.archive.clusterread import split_names
    from dcptool.errors import UsageError

    names = split_names(names)
    if len(names) > 1:
        raise UsageError(f"-b/--bucket: one bucket on the node, not {len(names)}")
    return names[0] if names else "default"


def _print_against(report, prefix: str = "") -> None:
    """An --against report as text: differing vbuckets with their first differing keys,
    then one OK or FAILED line (`prefix` before each line: a cluster archive's bucket)."""
    # notes go to stderr (-q silences them); results to stdout
    for v in report.vbuckets:
        for text in v["notes"]:
            note(f"{prefix}vbucket {v['vbucket']}: note: {text}")
        if v["match"]:
            continue
        a, n = v["archive"], v["node"]
        upto = v.get("compared_to_seqno", v["end_seqno"])
        typer.echo(f"{prefix}vbucket {v['vbucket']} differs: archive "
                   f"{plural(a['count'], 'key')} (hash {a['hash']}), node "
                   f"{plural(n['count'], 'key')} (hash {n['hash']})"
                   + (f" up to seqno {upto}" if upto is not None else " mapping to it"))
        for d in v["differences"]:
            where = "" if d.get("collection_id", "0") == "0" else \
                f" (collection {d['collection_id']})"
            typer.echo(f"{prefix}  {d['key']}{where}: archive {_state(d['archive'])}, node "
                       f"{_state(d['node'])}")
    for text in report.notes:
        note(f"{prefix}note: {text}")
    total = len(report.vbuckets)
    keys = sum(v["archive"]["count"] for v in report.vbuckets)
    if report.ok:
        typer.echo(f"{prefix}OK: {plural(total, 'vbucket')} ({plural(keys, 'key')}) of backup "
                   f"{report.backup} match {report.node}")
    else:
        bad = report.differing
        typer.echo(f"{prefix}FAILED: {len(bad)} of {plural(total, 'vbucket')} differ from "
                   f"{report.node}: " + ", ".join(str(v["vbucket"]) for v in bad))


def _state(s) -> str:
    if s is None:
        return "absent"
    return (f"{'deleted' if s['deleted'] else 'live'} rev {s['rev_seqno']} cas {s['cas']}")


# -- cluster archives -------------------------------------------------------------------------


def _cluster_verify(archive, buckets, as_json: bool, checksums_only: bool, backup_id,
                    vbuckets) -> None:
    """verify of a cluster archive: each bucket archive (those -b names), the cluster
    archive's key files and its run files. JSON: docs/json-output.md, "dcptool verify of a
    cluster archive"."""
    from dcptool.archive.clusterread import check_cluster
    from dcptool.archive.errors import ArchiveError
    from dcptool.cli.clusterarchive import open_cluster, pick_buckets
    from dcptool.errors import UsageError

    if backup_id or vbuckets:
        raise UsageError("--backup and --vbuckets only apply with --against")
    cluster = open_cluster(archive)
    names = pick_buckets(cluster, buckets)
    reports: dict[str, object] = {}
    for name in names:
        try:
            reports[name] = verify_archive(cluster.open_bucket(name), records=not checksums_only)
        except ArchiveError as exc:  # its archive.json (or keys) does not open
            reports[name] = exc
    runs_checked, problems = check_cluster(cluster, names)
    failed = [n for n, r in reports.items() if isinstance(r, ArchiveError) or not r.ok]
    ok = not failed and not problems
    if as_json:
        print_json({
            "kind": "cluster", "archive": str(cluster.path), "ok": ok,
            "buckets": {n: ({"ok": False, "error": r.message} if isinstance(r, ArchiveError)
                            else r.to_json()) for n, r in reports.items()},
            "runs_checked": runs_checked,
            "problems": [{"path": p, "message": m} for p, m in problems],
        }, pretty=True)
    else:
        for name, r in reports.items():
            if isinstance(r, ArchiveError):
                typer.echo(f"bucket {name}: FAILED: {r.message}")
                continue
            for p in r.problems:
                typer.echo(f"{p.path}: {p.message}")
            for text in r.notes:
                typer.echo(f"note: {text}")
            what = _checked(r, checksums_only)
            typer.echo(f"bucket {name}: OK: {what} verified" if r.ok else
                       f"bucket {name}: FAILED: {plural(len(r.problems), 'problem')} in {what}")
        for path, message in problems:
            typer.echo(f"{path}: {message}")
        runs = plural(runs_checked, "run")
        if ok:
            typer.echo(f"OK: {plural(len(names), 'bucket')} and {runs} verified")
        else:
            bad = [f"bucket {n}" for n in failed] + \
                ([plural(len(problems), "problem") + " in the runs and keys"] if problems else [])
            typer.echo(f"FAILED: {', '.join(bad)} ({plural(len(names), 'bucket')}, {runs} "
                       "checked)")
    if not ok:
        raise typer.Exit(1)


def _cluster_verify_against(archive, buckets, as_json: bool, backup_id, vbuckets,
                            conn_args: ConnArgs, master, partitions, no_progress: bool) -> None:
    """verify --against of a cluster archive: each bucket (those -b names) compared with
    the node's bucket of the same name, one after the other on the same Spark session."""
    from dcptool.cli.clusterarchive import open_cluster, pick_buckets
    from dcptool.client.vbspec import parse_vbuckets
    from dcptool.errors import DcptoolError, UsageError
    from dcptool.pipeline.compare import run_verify_against

    cluster = open_cluster(archive)
    names = pick_buckets(cluster, buckets)
    if backup_id is not None and len(names) != 1:
        raise UsageError("--backup names a backup of one bucket: give -b NAME too")
    plans = []
    for name in names:  # every clear error (backup id, vbuckets, privileges) before Spark
        opened = cluster.open_bucket(name)
        bid = backup_id_arg(opened, backup_id)
        vbs = parse_vbuckets(vbuckets, limit=opened.vbucket_count,
                             whose=f"bucket {name}'s archive") if vbuckets else None
        opts = conn_args.options(bucket=name)
        check_privileges(opts, "verify an archive against", DCP_PRODUCER)
        plans.append((name, opened, bid, vbs, opts))
    results: dict[str, object] = {}
    with spark_progress("compare", disabled=no_progress or as_json):
        for name, opened, bid, vbs, opts in plans:
            try:
                results[name] = run_verify_against(opened, opts, backup=bid, vbuckets=vbs,
                                                   partitions=partitions, master=master)
            except DcptoolError as exc:  # e.g. an archive of no backup yet
                results[name] = exc
    failed = [n for n, r in results.items() if isinstance(r, DcptoolError) or not r.ok]
    if as_json:
        print_json({
            "kind": "cluster", "archive": str(cluster.path), "ok": not failed,
            "buckets": {n: ({"ok": False, "error": r.message} if isinstance(r, DcptoolError)
                            else r.to_json()) for n, r in results.items()},
        }, pretty=True)
    else:
        for name, r in results.items():
            if isinstance(r, DcptoolError):
                typer.echo(f"bucket {name}: FAILED: {r.message}")
            else:
                _print_against(r, prefix=f"bucket {name}: ")
        if failed:
            typer.echo(f"FAILED: {len(failed)} of {plural(len(names), 'bucket')} "
                       f"{'differs' if len(failed) == 1 else 'differ'} from the node: "
                       + ", ".join(failed))
        else:
            typer.echo(f"OK: {plural(len(names), 'bucket')} match the node")
    if failed:
        raise typer.Exit(1)
