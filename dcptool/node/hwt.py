"""The high watermark table (HWT): how far each DCP client has read, so the purger waits.

Seed 002: every client registers, per vbucket, the seqno up to which it holds every change
(its high watermark); the tombstone purger never purges a tombstone above the lowest
watermark of a live row (`decisions.purge_bound`). A row is

* **ok** while it holds the purger back;
* **expired** once its expiry time passed: it holds nothing back and is dropped at the
  next purger run (a client that comes back later asks from its old position and, if the
  purger passed it, is told to roll back to 0);
* **lost** when the guard rail took it: it kept a purgeable tombstone longer than
  --hwt-max-hold (`decisions.hold_seconds`). It holds nothing back and stays listed until
  it expires, is removed, or the client registers again.

A new registration from the same client name and instance replaces the old row (and
clears a lost mark). The table lives in memory on the event loop (the bucket owns it) and
is written through to the `hwt` table of the node's database on the maintenance thread,
in the order of the changes; requests are answered once their change is on disk.

**Replicated rows** (seed 002, "Synchronized HWT replication"; `hwtrepl`). A node that
holds replica vbuckets also keeps the rows of its source (the active, or the previous hop
of a chain), one `ReplicatedRow` per (name, instance, vbucket), apart from the rows
registered on this node (`entries`): one client registers the same (name, instance) on
every node for the vbuckets active there, so a node's own row and the rows it replicates
share keys but not vbuckets. A replicated row is installed only once this node has
persisted its vbucket up to the row's seqno. Replicated rows hold the purger back like
registered ones (`watermarks`), survive a restart (table `hwt_replica`) and stay when the
vbucket is promoted, so a client resumes on the new active without missing a deletion; a
registration of the same (name, instance) naming the vbucket on this node supersedes them,
HWT_REMOVE removes them too, and they expire as their source row does.
"""
from __future__ import annotations

import json
import math
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from . import storage as st
from .decisions import Watermark

#: limits of a registration (checked by `parse_registration`)
MAX_NAME = 200
MAX_INSTANCE = 100
MAX_META_BYTES = 4096
MAX_TTL = 366 * 86400
MAX_ENTRIES = 10_000

OK = "ok"
EXPIRED = "expired"
LOST = "lost"


class HwtRequestError(ValueError):
    """A register/list/remove request the node cannot accept; the message says why."""


class _RowState:
    """What a registered row and a replicated row share: the client's name and the state
    at a time (set by the dataclasses below: name, instance, expires_at, lost_at)."""

    __slots__ = ()

    @property
    def client(self) -> str:
        return f"{self.name}/{self.instance}"

    def state(self, now: float) -> str:
        if self.lost_at is not None:
            return LOST
        if self.expires_at <= now:
            return EXPIRED
        return OK


@dataclass
class HwtEntry(_RowState):
    """One row of the table."""

    name: str
    instance: str
    seqnos: dict[int, int]
    reported_at: float
    expires_at: float
    meta: dict[str, Any] = field(default_factory=dict)
    lost_at: float | None = None
    lost_reason: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.instance)

    def watermark(self) -> Watermark:
        return Watermark(self.client, self.seqnos, self.expires_at, self.lost_at is not None)

    def to_row(self) -> tuple:
        return (self.name, self.instance,
                json.dumps({str(vb): s for vb, s in sorted(self.seqnos.items())}),
                self.reported_at, self.expires_at, json.dumps(self.meta, sort_keys=True),
                self.lost_at, self.lost_reason)

    @classmethod
    def from_row(cls, row: tuple) -> "HwtEntry":
        name, instance, seqnos, reported, expires, meta, lost_at, lost_reason = row
        return cls(name, instance, {int(vb): int(s) for vb, s in json.loads(seqnos).items()},
                   float(reported), float(expires), json.loads(meta or "{}"),
                   lost_at, lost_reason)

    def describe(self, now: float) -> dict[str, Any]:
        """The row as HWT_LIST reports it (without the per-vbucket hold figures)."""
        seqs = list(self.seqnos.values())
        return {
            "name": self.name, "instance": self.instance, "state": self.state(now),
            "reported_at": self.reported_at, "expires_at": self.expires_at,
            "lost_at": self.lost_at, "lost_reason": self.lost_reason, "meta": self.meta,
            "vbuckets": {str(vb): s for vb, s in sorted(self.seqnos.items())},
            "lowest_seqno": min(seqs) if seqs else None,
            "highest_seqno": max(seqs) if seqs else None,
        }


