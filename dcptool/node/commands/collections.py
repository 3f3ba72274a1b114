"""Collections commands: GET_COLLECTIONS_MANIFEST (0xba), GET_COLLECTION_ID (0xbb),
GET_SCOPE_ID (0xbc), and SET_COLLECTIONS_MANIFEST (0xb9), the way a cluster's members
share one manifest.

Layouts (kv_engine docs/Collections.md):

* 0xba: no extras, key or value; answers the manifest JSON (ids as hex strings).
* 0xbb: the path `scope.collection` in the value (or, as older clients send it, in the
  key; not both). An empty scope or collection name means `_default`. Answers extras
  manifest uid u64 + collection id u32 (big-endian). A path without exactly one `.` or
  with a name that is not valid is EINVAL; an unknown scope UNKNOWN_SCOPE (0x8c), an
  unknown collection UNKNOWN_COLLECTION (0x88), both with `{"manifest_uid": "<hex>"}`.
* 0xbc: the path `scope` (a `.collection` after it is ignored; more than one `.` is
  EINVAL); answers manifest uid u64 + scope id u32.
* 0xb9: value = a whole manifest (JSON, the internal form with `next_id` allowed). The
  node makes it its manifest (`Bucket.set_manifest`: the differences become system events
  in its active vbuckets). A manifest whose uid is below the node's is ERANGE (kv_engine's
  "out of range"), a malformed one EINVAL; the answer is a JSON summary. Sent by the
  member that took a REST change to every other member (`dcptool.node.rest`).
"""
from __future__ import annotations

import json
import struct

from dcptool.protocol.collections import (
    DEFAULT_COLLECTION,
    DEFAULT_SCOPE,
    CollectionsError,
    Manifest,
    hex_id,
    valid_name,
)
from dcptool.protocol.constants import Datatype, Opcode, Status

from ..access import Privilege
from .common import command, unknown_collection

SET_COLLECTIONS_MANIFEST = 0xB9
_ID_EXTRAS = struct.Struct(">QI")


def _json_reply(conn, frame, doc, status: int = Status.SUCCESS) -> None:
    conn.reply(frame, status, value=json.dumps(doc, separators=(",", ":")).encode(),
               datatype=Datatype.JSON if conn.json else 0)


def _unknown_scope(conn, frame) -> None:
    body = b'{"manifest_uid":"%s"}' % hex_id(conn.bucket.manifest.uid).encode()
    dt = Datatype.JSON if conn.json else 0
    if conn.collections:
        conn.reply(frame, Status.UNKNOWN_SCOPE, value=body, datatype=dt)
    else:
        conn.error(frame, Status.UNKNOWN_SCOPE, value=body, datatype=dt)


def _name(part: str, default: str) -> str | None:
    """The name a path part means (empty: `_default`), or None when it is not valid."""
    if not part:
        return default
    if part == default or valid_name(part):
        return part
    return None


def _path(conn, frame) -> str | None:
    """The path of a 0xbb/0xbc request (value, or key), or None after answering EINVAL."""
    key, value = bytes(frame.key), bytes(frame.value)
    if frame.extras or (key and value) or frame.cas:
        conn.reply(frame, Status.EINVAL)
        return None
    try:
        return (value or key).decode()
    except UnicodeDecodeError:
        conn.reply(frame, Status.EINVAL)
        return None


def _disabled(conn, frame) -> bool:
    """A node started with --no-collections answers like a server without collections."""
    config = getattr(conn.node, "config", None)
    if config is None or config.collections_enabled:
        return False
    conn.reply(frame, Status.UNKNOWN_COMMAND)
    return True


@command(Opcode.GET_COLLECTIONS_MANIFEST, decode=False, privilege=Privilege.META_READ)
def get_collections_manifest(conn, frame) -> None:
    if _disabled(conn, frame):
        return
    if frame.extras or frame.key or frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    conn.reply(frame, value=conn.bucket.manifest.to_bytes(),
               datatype=Datatype.JSON if conn.json else 0)


@command(Opcode.GET_COLLECTION_ID, decode=False, privilege=Privilege.META_READ)
def get_collection_id(conn, frame) -> None:
    if _disabled(conn, frame):
        return
    path = _path(conn, frame)
    if path is None:
        return
    parts = path.split(".")
    if len(parts) != 2:
        conn.reply(frame, Status.EINVAL)
        return
    scope = _name(parts[0], DEFAULT_SCOPE)
    coll = _name(parts[1], DEFAULT_COLLECTION)
    if scope is None or coll is None:
        conn.reply(frame, Status.EINVAL)
        return
    m = conn.bucket.manifest
    s = m.scope(scope)
    if s is None:
        _unknown_scope(conn, frame)
        return
    c = s.collection(coll)
    if c is None:
        unknown_collection(conn, frame)
        return
    conn.reply(frame, extras=_ID_EXTRAS.pack(m.uid, c.uid))


@command(Opcode.GET_SCOPE_ID, decode=False, privilege=Privilege.META_READ)
def get_scope_id(conn, frame) -> None:
    if _disabled(conn, frame):
        return
    path = _path(conn, frame)
    if path is None:
        return
    parts = path.split(".")
    if len(parts) > 2:
        conn.reply(frame, Status.EINVAL)
        return
    scope = _name(parts[0], DEFAULT_SCOPE)
    if scope is None:
        conn.reply(frame, Status.EINVAL)
        return
    m = conn.bucket.manifest
    s = m.scope(scope)
    if s is None:
        _unknown_scope(conn, frame)
        return
    conn.reply(frame, extras=_ID_EXTRAS.pack(m.uid, s.uid))


@command(SET_COLLECTIONS_MANIFEST, decode=False, privilege=Privilege.NODE_MANAGEMENT)
def set_collections_manifest(conn, frame) -> None:
    if frame.extras or frame.key or not frame.value:
        conn.reply(frame, Status.EINVAL)
        return
    try:
        new = Manifest.from_json(bytes(frame.value))
    except CollectionsError as exc:
        _json_reply(conn, frame, {"error": {"context": str(exc)}}, Status.EINVAL)
        return
    bucket = conn.bucket
    try:
        events = bucket.set_manifest(new)
    except ValueError as exc:
        status = Status.ERANGE if new.uid < bucket.manifest.uid else Status.EINVAL
        _json_reply(conn, frame, {"error": {"context": str(exc)}}, status)
        return
    _json_reply(conn, frame, {"uid": hex_id(bucket.manifest.uid), "events": len(events)})
