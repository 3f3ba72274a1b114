"""`dcptool info ARCHIVE`: the backups an archive holds. Needs no node."""
from __future__ import annotations

from pathlib import Path

import typer

from dcptool.archive import Archive
from dcptool.archive.info import describe_archive
from dcptool.cli.app import app
from dcptool.cli.output import console, print_json


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _short_time(iso: str | None) -> str:
    """'2026-11-22T10:15:02.123456Z' -> '2026-11-22 10:15:02'."""
    if not iso:
        return "?"
    return iso.replace("T", " ")[:19]


@app.command()
def info(
    archive: Path = typer.Argument(..., help="Archive directory.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print the description as JSON."),
) -> None:
    """Show the backups an archive holds: id, parent, type, complete or partial, time,
    vbuckets, counts, size on disk and rollbacks.

    Example: dcptool info /backups/default
    """
    desc = describe_archive(Archive.open(archive))
    if as_json:
        print_json(desc, pretty=True)
        return
    from rich.table import Table

    a = desc["archive"]
    con = console()
    if not con.is_terminal:
        con.width = max(con.width, 200)
    con.print(f"archive [bold]{a['path']}[/bold]  bucket {a['bucket']}  "
              f"{a['vbuckets']} vbuckets  created {a['created']}  format {a['format']} "
              f"v{a['version']}  {human_bytes(a['size_on_disk'])}")
    if a["locked_by"] is not None:
        who = a["locked_by"] or {}
        con.print(f"[yellow]locked by pid {who.get('pid')} on {who.get('host')} since "
                  f"{who.get('time')} ({who.get('purpose')})[/yellow]")
    backups = desc["backups"]
    if not backups:
        con.print("no backups yet")
        return
    table = Table(show_lines=False)
    for col in ("backup", "parent", "type", "state", "time", "vbuckets", "mutations",
                "deletions", "expirations", "rollbacks", "size"):
        table.add_column(col, no_wrap=col in ("backup", "parent"),
                         justify="right" if col in ("vbuckets", "mutations", "deletions",
                                                    "expirations", "rollbacks", "size")
                         else "left")
    for b in backups:
        if b["state"] == "damaged":
            table.add_row(b["id"], "", "", "[red]damaged[/red]", "", "", "", "", "", "",
                          human_bytes(b["size_on_disk"]))
            continue
        state = b["state"] if b["state"] == "complete" else "[yellow]partial[/yellow]"
        vbs = str(b["vbuckets"]) if b["state"] == "complete" else \
            f"{b['vbuckets']}/{b['vbuckets_started']}"
        table.add_row(b["id"], b["parent"] or "-", b["type"] or "?", state,
                      _short_time(b["started"]), vbs, f"{b['mutations']:,}", f"{b['deletions']:,}",
                      f"{b['expirations']:,}", str(b["rollbacks"]),
                      human_bytes(b["size_on_disk"]))
    con.print(table)
    for b in backups:
        if b["state"] == "partial":
            con.print(f"[yellow]{b['id']} is partial[/yellow] ({b['vbuckets']} of "
                      f"{b['vbuckets_started']} vbuckets started completed): the next backup "
                      "resumes it; --purge-partial discards it")
        elif b["state"] == "damaged":
            con.print(f"[red]{b['id']}: {b['error']}[/red]")
        if b.get("merged_from"):
            ids = b["merged_from"]
            con.print(f"{b['id']}: merged from {len(ids)} backups ({ids[0]} .. {ids[-1]})")
        for r in b.get("rollback_records", []):
            con.print(f"{b['id']}: vbucket {r['vbucket']} rolled back to seqno {r['seqno']} "
                      f"(uuid {r['vbucket_uuid']})")
