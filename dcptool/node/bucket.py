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
* `manifest`: the collections manifest (`dcptool.protocol.collections.Manifest`), kept in
  the database's meta table (internal JSON with `next_id`) and loaded at warm-up;
  `collections` ({live collection id: max TTL}) and `scope_of` ({collection id: scope
  id}) are indexes of it for the hot paths. `dropped`: ids of dropped collections whose
  documents are not purged yet (persisted too); compaction purges them.
"""
from __future__ import annotations

import heapq
import json
import logging
import time
from pathlib import Path
from typing import Any

from dcptool.errors import DcptoolError
from dcptool.protocol.collections import (
    DEFAULT_COLLECTION,
    DEFAULT_SCOPE,
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_DROP_SCOPE,
    EVENT_END_COLLECTION,
    Collection,
    CollectionsError,
    Manifest,
    ManifestError,
    Scope,
    SystemEvent,
    doc_key_cid,
    encode_leb128,
)
from dcptool.protocol.constants import VBucketState

from .cache import BloomFilter, ResidentCache
from .checkpoint import CheckpointMemory
from .config import DEFAULT_MEMORY_QUOTA
from .compaction import Purger
from .hwt import HighWatermarkTable
from .item import ITEM_MUTATION, ITEM_SYSTEM
from .storage import FORMAT_VERSION, MIGRATABLE_FORMATS, Storage, collection_counts
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
        #: the bucket's uuid (kept in its database; set at warm-up by the node), its
        #: settings with Couchbase Server's REST names (`dcptool.node.bucketset`) and the
        #: maxTTL documents without a collection maxTTL get (0: none)
        self.uuid = ""
        self.settings: dict[str, Any] = {}
        self.max_ttl = 0
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
        #: the collections manifest and its indexes (see the module text)
        self.manifest = Manifest()
        self.collections: dict[int, int] = {0: 0}
        self.scope_of: dict[int, int] = {0: 0}
        self.dropped: set[int] = set()
        #: called as fn(bucket, old manifest, events) after every manifest change
        self.manifest_listeners: list = []

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
        migrated = None
        fmt = int(meta.get("format", FORMAT_VERSION))
        if fmt in MIGRATABLE_FORMATS:
            migrated = st.migrate(fmt)
            log.info("%s: storage format %d -> %d: %d keys given the default collection's "
                     "prefix", self.data_dir, fmt, FORMAT_VERSION, migrated)
            meta = st.get_meta()
        elif fmt != FORMAT_VERSION:
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
        self._load_manifest(meta)
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
        if migrated is not None:
            self.warmup["migrated_keys"] = migrated
        if self.manifest.uid:
            self.warmup["manifest_uid"] = format(self.manifest.uid, "x")
        log.info("warm-up: %s", self.warmup)

    def _warm_up_value(self) -> int:
        """Value eviction: every document into its vbucket's hash table, the counts and CAS
        clocks from them, the expiry heap from those with a TTL. Returns how many loaded."""
        vbs = self.vbuckets
        loaded = 0
        dropped = self.dropped
        for vbid, item in self.storage.iter_items():
            vb = vbs.get(vbid)
            if vb is None:
                continue
            vb.items[item.key] = item
            if item.op == ITEM_MUTATION and not (
                    dropped and item.key[0] and doc_key_cid(item.key) in dropped):
                vb.live_items += 1
            if item.cas > vb.max_cas:
                vb.max_cas = item.cas
            loaded += 1
        for vb in vbs.values():
            for it in vb.items.values():
                if it.expiry and it.op == ITEM_MUTATION and not (
                        dropped and it.key[0] and doc_key_cid(it.key) in dropped):
                    self.expiry_heap.append((it.expiry, vb.id, it.key, it.seqno))
        return loaded

    def _warm_up_full(self) -> int:
        """Full eviction: counts and CAS clocks from aggregate queries, the bloom filters
        from one scan of the key index and the expiry heap from the documents with a TTL.
        No document is loaded. Returns how many keys the database holds."""
        st = self.storage
        vbs = self.vbuckets
        counts = st.vbucket_counts(sorted(vbs))
        prefixes = [encode_leb128(c) for c in sorted(self.dropped)]
        total = 0
        for vbid, vb in vbs.items():
            n, live, max_cas = counts.get(vbid, (0, 0, 0))
            if prefixes and n:
                live -= collection_counts(st._db, vbid, prefixes)[1]
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
        dropped = self.dropped
        self.expiry_heap.extend(e for e in st.iter_expiring() if e[1] in vbs and not (
            dropped and e[2][0] and doc_key_cid(e[2]) in dropped))
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
        dropped = self.dropped
        while heap and heap[0][0] <= now and n < limit:
            _exp, vbid, key, seqno = heapq.heappop(heap)
            if dropped and key[0] and doc_key_cid(key) in dropped:
                continue  # a dropped collection's documents only wait for compaction
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

    # -- collections -----------------------------------------------------------------------
    #
    # Every change: a new manifest (uid + 1), kept through the flusher (in order with the
    # system events that follow it), then one system event per active vbucket at that
    # vbucket's next seqno. Replica vbuckets get the events over DCP from their active, at
    # the same seqnos (`follow_event`). Dropping a collection takes its documents out of
    # the live counts at once; compaction purges them (`compaction.purge_dropped`).

    def _load_manifest(self, meta: dict[str, str]) -> None:
        raw = meta.get("manifest")
        if raw:
            try:
                self.manifest = Manifest.from_json(raw)
            except CollectionsError as exc:
                raise DcptoolError(f"{self.data_dir}: the stored collections manifest is "
                                   f"unreadable: {exc}") from None
        dropped = meta.get("dropped")
        self.dropped = set(json.loads(dropped)) if dropped else set()
        self._index()

    def _index(self) -> None:
        m = self.manifest
        self.collections = {c.uid: c.max_ttl for s in m.scopes for c in s.collections}
        self.scope_of = {c.uid: s.uid for s in m.scopes for c in s.collections}

    def persist_manifest(self) -> None:
        """Queue the manifest and the dropped collections not yet purged for the flusher."""
        self.storage.enqueue_node_meta(
            manifest=self.manifest.to_bytes(internal=True).decode(),
            dropped=json.dumps(sorted(self.dropped)))

    def _commit_manifest(self, new: Manifest, events: list[SystemEvent], *,
                         write_events: bool = True) -> Manifest:
        """Make `new` the manifest, persist it, take dropped collections out of the live
        counts and write `events` into every active vbucket (replica vbuckets get theirs
        from their active)."""
        old = self.manifest
        self.manifest = new
        self._index()
        gone = [ev.collection_id for ev in events
                if ev.event == EVENT_END_COLLECTION and ev.collection_id is not None]
        for cid in gone:
            self.dropped.add(cid)
        self.persist_manifest()
        if write_events:
            for vb in self.vbuckets.values():
                if vb.state == VBucketState.ACTIVE:
                    for ev in events:
                        vb.system_event(ev)
        for cid in gone:
            self._uncount(cid)
        for fn in list(self.manifest_listeners):
            try:
                fn(self, old, events)
            except Exception:  # pragma: no cover - a listener must not undo the change
                log.exception("manifest listener failed")
        return new

    def _uncount(self, cid: int) -> None:
        """A dropped collection's live documents leave the live counts."""
        prefix = encode_leb128(cid)
        if not self.full_eviction:
            for vb in self.vbuckets.values():
                n = 0
                for key, it in vb.items.items():
                    if it.op == ITEM_MUTATION and key.startswith(prefix):
                        n += 1
                vb.live_items -= n
            return
        # full eviction: once everything written before the drop is on disk (nothing of
        # the collection is written after it), count on disk
        import asyncio

        async def count() -> None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self.storage.wait_flushed)
            for vb in self.vbuckets.values():
                live = (await asyncio.wrap_future(self.storage.maintenance(
                    lambda db, v: collection_counts(db, v, [prefix]), vb.id)))[1]
                vb.live_items -= live
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (tests of the bucket alone): count now
            for vb in self.vbuckets.values():
                vb.live_items -= collection_counts(self.storage._db, vb.id, [prefix])[1]
            return
        task = loop.create_task(count())
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)

    def create_scope(self, name: str) -> tuple[Manifest, Scope]:
        """Create scope `name`; ManifestError (kind exists/invalid/limit) if it cannot be."""
        new, scope = self.manifest.create_scope(name)
        self._commit_manifest(new, [SystemEvent(0, EVENT_CREATE_SCOPE, new.uid, scope.uid,
                                                None, name)])
        return new, scope

    def create_collection(self, scope: str, name: str, max_ttl: int = 0
                          ) -> tuple[Manifest, Collection]:
        new, s, coll = self.manifest.create_collection(scope, name, max_ttl)
        self._commit_manifest(new, [SystemEvent(0, EVENT_BEGIN_COLLECTION, new.uid, s.uid,
                                                coll.uid, name, coll.max_ttl)])
        return new, coll

    def drop_collection(self, scope: str, name: str) -> Manifest:
        """Drop a collection. The _default collection stays (this node keeps it, so a legacy
        client always has a collection to use): ManifestError kind "forbidden"."""
        if scope == DEFAULT_SCOPE and name == DEFAULT_COLLECTION:
            raise ManifestError("forbidden", "the _default collection cannot be dropped")
        new, s, coll = self.manifest.drop_collection(scope, name)
        self._commit_manifest(new, [SystemEvent(0, EVENT_END_COLLECTION, new.uid, s.uid,
                                                coll.uid)])
        return new

    def drop_scope(self, name: str) -> Manifest:
        """Drop a scope: one manifest change (uid + 1); one drop event per collection in
        it, then the scope's, all carrying the new uid."""
        if name == DEFAULT_SCOPE:
            raise ManifestError("forbidden", "the _default scope cannot be dropped")
        new, s = self.manifest.drop_scope(name)
        events = [SystemEvent(0, EVENT_END_COLLECTION, new.uid, s.uid, c.uid)
                  for c in s.collections]
        events.append(SystemEvent(0, EVENT_DROP_SCOPE, new.uid, s.uid))
        return self._commit_manifest(new, events)

    def set_manifest(self, new: Manifest) -> list[SystemEvent]:
        """Make `new` (a whole manifest, from another member of a cluster) the manifest:
        the differences become system events in the order drops of collections, drops of
        scopes, new scopes, new collections; each carries the uid `new` has. A manifest
        whose uid is not above ours is refused (ValueError) unless it is the same one."""
        old = self.manifest
        if new.uid <= old.uid:
            if new.to_json() == old.to_json():
                return []
            raise ValueError(f"manifest uid {new.uid:x} is not above the node's "
                             f"({old.uid:x})")
        if not any(s.uid == 0 and any(c.uid == 0 for c in s.collections) for s in new.scopes):
            raise ValueError("the manifest has no _default collection")
        uid = new.uid
        old_c = {c.uid: (s.uid, c) for s in old.scopes for c in s.collections}
        new_c = {c.uid: (s.uid, c) for s in new.scopes for c in s.collections}
        old_s = {s.uid: s for s in old.scopes}
        new_s = {s.uid: s for s in new.scopes}
        events = []
        for cid, (sid, _c) in sorted(old_c.items()):
            if cid not in new_c:
                events.append(SystemEvent(0, EVENT_END_COLLECTION, uid, sid, cid))
        for sid in sorted(old_s):
            if sid not in new_s:
                events.append(SystemEvent(0, EVENT_DROP_SCOPE, uid, sid))
        for sid, s in sorted(new_s.items()):
            if sid not in old_s:
                events.append(SystemEvent(0, EVENT_CREATE_SCOPE, uid, sid, None, s.name))
        for cid, (sid, c) in sorted(new_c.items()):
            if cid not in old_c:
                events.append(SystemEvent(0, EVENT_BEGIN_COLLECTION, uid, sid, cid, c.name,
                                          c.max_ttl))
        if new.next_id < old.next_id:
            from dataclasses import replace
            new = replace(new, next_id=old.next_id)
        self._commit_manifest(new, events)
        return events

    def follow_event(self, ev: SystemEvent) -> bool:
        """A replica vbucket received `ev` from its active: bring the manifest along if the
        change is new here (ids are never reused: a collection created again is a new id),
        and write the change into this node's own active vbuckets, as a change made here
        would be (whichever way a change reaches a member first, the REST push or a
        replica stream, each active vbucket gets its event once). Returns True when the
        manifest changed."""
        from dataclasses import replace

        m = self.manifest
        uid = max(m.uid, ev.manifest_uid)
        kind = ev.event
        if kind == EVENT_BEGIN_COLLECTION:
            cid = ev.collection_id
            # ids are handed out in order and every vbucket gets the events in one order:
            # an id below next_id was seen here already (and maybe dropped since)
            if cid is None or cid in self.collections or cid < m.next_id:
                return False
            scope = m.scope_by_id(ev.scope_id)
            if scope is None:
                return False
            ns = replace(scope, collections=scope.collections + (
                Collection(ev.name, cid, ev.max_ttl),))
            new = replace(m, uid=uid, next_id=max(m.next_id, cid + 1),
                          scopes=tuple(ns if s is scope else s for s in m.scopes))
        elif kind == EVENT_END_COLLECTION:
            cid = ev.collection_id
            if cid not in self.collections or cid == 0:
                return False
            new = replace(m, uid=uid, scopes=tuple(
                replace(s, collections=tuple(c for c in s.collections if c.uid != cid))
                for s in m.scopes))
        elif kind == EVENT_CREATE_SCOPE:
            if ev.scope_id < m.next_id or m.scope(ev.name) is not None:
                return False
            new = replace(m, uid=uid, next_id=max(m.next_id, ev.scope_id + 1),
                          scopes=m.scopes + (Scope(ev.name, ev.scope_id),))
        elif kind == EVENT_DROP_SCOPE:
            scope = m.scope_by_id(ev.scope_id)
            if scope is None or ev.scope_id == 0:
                return False
            new = replace(m, uid=uid, scopes=tuple(s for s in m.scopes if s is not scope))
            # collections still in it go with it (their own drop events came first)
            evs = [SystemEvent(ev.seqno, EVENT_END_COLLECTION, uid, scope.uid, c.uid)
                   for c in scope.collections]
            self._commit_manifest(new, evs + [ev._replace(manifest_uid=uid)])
            return True
        else:
            return False
        self._commit_manifest(new, [ev._replace(manifest_uid=uid)])
        return True

    def visible(self, dkey: bytes) -> bool:
        """Is the document with doc key `dkey` in a live collection? (the default collection
        always is; a dropped collection's documents are not, purged or not)"""
        return not dkey[0] or doc_key_cid(dkey) in self.collections


#: background tasks of buckets (a task is only weakly referenced by the loop)
_TASKS: set = set()
