"""The bucket: all vbuckets of the node, their storage, warm-up and background tasks.

Shared state, and why it exists:

* `vbuckets`: vbid -> VBucket, every vbucket this node holds (fixed count, chosen at
  creation and kept in the database).
* `storage`: the SQLite database and its flusher; the only writer to disk.
* `memory`: checkpoint memory accounting shared by every vbucket (the DCP budget).
* `expiry_heap`: (expiry, vbid, key, seqno) of items that carry a TTL, so the expiry
  pager finds due items without scanning the hash tables.
* `producers`: DCP producer connections by name (a second one with the same name
  replaces the first).
* `warmup`: what warm-up found (clean or unclean shutdown, items loaded).
* `hwt`: the high watermark table (seed 002), loaded at warm-up, written through.
* `purger`: compaction and the tombstone purger, bounded by `hwt`.
"""
from __future__ import annotations

import heapq
import logging
import time
from pathlib import Path
from typing import Any

from dcptool.errors import DcptoolError
from dcptool.protocol.constants import VBucketState

from .cache import BloomFilter, ResidentCache
from .checkpoint import CheckpointMemory
from .config import DEFAULT_MEMORY_QUOTA
from .compaction import Purger
from .hwt import HighWatermarkTable
from .item import ITEM_MUTATION
from .storage import FORMAT_VERSION, Storage
from .vbucket import VBucket, new_vbucket_uuid

log = logging.getLogger("dcptool.node")