@dataclass
class ReplicatedRow(_RowState):
    """One vbucket of a row this node replicated from `source` (HOST:PORT)."""

    name: str
    instance: str
    vb: int
    seqno: int
    reported_at: float
    expires_at: float
    meta: dict[str, Any] = field(default_factory=dict)
    lost_at: float | None = None
    lost_reason: str | None = None
    source: str = ""
    installed_at: float = 0.0

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.name, self.instance, self.vb)

    def watermark(self) -> Watermark:
        return Watermark(self.client, {self.vb: self.seqno}, self.expires_at,
                         self.lost_at is not None)

    def same_as(self, other: "ReplicatedRow") -> bool:
        """The same source row (nothing to write again)."""
        return (self.seqno, self.reported_at, self.expires_at, self.meta, self.lost_at,
                self.source) == (other.seqno, other.reported_at, other.expires_at,
                                 other.meta, other.lost_at, other.source)

    def to_row(self) -> tuple:
        return (self.name, self.instance, self.vb, self.seqno, self.reported_at,
                self.expires_at, json.dumps(self.meta, sort_keys=True), self.lost_at,
                self.lost_reason, self.source, self.installed_at)

    @classmethod
    def from_row(cls, row: tuple) -> "ReplicatedRow":
        (name, instance, vb, seqno, reported, expires, meta, lost_at, lost_reason, source,
         installed) = row
        return cls(name, instance, int(vb), int(seqno), float(reported), float(expires),
                   json.loads(meta or "{}"), lost_at, lost_reason, source or "",
                   float(installed or 0.0))

    def describe(self, now: float) -> dict[str, Any]:
        """The row as HWT_LIST reports it under "replicated"."""
        return {"name": self.name, "instance": self.instance, "vbucket": self.vb,
                "seqno": self.seqno, "state": self.state(now), "reported_at": self.reported_at,
                "expires_at": self.expires_at, "lost_at": self.lost_at,
                "lost_reason": self.lost_reason, "meta": self.meta, "source": self.source,
                "installed_at": self.installed_at}


_REPLICA_COLUMNS = ("name, instance, vb, seqno, reported_at, expires_at, meta, lost_at, "
                    "lost_reason, source, installed_at")
_REPLICA_SCHEMA = """
CREATE TABLE IF NOT EXISTS hwt_replica (
    name         TEXT NOT NULL,
    instance     TEXT NOT NULL,
    vb           INTEGER NOT NULL,
    seqno        INTEGER NOT NULL,
    reported_at  REAL NOT NULL,
    expires_at   REAL NOT NULL,
    meta         TEXT NOT NULL DEFAULT '{}',
    lost_at      REAL,
    lost_reason  TEXT,
    source       TEXT NOT NULL DEFAULT '',
    installed_at REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (name, instance, vb)
)"""


def _replica_write(db, put: list[tuple], delete: list[tuple[str, str, int]]) -> None:
    """Write replicated rows and delete others in one transaction (maintenance thread)."""
    with st.write_tx(db):
        if delete:
            db.executemany("DELETE FROM hwt_replica WHERE name = ? AND instance = ? AND vb = ?",
                           delete)
        if put:
            db.executemany(f"INSERT OR REPLACE INTO hwt_replica ({_REPLICA_COLUMNS}) "
                           f"VALUES (?,?,?,?,?,?,?,?,?,?,?)", put)


# ---------------------------------------------------------------------------
# requests


def _text(doc: dict, name: str, limit: int, *, required: bool = True) -> str | None:
    v = doc.get(name)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v:
        raise HwtRequestError(f'"{name}" must be a non-empty string')
    if len(v) > limit:
        raise HwtRequestError(f'"{name}" is longer than {limit} characters')
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise HwtRequestError(f'"{name}" holds control characters')
    return v


