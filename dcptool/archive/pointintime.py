"""Point in time: what an archive can give as of a wall-clock TIME.

Pure functions over manifests and record iterators (no Spark, no node). Restore
(`--to-time`), `examine --at`, `export --resolved --at` and the Spark source's `asOf`
option share them; `info` draws the coverage they compute.

Definitions (docs/archive-format.md, "Point in time"):

- A record's time is its CAS with the low 16 bits cleared, in nanoseconds since the epoch
  (Couchbase's CAS is a hybrid logical clock; the reference node makes it the same way).
- A snapshot boundary's time is the greatest record time in the vbucket's history (along
  the chain, in stream order) up to and including that boundary; a boundary with no record
  before it has no time (it stands before every TIME).
- The cut for TIME, per vbucket, is the last snapshot boundary of the chain (rollbacks
  applied: a rollback removes the boundaries above its seqno) whose time is at or before
  TIME. A deduplicated snapshot holding changes from both sides of TIME is never cut
  inside: the cut is its start (the previous boundary). The cut's lag is TIME minus its
  time; the cut is exact when the vbucket's next change (the next seqno, present: none
  deduplicated away) is later than TIME: it did not change in between (an idle vbucket's
  lag is long, its cut exact).
- A backup covers the wall-clock interval its streams ran: from its `started` (its id)
  to its `finished`; a full backup covers only its `finished` (its streams begin with the
  node's deduplicated disk snapshot: a time while it ran may have no boundary before it).
  A merged backup covers only its end (its originals' end, `extra.merge.covered`), and
  gives only its start and end boundaries: it keeps the newest version of each key of its
  range, so the state inside the range is gone. Between two backups there is a gap when
  the later one did not start within a tolerance of the earlier one's end: the greatest
  `extra.checkpoint_interval` (seconds, a continuous backup's) plus DCPTOOL_GAP_TOLERANCE
  seconds (default DEFAULT_TOLERANCE).
- While a continuous backup finds the node unchanged since the archive's newest backup, it
  writes no backup; its status file (`continuous.json`: `unchanged_backup`,
  `unchanged_through`) says until when the node held that backup's state, and the window
  reaches that time (`archive_coverage`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Sequence

from dcptool.errors import DcptoolError, UsageError

from .format import (
    CONTINUOUS_JSON,
    END,
    REC_DELETION,
    REC_EXPIRATION,
    REC_MUTATION,
    REC_SYSTEM_EVENT,
    ROLLBACK,
    SNAPSHOT,
    STREAM,
    parse_duration,
)

#: the low CAS bits that are a logical counter, not time
HLC_COUNTER_BITS = 0xFFFF
#: seconds a backup may start after the previous one's end without a gap between them
DEFAULT_TOLERANCE = 10.0
NS = 1_000_000_000

def record_time(cas: int) -> int:
    """A record's time: nanoseconds since the epoch (the CAS without its logical counter)."""
    return int(cas) & ~HLC_COUNTER_BITS


def to_ns(t: datetime) -> int:
    """A zone-aware datetime as nanoseconds since the epoch."""
    delta = t - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86400 + delta.seconds) * NS + delta.microseconds * 1000


