"""What every command module shares: registration (`command`), answers that wait for the
disk (`answer_later`), the NOT_MY_VBUCKET answer of a request for a vbucket not active here,
and the doc key of a request's key (`request_doc_key`).

Doc keys (collections): inside the node every key is collection-prefixed (LEB128
collection id + key). On a legacy connection a key K means 0x00 + K. On a connection that
negotiated Collections the key must carry a valid prefix, as kv_engine's validator
(McbpValidator::is_document_key_valid) checks it: at least 2 bytes, a canonical LEB128 of at
most 5 bytes with a logical key after it, not one of the reserved ids 1-7 (EINVAL for all of
these), a logical key of at most 250 bytes in the default collection and 246 in others;
then a collection the manifest does not have (never created, or dropped) is
UNKNOWN_COLLECTION (0x88) with the manifest uid as JSON `{"manifest_uid": "<hex>"}`.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from dcptool.protocol.collections import (
    FIRST_USER_ID,
    CollectionsError,
    decode_leb128,
    encode_leb128,
    hex_id,
)
from dcptool.protocol.constants import Datatype, Status

from ..access import Privilege, guard
from ..bucketconfig import cluster_config_json

log = logging.getLogger("dcptool.node.connection")


@dataclass(slots=True, frozen=True)
class Command:
    fn: Callable
    pre_auth: bool
    needs_bucket: bool
    decode: bool
    dcp: bool


COMMANDS: dict[int, Command] = {}


#: `privilege=` of a command whose handler calls `has_privilege` itself
CHECKED_IN_HANDLER = "checked in handler"


def command(*opcodes: int, pre_auth: bool = False, bucket: bool = True, decode: bool = True,
            dcp: bool = False, privilege: "Privilege | str | None" = None):
    if privilege is None and not pre_auth:
        raise TypeError(f"command {[hex(int(op)) for op in opcodes]} names no privilege")

    def register(fn):
        handler = fn if privilege in (None, CHECKED_IN_HANDLER) else guard(fn, privilege)
        for op in opcodes:
            COMMANDS[int(op)] = Command(handler, pre_auth, bucket, decode, dcp)
        return fn
    return register


#: answers in progress (a task is only weakly referenced by the loop)
_LATER: set[asyncio.Task] = set()


def answer_later(conn, frame, work: Callable[[], Awaitable[None]]) -> None:
    """Run `work()` (which replies with `conn.reply`) on the loop and send its replies.

    A failure answers EINTERNAL; a connection closed meanwhile gets nothing.
    """
    async def run() -> None:
        try:
            await work()
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("%s: command 0x%02x failed", conn.peer, frame.opcode)
            conn.reply(frame, Status.EINTERNAL)
        if not conn.closing:
            conn.flush()
        else:
            conn.out = []

    task = asyncio.get_running_loop().create_task(run())
    _LATER.add(task)
    task.add_done_callback(_LATER.discard)


def not_my_vbucket(conn, frame) -> None:
    """NOT_MY_VBUCKET with the cluster map, so a smart client can refresh its view."""
    conn.error(frame, Status.NOT_MY_VBUCKET, value=cluster_config_json(conn),
               datatype=Datatype.JSON if conn.json else 0)


#: keys: a legacy key (and a default-collection logical key) up to 250 bytes; on a
#: collections connection the whole key up to 251, a logical key of another collection up
#: to 246 (kv_engine's MaxCollectionsKeyLen and MaxCollectionsLogicalKeyLen)
MAX_KEY = 250
MAX_COLLECTIONS_KEY = 251
MAX_COLLECTION_LOGICAL_KEY = 246
_DEFAULT_PREFIX = b"\x00"
_JSON = int(Datatype.JSON)
_EINVAL = int(Status.EINVAL)


def unknown_collection(conn, frame) -> None:
    """UNKNOWN_COLLECTION with the manifest uid the decision was made against."""
    body = b'{"manifest_uid":"%s"}' % hex_id(conn.bucket.manifest.uid).encode()
    dt = _JSON if conn.json else 0
    if conn.collections:
        conn.reply(frame, Status.UNKNOWN_COLLECTION, value=body, datatype=dt)
    else:  # never reached today (a legacy key is always the default collection's)
        conn.error(frame, Status.UNKNOWN_COLLECTION, value=body, datatype=dt)


def key_cid(conn, frame, key) -> int | None:
    """The collection id of a collections connection's key, or None after answering EINVAL
    (a malformed or reserved prefix, a key too long) or UNKNOWN_COLLECTION."""
    n = len(key)
    if n < 2 or n > MAX_COLLECTIONS_KEY:
        conn.reply(frame, _EINVAL)
        return None
    b = key[0]
    if b == 0:
        return 0
    if b < 0x80:
        cid, pos = b, 1
    else:
        try:
            cid, pos = decode_leb128(key)
        except CollectionsError:
            conn.reply(frame, _EINVAL)
            return None
        if pos != len(encode_leb128(cid)) or pos >= n:  # non-canonical, or no logical key
            conn.reply(frame, _EINVAL)
            return None
    if cid < FIRST_USER_ID or n - pos > MAX_COLLECTION_LOGICAL_KEY:
        conn.reply(frame, _EINVAL)
        return None
    if cid not in conn.bucket.collections:
        unknown_collection(conn, frame)
        return None
    return cid


def request_doc_key(conn, frame, key) -> bytes | None:
    """The doc key a request's `key` names, or None after answering (see the module text).
    A legacy connection's key K (1 to 250 bytes) is 0x00 + K."""
    if not conn.collections:
        if not key or len(key) > MAX_KEY:
            conn.reply(frame, _EINVAL)
            return None
        return _DEFAULT_PREFIX + key
    if key_cid(conn, frame, key) is None:
        return None
    return bytes(key)


def cap_expiry(bucket, dkey: bytes, expiry: int, now: int) -> int:
    """A write's absolute expiry under its collection's max TTL, or the bucket's maxTTL
    when the collection has none, as kv_engine applies it: no expiry, or one later than
    now + maxTTL, becomes now + maxTTL."""
    from dcptool.protocol.collections import doc_key_cid

    ttl = bucket.collections.get(doc_key_cid(dkey), 0) if dkey[0] else 0
    ttl = ttl or getattr(bucket, "max_ttl", 0)
    if ttl and (not expiry or expiry > now + ttl):
        return now + ttl
    return expiry
