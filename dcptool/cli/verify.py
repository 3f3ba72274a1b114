"""`dcptool verify ARCHIVE`: prove every file and record of an archive sound; with
`--against`, compare the archive's state with the live node it came from."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from dcptool.archive.verify import verify_archive
from dcptool.cli.app import app
from dcptool.cli.options import MasterOpt, NoProgressOpt, PartitionsOpt
from dcptool.cli.connopts import ConnArgs, connection_options
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


@app.command()
@connection_options()
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
    """
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
        # the size as `info` gives it: the bytes of the backups' files
        what = (f"{plural(report.backups_checked, 'backup')} "
                f"({human_bytes(report.size_on_disk)}), "
                f"{plural(report.files_checked, 'file')}")
        if not checksums_only:
            what += f", {report.records_checked:,} records"
        if report.ok:
            typer.echo(f"OK: {what} verified")
        else:
            typer.echo(f"FAILED: {len(report.problems)} problem"
                       f"{'s' if len(report.problems) != 1 else ''} in {what}")
    if not report.ok:
        raise typer.Exit(1)


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
    opts = conn_args.options()
    check_privileges(opts, "verify an archive against", DCP_PRODUCER)  # before Spark starts
    with spark_progress("compare", disabled=no_progress or as_json):
        report = run_verify_against(opened, opts, backup=backup_id, vbuckets=vbs,
                                    partitions=partitions, master=master)
    if as_json:
        print_json(report.to_json(), pretty=True)
    else:
        # notes go to stderr (-q silences them); results to stdout
        for v in report.vbuckets:
            for text in v["notes"]:
                note(f"vbucket {v['vbucket']}: note: {text}")
            if v["match"]:
                continue
            a, n = v["archive"], v["node"]
            upto = v.get("compared_to_seqno", v["end_seqno"])
            typer.echo(f"vbucket {v['vbucket']} differs: archive {plural(a['count'], 'key')} "
                       f"(hash {a['hash']}), node {plural(n['count'], 'key')} (hash {n['hash']})"
                       + (f" up to seqno {upto}" if upto is not None else " mapping to it"))
            for d in v["differences"]:
                where = "" if d.get("collection_id", "0") == "0" else \
                    f" (collection {d['collection_id']})"
                typer.echo(f"  {d['key']}{where}: archive {_state(d['archive'])}, node "
                           f"{_state(d['node'])}")
        for text in report.notes:
            note(f"note: {text}")
        total = len(report.vbuckets)
        keys = sum(v["archive"]["count"] for v in report.vbuckets)
        if report.ok:
            typer.echo(f"OK: {plural(total, 'vbucket')} ({plural(keys, 'key')}) of backup {report.backup} match "
                       f"{report.node}")
        else:
            bad = report.differing
            typer.echo(f"FAILED: {len(bad)} of {plural(total, 'vbucket')} differ from {report.node}: "
                       + ", ".join(str(v["vbucket"]) for v in bad))
    if not report.ok:
        raise typer.Exit(1)


def _state(s) -> str:
    if s is None:
        return "absent"
    return (f"{'deleted' if s['deleted'] else 'live'} rev {s['rev_seqno']} cas {s['cas']}")