def parse_registration(doc: Any, *, num_vbuckets: int, now: float,
                       default_ttl: float) -> HwtEntry:
    """The entry an HWT_REGISTER document asks for (see docs/protocol-extensions.md)."""
    if not isinstance(doc, dict):
        raise HwtRequestError("the value must be a JSON object")
    unknown = set(doc) - {"name", "instance", "vbuckets", "ttl", "meta"}
    if unknown:
        raise HwtRequestError(f"unknown field {min(unknown)!r}")
    name = _text(doc, "name", MAX_NAME)
    instance = _text(doc, "instance", MAX_INSTANCE)
    vbs = doc.get("vbuckets")
    if not isinstance(vbs, dict) or not vbs:
        raise HwtRequestError('"vbuckets" must be a non-empty object {"vbucket": seqno}')
    seqnos: dict[int, int] = {}
    for k, v in vbs.items():
        try:
            vb = int(k)
        except (TypeError, ValueError):
            raise HwtRequestError(f"vbucket {k!r} is not a number") from None
        if str(vb) != str(k).strip() or not 0 <= vb < num_vbuckets:
            raise HwtRequestError(f"vbucket {k!r} is not one of this bucket's "
                                  f"{num_vbuckets} vbuckets")
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= st.SEQNO_MASK:
            raise HwtRequestError(f"the seqno of vbucket {vb} must be an integer from 0 "
                                  f"to {st.SEQNO_MASK}")
        seqnos[vb] = v
    ttl = doc.get("ttl", default_ttl)
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) \
            or not 0 < ttl <= MAX_TTL:
        raise HwtRequestError(f'"ttl" must be a number of seconds above 0 and at most {MAX_TTL}')
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise HwtRequestError('"meta" must be a JSON object')
    if len(json.dumps(meta)) > MAX_META_BYTES:
        raise HwtRequestError(f'"meta" is larger than {MAX_META_BYTES} bytes')
    return HwtEntry(name, instance, seqnos, now, now + float(ttl), meta)


def parse_selector(doc: Any, *, name_required: bool) -> tuple[str | None, str | None]:
    """(name, instance) of an HWT_LIST or HWT_REMOVE document; None matches any."""
    if doc is None:
        if name_required:
            raise HwtRequestError('the value must be a JSON object with a "name"')
        return None, None
    if not isinstance(doc, dict):
        raise HwtRequestError("the value must be a JSON object")
    unknown = set(doc) - {"name", "instance"}
    if unknown:
        raise HwtRequestError(f"unknown field {min(unknown)!r}")
    name = _text(doc, "name", MAX_NAME, required=name_required)
    instance = _text(doc, "instance", MAX_INSTANCE, required=False)
    return name, instance


def parse_list_request(doc: Any, *, num_vbuckets: int
                       ) -> tuple[str | None, str | None, list[int] | None, bool]:
    """(name, instance, vbuckets, holding) of an HWT_LIST document.

    Besides the selector, HWT_LIST takes `"vbuckets": [vb, ...]` (only rows naming one of
    them; their replicated rows and purge seqnos are listed; replication asks this way)
    and `"holding": false` (skip the per-row hold figures, which read the tombstone
    index)."""
    if not isinstance(doc, dict):
        name, instance = parse_selector(doc, name_required=False)
        return name, instance, None, True
    rest = {k: v for k, v in doc.items() if k not in ("vbuckets", "holding")}
    name, instance = parse_selector(rest or None, name_required=False)
    vbs = doc.get("vbuckets")
    if vbs is not None:
        if not isinstance(vbs, list) or any(isinstance(v, bool) or not isinstance(v, int)
                                            or not 0 <= v < num_vbuckets for v in vbs):
            raise HwtRequestError(f'"vbuckets" must be a list of vbucket numbers below '
                                  f'{num_vbuckets}')
        vbs = sorted(set(vbs))
    holding = doc.get("holding", True)
    if not isinstance(holding, bool):
        raise HwtRequestError('"holding" must be true or false')
    return name, instance, vbs, holding


# ---------------------------------------------------------------------------
# the table


