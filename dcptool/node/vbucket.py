"""A vbucket: the owner of its seqno counter, CAS clock, failover log, documents and checkpoints.

Nothing outside this class assigns seqnos, CAS values or failover entries. Every change
goes through `_commit`, which gives it the next seqno, puts it in the hash table, queues
it into the open checkpoint (where streams read it) and hands it to the flusher.
"""
from __future__ import annotations

import heapq
import secrets
import struct
import time
from collections import deque
from typing import Callable, Iterable

from dcptool.protocol.collections import EVENT_END_COLLECTION, decode_leb128

from dcptool.protocol.constants import Datatype, MetaOption, Status, VBucketState

from . import decisions
from .checkpoint import CheckpointManager, CheckpointMemory
from .decisions import is_expired
from .item import ITEM_DELETION, ITEM_EXPIRATION, ITEM_MUTATION, ITEM_SYSTEM, Item
from .sysevent import system_item

#: at most this many failover entries are kept (oldest dropped)
MAX_FAILOVER_ENTRIES = 25
#: the low 16 bits of a hybrid-logical-clock CAS are a counter
_HLC_MASK = ~0xFFFF
_U64 = (1 << 64) - 1
#: full eviction: items at the head of one vbucket's table an eviction pass looks at
EVICTION_SCAN_LIMIT = 4096
#: a collection system event's key: 0x01 b"c" and the collection id (node/sysevent.py)
_COLLECTION_EVENT = 0x63  # b"c"
_ID = struct.Struct(">I")


def new_vbucket_uuid() -> int:
    """A random non-zero uuid of at most 48 significant bits, as kv_engine makes them."""
    while True:
        u = secrets.randbits(48)
        if u:
            return u


class MutationResult:
    """What a KV command needs to answer: the status and, on success, the stored item."""

    __slots__ = ("status", "item")

    def __init__(self, status: int, item: Item | None = None) -> None:
        self.status = status
        self.item = item


