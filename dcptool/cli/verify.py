"""`dcptool verify ARCHIVE`: prove every file and record of an archive sound."""
from __future__ import annotations

from pathlib import Path

import typer

from dcptool.archive.verify import verify_archive
from dcptool.cli.app import app
from dcptool.cli.output import print_json


@app.command()
def verify(
    archive: Path = typer.Argument(..., help="Archive directory.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    checksums_only: bool = typer.Option(
        False, "--checksums-only",
        help="Check manifests, sizes and SHA-256 only; do not decode records."),
) -> None:
    """Check every backup of an archive: manifests, each file's size and SHA-256, every record,
    seqno order inside snapshots, and that each backup starts where its parent ended.

    Prints what is wrong, naming the file, and exits 1 if anything is; 0 otherwise.

    Example: dcptool verify /backups/default
    """
    report = verify_archive(archive, records=not checksums_only)
    if as_json:
        print_json(report.to_json(), pretty=True)
    else:
        for p in report.problems:
            typer.echo(f"{p.path}: {p.message}")
        for note in report.notes:
            typer.echo(f"note: {note}")
        what = (f"{report.backups_checked} backups, {report.files_checked} files "
                f"({report.bytes_checked:,} bytes)")
        if not checksums_only:
            what += f", {report.records_checked:,} records"
        if report.ok:
            typer.echo(f"OK: {what} verified")
        else:
            typer.echo(f"FAILED: {len(report.problems)} problem"
                       f"{'s' if len(report.problems) != 1 else ''} in {what}")
    if not report.ok:
        raise typer.Exit(1)
