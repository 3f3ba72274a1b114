"""What one DCP stream lets through: the collections filter of a stream (kv_engine's
Collections::VB::Filter, restated).

Three kinds, chosen when the stream is accepted:

* legacy (the connection did not negotiate HELLO Collections): the default collection's
  documents only, never a system event. The stream strips the 0x00 prefix from keys.
* pass-through (a collections connection, no `collections`/`scope` in the stream-request
  value): every document and every system event.
* filtered: the documents and the events of the collections named in the request, or of
  the collections of one scope (collections created in that scope later join the filter
  when their creation passes; the scope's own create/drop events are sent too).

A drop event of a collection in the filter is sent and takes the collection out; once
no collection is left (for a scope filter: once the scope's drop passed) the filter is
`empty` and the stream ends with STREAM_END FilterEmpty (Ok for a legacy connection).

Documents of collections the manifest no longer has (dropped: on disk until compaction
purges them, in memory until their checkpoint is freed) are never sent. The per-item check
is done only when the snapshot may hold something the filter rejects: a legacy or
pass-through stream sends a memory snapshot untouched when it holds default-collection
documents only, and a pass-through stream also when no collection was ever dropped.

The manifest uid a client gives is checked (a uid ahead of the node's manifest is refused
with CollectionsManifestIsAhead) but does not hide events: current kv_engine documents it
as a debugging aid.
"""
from __future__ import annotations

from typing import Iterable

from dcptool.protocol.collections import (
    DEFAULT_COLLECTION_ID,
    FIRST_USER_ID,
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_DROP_SCOPE,
    EVENT_END_COLLECTION,
    EVENT_MODIFY_COLLECTION,
    Manifest,
    StreamFilter,
    decode_leb128,
)
from dcptool.protocol.constants import Status

from .item import ITEM_SYSTEM, Item
from .sysevent import event_of

#: CollectionsManifestIsAhead: the client knows a newer manifest than this node
STATUS_MANIFEST_AHEAD = 0x8B

#: a row of a disk snapshot: (id, key, rev, cas, flags, expiry, datatype, op, delete_time, value)
_SEQNO_MASK = (1 << 48) - 1