class HighWatermarkTable:
    """The rows of one bucket, keyed by (name, instance), written through to storage.

    Every change returns the Future of its write (done in submission order on the
    storage's maintenance thread); the caller answers the client once it is done.
    """

    def __init__(self, storage: "st.Storage") -> None:
        self.storage = storage
        self.entries: dict[tuple[str, str], HwtEntry] = {}
        #: rows replicated from the source of each replica vbucket (see the module doc)
        self.replicated: dict[tuple[str, str, int], ReplicatedRow] = {}
        #: {vb: (source HOST:PORT, its purge seqno)} as last read by `hwtrepl`; the purger
        #: of a replica vbucket never goes beyond it (nothing known: it purges nothing)
        self.source_purge: dict[int, tuple[str, int]] = {}
        #: {vb: [row descriptions]} source rows ahead of this node's persisted seqno
        self.pending: dict[int, list[dict[str, Any]]] = {}
        self.registrations = 0
        self.dropped_expired = 0
        self.marked_lost = 0

    def load(self) -> None:
        self.entries = {}
        for row in self.storage.load_hwt():
            e = HwtEntry.from_row(row)
            self.entries[e.key] = e
        self.replicated = {}
        db = self.storage._db
        db.execute(_REPLICA_SCHEMA)
        for row in db.execute(f"SELECT {_REPLICA_COLUMNS} FROM hwt_replica").fetchall():
            r = ReplicatedRow.from_row(row)
            self.replicated[r.key] = r

    def __len__(self) -> int:
        return len(self.entries)

    def select(self, name: str | None = None, instance: str | None = None) -> list[HwtEntry]:
        return [e for k, e in sorted(self.entries.items())
                if (name is None or e.name == name) and (instance is None or e.instance == instance)]

    def watermarks(self) -> list[Watermark]:
        return ([e.watermark() for e in self.entries.values()]
                + [r.watermark() for r in self.replicated.values()])

    def select_replicated(self, name: str | None = None, instance: str | None = None,
                          vbuckets: "set[int] | list[int] | None" = None) -> list[ReplicatedRow]:
        want = None if vbuckets is None else set(vbuckets)
        return [r for k, r in sorted(self.replicated.items())
                if (name is None or r.name == name) and (instance is None or r.instance == instance)
                and (want is None or r.vb in want)]

    def register(self, entry: HwtEntry) -> tuple[bool, Future]:
        """Add or replace (same name and instance) a row. (replaced, write future).

        Replicated rows of the same client for the vbuckets it names are superseded."""
        replaced = entry.key in self.entries
        if not replaced and len(self.entries) >= MAX_ENTRIES:
            raise HwtRequestError(f"the table is full ({MAX_ENTRIES} rows); remove unused ones")
        self.entries[entry.key] = entry
        self.registrations += 1
        superseded = [k for k in ((entry.name, entry.instance, vb) for vb in entry.seqnos)
                      if k in self.replicated]
        if superseded:
            for k in superseded:
                del self.replicated[k]
            self.storage.maintenance(_replica_write, [], superseded)
        return replaced, self.storage.maintenance(st.hwt_put, entry.to_row())

    def remove(self, name: str, instance: str | None = None
               ) -> tuple[list[HwtEntry], list[ReplicatedRow], Future | None]:
        """Remove the registered rows and the replicated rows of `name` (one instance or
        all). (registered rows, replicated rows, write future)."""
        gone = self.select(name, instance)
        gone_r = self.select_replicated(name, instance)
        for e in gone:
            del self.entries[e.key]
        for r in gone_r:
            del self.replicated[r.key]
        if gone_r:
            self.storage.maintenance(_replica_write, [], [r.key for r in gone_r])
        fut = self.storage.maintenance(st.hwt_delete, [e.key for e in gone]) \
            if gone or gone_r else None
        return gone, gone_r, fut

    def drop_expired(self, now: float) -> tuple[list[HwtEntry], Future | None]:
        """Drop rows past their expiry (the purger does this when it runs), replicated
        ones too (only the registered ones are returned)."""
        gone = [e for e in self.entries.values() if e.expires_at <= now]
        for e in gone:
            del self.entries[e.key]
        self.dropped_expired += len(gone)
        gone_r = [r.key for r in self.replicated.values() if r.expires_at <= now]
        for k in gone_r:
            del self.replicated[k]
        if gone_r:
            self.storage.maintenance(_replica_write, [], gone_r)
        fut = self.storage.maintenance(st.hwt_delete, [e.key for e in gone]) if gone else None
        return gone, fut

    def install(self, vb: int, rows: dict[tuple[str, str], ReplicatedRow]) -> Future | None:
        """Make `rows` the replicated rows of vbucket `vb` (`hwtrepl.plan_install` decides
        which); others of `vb` go. Only changes are written."""
        put = []
        delete = []
        for k in [k for k in self.replicated if k[2] == vb]:
            if (k[0], k[1]) not in rows:
                delete.append(k)
                del self.replicated[k]
        for (name, instance), r in rows.items():
            old = self.replicated.get((name, instance, vb))
            if old is not None and old.same_as(r):
                continue
            self.replicated[r.key] = r
            put.append(r.to_row())
        if not put and not delete:
            return None
        return self.storage.maintenance(_replica_write, put, delete)

    def mark_lost(self, key: tuple[str, str], now: float, reason: str) -> Future | None:
        e = self.entries.get(key)
        if e is None or e.lost_at is not None:
            return None
        e.lost_at = now
        e.lost_reason = reason
        self.marked_lost += 1
        return self.storage.maintenance(st.hwt_put, e.to_row())

    def counts(self, now: float) -> dict[str, int]:
        out = {OK: 0, EXPIRED: 0, LOST: 0}
        for e in self.entries.values():
            out[e.state(now)] += 1
        return out
