"""Collections system events as the node keeps them: Items in the vbucket's seqno order.

A scope or collection created or dropped is one change in every vbucket, with its own
seqno, so DCP sends it in order with the documents (kv_engine weaves system events into
the checkpoints the same way). The Item:

* `op` is ITEM_SYSTEM; `flags` the DCP event id (0 begin collection, 1 end collection,
  3 create scope, 4 drop scope).
* `key` is in the system namespace (collection id 1, so no document key can equal it):
  0x01, then b"c" or b"s", then the collection or scope id as 4 bytes big-endian. The drop
  of a collection or scope has the key of its creation and so replaces it in the hash
  table and the database, as a tombstone replaces a document.
* `value` is msgpack [event, manifest_uid, scope_id, collection_id | None, name, max_ttl]:
  what `event_of` turns back into a `SystemEvent`.
"""
from __future__ import annotations

import struct

import msgpack

from dcptool.protocol.collections import (
    EVENT_BEGIN_COLLECTION,
    EVENT_CREATE_SCOPE,
    EVENT_DROP_SCOPE,
    EVENT_END_COLLECTION,
    EVENT_MODIFY_COLLECTION,
    SystemEvent,
)

from .item import ITEM_SYSTEM, Item

_ID = struct.Struct(">I")
SYSTEM_PREFIX = b"\x01"
_COLLECTION_KEY = SYSTEM_PREFIX + b"c"
_SCOPE_KEY = SYSTEM_PREFIX + b"s"


def event_key(event: int, scope_id: int, collection_id: int | None) -> bytes:
    if event in (EVENT_BEGIN_COLLECTION, EVENT_END_COLLECTION, EVENT_MODIFY_COLLECTION):
        return _COLLECTION_KEY + _ID.pack(collection_id or 0)
    if event in (EVENT_CREATE_SCOPE, EVENT_DROP_SCOPE):
        return _SCOPE_KEY + _ID.pack(scope_id)
    raise ValueError(f"unknown system event {event}")


def system_item(ev: SystemEvent, *, rev: int = 1, cas: int = 0) -> Item:
    """The Item for `ev` (seqno 0 until the vbucket commits it)."""
    value = msgpack.packb([ev.event, ev.manifest_uid, ev.scope_id, ev.collection_id, ev.name,
                           ev.max_ttl])
    return Item(event_key(ev.event, ev.scope_id, ev.collection_id), value, ev.seqno, rev, cas,
                ev.event, 0, 0, ITEM_SYSTEM)


def event_of(item: Item) -> SystemEvent:
    """The SystemEvent a system Item holds, at the item's seqno."""
    event, uid, sid, cid, name, ttl = msgpack.unpackb(item.value)
    return SystemEvent(item.seqno, event, uid, sid, cid, name, ttl)


def is_system_key(key: bytes) -> bool:
    return key[:1] == SYSTEM_PREFIX
