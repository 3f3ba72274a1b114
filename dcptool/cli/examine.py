"""`dcptool examine ARCHIVE KEY`: every version of one key across the backups."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from dcptool.cli.app import app
from dcptool.cli.manual import manual
from dcptool.cli.options import NearestOpt, point_in_time
from dcptool.cli.output import (
    backup_id_arg, expiry_time, plural, human_bytes, print_json, print_table, table_console,
)
from dcptool.errors import DcptoolError


manual(
    "examine",
    exit_note="1 when the key has no version in the archive.",
    files=(
        ("ARCHIVE/", "The archive (read only)."),
    ),
    env=("DCPTOOL_GAP_TOLERANCE",),
    see_also=("info", "export", "restore"),
)


@app.command()
def examine(
    archive: Annotated[str, typer.Argument(
        metavar="ARCHIVE", help="Archive directory, or s3://BUCKET/PREFIX.",
        show_default=False)],
    key: Annotated[str, typer.Argument(help="Document key.", show_default=False)],
    backup_id: Annotated[Optional[str], typer.Option(
        "--backup", metavar="ID", help="Only the chain of this backup (its id or an "
                                       "unambiguous beginning of it; default: every "
                                       "backup).")] = None,
    collection: Annotated[Optional[str], typer.Option(
        "--collection", metavar="SCOPE.COLLECTION",
        help="Only the versions in this collection (default: the key in every "
             "collection).")] = None,
    at: Annotated[Optional[str], typer.Option(
        "--at", metavar="TIME",
        help="Mark the version the key had at this time (ISO 8601 with a zone, or "
             "relative: -15m), as restore --to-time would restore it.")] = None,
    nearest: NearestOpt = False,
    show_values: Annotated[bool, typer.Option("--values", help="Show each version's value.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the timeline as JSON.")] = False,
    bucket: Annotated[Optional[str], typer.Option(
        "-b", "--bucket", metavar="NAME", show_default=False,
        help="Of a cluster archive: the bucket whose archive to read (needed when it holds "
             "more than one).")] = None,
) -> None:
    """Show every version of one key across the archive's backups.

    For each version: backup, scope and collection, seqno, rev seqno, cas, type, size,
    flags and expiry (a UTC time; "never" for none), oldest first. --backup takes a
    backup's id or an unambiguous beginning of it. Versions on a history branch a rollback cut off are marked dead;
    versions of a collection that was later dropped are marked so; the version a restore
    would write is marked "would restore". Needs no node.

    Of a cluster archive (backup --all-buckets) it reads the archive of the bucket -b
    names (or of its only bucket).

    --at TIME reads the chain that holds TIME and marks "as of TIME" the version the key
    had at its vbucket's last snapshot boundary at or before TIME (what 'restore
    --to-time TIME' writes; none when the key did not exist or was deleted then); a time
    in a gap of the archive (no backup running) is refused unless --nearest.

    Example: dcptool examine /backups/default airline_10 --values
    Example: dcptool examine /backups/default airline_10 --at 2026-11-28T14:03:00Z
    Example: dcptool examine /backups/cluster airline_10 -b travel-sample
    """
    from dcptool.cli.clusterarchive import open_bucket_archive
    from dcptool.pipeline.examine import examine_key

    from dcptool.errors import UsageError

    when = point_in_time(at, nearest, "--at")
    if when is not None and backup_id:
        raise UsageError("--at and --backup exclude each other")
    opened = open_bucket_archive(archive, bucket)
    backup_id = backup_id_arg(opened, backup_id)
    d = examine_key(opened, key, backup=backup_id, values=show_values, collection=collection,
                    at=when, nearest=nearest)
    if json_out:
        print_json(d)
        if not d["versions"]:
            raise typer.Exit(1)
        return
    if not d["versions"]:
        raise DcptoolError(f"key {key!r} has no version in archive {archive} "
                           f"(vbucket {d['vbucket']}, {plural(d['backups_read'], 'backup')} read)")
    con = table_console()
    rows = []
    for v in d["versions"]:
        notes = ["dead branch"] if v["dead"] else (["would restore"] if v["restored"] else [])
        if v.get("as_of"):
            notes.insert(0, "as of --at")
        if v["collection_dropped"]:
            notes.append("collection dropped")
        rows.append([v["backup"], v["scope"] or "?", v["collection"] or "?", f"{v['seqno']:,}",
                     f"{v['rev_seqno']:,}", str(v["cas"]), v["type"], human_bytes(v["size"]),
                     "-" if v["flags"] is None else str(v["flags"]), expiry_time(v["expiry"]),
                     ", ".join(notes)])
    # a table where it fits, a block per version where it does not; a column no version
    # has a value in is left out
    print_table(con, ["backup", "scope", "collection", "seqno", "rev", "cas", "type", "size",
                      "flags", "expiry", "note"], rows,
                title=f"{d['key']} (vbucket {d['vbucket']})",
                right=("seqno", "rev", "cas", "size", "flags"))
    if d.get("at"):
        a = d["at"]
        state = ("existed" if a["exists"] else
                 "did not exist (deleted, or not yet written)")
        con.print(f"as of {a['to_time']}: the key {state}; vbucket {d['vbucket']} cut at seqno "
                  f"{a['seqno']} (backup {a['backup']})"
                  + (f", {a['lag_seconds']:.3f} s before it" if a["lag_seconds"] is not None
                     else ""), markup=False, highlight=False)
    if show_values:
        for v in d["versions"]:
            text = v.get("value", v.get("value_base64"))
            enc = "" if "value" in v else " (base64)"
            con.print(f"{v['backup']} seqno {v['seqno']}{enc}: {text}", markup=False,
                      highlight=False)
