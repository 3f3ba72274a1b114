"""Full eviction: the hash tables as a bounded cache over the database.

With `--eviction full` a vbucket's `items` holds only the resident documents: every
version the flusher has not committed yet (dirty) and as many committed (clean) ones as
fit in `--memory-quota`. A lookup that misses the hash table asks the vbucket's bloom
filter of keys first; only a key the filter may hold is read from SQLite (a background
fetch, here done inline on the loop through one read connection). The filter holds every
key ever stored in the vbucket (keys are never removed from it: a purged or rolled-back
key only costs a disk lookup that finds nothing), so it never answers "absent" for a key
that exists.

Eviction walks each vbucket's hash table in insertion order (a key moves to the end
whenever it is written or fetched: oldest first) and drops clean items until the
resident bytes are under `LOW_WATER` of the quota. It runs after every flusher commit
(that is when dirty items become clean) and, when fetches push the cache over its
quota, once more on the loop.
"""
from __future__ import annotations

import logging
import sqlite3
from array import array
from typing import TYPE_CHECKING

from .item import Item
from .storage import ITEM_COLUMNS, item_from_row

if TYPE_CHECKING:
    from .storage import Storage
    from .vbucket import VBucket

log = logging.getLogger("dcptool.node.cache")

#: eviction brings the resident bytes down to this share of the quota
LOW_WATER = 0.9


class BloomFilter:
    """Keys that may exist, with no false negatives; grows by adding a filter four times
    as large whenever the newest one reaches its capacity (a scalable bloom filter), so a
    vbucket that starts empty and is restored into stays cheap to ask.

    A blocked filter: a key's `K` = 4 bits all lie in one 64-bit word, so an answer costs
    one memory access (the filters of 1024 vbuckets are megabytes: a probe per bit would
    be a cache miss per bit). Words are a power of two, at least `BITS` bits per key of
    the capacity: about 1-2% false positives in a full filter, far fewer below capacity.
    The word and the bits come from Python's `hash()` of the key (random per process, fine
    for a filter rebuilt at every warm-up).
    """

    BITS = 10
    GROWTH = 4
    MIN_CAPACITY = 4096

    __slots__ = ("filters", "keys", "_words", "_wmask", "_room", "_last")

    def __init__(self, capacity: int = 0) -> None:
        #: [array of 64-bit words, word mask, capacity]
        self.filters: list[list] = []
        self.keys = 0
        #: (key, word index, bit mask) of the last key found absent: adding it next (the
        #: write that follows a miss) reuses them
        self._last: tuple | None = None
        self._grow(max(self.MIN_CAPACITY, capacity))

    def _grow(self, capacity: int) -> None:
        nwords = 1 << max(7, ((capacity * self.BITS + 63) // 64 - 1).bit_length())
        f = [array("Q", bytes(8 * nwords)), nwords - 1, capacity]
        self.filters.append(f)
        self._words, self._wmask, self._room = f[0], f[1], capacity

    @property
    def size_bytes(self) -> int:
        return sum(len(f[0]) * 8 for f in self.filters)

    def add(self, key: bytes) -> None:
        if not self._room:
            self._grow(self.filters[-1][2] * self.GROWTH)
        self._room -= 1
        self.keys += 1
        last = self._last
        if last is not None and last[0] is key:
            self._last = None
            h = last[1]
            mask = last[2]
        else:
            h = hash(key)
            mask = ((1 << ((h >> 32) & 63)) | (1 << ((h >> 38) & 63))
                    | (1 << ((h >> 44) & 63)) | (1 << ((h >> 50) & 63)))
        self._words[h & self._wmask] |= mask

    def __contains__(self, key: bytes) -> bool:
        h = hash(key)
        mask = ((1 << ((h >> 32) & 63)) | (1 << ((h >> 38) & 63))
                | (1 << ((h >> 44) & 63)) | (1 << ((h >> 50) & 63)))
        for words, wmask, _cap in self.filters:
            if words[h & wmask] & mask == mask:
                return True
        self._last = (key, h, mask)
        return False


class ResidentCache:
    """The node-wide budget of resident documents in full eviction, its counters and the
    connection misses are read through.

    * `quota`: bytes of resident documents (`Item.size`) eviction keeps the node under.
    * `bytes`: resident bytes now, over every vbucket.
    * `evictions`, `bg_fetches`, `bg_fetch_misses`, `bloom_negatives`: STAT counters
      (ep_num_value_ejects, ep_bg_fetched, ep_bg_fetch_misses, ep_bg_fetch_avoided).
    """

    def __init__(self, storage: "Storage", quota: int) -> None:
        self.storage = storage
        self.quota = quota
        self.bytes = 0
        self.evictions = 0
        self.bg_fetches = 0
        self.bg_fetch_misses = 0
        self.bloom_negatives = 0
        self.vbuckets: list["VBucket"] = []
        self.loop = None
        self._db: sqlite3.Connection | None = None
        self._scheduled = False
        #: True after an eviction pass found nothing clean enough to reach the low water
        #: mark: wait for the next flusher commit before trying again
        self._starved = False
        self._next_vb = 0

    # -- reads ---------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self._db = self.storage._connect(readonly=True)
        return self._db

    def read(self, vbid: int, key: bytes) -> Item | None:
        """The stored version of `key` in `vbid` (the newest once it is clean), or None."""
        self.bg_fetches += 1
        # fetchall: the statement runs to its end, so no read snapshot stays open and the
        # next lookup sees every commit made since
        rows = self._conn().execute(
            f"SELECT {ITEM_COLUMNS} FROM items WHERE vb = ? AND key = ?", (vbid, key)).fetchall()
        if not rows:
            self.bg_fetch_misses += 1
            return None
        return item_from_row(rows[0])[1]

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._conn().execute(sql, args).fetchall()

    def close(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None

    # -- eviction --------------------------------------------------------------------

    def fetched(self) -> None:
        """A fetch added a clean item: evict soon (on the loop) if over the quota."""
        if self.bytes > self.quota and not self._scheduled and not self._starved:
            self._scheduled = True
            if self.loop is not None:
                self.loop.call_soon(self._scheduled_run)
            else:
                self._scheduled_run()

    def _scheduled_run(self) -> None:
        self._scheduled = False
        self.evict()

    def on_persisted(self) -> None:
        self._starved = False
        if self.bytes > self.quota:
            self.evict()

    def evict(self) -> int:
        """Drop clean items, oldest first, round-robin over the vbuckets, until the
        resident bytes are under the low water mark. Returns how many went."""
        target = int(self.quota * LOW_WATER)
        vbs = self.vbuckets
        if not vbs or self.bytes <= target:
            return 0
        n = len(vbs)
        evicted = 0
        # each vbucket that holds items gives a share of what has to go per round, so no
        # vbucket is emptied while others keep their oldest items
        while True:
            holding = sum(1 for vb in vbs if vb.items)
            if not holding:
                break
            share = (self.bytes - target) // holding + 1
            progress = False
            for i in range(n):
                vb = vbs[(self._next_vb + i) % n]
                if vb.items:
                    got = vb.evict_clean(share)
                    if got:
                        evicted += got
                        progress = True
                if self.bytes <= target:
                    self._next_vb = (self._next_vb + i + 1) % n
                    self.evictions += evicted
                    return evicted
            if not progress:
                break
        self.evictions += evicted
        self._starved = self.bytes > self.quota
        return evicted
