"""Options and option parsers more than one command family shares.

The connection options (-c, -u, -p, -b, ...) are `connopts.py`'s; these are the rest: the
Spark options of the commands that run Spark jobs, `--no-progress`, the point-in-time
options (`--nearest` and the check of a time option), and the parser of a watermark's time
to live.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from dcptool.errors import UsageError

SPARK = "Spark"
MasterOpt = Annotated[Optional[str], typer.Option(
    "--master", envvar="DCPTOOL_SPARK_MASTER", rich_help_panel=SPARK, metavar="URL",
    help="Spark master URL (default local[*], the embedded Spark). With any other master the "
         "archive must be on a filesystem the driver and every executor share, or on S3 "
         "(checked before the run).")]
PartitionsOpt = Annotated[Optional[int], typer.Option(
    "--partitions", rich_help_panel=SPARK, min=1,
    help="Spark tasks, each streaming a group of vbuckets (default 2x the cores).")]
NoProgressOpt = Annotated[bool, typer.Option(
    "--no-progress", help="No progress bar (there is none anyway unless stderr is a "
                          "terminal, nor with --json).")]

#: `--nearest` of the commands that read an archive `--at` a time (examine, export)
NearestOpt = Annotated[bool, typer.Option(
    "--nearest", help="With --at in a gap of the archive: the nearest snapshot "
                      "boundary before it instead of refusing.")]


def point_in_time(text: str | None, nearest: bool, option: str) -> int | None:
    """The time a point-in-time option (`--to-time`, `--at`) gives, in CAS nanoseconds
    (None without it); `--nearest` without it is a usage error."""
    if nearest and not text:
        raise UsageError(f"--nearest goes with {option}")
    if not text:
        return None
    from dcptool.archive.pointintime import parse_time

    return parse_time(text, option=option)


def parse_ttl(text: str, what: str = "--ttl") -> float:
    from dcptool.node.config import parse_duration

    ttl = parse_duration(text, what=what)
    if ttl is None or ttl <= 0:
        raise UsageError(f"{what} must be positive")
    if ttl > 366 * 86400:
        raise UsageError(f"{what} must be at most 366 days")
    return ttl
