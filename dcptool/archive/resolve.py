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

Collections (format 3): keys are doc keys (the collection id as a LEB128 prefix; readers
of format 1 and 2 files prefix 0x00). A system event record (REC_SYSTEM_EVENT) that
survives the same cut and lies at or below the chosen seqno ends its collection: a
collection's drop (EVENT_END_COLLECTION), or its scope's drop (EVENT_DROP_SCOPE), makes
every version of that collection unrestorable as of that point, since ids are never reused.
A point before the drop restores them. `CollectionNames` names collection ids through the
manifests and the create events of an archive.
"""
from __future__ import annotations

import re
from itertools import islice
from operator import itemgetter, lt as _LT
from typing import Iterable, Iterator, Sequence

from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION,
    EVENT_DROP_SCOPE,
    EVENT_END_COLLECTION,
    doc_key_cid,
)

from .errors import ResolutionError
from .format import (
    END,
    REC_DELETION,
    REC_EXPIRATION,
    REC_MUTATION,
    REC_SYSTEM_EVENT,
    ROLLBACK,
    SNAPSHOT,
    STREAM,
)


def key_cid(key: bytes) -> int:
    """The collection id of a doc key (0 for the default collection, one byte)."""
    return doc_key_cid(key) if key else 0


class Drops:
    """The collections ended by the system events of one vbucket's history up to a point:
    dropped collection ids, dropped scope ids, and the scope of each collection the events
    created (a scope drop ends them; `scope_of` may add what the manifests know)."""

    __slots__ = ("collections", "scopes", "scope_of")

    def __init__(self) -> None:
        self.collections: set[int] = set()
        self.scopes: set[int] = set()
        self.scope_of: dict[int, int] = {}

    def __bool__(self) -> bool:
        return bool(self.collections or self.scopes)

    def add(self, rec: tuple) -> None:
        """Take one REC_SYSTEM_EVENT record (8, seqno, event, uid, sid, cid, name, max_ttl)."""
        ev, sid, cid = rec[2], rec[4], rec[5]
        if ev == EVENT_END_COLLECTION and cid is not None:
            self.collections.add(cid)
        elif ev == EVENT_DROP_SCOPE:
            self.scopes.add(sid)
        elif ev == EVENT_BEGIN_COLLECTION and cid is not None:
            self.scope_of[cid] = sid

    def dropped(self, cid: int, scope_of: dict[int, int] | None = None) -> bool:
        if cid in self.collections:
            return True
        if self.scopes:
            sid = self.scope_of.get(cid)
            if sid is None and scope_of is not None:
                sid = scope_of.get(cid)
            return sid is not None and sid in self.scopes
        return False

    def dead_ids(self, cids, scope_of: dict[int, int] | None = None) -> set[int]:
        return {c for c in cids if self.dropped(c, scope_of)}


def drop_dropped(resolved: dict[bytes, tuple], drops: Drops,
                 scope_of: dict[int, int] | None = None) -> dict[bytes, tuple]:
    """`resolved` without the keys of collections `drops` ended (the same dict when none)."""
    if not drops:
        return resolved
    dead: dict[int, bool] = {}
    out: dict[bytes, tuple] = {}
    for k, r in resolved.items():
        c = k[0] if k else 0
        if c >= 0x80:
            c = key_cid(k)
        d = dead.get(c)
        if d is None:
            d = dead[c] = drops.dropped(c, scope_of)
        if not d:
            out[k] = r
    return out


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
            include_deletions: bool = True, keep_dropped: bool = False,
            scope_of: dict[int, int] | None = None) -> dict[bytes, tuple]:
    """{doc key: newest surviving record} of one vbucket over `parts` (oldest part first).

    Each part is iterated once, newest part first. Records other than items, rollbacks and
    system events (headers, stream, snapshot and end records) are ignored. With
    `include_deletions=False` keys whose resolved state is a deletion or expiration are
    left out. Keys of a collection a surviving system event at or below `upto_seqno`
    dropped are left out unless `keep_dropped`; `scope_of` ({collection id: scope id},
    from the manifests) names the collections a scope drop ends that no create event of
    these parts names.
    """
    resolved, drops = resolve_with_drops(parts, upto_seqno=upto_seqno)
    if not keep_dropped:
        resolved = drop_dropped(resolved, drops, scope_of)
    if not include_deletions:
        return {k: r for k, r in resolved.items() if r[0] == REC_MUTATION}
    return resolved


#: runs of at least this many mutations in a batch are resolved at once (C-level passes)
_RUN = 16
_FIRST = itemgetter(0)
_SEQNO = itemgetter(1)
_MUTATION_KEY = itemgetter(7)
_NOT_A_MUTATION = re.compile(b"[^%c]" % REC_MUTATION)
#: records per batch of a part that is a plain iterable
_CHUNK = 4096


def _batches(part: Iterable[tuple]) -> Iterator[list[tuple]]:
    """A part's records a batch at a time: the zstd frames of a backup's vbucket (a part
    with `batches()`, such as VBucketHistory), else chunks of the iterable."""
    batches = getattr(part, "batches", None)
    if batches is not None:
        yield from batches()
        return
    it = iter(part)
    while True:
        chunk = list(islice(it, _CHUNK))
        if not chunk:
            return
        yield chunk


def _segments(batch: list[tuple]) -> list[tuple[int, int, bool]]:
    """(start, end, a run of mutations?) covering `batch` in order: the runs of at least
    _RUN mutations, and the rest."""
    n = len(batch)
    try:
        kinds = bytes(map(_FIRST, batch))
    except (TypeError, ValueError, IndexError):  # a malformed record: one by one
        return [(0, n, False)]
    if kinds.count(REC_MUTATION) < _RUN:
        return [(0, n, False)]
    out: list[tuple[int, int, bool]] = []
    prev = 0
    for p in [m.start() for m in _NOT_A_MUTATION.finditer(kinds)] + [n]:
        if p - prev >= _RUN:
            out.append((prev, p, True))
        elif p > prev:
            out.append((prev, p, False))
        if p < n:
            out.append((p, p + 1, False))
        prev = p + 1
    return out


def resolve_with_drops(parts: Sequence[Iterable[tuple]], *, upto_seqno: int | None = None
                       ) -> tuple[dict[bytes, tuple], Drops]:
    """({doc key: newest surviving record}, the surviving drops) of one vbucket: resolve()
    before dropped collections are taken out."""
    resolved: dict[bytes, tuple] = {}
    drops = Drops()
    cut: int | None = None  # lowest rollback seqno seen in the parts already processed
    limit = upto_seqno
    for part in reversed(parts):
        local: dict[bytes, tuple] = {}
        top = -1  # highest item seqno read so far in this part
        part_low: int | None = None
        bound = cut if limit is None else (limit if cut is None else min(cut, limit))
        for batch in _batches(part):
            for i, j, run in _segments(batch):
                recs = batch[i:j] if i or j != len(batch) else batch
                if run:
                    # a run of mutations at once: seqnos above the last and increasing, all
                    # at or below the bound (else record by record, to say what is wrong)
                    seqnos = list(map(_SEQNO, recs))
                    if seqnos[0] > top and (bound is None or seqnos[-1] <= bound) \
                            and all(map(_LT, seqnos, seqnos[1:])):
                        local.update(zip(map(_MUTATION_KEY, recs), recs))
                        top = seqnos[-1]
                        continue
                for rec in recs:
                    t = rec[0]
                    if t == REC_MUTATION:
                        key = rec[7]
                    elif t == REC_DELETION or t == REC_EXPIRATION:
                        key = rec[4]
                    elif t == ROLLBACK:
                        s = rec[1]
                        if top > s:
                            raise ResolutionError(
                                f"rollback record to seqno {s} follows an item at seqno {top} "
                                "in the same backup (an archive writer removes those before "
                                "recording a rollback)")
                        if part_low is None or s < part_low:
                            part_low = s
                        continue
                    elif t == REC_SYSTEM_EVENT:
                        if bound is None or rec[1] <= bound:
                            drops.add(rec)
                        continue
                    else:
                        continue
                    seqno = rec[1]
                    if seqno <= top:
                        raise ResolutionError(f"item seqno {seqno} does not increase (after "
                                              f"{top})")
                    top = seqno
                    if bound is not None and seqno > bound:
                        continue
                    local[key] = rec
        for key, rec in local.items():
            if key not in resolved:
                resolved[key] = rec
        if part_low is not None and (cut is None or part_low < cut):
            cut = part_low
    return resolved, drops


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
        if (t == REC_MUTATION or t == REC_DELETION or t == REC_EXPIRATION
                or t == REC_SYSTEM_EVENT):
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