class FilterRefused(Exception):
    """A stream-request value the node answers with an error status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def ever_dropped(manifest: Manifest) -> bool:
    """Was any scope or collection of this manifest's history dropped? Every user scope and
    collection took one id, and ids are never reused."""
    live = sum(len(s.collections) for s in manifest.scopes) - 1 + len(manifest.scopes) - 1
    return manifest.next_id - FIRST_USER_ID > live


class DcpFilter:
    """The filter state of one stream. `cids` is None for pass-through."""

    __slots__ = ("legacy", "cids", "scope", "scope_dropped", "uid")

    def __init__(self, *, legacy: bool = False, cids: set[int] | None = None,
                 scope: int | None = None, uid: int | None = None) -> None:
        self.legacy = legacy
        self.cids = cids
        self.scope = scope
        self.scope_dropped = False
        self.uid = uid

    @property
    def passthrough(self) -> bool:
        return self.cids is None

    @property
    def empty(self) -> bool:
        """No collection left: the stream ends with FilterEmpty."""
        if self.cids is None:
            return False
        if self.scope is not None:
            return self.scope_dropped
        return not self.cids

    # -- construction --------------------------------------------------------------------

    @classmethod
    def legacy_filter(cls, manifest: Manifest | None) -> "DcpFilter":
        """A connection without collections: the default collection (which must exist)."""
        if manifest is not None and manifest.collection_by_id(DEFAULT_COLLECTION_ID) is None:
            raise FilterRefused(Status.UNKNOWN_COLLECTION, "the default collection was dropped")
        return cls(legacy=True, cids={DEFAULT_COLLECTION_ID})

    @classmethod
    def from_request(cls, sf: StreamFilter, manifest: Manifest | None) -> "DcpFilter":
        """The filter of a collections connection's stream request (`sf` already parsed).
        Raises FilterRefused: a uid ahead of the node's manifest, an unknown collection or
        scope."""
        if manifest is None:
            manifest = Manifest()
        if sf.uid is not None and sf.uid > manifest.uid:
            raise FilterRefused(STATUS_MANIFEST_AHEAD,
                                f"the client's manifest uid {sf.uid:x} is ahead of the node's "
                                f"{manifest.uid:x}")
        if sf.collections is not None:
            for cid in sf.collections:
                if manifest.collection_by_id(cid) is None:
                    raise FilterRefused(Status.UNKNOWN_COLLECTION,
                                        f"unknown collection {cid:x}")
            return cls(cids=set(sf.collections), uid=sf.uid)
        if sf.scope is not None:
            scope = manifest.scope_by_id(sf.scope)
            if scope is None:
                raise FilterRefused(Status.UNKNOWN_SCOPE, f"unknown scope {sf.scope:x}")
            return cls(cids={c.uid for c in scope.collections}, scope=sf.scope, uid=sf.uid)
        return cls(uid=sf.uid)

    # -- decisions ---------------------------------------------------------------------------

    def admits_event(self, item: Item) -> bool:
        """Does the system event `item` go to this stream? Updates the filter (a drop takes
        its collection out, a creation in the filtered scope adds it)."""
        ev = event_of(item)
        event = ev.event
        cids = self.cids
        if event in (EVENT_BEGIN_COLLECTION, EVENT_END_COLLECTION, EVENT_MODIFY_COLLECTION):
            cid = ev.collection_id
            if event == EVENT_END_COLLECTION:
                removed = cids is not None and cid in cids
                if removed:
                    cids.discard(cid)
                if self.legacy:
                    return False
                return cids is None or removed or (self.scope is not None
                                                   and ev.scope_id == self.scope)
            if self.legacy:
                return False
            if event == EVENT_MODIFY_COLLECTION:
                return False  # needs FlatBuffers events (never negotiated here)
            if cids is None:
                return True
            if self.scope is not None and ev.scope_id == self.scope:
                cids.add(cid)
            return cid in cids
        if event in (EVENT_CREATE_SCOPE, EVENT_DROP_SCOPE):
            if self.legacy:
                return False
            if cids is None:
                return True
            if self.scope is not None and ev.scope_id == self.scope:
                if event == EVENT_DROP_SCOPE:
                    self.scope_dropped = True
                return True
            return False
        return False

    def filter_items(self, items: Iterable[Item], live) -> list[Item]:
        """The items of a memory snapshot this stream sends, in order (the filter updated
        by the system events among them). `live`: the ids of the collections the manifest
        has (documents of others are never sent)."""
        out = []
        cids = self.cids
        for it in items:
            key = it.key
            c = key[0]
            if c == 1 and it.op == ITEM_SYSTEM:
                if self.admits_event(it):
                    out.append(it)
                cids = self.cids
                continue
            if c >= 0x80:
                c = decode_leb128(key)[0]
            if (cids is None or c in cids) and c in live:
                out.append(it)
        return out

    def filter_rows(self, rows: list[tuple], live) -> list[tuple]:
        """The same for rows of a disk snapshot."""
        out = []
        cids = self.cids
        for row in rows:
            key = row[1]
            c = key[0]
            if c == 1 and row[7] == ITEM_SYSTEM:
                rid, key, rev, cas, flags, expiry, dt, op, dtime, val = row
                it = Item(key, val, rid & _SEQNO_MASK, rev, cas, flags, expiry, dt, op, dtime)
                if self.admits_event(it):
                    out.append(row)
                continue
            if c >= 0x80:
                c = decode_leb128(key)[0]
            if (cids is None or c in cids) and c in live:
                out.append(row)
        return out


def parse_request_value(value: bytes) -> StreamFilter:
    """The stream-request value of a collections connection. Raises FilterRefused (EINVAL)
    for what kv_engine refuses: not JSON, not an object, wrong types, both collections and
    scope, sid 0, or an object without any of uid, sid, collections, scope, purge_seqno.
    Unknown keys next to known ones are ignored."""
    from dcptool.protocol.collections import CollectionsError

    try:
        sf = StreamFilter.parse(value)
    except CollectionsError as exc:
        raise FilterRefused(Status.EINVAL, str(exc)) from None
    if value and sf == StreamFilter():
        raise FilterRefused(Status.EINVAL, "the stream request value names no uid, sid, "
                            "collections or scope")
    return sf