class VBucket:
    """One partition of the key space.

    * `state`: VBucketState (active, replica, pending, dead).
    * `high_seqno`: the last seqno given out; strictly increasing.
    * `persisted_seqno`: the last seqno the flusher committed (updated from the flusher).
    * `purge_seqno`: tombstones up to here have been purged from disk.
    * `failover_log`: (uuid, seqno) pairs, newest first; entry 0's uuid is the current one.
    * `max_cas`: the hybrid logical clock; every CAS given out is above it.
    * `items`: key -> newest Item (tombstones included, until purged); in full eviction
      only the resident ones (every uncommitted version, and committed ones while they fit
      the memory quota): `find(key)` is the lookup that also reads the disk.
    * `checkpoints`: the in-memory change queue read by DCP streams.
    * `waiters`: callbacks to run once when the next change is queued (idle streams).
    * `streams`: the live DCP streams of this vbucket, ended on a state change.
    * `default_high`: the seqno of the newest change in the default collection;
      `coll_high`: {collection id: seqno of its newest change (its creation event
      included)} for the other live collections; `other_high`: the newest seqno of
      anything outside the default collection (documents of other collections and system
      events), 0 when the vbucket never had any (DCP streams of legacy connections skip
      their per-item filter for snapshots above it). Kept by `note_seqno` on every commit,
      rebuilt at warm-up by `rebuild_collection_seqnos`.
    * `locks`: key -> (lock CAS, unlock time in unix seconds) of the documents a client
      locked with GET_LOCKED. A lock lives in memory only (as kv_engine's): a restart or
      any new version of the key ends it, and it ends by itself at its time.
    """

    def __init__(
        self,
        vbid: int,
        *,
        state: int,
        failover_log: list[tuple[int, int]],
        high_seqno: int,
        persisted_seqno: int,
        purge_seqno: int,
        max_cas: int,
        memory: CheckpointMemory,
        dirty: deque,
        expiry_heap: list | None = None,
        checkpoint_max_items: int = 10000,
        checkpoint_max_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.id = vbid
        self.state = state
        self.failover_log = failover_log
        self.high_seqno = high_seqno
        self.persisted_seqno = persisted_seqno
        self.purge_seqno = purge_seqno
        self.max_cas = max_cas
        self.items: dict[bytes, Item] = {}
        #: the version of a key, resident or not (value eviction: the hash table's `get`)
        self.find: Callable[[bytes], Item | None] = self.items.get
        #: make an item its key's newest version in the hash table, keeping the counts
        #: (`_commit` uses `_put` and accounts the per-collection high seqnos itself;
        #: `install`, for changes that do not come through `_commit`, does both)
        self._put: Callable[[Item], None] = self._install_value
        #: live (not deleted) documents, kept as items change
        self.live_items = 0
        self.checkpoints = CheckpointManager(vbid, memory, start_seqno=high_seqno + 1,
                                             max_items=checkpoint_max_items,
                                             max_bytes=checkpoint_max_bytes)
        self.checkpoints.persisted_seqno = persisted_seqno
        self._dirty = dirty
        self._expiry_heap = expiry_heap if expiry_heap is not None else []
        self.waiters: list[Callable[[], None]] = []
        self.streams: set = set()
        self.state_listeners: list[Callable[["VBucket", int], None]] = []
        self.on_meta_change: Callable[["VBucket"], None] | None = None
        self.default_high = 0
        self.other_high = 0
        self.coll_high: dict[int, int] = {}
        #: the per-collection high seqnos cover what the vbucket held before this process
        #: (a fresh vbucket holds nothing; else `ensure_collection_seqnos` rebuilds them)
        self.coll_seqnos_built = high_seqno == 0
        self.locks: dict[bytes, tuple[int, float]] = {}

    #: full eviction (see dcptool.node.cache): `items` holds the resident documents only
    full = False

    def enable_full_eviction(self, cache, bloom, *, live: int = 0, keys: int = 0) -> None:
        """Make the hash table a cache over the database: misses go to `bloom`, then to
        disk through `cache`. `live` and `keys` are the counts warm-up found on disk."""
        self.full = True
        self.cache = cache
        self.bloom = bloom
        #: keys known (live and tombstones), resident or not
        self.nkeys = keys
        self.live_items = live
        #: the last key a lookup found absent (so the commit that follows does not ask again)
        self._absent: bytes | None = None
        self.find = self._find_full
        self._put = self._install_full

    # -- identity -------------------------------------------------------------

    @property
    def uuid(self) -> int:
        return self.failover_log[0][0]

    def add_failover_entry(self, seqno: int | None = None) -> tuple[int, int]:
        """Start a new history branch at `seqno` (default: the high seqno)."""
        if seqno is None:
            seqno = self.high_seqno
        log = [(u, s) for (u, s) in self.failover_log if s <= seqno]
        uuid = new_vbucket_uuid()
        while any(u == uuid for u, _ in log):
            uuid = new_vbucket_uuid()
        log.insert(0, (uuid, seqno))
        del log[MAX_FAILOVER_ENTRIES:]
        self.failover_log = log
        if self.on_meta_change is not None:
            self.on_meta_change(self)
        return uuid, seqno

    def set_state(self, state: int, *, new_branch: bool = True) -> None:
        """Change state; becoming active starts a new history branch (a new failover entry),
        except at the end of a takeover (`new_branch=False`: a controlled handover, seed 000)."""
        old = self.state
        if state == old:
            return
        self.state = state
        if state == VBucketState.ACTIVE and new_branch:
            self.add_failover_entry()
        elif self.on_meta_change is not None:
            self.on_meta_change(self)
        for listener in list(self.state_listeners):
            listener(self, old)

    # -- clock ----------------------------------------------------------------

    def next_cas(self) -> int:
        cas = time.time_ns() & _HLC_MASK
        if cas <= self.max_cas:
            cas = self.max_cas + 1
        self.max_cas = cas
        return cas

    def observe_cas(self, cas: int) -> None:
        """Keep the clock above a CAS that came from elsewhere (SET_WITH_META)."""
        if cas > self.max_cas:
            self.max_cas = cas

    # -- the one way in ------------------------------------------------------------

    def _commit(self, item: Item) -> Item:
        if self.locks:
            self.locks.pop(item.key, None)
        seqno = self.high_seqno + 1
        self.high_seqno = seqno
        item.seqno = seqno
        if item.key[0]:
            self._note_other(item.key, seqno, item.op, item.flags)
        else:
            self.default_high = seqno
        self._put(item)
        # the rest, in both eviction modes: the open checkpoint (streams read it), the
        # flusher's queue, the expiry heap, the idle streams' wake-ups
        self.checkpoints.queue(item)
        self._dirty.append((self.id, item))
        if item.expiry and item.op == ITEM_MUTATION:
            heapq.heappush(self._expiry_heap, (item.expiry, self.id, item.key, seqno))
        if self.waiters:
            waiters, self.waiters = self.waiters, []
            for w in waiters:
                w()
        return item

    def install(self, item: Item) -> None:
        """Make `item` (seqno already set: a replica applying what its active sent) its
        key's newest version, keeping the counts and the per-collection high seqnos."""
        self.note_seqno(item)
        self._put(item)

    # -- per-collection high seqnos ------------------------------------------------

    def note_seqno(self, item: Item) -> None:
        """Account a change that did not come through `_commit` (a replica applying what
        its active sent) in the per-collection high seqnos."""
        if item.key[0]:
            self._note_other(item.key, item.seqno, item.op, item.flags)
        elif item.seqno > self.default_high:
            self.default_high = item.seqno

    def _note_other(self, key: bytes, seqno: int, op: int, flags: int) -> None:
        if seqno > self.other_high:
            self.other_high = seqno
        c = key[0]
        if c == 1:
            # the system namespace: a collection's creation starts its high seqno, its
            # drop ends it (scope events belong to no collection)
            if op == ITEM_SYSTEM and len(key) >= 6 and key[1] == _COLLECTION_EVENT:
                cid = _ID.unpack_from(key, 2)[0]
                if flags == EVENT_END_COLLECTION:
                    self.coll_high.pop(cid, None)
                else:
                    self.coll_high[cid] = seqno
            return
        if c >= 0x80:
            c = decode_leb128(key)[0]
        if seqno > self.coll_high.get(c, 0):
            self.coll_high[c] = seqno

    def collection_high(self, cid: int) -> int | None:
        """The high seqno of collection `cid` in this vbucket (None: the vbucket does not
        know the collection)."""
        if not self.coll_seqnos_built:
            self.ensure_collection_seqnos()
        if cid == 0:
            return self.default_high
        return self.coll_high.get(cid)

    def legacy_high(self) -> int:
        """The high seqno a client without collections is told (GET_ALL_VB_SEQNOS): the
        default collection's (kv_engine), the vbucket's when it never held anything else."""
        if not self.coll_seqnos_built:
            self.ensure_collection_seqnos()
        return self.default_high if self.other_high else self.high_seqno

    def ensure_collection_seqnos(self) -> None:
        """Rebuild the per-collection high seqnos once, if warm-up did not: from the hash
        table (value eviction) or from the database and the resident items (full eviction).
        What was committed since warm-up is kept."""
        if self.coll_seqnos_built:
            return
        since = (self.default_high, self.other_high, dict(self.coll_high))
        if self.full:
            from .storage import SEQNO_MASK, row_id

            rows = self.cache.query(
                "SELECT key, id, op, flags FROM items WHERE id > ? AND id <= ?",
                (row_id(self.id, 0), row_id(self.id, SEQNO_MASK)))
            disk = [Item(k, b"", rid & SEQNO_MASK, 0, 0, flags, 0, 0, op)
                    for k, rid, op, flags in rows]
            self.rebuild_collection_seqnos(disk + list(self.items.values()))
        else:
            self.rebuild_collection_seqnos()
        d, o, c = since
        self.default_high = max(self.default_high, d)
        self.other_high = max(self.other_high, o)
        for cid, seqno in c.items():
            if seqno > self.coll_high.get(cid, 0):
                self.coll_high[cid] = seqno

    def rebuild_collection_seqnos(self, items: Iterable[Item] | None = None) -> None:
        """Warm-up: the per-collection high seqnos from the newest version of every key
        (`items`, default the hash table; full eviction passes what the database holds).
        Call after the vbucket's items are loaded, before it takes writes."""
        default = other = 0
        highs: dict[int, int] = {}
        dropped: set[int] = set()
        for it in (self.items.values() if items is None else items):
            key = it.key
            seqno = it.seqno
            c = key[0]
            if not c:
                if seqno > default:
                    default = seqno
                continue
            if seqno > other:
                other = seqno
            if c == 1:
                if it.op == ITEM_SYSTEM and len(key) >= 6 and key[1] == _COLLECTION_EVENT:
                    cid = _ID.unpack_from(key, 2)[0]
                    if it.flags == EVENT_END_COLLECTION:
                        dropped.add(cid)
                    elif seqno > highs.get(cid, 0):
                        highs[cid] = seqno
                continue
            if c >= 0x80:
                c = decode_leb128(key)[0]
            if seqno > highs.get(c, 0):
                highs[c] = seqno
        for cid in dropped:
            highs.pop(cid, None)
        highs.pop(0, None)
        self.default_high = default
        self.other_high = other
        self.coll_high = highs
        self.coll_seqnos_built = True

    def _install_value(self, item: Item) -> None:
        items = self.items
        old = items.get(item.key)
        self.live_items += (item.op == ITEM_MUTATION) - (old is not None and old.op == ITEM_MUTATION)
        items[item.key] = item

    def _install_full(self, item: Item) -> None:
        """Full eviction: make `item` the resident newest version of its key (it stays
        resident until the flusher committed it), keeping the counts."""
        key = item.key
        cache = self.cache
        old = self.items.pop(key, None)
        if old is not None:
            cache.bytes -= old.size
        elif key is not self._absent:
            old = self._disk_version(key)
        self._absent = None
        if old is None:
            self.nkeys += 1
            self.bloom.add(key)
        self.live_items += (item.op == ITEM_MUTATION) - (old is not None and old.op == ITEM_MUTATION)
        self.items[key] = item
        cache.bytes += item.size

    def _disk_version(self, key: bytes) -> Item | None:
        if key not in self.bloom:
            self.cache.bloom_negatives += 1
            return None
        return self.cache.read(self.id, key)

    def _find_full(self, key: bytes) -> Item | None:
        it = self.items.get(key)
        if it is not None:
            return it
        it = self._disk_version(key)
        if it is None:
            self._absent = key
            return None
        # clean (only committed versions are evicted): resident again, newest
        self.items[key] = it
        self.cache.bytes += it.size
        self.cache.fetched()
        return it

    def evict_clean(self, want: int) -> int:
        """Drop committed items from the head of the table (oldest first) until `want`
        bytes are freed or EVICTION_SCAN_LIMIT items were looked at. Returns how many went."""
        items = self.items
        persisted = self.persisted_seqno
        victims = []
        freed = 0
        scanned = 0
        for key, it in items.items():
            if it.seqno <= persisted:
                victims.append(key)
                freed += it.size
                if freed >= want:
                    break
            scanned += 1
            if scanned >= EVICTION_SCAN_LIMIT:
                break
        for key in victims:
            del items[key]
        self.cache.bytes -= freed
        return len(victims)

    def load(self, item: Item) -> None:
        """Put an item read from disk at warm-up into the hash table (no new seqno)."""
        self.items[item.key] = item
        if item.op == ITEM_MUTATION:
            self.live_items += 1
        if item.expiry and item.op == ITEM_MUTATION:
            heapq.heappush(self._expiry_heap, (item.expiry, self.id, item.key, item.seqno))

    # -- reads -------------------------------------------------------------------

    def get(self, key: bytes, now: float) -> Item | None:
        """The live item for `key`, or None. An expired item is turned into a tombstone."""
        it = self.find(key)
        if it is None or it.op != ITEM_MUTATION:
            return None
        if is_expired(it.expiry, now):
            if self.state == VBucketState.ACTIVE:
                self.expire(it, int(now))
            return None
        return it

    def get_meta(self, key: bytes, now: float) -> Item | None:
        """The newest version of `key`, tombstones included (expired items are expired first)."""
        it = self.find(key)
        if it is not None and it.op == ITEM_MUTATION and is_expired(it.expiry, now) \
                and self.state == VBucketState.ACTIVE:
            it = self.expire(it, int(now))
        return it

    # -- locks (GET_LOCKED / UNLOCK_KEY) ----------------------------------------------

    def lock_cas(self, key: bytes, now: float) -> int:
        """The CAS of the lock held on `key`, or 0 when it is not locked (a lock past its
        time is dropped here)."""
        lock = self.locks.get(key)
        if lock is None:
            return 0
        if lock[1] <= now:
            del self.locks[key]
            return 0
        return lock[0]

    def lock(self, key: bytes, seconds: int, now: float) -> int:
        """Lock `key` for `seconds`; the lock's CAS (a new one of the clock)."""
        cas = self.next_cas()
        self.locks[key] = (cas, now + seconds)
        return cas

    def unlock(self, key: bytes) -> None:
        self.locks.pop(key, None)

    def _locked_against(self, key: bytes, cas: int, now: float) -> bool:
        """Is `key` locked against a write that carries `cas`? A write with the lock's
        CAS may go ahead (and its new version ends the lock)."""
        held = self.lock_cas(key, now)
        return bool(held) and held != cas

    # -- front-end writes ----------------------------------------------------------

    def store(self, key: bytes, value: bytes, flags: int, expiry: int, datatype: int, *,
              cas: int = 0, mode: int = 0, now: float | None = None,
              new_cas: int = 0) -> MutationResult:
        """SET (mode 0), ADD (1) or REPLACE (2). `expiry` is already absolute. `new_cas`:
        the version's CAS when the caller took it from `next_cas` already (a sub-document
        mutation whose xattrs name their own CAS)."""
        if now is None:
            now = time.time()
        old = self.find(key)
        live = old if (old is not None and old.op == ITEM_MUTATION
                       and not is_expired(old.expiry, now)) else None
        if old is not None and live is None and old.op == ITEM_MUTATION:
            # expired: it becomes a tombstone first so the history shows the expiry
            old = self.expire(old, int(now))
        if mode == 1 and live is not None:
            return MutationResult(Status.KEY_EEXISTS)
        if mode == 2 and live is None:
            return MutationResult(Status.KEY_ENOENT)
        if self.locks and live is not None and self.lock_cas(key, now):
            if self._locked_against(key, cas, now):
                return MutationResult(Status.LOCKED)
        elif cas:
            if live is None:
                return MutationResult(Status.KEY_ENOENT)
            if live.cas != cas:
                return MutationResult(Status.KEY_EEXISTS)
        rev = old.rev + 1 if old is not None else 1
        item = Item(key, value, 0, rev, new_cas or self.next_cas(), flags, expiry, datatype)
        return MutationResult(Status.SUCCESS, self._commit(item))

    def delete(self, key: bytes, *, cas: int = 0, now: float | None = None) -> MutationResult:
        if now is None:
            now = time.time()
        live = self.get(key, now)
        if live is None:
            return MutationResult(Status.KEY_ENOENT)
        if self.locks and self.lock_cas(key, now):
            if self._locked_against(key, cas, now):
                return MutationResult(Status.LOCKED)
        elif cas and live.cas != cas:
            return MutationResult(Status.KEY_EEXISTS)
        item = Item(key, b"", 0, live.rev + 1, self.next_cas(), live.flags, 0, 0, ITEM_DELETION,
                    int(now))
        return MutationResult(Status.SUCCESS, self._commit(item))

    def system_event(self, ev) -> Item:
        """Commit a collections system event (`dcptool.node.sysevent`): the next seqno, the
        open checkpoint, the flusher, like any change. `ev` is a SystemEvent (its seqno is
        ignored)."""
        old = self.find(system_item(ev).key)
        item = system_item(ev, rev=old.rev + 1 if old is not None else 1, cas=self.next_cas())
        return self._commit(item)

    def expire(self, live: Item, now: int) -> Item:
        """Turn an expired item into a tombstone with a new seqno (DCP sends an expiration)."""
        item = Item(live.key, b"", 0, live.rev + 1, self.next_cas(), live.flags, 0, 0, ITEM_EXPIRATION,
                    now)
        return self._commit(item)

    def expire_if_due(self, key: bytes, seqno: int, now: float) -> bool:
        """Called by the expiry pager for a heap entry; True when a tombstone was written."""
        if self.state != VBucketState.ACTIVE:
            return False
        it = self.find(key)
        if it is None or it.seqno != seqno or it.op != ITEM_MUTATION:
            return False
        if not is_expired(it.expiry, now):
            return False
        self.expire(it, int(now))
        return True

    # -- replication-style writes (conflict resolution) -----------------------------

    def store_with_meta(self, key: bytes, value: bytes, *, flags: int, expiry: int, rev: int,
                        meta_cas: int, datatype: int, options: int = 0, cas: int = 0,
                        deletion: bool = False, now: float | None = None) -> MutationResult:
        """SET_WITH_META / DEL_WITH_META: keep the incoming version if it wins (section 4.14)."""
        if now is None:
            now = time.time()
        old = self.find(key)
        if cas:
            if old is None or old.op != ITEM_MUTATION:
                return MutationResult(Status.KEY_ENOENT)
            if old.cas != cas:
                return MutationResult(Status.KEY_EEXISTS)
        skip = bool(options & (MetaOption.FORCE_WITH_META_OP | MetaOption.SKIP_CONFLICT_RESOLUTION))
        if not skip and old is not None:
            existing = (old.rev, old.cas,
                        old.delete_time if old.op != ITEM_MUTATION else old.expiry, old.flags)
            incoming = (rev, meta_cas, expiry, flags)
            if not decisions.with_meta_wins(
                    incoming, existing, deletion=deletion,
                    incoming_xattr=bool(datatype & Datatype.XATTR),
                    existing_xattr=bool(old.datatype & Datatype.XATTR)):
                return MutationResult(Status.KEY_EEXISTS)
        if options & MetaOption.REGENERATE_CAS:
            meta_cas = self.next_cas()
        else:
            self.observe_cas(meta_cas)
        if deletion:
            op = ITEM_EXPIRATION if options & MetaOption.IS_EXPIRATION else ITEM_DELETION
            item = Item(key, value, 0, rev, meta_cas, flags, 0, datatype, op,
                        expiry or int(now))
        else:
            item = Item(key, value, 0, rev, meta_cas, flags, expiry, datatype)
        return MutationResult(Status.SUCCESS, self._commit(item))

    # -- the purger ------------------------------------------------------------------

    def purge_tombstones(self, tombstones: list[tuple[int, bytes]]) -> list[int]:
        """Forget these (seqno, key) tombstones and raise the purge seqno past them.

        A key whose newest version is no longer that tombstone (written again since) is
        left alone. Returns the seqnos actually purged. The purge seqno is raised here,
        on the loop, before storage deletes the rows: from now on a stream request or a
        backfill starting below it is told to roll back, so no client can start reading
        a disk snapshot that lacks deletions it needs.
        """
        items = self.items
        purged = []
        evicted = []
        for seqno, key in tombstones:
            it = items.get(key)
            if it is not None and it.seqno == seqno and it.op != ITEM_MUTATION:
                del items[key]
                purged.append(seqno)
                if self.full:
                    self.cache.bytes -= it.size
            elif it is None and self.full:
                evicted.append(seqno)
        if evicted:
            # not resident, so committed and the newest version on disk: the tombstone is
            # still the key's version when its row (id = vbucket and seqno) is still there
            from .storage import SEQNO_MASK, row_id

            for i in range(0, len(evicted), 500):
                chunk = evicted[i:i + 500]
                rows = self.cache.query(
                    f"SELECT id FROM items WHERE op != 0 AND id IN ({','.join('?' * len(chunk))})",
                    tuple(row_id(self.id, s) for s in chunk))
                purged += [r[0] & SEQNO_MASK for r in rows]
            purged.sort()
        if self.full:
            self.nkeys -= len(purged)
        self.purge_seqno = decisions.purge_seqno_after(self.purge_seqno, purged)
        return purged

    # -- stats ---------------------------------------------------------------------

    def counts(self) -> tuple[int, int]:
        """(live items, tombstones)."""
        if self.full:
            return self.live_items, self.nkeys - self.live_items
        return self.live_items, len(self.items) - self.live_items
