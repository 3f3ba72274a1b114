"""Persistence: one SQLite database in WAL mode, written by a flusher thread in batches.

Layout (`DIR/data.sqlite3`):

* `items`: one row per key with its newest version, tombstones included. The row id is
  `(vbucket << 48) | seqno`, so a vbucket's rows in seqno order are one range of the
  primary key and a disk backfill is a range scan. `(vb, key)` is unique.
* `vbucket_meta`: per vbucket its state, failover log (JSON, newest first), persisted
  seqno, purge seqno and the highest CAS given out.
* `meta`: node-wide facts: format version, vbucket count, bucket name, the
  clean-shutdown mark, the collections manifest (`manifest`: the internal JSON with
  `next_id`) and the dropped collections whose documents are not purged yet (`dropped`:
  a JSON list of ids).
* Format 2 (collections): every `key` is the collection-prefixed doc key (LEB128
  collection id + key; the default collection is 0x00 + key). Opening a format-1
  database prefixes 0x00 to every stored key once, in one transaction
  (`Storage.migrate`). System events (op 3) are rows too, keys in the system namespace.
* `hwt`: the high watermark table, one row per (client name, instance): per-vbucket
  seqnos (JSON), reported and expiry times, client meta (JSON) and, once the guard rail
  took it, when and why the row was lost.
* `items_tombstones`: a partial index of the tombstones only, by row id with their
  delete time, so compaction and the HWT's hold figures never scan live documents.

The event loop never waits for the disk: it appends `(vbid, item)` or
`(vbid, None, meta)` entries to a deque; the flusher thread takes what is there every
`flush_interval`, keeps the newest version of each key, writes it in one transaction
and commits. Each commit is one disk snapshot: the persisted seqno of every vbucket in
the batch moves to the highest seqno the batch held for it, in the same transaction, and
the loop is told afterwards. Backfills read through their own connections; WAL mode gives
each read transaction a consistent snapshot while the flusher goes on writing.

Maintenance (compaction and HWT writes) runs on one more thread with its own connection,
one job at a time in submission order (`maintenance(fn, ...)`), so the event loop never
waits for it either. Its write transactions take turns with the flusher's through
SQLite's lock; a backfill that opened its snapshot before a compaction keeps seeing the
purged tombstones until it ends.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

from .item import Item

log = logging.getLogger("dcptool.node.storage")

FORMAT_VERSION = 2
#: formats `Storage.migrate` brings up to FORMAT_VERSION
MIGRATABLE_FORMATS = (1,)
#: `Item.op` of a collections system event (node/item.py ITEM_SYSTEM): never a tombstone
OP_SYSTEM = 3
#: the pseudo vbucket id of node-wide meta entries in the flusher's queue
NODE_META = -1
SEQNO_BITS = 48
SEQNO_MASK = (1 << SEQNO_BITS) - 1
_TWO63 = 1 << 63
_TWO64 = 1 << 64

ITEM_COLUMNS = "id, key, rev, cas, flags, expiry, datatype, op, delete_time, value"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS vbucket_meta (
    vb              INTEGER PRIMARY KEY,
    state           INTEGER NOT NULL,
    failover        TEXT NOT NULL,
    persisted_seqno INTEGER NOT NULL DEFAULT 0,
    purge_seqno     INTEGER NOT NULL DEFAULT 0,
    max_cas         INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS items (
    id          INTEGER PRIMARY KEY,
    vb          INTEGER NOT NULL,
    key         BLOB NOT NULL,
    rev         INTEGER NOT NULL,
    cas         INTEGER NOT NULL,
    flags       INTEGER NOT NULL,
    expiry      INTEGER NOT NULL,
    datatype    INTEGER NOT NULL,
    op          INTEGER NOT NULL,
    delete_time INTEGER NOT NULL,
    value       BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS items_by_key ON items (vb, key);
CREATE INDEX IF NOT EXISTS items_tombstones ON items (id, delete_time) WHERE op != 0;
CREATE TABLE IF NOT EXISTS hwt (
    name        TEXT NOT NULL,
    instance    TEXT NOT NULL,
    seqnos      TEXT NOT NULL,
    reported_at REAL NOT NULL,
    expires_at  REAL NOT NULL,
    meta        TEXT NOT NULL DEFAULT '{}',
    lost_at     REAL,
    lost_reason TEXT,
    PRIMARY KEY (name, instance)
);
"""

