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


@dataclass
class HwtEntry:
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

    @property
    def client(self) -> str:
        return f"{self.name}/{self.instance}"

    def state(self, now: float) -> str:
        if self.lost_at is not None:
            return LOST
        if self.expires_at <= now:
            return EXPIRED
        return OK

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
        self.registrations = 0
        self.dropped_expired = 0
        self.marked_lost = 0

    def load(self) -> None:
        self.entries = {}
        for row in self.storage.load_hwt():
            e = HwtEntry.from_row(row)
            self.entries[e.key] = e

    def __len__(self) -> int:
        return len(self.entries)

    def select(self, name: str | None = None, instance: str | None = None) -> list[HwtEntry]:
        return [e for k, e in sorted(self.entries.items())
                if (name is None or e.name == name) and (instance is None or e.instance == instance)]

    def watermarks(self) -> list[Watermark]:
        return [e.watermark() for e in self.entries.values()]

    def register(self, entry: HwtEntry) -> tuple[bool, Future]:
        """Add or replace (same name and instance) a row. (replaced, write future)."""
        replaced = entry.key in self.entries
        if not replaced and len(self.entries) >= MAX_ENTRIES:
            raise HwtRequestError(f"the table is full ({MAX_ENTRIES} rows); remove unused ones")
        self.entries[entry.key] = entry
        self.registrations += 1
        return replaced, self.storage.maintenance(st.hwt_put, entry.to_row())

    def remove(self, name: str, instance: str | None = None) -> tuple[list[HwtEntry], Future | None]:
        gone = self.select(name, instance)
        for e in gone:
            del self.entries[e.key]
        fut = self.storage.maintenance(st.hwt_delete, [e.key for e in gone]) if gone else None
        return gone, fut

    def drop_expired(self, now: float) -> tuple[list[HwtEntry], Future | None]:
        """Drop rows past their expiry (the purger does this when it runs)."""
        gone = [e for e in self.entries.values() if e.expires_at <= now]
        for e in gone:
            del self.entries[e.key]
        self.dropped_expired += len(gone)
        fut = self.storage.maintenance(st.hwt_delete, [e.key for e in gone]) if gone else None
        return gone, fut

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
