"""`dcptool info`'s restorable window: each bucket's covered spans and gaps, drawn as a
one-line bar per bucket at the terminal's width (80 columns fit), and as JSON
(`point_in_time`: docs/json-output.md). The window comes from the manifests (and a
continuous backup's status file, archive/pointintime.py): no data file is read."""
from __future__ import annotations

from typing import Any

from dcptool.archive.pointintime import (
    NS, archive_coverage, short_time, span_text, timeline_bar,
)

COVERED = "█"
GAP = "░"
#: where the output cannot encode those
ASCII_COVERED = "#"
ASCII_GAP = "."
#: the narrowest bar drawn
MIN_BAR = 10


def timeline_info(archive: Any) -> dict[str, Any] | None:
    """{"window": {"earliest", "latest"}, "gaps": [{"from", "to"}], "gap_tolerance_seconds",
    "granularity"} of a bucket archive (None: no committed backup)."""
    from dcptool.archive.errors import ArchiveError

    manifests = {}
    for bid in archive.committed_ids():
        try:
            manifests[bid] = archive.manifest(bid)
        except ArchiveError:
            continue  # a damaged manifest: info names it in its table
    if not manifests:
        return None
    cov = archive_coverage(archive, manifests)
    return {**cov.as_json(), "granularity": "snapshot boundaries",
            "_coverage": cov}


def public(info: dict[str, Any] | None) -> dict[str, Any] | None:
    """timeline_info without its drawing state (what --json prints)."""
    if info is None:
        return None
    return {k: v for k, v in info.items() if not k.startswith("_")}


def timeline_lines(rows: list[tuple[str, dict[str, Any] | None]], width: int, *,
                   unicode: bool = True) -> list[str]:
    """A bar per bucket (`rows`: (name, timeline_info)), its window's ends as times, then
    what the bars mean. Fits `width` (at least 80 columns are assumed); `unicode=False`
    draws with ASCII characters."""
    full, light = (COVERED, GAP) if unicode else (ASCII_COVERED, ASCII_GAP)
    width = max(80, width)
    named = [(n, i) for n, i in rows if i is not None]
    if not named:
        return []
    label = min(16, max(len(n) for n, _ in named))
    bar = max(MIN_BAR, width - label - 2 * 19 - 4)
    out = ["restorable window (restore --to-time, examine --at, export --at):"]
    for name, info in named:
        cov = info["_coverage"]
        out.append(f"{name[:label]:<{label}} {short_time(cov.earliest)} "
                   f"{timeline_bar(cov, bar, covered_char=full, gap_char=light)} "
                   f"{short_time(cov.latest)}")
    for name, info in named:
        cov = info["_coverage"]
        gaps = cov.gaps
        what = "no gap" if not gaps else (
            f"{len(gaps)} gap{'s' if len(gaps) != 1 else ''}, the longest "
            f"{span_text(max(b - a for a, b in gaps))}")
        out.append(f"{name}: {span_text(cov.latest - cov.earliest)} window (UTC), {what}")
    tol = named[0][1]["gap_tolerance_seconds"]
    out.append(f"{full} a backup was running (any time restores, to each vbucket's "
               f"snapshot boundary at or before it); {light} a gap: no backup running (more "
               f"than {tol:g} s between two backups), --nearest needed. Batch backups give "
               "the granularity of their snapshot boundaries: a gap between every two.")
    return out


__all__ = ["timeline_info", "timeline_lines", "public", "NS"]