HWT_COLUMNS = "name, instance, seqnos, reported_at, expires_at, meta, lost_at, lost_reason"


def _first(row: tuple) -> int:
    return row[0]


def to_i64(v: int) -> int:
    """Store an unsigned 64-bit value in SQLite's signed INTEGER."""
    return v - _TWO64 if v >= _TWO63 else v


def from_i64(v: int) -> int:
    return v + _TWO64 if v < 0 else v


def row_id(vbid: int, seqno: int) -> int:
    return (vbid << SEQNO_BITS) | seqno


def item_from_row(row: tuple) -> tuple[int, Item]:
    rid, key, rev, cas, flags, expiry, datatype, op, delete_time, value = row
    return rid >> SEQNO_BITS, Item(key, value, rid & SEQNO_MASK, from_i64(rev), from_i64(cas),
                                   flags, expiry, datatype, op, delete_time)


class Storage:
    """The node's database and its flusher thread.

    `dirty` is the deque vbuckets append to. `on_persisted(dict vbid -> seqno)` runs on
    the event loop after each commit (through `call_soon_threadsafe`).
    """

    def __init__(self, path: Path, *, flush_interval: float = 0.02,
                 synchronous: str = "NORMAL", reader_cache_kib: int = 65536) -> None:
        self.path = Path(path)
        #: page cache of each read connection (backfills, full eviction's fetches)
        self.reader_cache_kib = reader_cache_kib
        self.flush_interval = flush_interval
        self.synchronous = synchronous
        self.dirty: deque = deque()
        self._db = self._connect()
        self._db.executescript(_SCHEMA)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._busy = False
        self._loop = None
        self._on_persisted: Callable[[dict[int, int]], None] | None = None
        self.batches = 0
        self.items_written = 0
        self.last_error: str | None = None
        self._readers: list[sqlite3.Connection] = []
        self._maint_pool: ThreadPoolExecutor | None = None
        self._maint_db: sqlite3.Connection | None = None

    def _connect(self, readonly: bool = False) -> sqlite3.Connection:
        if readonly:
            uri = f"file:{self.path}?mode=ro"
            db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={self.synchronous}")
            # checkpoint the WAL into the database less often: fewer rewrites of hot pages
            db.execute("PRAGMA wal_autocheckpoint=20000")
        db.execute("PRAGMA busy_timeout=10000")
        db.execute(f"PRAGMA cache_size=-{self.reader_cache_kib if readonly else 65536}")
        return db

    # -- node-wide meta -------------------------------------------------------------

    def get_meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT name, value FROM meta").fetchall())

    def set_meta(self, **values: Any) -> None:
        """Write node-wide meta synchronously (only while the flusher is not running)."""
        with self._tx():
            self._db.executemany("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
                                 [(k, str(v)) for k, v in values.items()])

    def _tx(self):
        return write_tx(self._db)

    def enqueue_node_meta(self, **values: Any) -> None:
        """Persist node-wide meta (the manifest, the dropped ids) through the flusher, in
        order with the items queued before and after it (usable while the flusher runs)."""
        self.dirty.append((NODE_META, None, {k: str(v) for k, v in values.items()}))
        self._wake.set()

    def migrate(self, from_format: int) -> int:
        """Bring a database of an older format to FORMAT_VERSION in one transaction;
        returns how many item rows were rewritten. Format 1 -> 2: every key gets the
        default collection's prefix 0x00. The unique (vb, key) index is rebuilt around the
        rewrite so no intermediate state can collide."""
        if from_format not in MIGRATABLE_FORMATS:
            raise ValueError(f"storage format {from_format} cannot be migrated")
        db = self._db
        with self._tx():
            db.execute("DROP INDEX IF EXISTS items_by_key")
            # || yields TEXT: cast back to the BLOB every key is
            cur = db.execute("UPDATE items SET key = CAST(X'00' || key AS BLOB)")
            n = cur.rowcount
            db.execute("CREATE UNIQUE INDEX items_by_key ON items (vb, key)")
            db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('format', ?)",
                       (str(FORMAT_VERSION),))
        return n

    # -- vbuckets ---------------------------------------------------------------------

    def load_vbucket_meta(self) -> dict[int, dict[str, Any]]:
        out = {}
        for vb, state, failover, persisted, purge, max_cas in self._db.execute(
                "SELECT vb, state, failover, persisted_seqno, purge_seqno, max_cas FROM vbucket_meta"):
            out[vb] = {"state": state, "failover": [tuple(e) for e in json.loads(failover)],
                       "persisted_seqno": persisted, "purge_seqno": purge,
                       "max_cas": from_i64(max_cas)}
        return out

    def write_vbucket_meta(self, rows: list[tuple[int, int, list, int, int, int]]) -> None:
        """(vb, state, failover, persisted, purge, max_cas) rows, synchronously (warm-up only)."""
        with self._tx():
            self._db.executemany(_UPSERT_VB_META, [
                (vb, st, json.dumps(fo), p, pu, to_i64(mc)) for vb, st, fo, p, pu, mc in rows])

    def high_seqnos(self) -> dict[int, int]:
        """The highest seqno on disk per vbucket."""
        out = {}
        for (vb,) in self._db.execute("SELECT DISTINCT vb FROM items"):
            row = self._db.execute("SELECT max(id) FROM items WHERE id >= ? AND id < ?",
                                   (row_id(vb, 0), row_id(vb + 1, 0))).fetchone()
            if row[0] is not None:
                out[vb] = row[0] & SEQNO_MASK
        return out

    def iter_items(self, batch: int = 10000) -> Iterator[tuple[int, Item]]:
        cur = self._db.execute(f"SELECT {ITEM_COLUMNS} FROM items ORDER BY id")
        while True:
            rows = cur.fetchmany(batch)
            if not rows:
                return
            for r in rows:
                yield item_from_row(r)

    # -- full-eviction warm-up: aggregates and streaming scans, nothing kept ------------------

    def vbucket_counts(self, vbids) -> dict[int, tuple[int, int, int]]:
        """Per vbucket with rows: (keys, live documents, highest CAS), one range scan each."""
        out = {}
        db = self._db
        for vb in vbids:
            n, live, cas_lo, cas_hi = db.execute(
                "SELECT count(*), coalesce(sum(op = 0), 0), max(CASE WHEN cas >= 0 THEN cas END), "
                "max(CASE WHEN cas < 0 THEN cas END) FROM items WHERE id >= ? AND id < ?",
                (row_id(vb, 0), row_id(vb + 1, 0))).fetchone()
            if n:
                # CAS values of 2^63 and above are stored negative (to_i64)
                out[vb] = (n, live, from_i64(cas_hi) if cas_hi is not None else (cas_lo or 0))
        return out

    def iter_keys(self, batch: int = 10000) -> Iterator[list[tuple[int, bytes]]]:
        """Batches of (vbucket, key) of every row, read from the (vb, key) index only."""
        cur = self._db.execute("SELECT vb, key FROM items INDEXED BY items_by_key")
        while True:
            rows = cur.fetchmany(batch)
            if not rows:
                return
            yield rows

    def iter_expiring(self) -> Iterator[tuple[int, int, bytes, int]]:
        """(expiry, vbucket, key, seqno) of the live documents with a TTL."""
        cur = self._db.execute("SELECT expiry, id, key FROM items WHERE expiry != 0 AND op = 0")
        for expiry, rid, key in cur:
            yield expiry, rid >> SEQNO_BITS, key, rid & SEQNO_MASK

    # -- flusher --------------------------------------------------------------------------

    def start_flusher(self, loop, on_persisted: Callable[[dict[int, int]], None]) -> None:
        self._loop = loop
        self._on_persisted = on_persisted
        self._thread = threading.Thread(target=self._run, name="dcptool-flusher", daemon=True)
        self._thread.start()

    def enqueue_meta(self, vbid: int, meta: dict[str, Any]) -> None:
        """Persist a vbucket's state/failover log/purge seqno/max CAS in order with its items."""
        self.dirty.append((vbid, None, meta))
        self._wake.set()

    def kick(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                self._flush_once()
            except Exception as exc:  # keep flushing; report it
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("flush failed")
                time.sleep(0.5)
        # final drain
        try:
            while self.dirty:
                self._flush_once()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("final flush failed")

    def _flush_once(self, max_batch: int = 200_000) -> int:
        dirty = self.dirty
        if not dirty:
            return 0
        with self._idle:
            self._busy = True
        try:
            latest: dict[tuple[int, bytes], Item] = {}
            persisted: dict[int, int] = {}
            metas: dict[int, dict[str, Any]] = {}
            popleft = dirty.popleft
            # appends from the loop go on meanwhile: take what is there now
            taken = [popleft() for _ in range(min(len(dirty), max_batch))]
            n = len(taken)
            for entry in taken:
                item = entry[1]
                if item is None:
                    metas.setdefault(entry[0], {}).update(entry[2])
                    continue
                vbid = entry[0]
                latest[(vbid, item.key)] = item
                persisted[vbid] = item.seqno
            two63, two64 = _TWO63, _TWO64
            rows = [
                ((vbid << SEQNO_BITS) | it.seqno, vbid, it.key,
                 it.rev - two64 if it.rev >= two63 else it.rev,
                 it.cas - two64 if it.cas >= two63 else it.cas,
                 it.flags, it.expiry, it.datatype, it.op, it.delete_time, it.value)
                for (vbid, _k), it in latest.items()
            ]
            # in row-id order the b-tree pages a batch touches are written once each
            rows.sort(key=_first)
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                if rows:
                    # many rows per statement: one sqlite3_step (run without the GIL) each
                    step = _ROWS_PER_STEP
                    full = len(rows) - len(rows) % step
                    if full:
                        flat = [v for r in rows[:full] for v in r]
                        w = step * _NCOLS
                        db.executemany(_UPSERT_ITEMS, [flat[i:i + w] for i in range(0, len(flat), w)])
                    if full < len(rows):
                        db.executemany(_UPSERT_ITEM, rows[full:])
                for vbid, meta in metas.items():
                    if vbid == NODE_META:
                        db.executemany("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)",
                                       list(meta.items()))
                    else:
                        self._apply_meta(vbid, meta)
                if persisted:
                    db.executemany(
                        "UPDATE vbucket_meta SET persisted_seqno = ? WHERE vb = ? AND persisted_seqno < ?",
                        [(s, vb, s) for vb, s in persisted.items()])
                db.execute("COMMIT")
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                finally:
                    # nothing of this batch is on disk: put it back, in order, for the next try
                    dirty.extendleft(reversed(taken))
                raise
            self.batches += 1
            self.items_written += len(rows)
            if persisted and self._loop is not None and self._on_persisted is not None:
                try:
                    self._loop.call_soon_threadsafe(self._on_persisted, persisted)
                except RuntimeError:  # loop closed during shutdown
                    pass
            return n
        finally:
            with self._idle:
                self._busy = False
                self._idle.notify_all()

    def _apply_meta(self, vbid: int, meta: dict[str, Any]) -> None:
        sets = []
        args: list[Any] = []
        if "state" in meta:
            sets.append("state = ?")
            args.append(meta["state"])
        if "failover" in meta:
            sets.append("failover = ?")
            args.append(json.dumps(meta["failover"]))
        if "purge_seqno" in meta:
            sets.append("purge_seqno = ?")
            args.append(meta["purge_seqno"])
        if "max_cas" in meta:
            sets.append("max_cas = max(max_cas, ?)")
            args.append(to_i64(meta["max_cas"]))
        if not sets:
            return
        self._db.execute(f"UPDATE vbucket_meta SET {', '.join(sets)} WHERE vb = ?", (*args, vbid))

    def wait_flushed(self, timeout: float = 60.0) -> bool:
        """Block until everything queued so far is committed (used at shutdown and by tests)."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while True:
            with self._idle:
                if not self.dirty and not self._busy:
                    return True
                self._idle.wait(0.01)
            self._wake.set()
            if time.monotonic() > deadline:
                return False

    def stop(self, *, clean: bool) -> None:
        """Stop the flusher after it wrote everything; mark a clean shutdown when asked."""
        if self._maint_pool is not None:
            # maintenance jobs already queued (HWT writes, a compaction step) finish first
            self._maint_pool.shutdown(wait=True)
            self._maint_pool = None
        if self._maint_db is not None:
            try:
                self._maint_db.close()
            except sqlite3.Error:
                pass
            self._maint_db = None
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join()
            self._thread = None
        while self.dirty:
            self._flush_once()
        if clean:
            self.set_meta(clean_shutdown=1)
        for r in self._readers:
            try:
                r.close()
            except sqlite3.Error:
                pass
        self._readers.clear()
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self._db.close()

    # -- maintenance: compaction and the high watermark table ----------------------------

    def maintenance(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(db, *args)` on the maintenance thread (one job at a time, in order).

        `db` is the maintenance connection; `fn` runs its own transactions. Returns a
        concurrent Future (wrap it with `asyncio.wrap_future` on the loop).
        """
        if self._maint_pool is None:
            self._maint_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dcptool-maint")

        def job():
            if self._maint_db is None:
                self._maint_db = self._connect()
            return fn(self._maint_db, *args)
        return self._maint_pool.submit(job)

    def load_hwt(self) -> list[tuple]:
        """Every HWT row (warm-up, before the flusher starts)."""
        return self._db.execute(f"SELECT {HWT_COLUMNS} FROM hwt ORDER BY name, instance").fetchall()

    # -- readers (backfill) -------------------------------------------------------------

    def reader(self) -> sqlite3.Connection:
        """A read connection for one backfill; give it back with `release_reader`."""
        if self._readers:
            return self._readers.pop()
        return self._connect(readonly=True)

    def release_reader(self, db: sqlite3.Connection) -> None:
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        if len(self._readers) < 16:
            self._readers.append(db)
        else:
            db.close()


_UPSERT_ITEM = (
    "INSERT OR REPLACE INTO items (id, vb, key, rev, cas, flags, expiry, datatype, op, "
    "delete_time, value) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
_NCOLS = 11
#: rows per INSERT of the flusher: the sqlite3 module holds the GIL while it binds a
#: statement's parameters and releases it for the step, so one step per row hands the
#: GIL back and forth with the event loop for every row
_ROWS_PER_STEP = 256
_UPSERT_ITEMS = _UPSERT_ITEM.split("VALUES")[0] + "VALUES " + ",".join(
    ["(" + ",".join("?" * _NCOLS) + ")"] * _ROWS_PER_STEP)
_UPSERT_VB_META = (
    "INSERT INTO vbucket_meta (vb, state, failover, persisted_seqno, purge_seqno, max_cas) "
    "VALUES (?,?,?,?,?,?) ON CONFLICT(vb) DO UPDATE SET state=excluded.state, "
    "failover=excluded.failover, persisted_seqno=excluded.persisted_seqno, "
    "purge_seqno=excluded.purge_seqno, max_cas=excluded.max_cas"
)


class BackfillReader:
    """One disk snapshot of one vbucket: the newest version of each key in (start, end], by seqno.

    Opening it starts a read transaction; `end` is the vbucket's persisted seqno in that
    same transaction, so rows and bound agree. `fetch(n)` returns raw rows
    (id, key, rev, cas, flags, expiry, datatype, op, delete_time, value).
    """

    def __init__(self, storage: Storage, vbid: int, start: int, end_limit: int | None = None) -> None:
        self.storage = storage
        self.vbid = vbid
        self.start = start
        self.db = storage.reader()
        self.done = False
        db = self.db
        db.execute("BEGIN")
        row = db.execute("SELECT persisted_seqno, purge_seqno FROM vbucket_meta WHERE vb = ?",
                         (vbid,)).fetchone()
        persisted = row[0] if row else 0
        self.purge_seqno = row[1] if row else 0
        self.end = persisted if end_limit is None else min(persisted, end_limit)
        self._cur = db.execute(
            f"SELECT {ITEM_COLUMNS} FROM items WHERE id > ? AND id <= ? ORDER BY id",
            (row_id(vbid, start), row_id(vbid, max(self.end, start))))

    #: a fetch stops at this many bytes of keys and values (or `n` rows): a stream whose
    #: client does not read holds at most about this much of its backfill
    FETCH_BYTES = 256 * 1024

    def fetch(self, n: int, max_bytes: int | None = None) -> list[tuple]:
        """Up to `n` rows, stopping once they hold `max_bytes` (FETCH_BYTES) or more."""
        if self.done:
            return []
        budget = self.FETCH_BYTES if max_bytes is None else max_bytes
        rows: list[tuple] = []
        size = 0
        step = 8   # a first guess that keeps a few huge documents from all coming at once
        while len(rows) < n and size < budget:
            want = min(n - len(rows), step)
            chunk = self._cur.fetchmany(want)
            rows += chunk
            got = sum(len(r[1]) + len(r[9] or b"") + 64 for r in chunk)
            size += got
            if len(chunk) < want:
                self.close()
                break
            step = max(1, min(1024, (budget - size) * len(chunk) // max(got, 1)))
        return rows

    def close(self) -> None:
        if not self.done:
            self.done = True
            self._cur = None
            self.storage.release_reader(self.db)
            self.db = None


# ---------------------------------------------------------------------------
# maintenance jobs: each takes the maintenance connection first (see Storage.maintenance)


def write_tx(db: sqlite3.Connection):
    class _T:
        def __enter__(self_inner):
            db.execute("BEGIN IMMEDIATE")

        def __exit__(self_inner, et, ev, tb):
            db.execute("COMMIT" if et is None else "ROLLBACK")
            return False
    return _T()


def hwt_put(db: sqlite3.Connection, row: tuple) -> None:
    """Insert or replace one HWT row (the HWT_COLUMNS, in order)."""
    with write_tx(db):
        db.execute(f"INSERT OR REPLACE INTO hwt ({HWT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)", row)


def hwt_delete(db: sqlite3.Connection, keys: list[tuple[str, str]]) -> None:
    """Delete HWT rows by (name, instance)."""
    with write_tx(db):
        db.executemany("DELETE FROM hwt WHERE name = ? AND instance = ?", keys)


# Tombstones are the rows with op 1 (deletion) or 2 (expiration). The partial index
# items_tombstones (op != 0) also holds the collections system events (op 3): every query
# of it says `op != 0 AND op != 3`, so a system event is never counted or purged as a
# tombstone (a collection's or scope's drop event stays, like the manifest history).


def tombstone_holds(db: sqlite3.Connection, vbid: int, watermarks: list[int],
                    before: float) -> dict[int, tuple[int, float | None, int]]:
    """For each watermark seqno of vbucket `vbid`: the tombstones above it that are old
    enough to purge (deleted at or before `before`), as (count, oldest delete time,
    highest seqno). One read transaction, so all answers come from one snapshot."""
    out: dict[int, tuple[int, float | None, int]] = {}
    db.execute("BEGIN")
    try:
        for w in sorted(set(watermarks)):
            row = db.execute(
                "SELECT count(*), min(delete_time), max(id) FROM items INDEXED BY items_tombstones "
                "WHERE op != 0 AND op != 3 AND id > ? AND id <= ? AND delete_time <= ?",
                (row_id(vbid, min(w, SEQNO_MASK)), row_id(vbid, SEQNO_MASK), before)).fetchone()
            n, oldest, top = row
            out[w] = (n, oldest, (top & SEQNO_MASK) if top is not None else 0)
    finally:
        db.execute("COMMIT")
    return out


def purgeable_tombstones(db: sqlite3.Connection, vbid: int, above: int, upto: int,
                         before: float, limit: int = -1) -> list[tuple[int, bytes]]:
    """(seqno, key) of the tombstones of `vbid` with a seqno in (above, upto] deleted at or
    before `before`, in seqno order; at most `limit` of them (-1: all)."""
    if upto <= above:
        return []
    rows = db.execute(
        "SELECT i.id, i.key FROM items AS i WHERE i.id IN ("
        "SELECT id FROM items INDEXED BY items_tombstones "
        "WHERE op != 0 AND op != 3 AND id > ? AND id <= ? AND delete_time <= ? ORDER BY id LIMIT ?) "
        "ORDER BY i.id",
        (row_id(vbid, above), row_id(vbid, min(upto, SEQNO_MASK)), before, limit)).fetchall()
    return [(rid & SEQNO_MASK, bytes(key)) for rid, key in rows]


def purge_tombstones(db: sqlite3.Connection, vbid: int, seqnos: list[int],
                     purge_seqno: int) -> int:
    """Delete these tombstones of `vbid` (a row that became a live document since is left
    alone) and raise the vbucket's purge seqno, in one transaction. Returns rows deleted."""
    with write_tx(db):
        before = db.total_changes
        db.executemany("DELETE FROM items WHERE id = ? AND op != 0 AND op != 3",
                       [(row_id(vbid, s),) for s in seqnos])
        deleted = db.total_changes - before
        db.execute("UPDATE vbucket_meta SET purge_seqno = max(purge_seqno, ?) WHERE vb = ?",
                   (purge_seqno, vbid))
    return deleted


# ---------------------------------------------------------------------------
# dropped collections: their documents are one key range per vbucket


def collection_key_range(prefix: bytes) -> tuple[bytes, bytes]:
    """[low, high) of the doc keys of the collection whose LEB128 prefix is `prefix`.

    Canonical LEB128 encodings are prefix-free (the last byte is the only one below 0x80),
    so the keys of one collection are exactly those from `prefix` up to the prefix with its
    last byte plus one."""
    return prefix, prefix[:-1] + bytes((prefix[-1] + 1,))


def collection_counts(db: sqlite3.Connection, vbid: int, prefixes: list[bytes]
                      ) -> tuple[int, int]:
    """(rows, live documents) of `vbid` in the collections with these key prefixes."""
    rows = live = 0
    for p in prefixes:
        lo, hi = collection_key_range(p)
        n, lv = db.execute(
            "SELECT count(*), coalesce(sum(op = 0), 0) FROM items INDEXED BY items_by_key "
            "WHERE vb = ? AND key >= ? AND key < ?", (vbid, lo, hi)).fetchone()
        rows += n
        live += lv
    return rows, live


def purge_collections(db: sqlite3.Connection, vbid: int, prefixes: list[bytes]) -> int:
    """Delete every row of `vbid` in the collections with these key prefixes (documents and
    tombstones of dropped collections), in one transaction. Returns rows deleted."""
    with write_tx(db):
        before = db.total_changes
        for p in prefixes:
            lo, hi = collection_key_range(p)
            db.execute("DELETE FROM items WHERE vb = ? AND key >= ? AND key < ?", (vbid, lo, hi))
        return db.total_changes - before