class Bucket:
    def __init__(
        self,
        data_dir: Path,
        *,
        name: str = "default",
        num_vbuckets: int = 1024,
        flush_interval: float = 0.02,
        checkpoint_memory: int = 256 * 1024 * 1024,
        checkpoint_max_items: int = 10000,
        checkpoint_max_bytes: int | None = None,
        purge_age: float = 3 * 86400,
        hwt_max_hold: float | None = 30 * 86400,
        compaction_interval: float | None = None,
        hwt_default_ttl: float = 7 * 86400,
        eviction: str = "value",
        memory_quota: int = DEFAULT_MEMORY_QUOTA,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.name = name
        self.num_vbuckets = num_vbuckets
        self.memory = CheckpointMemory(checkpoint_memory)
        if checkpoint_max_bytes is None:
            # an open checkpoint must be small enough that closed ones can be freed while
            # the open ones of all vbuckets stay well within the budget
            checkpoint_max_bytes = max(16 * 1024, min(8 * 1024 * 1024,
                                                      checkpoint_memory // (4 * num_vbuckets)))
        self.checkpoint_max_items = checkpoint_max_items
        self.checkpoint_max_bytes = checkpoint_max_bytes
        self.eviction = eviction
        self.full_eviction = eviction == "full"
        # full eviction bounds memory: a backfill's sequential scan gains nothing from a
        # large page cache, and up to 16 read connections are pooled
        self.storage = Storage(self.data_dir / "data.sqlite3", flush_interval=flush_interval,
                               reader_cache_kib=4096 if self.full_eviction else 65536)
        #: full eviction: the resident-document budget and its counters (None: value eviction)
        self.cache = ResidentCache(self.storage, memory_quota) if self.full_eviction else None
        self.memory.on_pressure = self.storage.kick
        self.vbuckets: dict[int, VBucket] = {}
        self.expiry_heap: list = []
        self.producers: dict[str, Any] = {}
        self.warmup: dict[str, Any] = {}
        self.expired_by_pager = 0
        self.hwt = HighWatermarkTable(self.storage)
        self.hwt_default_ttl = hwt_default_ttl
        self.purger = Purger(self, purge_age=purge_age, max_hold=hwt_max_hold,
                             interval=compaction_interval)

    # -- warm-up ------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Load the database; after an unclean stop give every active vbucket a new branch."""
        t0 = time.monotonic()
        st = self.storage
        meta = st.get_meta()
        fresh = not meta
        if fresh:
            st.set_meta(format=FORMAT_VERSION, vbuckets=self.num_vbuckets, bucket=self.name,
                        clean_shutdown=1)
            meta = st.get_meta()
        if int(meta.get("format", FORMAT_VERSION)) != FORMAT_VERSION:
            raise DcptoolError(f"{self.data_dir}: storage format {meta.get('format')} is not "
                               f"supported by this dcptool")
        if int(meta["vbuckets"]) != self.num_vbuckets:
            raise DcptoolError(
                f"{self.data_dir} holds a node with {meta['vbuckets']} vbuckets, not {self.num_vbuckets}",
                hint=f"start it with --vbuckets {meta['vbuckets']} or use another --data directory")
        if meta.get("bucket", self.name) != self.name:
            raise DcptoolError(
                f"{self.data_dir} holds bucket {meta['bucket']!r}, not {self.name!r}",
                hint=f"start it with --bucket {meta['bucket']}")
        clean = meta.get("clean_shutdown") == "1"
        vb_meta = st.load_vbucket_meta()
        disk_high = st.high_seqnos()
        new_rows = []
        for vbid in range(self.num_vbuckets):
            m = vb_meta.get(vbid)
            if m is None:
                m = {"state": VBucketState.ACTIVE, "failover": [(new_vbucket_uuid(), 0)],
                     "persisted_seqno": 0, "purge_seqno": 0, "max_cas": 0}
                vb_meta[vbid] = m
                new_rows.append(vbid)
            high = max(m["persisted_seqno"], disk_high.get(vbid, 0))
            m["persisted_seqno"] = high
            vb = VBucket(
                vbid, state=m["state"], failover_log=list(m["failover"]), high_seqno=high,
                persisted_seqno=high, purge_seqno=m["purge_seqno"], max_cas=m["max_cas"],
                memory=self.memory, dirty=st.dirty, expiry_heap=self.expiry_heap,
                checkpoint_max_items=self.checkpoint_max_items,
                checkpoint_max_bytes=self.checkpoint_max_bytes,
            )
            self.vbuckets[vbid] = vb
        vbs = self.vbuckets
        if self.full_eviction:
            loaded, keys = 0, self._warm_up_full()
        else:
            loaded, keys = self._warm_up_value(), None
        heapq.heapify(self.expiry_heap)
        branched = []
        if not clean and not fresh:
            for vb in vbs.values():
                if vb.state == VBucketState.ACTIVE:
                    vb.add_failover_entry(vb.persisted_seqno)
                    branched.append(vb.id)
        changed = set(new_rows) | set(branched)
        if changed:
            st.write_vbucket_meta([
                (vbid, vbs[vbid].state, vbs[vbid].failover_log, vbs[vbid].persisted_seqno,
                 vbs[vbid].purge_seqno, vbs[vbid].max_cas) for vbid in sorted(changed)])
        st.set_meta(clean_shutdown=0)
        self.hwt.load()
        for vb in vbs.values():
            vb.on_meta_change = self._meta_changed
        self.warmup = {"clean_shutdown": clean, "fresh": fresh, "items_loaded": loaded, "eviction": self.eviction,
                       "new_failover_entries": len(branched), "hwt_rows": len(self.hwt),
                       "seconds": round(time.monotonic() - t0, 3)}
        if keys is not None:
            self.warmup["keys_on_disk"] = keys
        log.info("warm-up: %s", self.warmup)

    def _warm_up_value(self) -> int:
        """Value eviction: every document into its vbucket's hash table, the counts and CAS
        clocks from them, the expiry heap from those with a TTL. Returns how many loaded."""
        vbs = self.vbuckets
        loaded = 0
        for vbid, item in self.storage.iter_items():
            vb = vbs.get(vbid)
            if vb is None:
                continue
            vb.items[item.key] = item
            if item.op == ITEM_MUTATION:
                vb.live_items += 1
            if item.cas > vb.max_cas:
                vb.max_cas = item.cas
            loaded += 1
        for vb in vbs.values():
            for it in vb.items.values():
                if it.expiry and it.op == ITEM_MUTATION:
                    self.expiry_heap.append((it.expiry, vb.id, it.key, it.seqno))
        return loaded

    def _warm_up_full(self) -> int:
        """Full eviction: counts and CAS clocks from aggregate queries, the bloom filters
        from one scan of the key index and the expiry heap from the documents with a TTL.
        No document is loaded. Returns how many keys the database holds."""
        st = self.storage
        vbs = self.vbuckets
        counts = st.vbucket_counts(sorted(vbs))
        total = 0
        for vbid, vb in vbs.items():
            n, live, max_cas = counts.get(vbid, (0, 0, 0))
            # room for the keys there are and as many again before the filter grows
            vb.enable_full_eviction(self.cache, BloomFilter(2 * n), live=live, keys=n)
            if max_cas > vb.max_cas:
                vb.max_cas = max_cas
            total += n
            self.cache.vbuckets.append(vb)
        for rows in st.iter_keys():
            for vbid, key in rows:
                vb = vbs.get(vbid)
                if vb is not None:
                    vb.bloom.add(key)
        self.expiry_heap.extend(e for e in st.iter_expiring() if e[1] in vbs)
        return total

    def _meta_changed(self, vb: VBucket) -> None:
        self.storage.enqueue_meta(vb.id, {"state": vb.state, "failover": vb.failover_log,
                                          "max_cas": vb.max_cas})

    # -- running ------------------------------------------------------------------------

    def start(self, loop) -> None:
        if self.cache is not None:
            self.cache.loop = loop
        self.storage.start_flusher(loop, self.on_persisted)

    def on_persisted(self, persisted: dict[int, int]) -> None:
        """Runs on the loop after a flusher commit: advance persisted seqnos, free checkpoints."""
        vbs = self.vbuckets
        for vbid, seqno in persisted.items():
            vb = vbs.get(vbid)
            if vb is None:
                continue
            if seqno > vb.persisted_seqno:
                vb.persisted_seqno = seqno
                vb.checkpoints.set_persisted(seqno)
        self.memory.maybe_reduce()
        if self.cache is not None:
            self.cache.on_persisted()

    def run_expiry_pager(self, now: float | None = None, limit: int = 10000) -> int:
        """Turn due items into tombstones (new seqnos); returns how many were expired."""
        if now is None:
            now = time.time()
        heap = self.expiry_heap
        n = 0
        while heap and heap[0][0] <= now and n < limit:
            _exp, vbid, key, seqno = heapq.heappop(heap)
            vb = self.vbuckets.get(vbid)
            if vb is not None and vb.expire_if_due(key, seqno, now):
                n += 1
        self.expired_by_pager += n
        return n

    def stop(self, *, clean: bool) -> None:
        """Persist every vbucket's CAS clock and failover log, flush everything, close."""
        for vb in self.vbuckets.values():
            self.storage.enqueue_meta(vb.id, {"state": vb.state, "failover": vb.failover_log,
                                              "max_cas": vb.max_cas})
            vb.checkpoints.close()
        if self.cache is not None:
            self.cache.close()
        self.storage.stop(clean=clean)

    # -- queries ---------------------------------------------------------------------------

    def vbucket(self, vbid: int) -> VBucket | None:
        return self.vbuckets.get(vbid)

    def totals(self) -> dict[str, int]:
        live = tomb = 0
        for vb in self.vbuckets.values():
            a, b = vb.counts()
            live += a
            tomb += b
        return {"curr_items": live, "tombstones": tomb}

    def eviction_stats(self) -> list[tuple[str, object]]:
        """The eviction policy and, in full eviction, residency and fetch counters."""
        vbs = self.vbuckets.values()
        active_live = sum(vb.live_items for vb in vbs if vb.state == VBucketState.ACTIVE)
        replica_live = sum(vb.live_items for vb in vbs if vb.state == VBucketState.REPLICA)
        resident = sum(len(vb.items) for vb in vbs)
        keys = sum(sum(vb.counts()) for vb in vbs)
        c = self.cache
        out: list[tuple[str, object]] = [
            ("ep_item_eviction_policy", "full_eviction" if c is not None else "value_only"),
            ("vb_active_curr_items", active_live),
            ("vb_replica_curr_items", replica_live),
            ("ep_resident_items", resident),
            ("ep_num_non_resident", keys - resident),
        ]
        if c is None:
            return out
        return out + [
            ("ep_max_size", c.quota),
            ("ep_kv_size", c.bytes),
            ("ep_num_value_ejects", c.evictions),
            ("ep_bg_fetched", c.bg_fetches),
            ("ep_bg_fetch_misses", c.bg_fetch_misses),
            ("ep_bg_fetch_avoided", c.bloom_negatives),
            ("ep_bloom_filter_key_count", sum(vb.bloom.keys for vb in vbs)),
            ("ep_bloom_filter_size", sum(vb.bloom.size_bytes for vb in vbs)),
        ]
