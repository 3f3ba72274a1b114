"""Compaction and the tombstone purger: drop tombstones no registered client still needs.

A compaction of a set of vbuckets runs in these steps (one compaction at a time):

1. On the loop: HWT rows past their expiry are dropped (seed 002: "expired entry will be
   deleted from table when tomb purger computes next watermark to advance").
2. The guard rail: for every live row, the maintenance thread measures how long the row
   has kept a purgeable tombstone (`decisions.hold_seconds`, from the tombstone index);
   rows holding longer than --hwt-max-hold are marked lost.
3. Per vbucket: the purge bound (`decisions.purge_bound`, over the registered and the
   replicated rows) also capped by the persisted seqno (only what is on disk is purged),
   COMPACT_DB's purge_before_seq and, for a replica vbucket, its source's purge seqno
   (`hwtrepl.purge_cap`: a replica's purger never goes beyond its source's, seed 002). The
   maintenance thread lists the tombstones under it; back on the loop the bound is
   computed again (a registration may have come in meanwhile), the vbucket forgets the
   tombstones and raises its purge seqno (`VBucket.purge_tombstones`); then the
   maintenance thread deletes the rows and stores the purge seqno in one transaction.

4. Dropped collections (`Bucket.dropped`): per vbucket, once everything queued is on
   disk, their documents and tombstones leave the hash table and the database (one key
   range per collection: `storage.purge_collections`); when every vbucket was done the ids
   leave `Bucket.dropped`. Readers stopped seeing them when the collection was dropped.
   Collections system events (op 3) are never purged, neither here nor as tombstones: a
   drop event replaced its create event under the same key and stays as history (one row
   per collection or scope ever dropped).

A backfill that opened its disk snapshot earlier still reads the tombstones (SQLite WAL
snapshot); one that opens later, from below the new purge seqno, ends its stream with
reason ROLLBACK, and a stream request from below it is answered ROLLBACK to 0, so a
client never misses a deletion without being told. The high seqno and the persisted
seqno do not move: they live in `vbucket_meta`, not in the rows.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from dcptool.protocol.constants import VBucketState

from . import decisions, hwtrepl
from . import storage as st
from .hwt import OK
from dcptool.logsafe import shown

if TYPE_CHECKING:
    from .hwt import HighWatermarkTable
    from .storage import Storage
    from .vbucket import VBucket

log = logging.getLogger("dcptool.node.compaction")

#: tombstones listed, forgotten and deleted per step (one write transaction each)
PAGE = 5000


class Compactable(Protocol):
    """What the purger works on (`bucket.Bucket`): the vbuckets and their storage, the
    high watermark table, the dropped collections not yet purged and how that set is kept."""

    storage: "Storage"
    vbuckets: "dict[int, VBucket]"
    hwt: "HighWatermarkTable"
    dropped: set[int]

    def persist_manifest(self) -> None: ...


class Purger:
    """Compaction of one bucket, on demand (COMPACT_DB) and every `interval` seconds.

    * `purge_age`: seconds a tombstone must be old before it may be purged.
    * `max_hold`: the HWT guard rail (None: rows are never marked lost).
    * `runs`, `purged`, `last`: counters and the summary of the last run, for STAT.
    """

    def __init__(self, bucket: Compactable, *, purge_age: float, max_hold: float | None,
                 interval: float | None = None) -> None:
        self.bucket = bucket
        self.purge_age = purge_age
        self.max_hold = max_hold
        self.interval = interval
        self.runs = 0
        self.purged = 0
        self.last: dict[str, Any] = {}
        self._lock = asyncio.Lock()
        #: dropped collection id -> vbuckets already purged of it (until all are)
        self._dropped_done: dict[int, set[int]] = {}

    async def _maint(self, fn, *args):
        return await asyncio.wrap_future(self.bucket.storage.maintenance(fn, *args))

    async def run_scheduled(self) -> None:
        """Compact every vbucket every `interval` seconds (the node's background task)."""
        if self.interval is None:
            return
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.compact(reason="scheduled")
            except asyncio.CancelledError:
                raise
            except Exception:  # keep the schedule; report it
                log.exception("scheduled compaction failed")

    async def compact(self, vbids: Iterable[int] | None = None, *, purge_before_ts: int = 0,
                      purge_before_seq: int = 0, drop_deletes: bool = False,
                      reason: str = "on demand") -> dict[str, Any]:
        """Compact `vbids` (default: all). Returns a summary for the caller and the log.

        `purge_before_ts` (Unix seconds, 0: the node's purge age) replaces the age
        cut-off; `drop_deletes` drops the age condition; `purge_before_seq` (0: none) caps
        the seqno. None of them lets the purger pass a live watermark.
        """
        async with self._lock:
            return await self._compact(vbids, purge_before_ts, purge_before_seq, drop_deletes,
                                       reason)

    async def _compact(self, vbids, purge_before_ts, purge_before_seq, drop_deletes,
                       reason) -> dict[str, Any]:
        t0 = time.monotonic()
        bucket = self.bucket
        hwt = bucket.hwt
        vbs = sorted(bucket.vbuckets) if vbids is None else sorted(set(vbids))
        now = time.time()
        age_cut = now - self.purge_age
        if drop_deletes:
            before = math.inf
        elif purge_before_ts:
            before = float(purge_before_ts)
        else:
            before = age_cut
        # 1. expired rows go
        expired, fut = hwt.drop_expired(now)
        if fut is not None:
            await asyncio.wrap_future(fut)
        for e in expired:
            log.info("HWT row %s expired (at %.0f) and was dropped", shown(e.client),
                     e.expires_at)
        # 2. the guard rail
        lost = await self._guard_rail(vbs, now, age_cut)
        # 3. per vbucket
        purged_total = 0
        per_vb: dict[int, dict[str, Any]] = {}
        for vbid in vbs:
            vb = bucket.vbuckets.get(vbid)
            if vb is None:
                continue
            n = await self._compact_vbucket(vb, now, before, purge_before_seq)
            if n:
                purged_total += n
                per_vb[vbid] = {"purged": n, "purge_seqno": vb.purge_seqno}
        collections_purged = 0
        if bucket.dropped:
            collections_purged = await self._purge_dropped(vbs)
        self.runs += 1
        self.purged += purged_total
        summary = {
            "reason": reason, "vbuckets": len(vbs), "purged": purged_total,
            "purge_seqnos": {str(vb): d["purge_seqno"] for vb, d in sorted(per_vb.items())},
            "expired_rows": [e.client for e in expired], "lost_rows": lost,
            "dropped_collection_items_purged": collections_purged,
            "seconds": round(time.monotonic() - t0, 3), "finished_at": time.time(),
        }
        self.last = summary
        log.info("compaction (%s) of %d vbuckets: %d tombstones purged in %d vbuckets, "
                 "%d HWT rows expired, %d lost, %.3f s", reason, len(vbs), purged_total,
                 len(per_vb), len(expired), len(lost), summary["seconds"])
        return summary

    async def _compact_vbucket(self, vb, now: float, before: float, purge_before_seq: int) -> int:
        """Purge what may go in one vbucket, a page of tombstones at a time (short write
        transactions: the flusher waits for each). Returns how many were purged."""
        total = 0
        above = 0
        while True:
            limit = self._seqno_limit(vb, now, before, purge_before_seq)
            if limit is None or limit <= above:
                return total
            page = await self._maint(st.purgeable_tombstones, vb.id, above, limit, before,
                                     PAGE)
            if not page:
                return total
            above = page[-1][0]
            # the table may have changed while the maintenance thread looked
            limit = self._seqno_limit(vb, now, before, purge_before_seq) or 0
            purged = vb.purge_tombstones([c for c in page if c[0] <= limit])
            if purged:
                await self._maint(st.purge_tombstones, vb.id, purged, vb.purge_seqno)
                total += len(purged)
            if len(page) < PAGE:
                return total

    async def _purge_dropped(self, vbs: list[int]) -> int:
        """Purge the documents of dropped collections from `vbs` (memory, then disk);
        returns the rows deleted. The ids leave `bucket.dropped` once every vbucket is done."""
        from dcptool.protocol.collections import encode_leb128

        bucket = self.bucket
        cids = sorted(bucket.dropped)
        prefixes = [encode_leb128(c) for c in cids]
        loop = asyncio.get_running_loop()
        # nothing of these collections is written after their drop: once the flusher is
        # idle, the disk holds every version there will be
        await loop.run_in_executor(None, bucket.storage.wait_flushed)
        total = 0
        for vbid in vbs:
            vb = bucket.vbuckets.get(vbid)
            if vb is None:
                continue
            gone = [k for k in vb.items if k[0] and k.startswith(tuple(prefixes))]
            for k in gone:
                it = vb.items.pop(k)
                if vb.full:
                    vb.cache.bytes -= it.size
            n = await self._maint(st.purge_collections, vbid, prefixes)
            if vb.full:
                vb.nkeys -= n
            total += n
        done = self._dropped_done
        for c in cids:
            done.setdefault(c, set()).update(vbs)
        finished = [c for c in cids if done[c] >= set(bucket.vbuckets)]
        if finished:
            for c in finished:
                del done[c]
            bucket.dropped.difference_update(finished)
            bucket.persist_manifest()
            log.info("dropped collections %s purged", [format(c, "x") for c in finished])
        return total

    def _seqno_limit(self, vb, now: float, before: float, purge_before_seq: int) -> int | None:
        """The highest seqno the purger may reach in `vb` now (None: nothing to do)."""
        bound = decisions.purge_bound(vb.id, self.bucket.hwt.watermarks(), now=now,
                                      purge_age=self.purge_age, before=before)
        limit = vb.persisted_seqno
        if bound.seqno is not None:
            limit = min(limit, bound.seqno)
        if purge_before_seq:
            limit = min(limit, purge_before_seq)
        cap = self._source_cap(vb)
        if cap is not None:
            limit = min(limit, cap)
        return limit if limit > 0 else None

    def _source_cap(self, vb) -> int | None:
        """A replica vbucket's cap: its source's purge seqno as last read (0: unknown)."""
        return hwtrepl.purge_cap(vb.state == VBucketState.REPLICA,
                                 self.bucket.hwt.source_purge.get(vb.id))

    async def _guard_rail(self, vbs: list[int], now: float, age_cut: float) -> list[str]:
        """Mark live rows that kept a purgeable tombstone longer than max_hold as lost."""
        if self.max_hold is None:
            return []
        hwt = self.bucket.hwt
        wanted = set(vbs)
        by_vb: dict[int, set[int]] = {}
        live = [e for e in hwt.entries.values() if e.state(now) == OK]
        for e in live:
            for vb, s in e.seqnos.items():
                if vb in wanted:
                    by_vb.setdefault(vb, set()).add(s)
        holds: dict[int, dict[int, tuple[int, float | None, int]]] = {}
        for vb, seqs in sorted(by_vb.items()):
            holds[vb] = await self._maint(st.tombstone_holds, vb, sorted(seqs), age_cut)
        lost = []
        for e in live:
            worst = 0.0
            worst_vb = None
            for vb, s in e.seqnos.items():
                h = holds.get(vb, {}).get(s)
                if h is None or h[1] is None:
                    continue
                hold = age_cut - h[1]
                if hold > worst:
                    worst, worst_vb = hold, vb
            if decisions.is_lost(worst, self.max_hold):
                why = (f"kept tombstones of vbucket {worst_vb} above seqno {e.seqnos[worst_vb]} "
                       f"for {worst:.0f} s after they could have been purged (--hwt-max-hold "
                       f"{self.max_hold:g} s)")
                fut = hwt.mark_lost(e.key, now, why)
                if fut is not None:
                    await asyncio.wrap_future(fut)
                    lost.append(e.client)
                    log.warning("HWT row %s is lost: it %s", shown(e.client), why)
        return lost


async def hold_figures(bucket: Compactable, entries, now: float, purge_age: float
                       ) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """Per live entry and vbucket, what it holds back: old-enough tombstones above its
    watermark (count, the highest seqno among them, and for how long the oldest has been
    purgeable). Only vbuckets where it holds something are listed."""
    age_cut = now - purge_age
    by_vb: dict[int, set[int]] = {}
    for e in entries:
        if e.state(now) != OK:
            continue
        for vb, s in e.seqnos.items():
            by_vb.setdefault(vb, set()).add(s)
    holds: dict[int, dict[int, tuple[int, float | None, int]]] = {}
    storage = bucket.storage
    for vb, seqs in sorted(by_vb.items()):
        holds[vb] = await asyncio.wrap_future(
            storage.maintenance(st.tombstone_holds, vb, sorted(seqs), age_cut))
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for e in entries:
        figs: dict[str, dict[str, Any]] = {}
        if e.state(now) == OK:
            for vb, s in sorted(e.seqnos.items()):
                h = holds.get(vb, {}).get(s)
                if h is None or not h[0]:
                    continue
                figs[str(vb)] = {"tombstones": h[0], "up_to_seqno": h[2],
                                 "seconds": round(max(0.0, age_cut - h[1]), 3)}
        out[e.key] = figs
    return out
