"""Chain resolution: the state of a vbucket as of a chosen backup (and seqno).

Pure functions over record iterators; no files. The same function serves `restore` (what to
write), the Spark source's `resolved=true` and `merge`.

The rule, for one vbucket: take the records of the chain's backups in order, oldest first
(each backup a *part*). A rollback record at seqno S in part N kills every record of the
parts before N whose seqno is above S (they are on a history branch the node abandoned).
Among the surviving records at or below the chosen seqno, the newest version of each key
(a mutation, deletion or expiration) is its resolved state.

The archive guarantees that inside one part a rollback record is preceded only by records at
or below its seqno (the writer removes its own newer records before writing one). With that,
surviving seqnos increase strictly in chain order, so "newest" is also "highest seqno". The
functions here check the guarantee and raise ResolutionError when it is broken.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from .errors import ResolutionError
from .format import REC_DELETION, END, REC_EXPIRATION, REC_MUTATION, ROLLBACK, SNAPSHOT, STREAM


def part_cuts(rollbacks_per_part: Sequence[Iterable[int]]) -> list[int | None]:
    """For each part, the seqno above which its records are dead (None: none are).

    cut[i] is the lowest rollback seqno recorded in any later part. A reader that already
    knows the rollbacks (from the manifests) can scan forward and drop a record of part i
    when cut[i] is not None and its seqno > cut[i].
    """
    cuts: list[int | None] = [None] * len(rollbacks_per_part)
    lowest: int | None = None
    for i in range(len(rollbacks_per_part) - 1, -1, -1):
        cuts[i] = lowest
        for s in rollbacks_per_part[i]:
            if lowest is None or s < lowest:
                lowest = s
    return cuts


def resolve(parts: Sequence[Iterable[tuple]], *, upto_seqno: int | None = None,
            include_deletions: bool = True) -> dict[bytes, tuple]:
    """{key: newest surviving record} of one vbucket over `parts` (oldest part first).

    Each part is iterated once, newest part first. Records other than items and rollbacks
    (headers, stream, snapshot and end records) are ignored. With `include_deletions=False`
    keys whose resolved state is a deletion or expiration are left out.
    """
    resolved: dict[bytes, tuple] = {}
    cut: int | None = None  # lowest rollback seqno seen in the parts already processed
    limit = upto_seqno
    for part in reversed(parts):
        local: dict[bytes, tuple] = {}
        top = -1  # highest item seqno read so far in this part
        part_low: int | None = None
        bound = cut if limit is None else (limit if cut is None else min(cut, limit))
        for rec in part:
            t = rec[0]
            if t == REC_MUTATION:
                key = rec[7]
            elif t == REC_DELETION or t == REC_EXPIRATION:
                key = rec[4]
            elif t == ROLLBACK:
                s = rec[1]
                if top > s:
                    raise ResolutionError(
                        f"rollback record to seqno {s} follows an item at seqno {top} in the same "
                        "backup (an archive writer removes those before recording a rollback)")
                if part_low is None or s < part_low:
                    part_low = s
                continue
            else:
                continue
            seqno = rec[1]
            if seqno <= top:
                raise ResolutionError(f"item seqno {seqno} does not increase (after {top})")
            top = seqno
            if bound is not None and seqno > bound:
                continue
            local[key] = rec
        for key, rec in local.items():
            if key not in resolved:
                resolved[key] = rec
        if part_low is not None and (cut is None or part_low < cut):
            cut = part_low
    if not include_deletions:
        return {k: r for k, r in resolved.items() if r[0] == REC_MUTATION}
    return resolved


def resolved_in_seqno_order(parts: Sequence[Iterable[tuple]], *, upto_seqno: int | None = None,
                            include_deletions: bool = True) -> list[tuple]:
    """resolve(), as a list of records sorted by seqno (the order a restore writes them)."""
    out = list(resolve(parts, upto_seqno=upto_seqno, include_deletions=include_deletions).values())
    out.sort(key=lambda r: r[1])
    return out


def mark_dead(parts: Sequence[Iterable[tuple]],
              rollbacks_per_part: Sequence[Iterable[int]]) -> Iterator[tuple[int, tuple, bool]]:
    """(part index, item record, dead?) for every item, oldest first, given the rollback
    seqnos of each part (from the manifests). For timelines such as `examine`."""
    cuts = part_cuts(rollbacks_per_part)
    for i, part in enumerate(parts):
        cut = cuts[i]
        for rec in part:
            if rec[0] in (REC_MUTATION, REC_DELETION, REC_EXPIRATION):
                yield i, rec, cut is not None and rec[1] > cut


def snapshot_boundaries(records: Iterable[tuple]) -> list[int]:
    """Seqnos at which one backup's records of a vbucket stand on a snapshot boundary of the
    live branch, ascending: stream and rollback positions, the end position, and the end of
    every snapshot known to be complete (an item at its end seqno was read, or another
    marker followed). A rollback record removes the boundaries above its seqno (such as the
    position the stream started from before the node rolled back)."""
    out: list[int] = []
    open_end: int | None = None

    def add(s: int) -> None:
        if not out or out[-1] != s:
            out.append(s)

    for rec in records:
        t = rec[0]
        if t == REC_MUTATION or t == REC_DELETION or t == REC_EXPIRATION:
            if open_end is not None and rec[1] == open_end:
                add(open_end)
                open_end = None
        elif t == SNAPSHOT:
            if open_end is not None:
                add(open_end)
            open_end = rec[2]
        elif t == STREAM:
            open_end = None
            add(rec[2])
        elif t == ROLLBACK:
            if open_end is not None:
                add(open_end)
                open_end = None
            while out and out[-1] > rec[1]:
                out.pop()
            add(rec[1])
        elif t == END:
            add(rec[2])
            open_end = None
    return out