def from_ns(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // NS, timezone.utc) + timedelta(microseconds=(ns % NS) // 1000)


def iso(ns: int | None) -> str | None:
    """'2026-11-28T14:03:00.123456Z' (None for None)."""
    if ns is None:
        return None
    return from_ns(ns).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def short_time(ns: int) -> str:
    """'2026-11-28 14:03:07' (UTC, to the second): what a terminal shows."""
    return from_ns(ns).strftime("%Y-%m-%d %H:%M:%S")


def parse_time(text: str, *, now: datetime | None = None, option: str = "TIME") -> int:
    """TIME as nanoseconds since the epoch: ISO 8601 with a zone ('2026-11-28T14:03:00Z',
    '2026-11-28T15:03:00+01:00') or relative to now ('-15m', '-2h', '-1d', '-1d6h').
    A time without a zone, or in the future, is a UsageError (one line)."""
    now = now or datetime.now(timezone.utc)
    s = str(text).strip()
    if s.startswith("-"):
        try:
            d = parse_duration(s[1:])
        except UsageError:
            raise UsageError(f"{option}: {text!r} is neither an ISO 8601 time with a zone nor "
                             "a relative time such as -15m, -2h, -1d") from None
        return to_ns(now - d)
    try:
        t = datetime.fromisoformat(s[:-1] + "+00:00" if s[-1:] in "zZ" and s else s)
    except ValueError:
        raise UsageError(f"{option}: {text!r} is neither an ISO 8601 time with a zone "
                         "(2026-11-28T14:03:00Z) nor a relative time such as -15m") from None
    if t.tzinfo is None:
        raise UsageError(f"{option}: {text!r} has no zone: add Z (UTC) or an offset such "
                         "as +01:00")
    ns = to_ns(t)
    if ns > to_ns(now):
        raise UsageError(f"{option}: {text} is in the future (now is {iso(to_ns(now))})")
    return ns


# -- boundaries and cuts (one vbucket, from its records) -----------------------------------------

@dataclass(slots=True)
class Boundary:
    """A snapshot boundary of a vbucket's history: the chain part (index) whose records
    reach it, its seqno, its time (None: no record before it), and what follows it: the
    seqno of the first record after it (None: none follows) and that record's time (None
    for a system event, which has none)."""

    part: int
    seqno: int
    time: int | None
    next_seqno: int | None = None
    after: int | None = None

    def exact_at(self, at: int) -> bool:
        """Whether the state at this boundary is the vbucket's state at `at`: the change
        right after it (the next seqno, none deduplicated away) is known to be later than
        `at`. With nothing after it, or a seqno missing, the archive cannot tell."""
        return (self.next_seqno == self.seqno + 1 and self.after is not None
                and self.after > at)


def boundaries(parts: Sequence[Iterable[tuple]],
               whole: Sequence[bool] | None = None, *,
               until: int | None = None,
               starts: Sequence[int | None] | None = None) -> list[Boundary]:
    """The live snapshot boundaries of one vbucket along a chain (`parts` oldest first, each
    one backup's records of the vbucket), in stream order, each with its time.

    Boundaries are those of `resolve.snapshot_boundaries`: stream and rollback positions,
    end positions and the end of every complete snapshot; a rollback record removes the
    boundaries above its seqno, in its part and the parts before. A part marked in `whole`
    (a merged backup: it holds only the newest version of each key of its range, so the
    state inside it is not kept) gives its start and end boundaries only. With `until`
    the reading stops at the first boundary whose time is after it (what follows cannot
    move the cut for `until`), or at a rollback record of a part that `starts` (each
    part's start time, ns) shows began after `until`: the archive learnt of that rollback
    after the time, when the backup recording it began."""
    out: list[Boundary] = []
    top: int | None = None  # greatest record time so far

    def add(i: int, s: int) -> bool:
        """Add a boundary; True when reading may stop."""
        if not (out and out[-1].seqno == s):
            out.append(Boundary(i, s, top))
        return until is not None and top is not None and top > until

    for i, part in enumerate(parts):
        open_end: int | None = None
        inner = not (whole is not None and whole[i])
        for rec in part:
            t = rec[0]
            stop = False
            if t == REC_MUTATION or t == REC_DELETION or t == REC_EXPIRATION:
                rt = record_time(rec[3])
                if top is None or rt > top:
                    top = rt
                if out and out[-1].next_seqno is None:
                    out[-1].next_seqno, out[-1].after = rec[1], rt
                if inner and open_end is not None and rec[1] == open_end:
                    stop = add(i, open_end)
                    open_end = None
            elif t == REC_SYSTEM_EVENT:
                if out and out[-1].next_seqno is None:
                    out[-1].next_seqno = rec[1]
                if inner and open_end is not None and rec[1] == open_end:
                    stop = add(i, open_end)
                    open_end = None
            elif t == SNAPSHOT:
                if inner and open_end is not None:
                    stop = add(i, open_end)
                open_end = rec[2]
            elif t == STREAM:
                open_end = None
                stop = add(i, rec[2])
            elif t == ROLLBACK:
                if (until is not None and starts is not None and starts[i] is not None
                        and starts[i] > until):
                    return out
                if inner and open_end is not None:
                    if add(i, open_end):
                        return out
                    open_end = None
                while out and out[-1].seqno > rec[1]:
                    out.pop()
                stop = add(i, rec[1])
            elif t == END:
                stop = add(i, rec[2])
                open_end = None
            if stop:
                return out
    return out


def cut_at(bounds: Sequence[Boundary], at: int) -> Boundary | None:
    """The last boundary whose time is at or before `at` (None: the history starts after)."""
    best = None
    for b in bounds:
        if b.time is None or b.time <= at:
            best = b
        else:
            break  # times never decrease along the stream
    return best


@dataclass(frozen=True, slots=True)
class VBucketCut:
    """One vbucket's cut for TIME: the chain part and seqno to resolve to, the boundary's
    time and its lag (TIME - time, ns; None when the vbucket held no record before it).
    `exact`: the vbucket's next change after the cut (the next seqno: none of them
    deduplicated away) is known to be later than TIME, so the state restored is its state
    at TIME."""

    vbucket: int
    part: int
    seqno: int
    time: int | None
    lag: int | None
    exact: bool = False

    def as_dict(self, backup_ids: Sequence[str] | None = None) -> dict[str, Any]:
        d = {"vbucket": self.vbucket, "seqno": self.seqno, "time": iso(self.time),
             "time_ns": self.time,
             "lag_seconds": None if self.lag is None else round(self.lag / NS, 6),
             "exact": self.exact}
        if backup_ids is not None:
            d["backup"] = backup_ids[self.part] if self.part >= 0 else None
        return d


def vbucket_cut(vbucket: int, parts: Sequence[Iterable[tuple]], at: int,
                whole: Sequence[bool] | None = None,
                starts: Sequence[int | None] | None = None) -> VBucketCut:
    """The cut of one vbucket for time `at` over `parts` (its chain, oldest first; `whole`:
    which are merged backups, `starts`: when each began, see boundaries()). A vbucket with
    no boundary at or before `at` (its history starts later) is cut at seqno 0 (nothing
    restored)."""
    b = cut_at(boundaries(parts, whole, until=at, starts=starts), at)
    if b is None:
        return VBucketCut(vbucket, -1, 0, None, None)
    return VBucketCut(vbucket, b.part, b.seqno, b.time, None if b.time is None else at - b.time,
                      b.exact_at(at))


def lag_summary(cuts: Iterable[VBucketCut]) -> dict[str, Any]:
    """{"worst_seconds", "median_seconds", "vbuckets", "exact_vbuckets"} over the cuts' lags
    (vbuckets with no record before their cut have no lag and are left out of the first
    three; `exact_vbuckets` counts the cuts that are the vbucket's state at TIME)."""
    cuts = list(cuts)
    lags = sorted(c.lag for c in cuts if c.lag is not None)
    n = len(lags)
    med = None
    if n:
        med = lags[n // 2] if n % 2 else (lags[n // 2 - 1] + lags[n // 2]) / 2
    return {"worst_seconds": round(lags[-1] / NS, 6) if n else None,
            "median_seconds": round(med / NS, 6) if med is not None else None,
            "vbuckets": n, "exact_vbuckets": sum(1 for c in cuts if c.exact)}


# -- coverage and gaps (from the manifests) ------------------------------------------------------

def id_time(backup_id: str) -> int:
    """A backup id (20261122T003809.496871Z) as ns since the epoch."""
    t = datetime.strptime(backup_id, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=timezone.utc)
    return to_ns(t)


def _iso_ns(text: str | None) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        t = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return to_ns(t)


def part_meta(manifest: dict[str, Any]) -> tuple[bool, int]:
    """(merged?, start time in ns) of a backup: what vbucket_cut needs of each part."""
    start = _iso_ns(manifest.get("started")) or id_time(manifest["id"])
    if is_merged(manifest):  # its originals' start, or its id (its last original's)
        spans = originals_covered(manifest)
        start = spans[0][0] if spans else id_time(manifest["id"])
    whole = is_merged(manifest) and not keeps_history(manifest)
    return whole, min(start, id_time(manifest["id"]))


def is_merged(manifest: dict[str, Any]) -> bool:
    """A merged backup (merge, or prune and remove merging forward)."""
    return isinstance((manifest.get("extra") or {}).get("merge"), dict)


def keeps_history(manifest: dict[str, Any]) -> bool:
    """A merged backup that kept every version of its range (`extra.merge.history`: a
    continuous backup's rotation): its snapshots are its originals', each boundary a state
    of the vbucket, and it covers what its originals covered."""
    return ((manifest.get("extra") or {}).get("merge") or {}).get("history") is True


def originals_covered(manifest: dict[str, Any]) -> list[tuple[int, int]]:
    """The spans a merged backup's originals covered (extra.merge.covered; [] when a
    merge by an older dcptool did not record them)."""
    spans = ((manifest.get("extra") or {}).get("merge") or {}).get("covered")
    out = []
    for s in spans if isinstance(spans, list) else ():
        if isinstance(s, list) and len(s) == 2:
            a, b = _iso_ns(s[0]), _iso_ns(s[1])
            if a is not None and b is not None:
                out.append((a, b))
    return out


def covered(manifest: dict[str, Any]) -> list[tuple[int, int]]:
    """The wall-clock intervals (ns) at which a backup gives the state: [(started,
    finished)] for an incremental (from `extra.covers_from` when a continuous backup
    recorded it); a history-keeping merged backup's originals' spans; the end alone for a full backup and for a merged one
    (a merge keeps the newest version of each key of its range: the state inside the
    range is gone, its end is exact). A merged backup's end is its originals' (recorded
    in extra.merge.covered; without it, the merged backup's id, its last original's
    start)."""
    if is_merged(manifest):
        spans = originals_covered(manifest)
        if spans and keeps_history(manifest):
            return spans
        end = spans[-1][1] if spans else id_time(manifest["id"])
        return [(end, end)]
    start = _iso_ns(manifest.get("started")) or id_time(manifest["id"])
    start = min(start, id_time(manifest["id"]))
    end = max(_iso_ns(manifest.get("finished")) or start, start)
    # a continuous backup's checkpoint: the checkpoints before it since `covers_from` saw
    # the node unchanged (they wrote no backup), so its coverage begins there
    since = _iso_ns((manifest.get("extra") or {}).get("covers_from"))
    if since is not None and manifest.get("type") != "full":
        start = min(start, since)
    if manifest.get("type") == "full":
        # a full backup's streams begin with the node's disk snapshot, deduplicated: the
        # state is known at its end (each vbucket's first boundary is at or before the
        # time its stream began), not while it ran
        return [(end, end)]
    return [(start, end)]


def base_tolerance() -> float:
    """DCPTOOL_GAP_TOLERANCE (seconds), else DEFAULT_TOLERANCE."""
    v = os.environ.get("DCPTOOL_GAP_TOLERANCE")
    if v:
        try:
            t = float(v)
        except ValueError:
            raise UsageError(f"DCPTOOL_GAP_TOLERANCE={v!r} is not a number of seconds") from None
        if t >= 0:
            return t
        raise UsageError(f"DCPTOOL_GAP_TOLERANCE={v!r} is negative")
    return DEFAULT_TOLERANCE


def tolerance_ns(manifests: Iterable[dict[str, Any]]) -> int:
    """The gap tolerance: DCPTOOL_GAP_TOLERANCE or DEFAULT_TOLERANCE seconds, plus the
    greatest `extra.checkpoint_interval` (seconds) a backup recorded."""
    extra = 0.0
    for m in manifests:
        v = (m.get("extra") or {}).get("checkpoint_interval")
        if isinstance(v, (int, float)) and v > extra:
            extra = float(v)
    return int((base_tolerance() + extra) * NS)


@dataclass
class Coverage:
    """What wall-clock time an archive (or a chain) saw streaming: its covered spans merged
    (gaps shorter than the tolerance closed), the window's ends and the gaps inside it."""

    spans: list[tuple[int, int]] = field(default_factory=list)
    tolerance: int = int(DEFAULT_TOLERANCE * NS)

    @property
    def earliest(self) -> int | None:
        return self.spans[0][0] if self.spans else None

    @property
    def latest(self) -> int | None:
        return self.spans[-1][1] if self.spans else None

    @property
    def gaps(self) -> list[tuple[int, int]]:
        return [(a[1], b[0]) for a, b in zip(self.spans, self.spans[1:])]

    def gap_at(self, t: int) -> tuple[int, int] | None:
        """The gap holding `t` (None: `t` is covered, or outside the window)."""
        for g in self.gaps:
            if g[0] < t < g[1]:
                return g
        return None

    def as_json(self) -> dict[str, Any]:
        return {"window": {"earliest": iso(self.earliest), "latest": iso(self.latest)},
                "gaps": [{"from": iso(a), "to": iso(b)} for a, b in self.gaps],
                "gap_tolerance_seconds": self.tolerance / NS}


def coverage(manifests: Iterable[dict[str, Any]]) -> Coverage:
    """The coverage of these backups' manifests."""
    ms = list(manifests)
    tol = tolerance_ns(ms)
    spans = sorted(s for m in ms for s in covered(m))
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1] + tol:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return Coverage(merged, tol)


def unchanged_through(archive: Any, newest: str) -> int | None:
    """When (ns) a continuous backup's last checkpoint found the node as the archive's
    newest backup `newest` left it (its status file, written as it goes), or None: no
    status, another backup named, or a file that cannot be read."""
    import json

    from . import storage

    try:
        st = json.loads(storage.read_bytes(archive.path / CONTINUOUS_JSON))
    except (OSError, ValueError, DcptoolError):
        return None
    if not isinstance(st, dict) or st.get("unchanged_backup") != newest:
        return None
    return _iso_ns(st.get("unchanged_through"))


def archive_coverage(archive: Any, manifests: dict[str, dict[str, Any]]) -> Coverage:
    """The coverage of an archive's committed backups (`manifests`: by id), its window
    reaching on to when a continuous backup last found the node unchanged since the newest
    of them (`unchanged_through`)."""
    cov = coverage(manifests.values())
    tail = unchanged_through(archive, max(manifests)) if manifests else None
    if tail is not None and cov.spans and tail > cov.spans[-1][1]:
        cov.spans[-1] = (cov.spans[-1][0], tail)
    return cov


# -- choosing the chain and checking TIME against the coverage ----------------------------------

@dataclass
class TimePlan:
    """What a read as of TIME reads: the chain (ids, oldest first) whose records hold the
    state at `at`, and the coverage checked."""

    at: int
    chain: list[str]
    coverage: Coverage
    #: with `nearest`, TIME fell in this gap (the cut is the nearest boundary before)
    gap: tuple[int, int] | None = None


def chain_for_time(archive: Any, at: int, manifests: dict[str, dict[str, Any]] | None = None
                   ) -> list[str]:
    """The chain (ids, oldest first) that holds the state at `at`: that of the newest backup,
    or, when `at` is before that chain's full backup began, of the newest backup older than
    it, and so on ([] when every chain starts after `at`)."""
    manifests = manifests if manifests is not None else archive.manifests()
    ids = sorted(manifests)
    while ids:
        chain = archive.chain_ids(manifests, ids[-1])
        first = min(t for t, _ in covered(manifests[chain[0]]))
        if first <= at:
            return chain
        ids = [b for b in ids if b < chain[0]]
    return []


def plan_time(archive: Any, at: int, *, nearest: bool = False, option: str = "--to-time",
              nearest_flag: str = "--nearest") -> TimePlan:
    """Check `at` against the archive's coverage and choose the chain to read. Refused in
    one line (UsageError): a time before the archive's first backup began, or inside a gap
    (no backup was running; after the newest backup ended too), unless `nearest`, which
    takes the nearest snapshot boundary before it."""
    manifests = archive.manifests()
    if not manifests:
        raise UsageError(f"archive {archive.path} holds no committed backup")
    cov = archive_coverage(archive, manifests)
    if at < cov.earliest:
        raise UsageError(f"{option} {iso(at)} is before the archive's window "
                         f"({iso(cov.earliest)} to {iso(cov.latest)})")
    gap = cov.gap_at(at)
    if gap is None and at > cov.latest + cov.tolerance:
        gap = (cov.latest, at)
        what = (f"{option} {iso(at)} is after the archive's window, which ends "
                f"{iso(cov.latest)} (no backup was running since)")
    else:
        what = (f"{option} {iso(at)} falls in a gap of the archive: no backup was running "
                f"from {iso(gap[0])} to {iso(gap[1])}") if gap else ""
    if gap is not None and not nearest:
        raise UsageError(what, hint=f"{nearest_flag} takes the nearest snapshot boundary "
                                    "before it")
    return TimePlan(at, chain_for_time(archive, at, manifests), cov, gap)


# -- drawing the coverage -----------------------------------------------------------------------

def timeline_bar(cov: Coverage, width: int, *, covered_char: str = "█",
                 gap_char: str = "·") -> str:
    """The window as `width` cells: a cell any covered span touches is `covered_char`, a
    cell wholly inside a gap `gap_char`."""
    if width <= 0 or not cov.spans:
        return ""
    lo, hi = cov.earliest, cov.latest
    if hi <= lo:
        return covered_char * width
    step = (hi - lo) / width
    cells = [gap_char] * width
    for a, b in cov.spans:
        i = min(width - 1, int((a - lo) / step))
        j = min(width - 1, max(i, int((b - lo) / step - 1e-9)))
        for k in range(i, j + 1):
            cells[k] = covered_char
    return "".join(cells)


def span_text(ns: int) -> str:
    """A duration for people: '45 s', '12 min', '3.5 h', '2.0 d'."""
    s = ns / NS
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


__all__ = ["Boundary", "Coverage", "TimePlan", "VBucketCut", "boundaries", "chain_for_time",
           "coverage", "covered", "cut_at", "iso", "keeps_history", "lag_summary", "parse_time", "plan_time", "record_time", "timeline_bar", "vbucket_cut"]
