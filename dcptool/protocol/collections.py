"""Scopes and collections: the pure parts every layer agrees on (no I/O).

* **Collection-prefixed keys** ("doc keys"): on a connection that negotiated HELLO
  Collections every key starts with its collection id as an unsigned LEB128; the default
  collection is the single byte 0x00. dcptool uses this form everywhere a key's identity
  matters (the node's hash tables and database, DCP records, archive records), exactly as
  kv_engine stores a `DocKey`. `doc_key` builds one, `split_doc_key` takes one apart.
* **The manifest**: a bucket's scopes and collections with their ids, names and max TTLs,
  and the manifest uid that rises with every change (`Manifest`). Its JSON form is the one
  GET_COLLECTIONS_MANIFEST (0xba) and the REST port return: ids as lower-case hex strings.
* **System events** (DCP_SYSTEM_EVENT 0x5f, versions 0 and 1): `SystemEvent` and its
  key/value codec.
* **The stream-request value** (the JSON filter of a collections-enabled stream request):
  `StreamFilter`.

Facts: kv_engine docs/Collections.md (ids, LEB128 table, limits),
docs/dcp/documentation/commands/system_event.md and stream-request-value.md.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, NamedTuple

#: the default scope and collection (always present, id 0)
DEFAULT_SCOPE = "_default"
DEFAULT_COLLECTION = "_default"
DEFAULT_SCOPE_ID = 0
DEFAULT_COLLECTION_ID = 0
#: collection id 1 is the system namespace (system events' keys); 2-7 are reserved
SYSTEM_COLLECTION_ID = 1
#: the first id given to a user scope or collection
FIRST_USER_ID = 8
MAX_ID = 0xFFFFFFFF
#: LEB128 of a 32-bit id is at most 5 bytes
MAX_LEB128_BYTES = 5

#: names: 1 to 251 bytes of A-Z a-z 0-9 _ - %, not starting with _ or % (the _default
#: scope and collection, and the _system scope of 7.6, are the only names starting with _)
MAX_NAME_LENGTH = 251
_NAME_RE = re.compile(r"^[A-Za-z0-9\-][A-Za-z0-9_\-%]{0,250}$")

#: limits as Couchbase Server 7.x has them by default (per bucket here, since a node is a
#: one-bucket cluster): scopes and collections, the default ones included
MAX_SCOPES = 1000
MAX_COLLECTIONS = 1000

# system event ids (the u32 "event" in the extras)
EVENT_BEGIN_COLLECTION = 0
EVENT_END_COLLECTION = 1
EVENT_CREATE_SCOPE = 3
EVENT_DROP_SCOPE = 4
EVENT_MODIFY_COLLECTION = 5
EVENT_NAMES = {
    EVENT_BEGIN_COLLECTION: "create-collection",
    EVENT_END_COLLECTION: "drop-collection",
    EVENT_CREATE_SCOPE: "create-scope",
    EVENT_DROP_SCOPE: "drop-scope",
    EVENT_MODIFY_COLLECTION: "modify-collection",
}
COLLECTION_EVENTS = (EVENT_BEGIN_COLLECTION, EVENT_END_COLLECTION, EVENT_MODIFY_COLLECTION)

_U64_U32 = struct.Struct(">QI")
_U64_U32_U32 = struct.Struct(">QII")
_U64_U32_U32_U32 = struct.Struct(">QIII")


class CollectionsError(ValueError):
    """Malformed collections input: a LEB128 prefix, a manifest, a filter or a name."""


class ManifestError(ValueError):
    """A manifest change that cannot be made. `kind` says why, for the layer that answers:

    * "exists": the scope or collection already exists
    * "not-found": the scope or collection does not exist
    * "invalid": a bad name or value (the message says which)
    * "limit": the bucket already has the maximum number of scopes or collections
    * "forbidden": the _default scope cannot be dropped
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ---------------------------------------------------------------------------------------------
# LEB128 collection prefixes

_DEFAULT_PREFIX = b"\x00"


def encode_leb128(value: int) -> bytes:
    """Unsigned LEB128 of a 32-bit id: 7 bits per byte, least significant first, the high
    bit set on every byte but the last."""
    if not 0 <= value <= MAX_ID:
        raise CollectionsError(f"collection id {value} is outside 0..0xffffffff")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_leb128(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int]:
    """(value, position after it). Raises CollectionsError for a prefix that is cut off,
    longer than 5 bytes, or above 32 bits."""
    value = 0
    shift = 0
    end = len(buf)
    for i in range(MAX_LEB128_BYTES):
        if pos + i >= end:
            raise CollectionsError("collection id prefix is cut off")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value > MAX_ID:
                raise CollectionsError("collection id prefix is above 32 bits")
            return value, pos + i + 1
        shift += 7
    raise CollectionsError("collection id prefix is longer than 5 bytes")


def doc_key(cid: int, key: bytes) -> bytes:
    """The collection-prefixed form of `key` in collection `cid`."""
    if cid == 0:
        return _DEFAULT_PREFIX + key
    return encode_leb128(cid) + key


def split_doc_key(dkey: bytes) -> tuple[int, bytes]:
    """(collection id, key) of a collection-prefixed key. Raises CollectionsError."""
    if dkey and dkey[0] < 0x80:
        return dkey[0], dkey[1:]
    cid, pos = decode_leb128(dkey)
    return cid, dkey[pos:]


def doc_key_cid(dkey: bytes) -> int:
    """The collection id of a collection-prefixed key (no copy of the key)."""
    if dkey and dkey[0] < 0x80:
        return dkey[0]
    return decode_leb128(dkey)[0]


def is_default_key(dkey: bytes) -> bool:
    return bool(dkey) and dkey[0] == 0


def valid_name(name: str) -> bool:
    """A name a user may give a new scope or collection."""
    return bool(_NAME_RE.match(name))


def hex_id(value: int) -> str:
    """Ids and manifest uids in JSON: lower-case hex without 0x."""
    return format(value, "x")


def parse_hex_id(text: Any, what: str = "id") -> int:
    if not isinstance(text, str) or not text or len(text) > 16:
        raise CollectionsError(f"{what} must be a hex string, not {text!r}")
    try:
        value = int(text, 16)
    except ValueError:
        raise CollectionsError(f"{what} must be a hex string, not {text!r}") from None
    if text.startswith(("0x", "0X", "-", "+")):
        raise CollectionsError(f"{what} must be a hex string, not {text!r}")
    return value


# ---------------------------------------------------------------------------------------------
# The manifest


@dataclass(frozen=True)
class Collection:
    name: str
    uid: int
    #: seconds; 0 = no limit (the bucket's max TTL applies)
    max_ttl: int = 0


@dataclass(frozen=True)
class Scope:
    name: str
    uid: int
    collections: tuple[Collection, ...] = ()

    def collection(self, name: str) -> Collection | None:
        for c in self.collections:
            if c.name == name:
                return c
        return None


def _default_scope() -> Scope:
    return Scope(DEFAULT_SCOPE, DEFAULT_SCOPE_ID,
                 (Collection(DEFAULT_COLLECTION, DEFAULT_COLLECTION_ID),))


@dataclass(frozen=True)
class Manifest:
    """A bucket's collections manifest. Immutable: every change returns a new manifest
    with `uid` one higher. `next_id` is the next scope or collection id to give out; ids are
    never reused, so a collection dropped and created again under the same name gets a new id.
    """

    uid: int = 0
    scopes: tuple[Scope, ...] = field(default_factory=lambda: (_default_scope(),))
    next_id: int = FIRST_USER_ID

    # -- lookups -------------------------------------------------------------------------

    def scope(self, name: str) -> Scope | None:
        for s in self.scopes:
            if s.name == name:
                return s
        return None

    def scope_by_id(self, sid: int) -> Scope | None:
        for s in self.scopes:
            if s.uid == sid:
                return s
        return None

    def collection(self, scope: str, name: str) -> Collection | None:
        s = self.scope(scope)
        return None if s is None else s.collection(name)

    def collection_by_id(self, cid: int) -> tuple[Scope, Collection] | None:
        for s in self.scopes:
            for c in s.collections:
                if c.uid == cid:
                    return s, c
        return None

    def collection_ids(self) -> dict[int, tuple[str, str]]:
        """{collection id: (scope name, collection name)} of every live collection."""
        return {c.uid: (s.name, c.name) for s in self.scopes for c in s.collections}

    def scope_of(self, cid: int) -> int | None:
        found = self.collection_by_id(cid)
        return None if found is None else found[0].uid

    @property
    def num_collections(self) -> int:
        return sum(len(s.collections) for s in self.scopes)

    # -- changes -------------------------------------------------------------------------

    def create_scope(self, name: str) -> tuple["Manifest", Scope]:
        if not valid_name(name):
            raise ManifestError("invalid", f"scope name {name!r} is not valid (1-251 characters "
                                "of A-Z a-z 0-9 _ - %, not starting with _ or %)")
        if self.scope(name) is not None:
            raise ManifestError("exists", f"scope {name!r} already exists")
        if len(self.scopes) >= MAX_SCOPES:
            raise ManifestError("limit", f"the bucket already has {MAX_SCOPES} scopes")
        scope = Scope(name, self.next_id)
        return replace(self, uid=self.uid + 1, scopes=self.scopes + (scope,),
                       next_id=self.next_id + 1), scope

    def create_collection(self, scope: str, name: str, max_ttl: int = 0
                          ) -> tuple["Manifest", Scope, Collection]:
        s = self.scope(scope)
        if s is None:
            raise ManifestError("not-found", f"scope {scope!r} does not exist")
        if not valid_name(name):
            raise ManifestError("invalid", f"collection name {name!r} is not valid (1-251 "
                                "characters of A-Z a-z 0-9 _ - %, not starting with _ or %)")
        if not isinstance(max_ttl, int) or not 0 <= max_ttl <= 0x7FFFFFFF:
            raise ManifestError("invalid", f"maxTTL must be 0..2147483647 seconds, not {max_ttl!r}")
        if s.collection(name) is not None:
            raise ManifestError("exists", f"collection {scope}.{name} already exists")
        if self.num_collections >= MAX_COLLECTIONS:
            raise ManifestError("limit", f"the bucket already has {MAX_COLLECTIONS} collections")
        coll = Collection(name, self.next_id, max_ttl)
        new_scope = replace(s, collections=s.collections + (coll,))
        return (replace(self, uid=self.uid + 1, next_id=self.next_id + 1,
                        scopes=tuple(new_scope if x is s else x for x in self.scopes)),
                new_scope, coll)

    def drop_collection(self, scope: str, name: str) -> tuple["Manifest", Scope, Collection]:
        s = self.scope(scope)
        if s is None:
            raise ManifestError("not-found", f"scope {scope!r} does not exist")
        c = s.collection(name)
        if c is None:
            raise ManifestError("not-found", f"collection {scope}.{name} does not exist")
        new_scope = replace(s, collections=tuple(x for x in s.collections if x is not c))
        return (replace(self, uid=self.uid + 1,
                        scopes=tuple(new_scope if x is s else x for x in self.scopes)),
                new_scope, c)

    def drop_scope(self, name: str) -> tuple["Manifest", Scope]:
        """Drops the scope and every collection in it (the caller sends a drop event for each
        collection before the scope's)."""
        if name == DEFAULT_SCOPE:
            raise ManifestError("forbidden", "the _default scope cannot be dropped")
        s = self.scope(name)
        if s is None:
            raise ManifestError("not-found", f"scope {name!r} does not exist")
        return replace(self, uid=self.uid + 1,
                       scopes=tuple(x for x in self.scopes if x is not s)), s

    # -- JSON ----------------------------------------------------------------------------

    def to_json(self, *, internal: bool = False) -> dict[str, Any]:
        """The manifest as GET_COLLECTIONS_MANIFEST returns it. `internal` adds `next_id`
        (how the node keeps it in its database)."""
        out: dict[str, Any] = {"uid": hex_id(self.uid), "scopes": [
            {"name": s.name, "uid": hex_id(s.uid), "collections": [
                ({"name": c.name, "uid": hex_id(c.uid), "maxTTL": c.max_ttl} if c.max_ttl
                 else {"name": c.name, "uid": hex_id(c.uid)})
                for c in s.collections]}
            for s in self.scopes]}
        if internal:
            out["next_id"] = hex_id(self.next_id)
        return out

    def to_bytes(self, *, internal: bool = False) -> bytes:
        return json.dumps(self.to_json(internal=internal), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, obj: Any) -> "Manifest":
        """Parse the JSON form (ids as hex strings; `maxTTL` or `max_ttl`). Raises
        CollectionsError naming what is wrong."""
        if isinstance(obj, (bytes, bytearray, str)):
            try:
                obj = json.loads(obj)
            except ValueError as exc:
                raise CollectionsError(f"manifest is not JSON: {exc}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("scopes"), list):
            raise CollectionsError("manifest must be an object with a 'scopes' list")
        uid = parse_hex_id(obj.get("uid", "0"), "manifest uid")
        scopes = []
        highest = FIRST_USER_ID - 1
        for s in obj["scopes"]:
            if not isinstance(s, dict) or not isinstance(s.get("name"), str):
                raise CollectionsError("every scope needs a name")
            sid = parse_hex_id(s.get("uid"), f"scope {s.get('name')!r} uid")
            colls = []
            for c in s.get("collections") or []:
                if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                    raise CollectionsError(f"every collection of scope {s['name']!r} needs a name")
                cid = parse_hex_id(c.get("uid"), f"collection {c.get('name')!r} uid")
                ttl = c.get("maxTTL", c.get("max_ttl", 0)) or 0
                if not isinstance(ttl, int) or ttl < 0:
                    raise CollectionsError(f"collection {c['name']!r} maxTTL must be a number")
                colls.append(Collection(c["name"], cid, ttl))
                highest = max(highest, cid)
            scopes.append(Scope(s["name"], sid, tuple(colls)))
            highest = max(highest, sid)
        next_id = obj.get("next_id")
        next_id = parse_hex_id(next_id, "next_id") if next_id is not None else highest + 1
        return cls(uid, tuple(scopes), max(next_id, highest + 1))


# ---------------------------------------------------------------------------------------------
# System events


class SystemEvent(NamedTuple):
    """One DCP system event. `collection_id` is None for scope events; `name` is "" for
    drop events (they carry no key); `max_ttl` only for a collection created with one."""

    seqno: int
    event: int
    manifest_uid: int
    scope_id: int
    collection_id: int | None = None
    name: str = ""
    max_ttl: int = 0

    @property
    def kind(self) -> str:
        return EVENT_NAMES.get(self.event, f"event-{self.event}")

    def encode(self) -> tuple[bytes, bytes, int]:
        """(key, value, version) as DCP_SYSTEM_EVENT carries them."""
        ev = self.event
        if ev in (EVENT_BEGIN_COLLECTION, EVENT_MODIFY_COLLECTION):
            if self.max_ttl:
                return (self.name.encode(), _U64_U32_U32_U32.pack(
                    self.manifest_uid, self.scope_id, self.collection_id or 0, self.max_ttl), 1)
            return (self.name.encode(), _U64_U32_U32.pack(
                self.manifest_uid, self.scope_id, self.collection_id or 0), 0)
        if ev == EVENT_END_COLLECTION:
            return b"", _U64_U32_U32.pack(self.manifest_uid, self.scope_id,
                                          self.collection_id or 0), 0
        if ev == EVENT_CREATE_SCOPE:
            return self.name.encode(), _U64_U32.pack(self.manifest_uid, self.scope_id), 0
        if ev == EVENT_DROP_SCOPE:
            return b"", _U64_U32.pack(self.manifest_uid, self.scope_id), 0
        raise CollectionsError(f"unknown system event {ev}")

    @classmethod
    def decode(cls, seqno: int, event: int, version: int, key: bytes | memoryview,
               value: bytes | memoryview) -> "SystemEvent":
        """Parse a version 0 or 1 event. Raises CollectionsError (FlatBuffers, version 2, is
        never asked for by dcptool)."""
        if version not in (0, 1):
            raise CollectionsError(f"system event version {version} is not supported")
        value = bytes(value)
        try:
            name = bytes(key).decode()
        except UnicodeDecodeError:
            raise CollectionsError("system event key is not UTF-8") from None
        n = len(value)
        if event in (EVENT_BEGIN_COLLECTION, EVENT_MODIFY_COLLECTION):
            if n == 20:
                uid, sid, cid, ttl = _U64_U32_U32_U32.unpack(value)
                return cls(seqno, event, uid, sid, cid, name, ttl)
            if n == 16:
                uid, sid, cid = _U64_U32_U32.unpack(value)
                return cls(seqno, event, uid, sid, cid, name, 0)
        elif event == EVENT_END_COLLECTION:
            if n == 16:
                uid, sid, cid = _U64_U32_U32.unpack(value)
                return cls(seqno, event, uid, sid, cid, "", 0)
        elif event in (EVENT_CREATE_SCOPE, EVENT_DROP_SCOPE):
            if n == 12:
                uid, sid = _U64_U32.unpack(value)
                return cls(seqno, event, uid, sid, None, name if event == EVENT_CREATE_SCOPE
                           else "", 0)
        else:
            raise CollectionsError(f"unknown system event {event}")
        raise CollectionsError(f"system event {event} value has {n} bytes")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seqno": self.seqno, "event": self.kind,
                               "manifest_uid": hex_id(self.manifest_uid),
                               "scope_id": hex_id(self.scope_id)}
        if self.collection_id is not None:
            out["collection_id"] = hex_id(self.collection_id)
        if self.name:
            out["name"] = self.name
        if self.max_ttl:
            out["max_ttl"] = self.max_ttl
        return out


# ---------------------------------------------------------------------------------------------
# The stream-request value


@dataclass(frozen=True)
class StreamFilter:
    """What a collections-enabled stream request asks for (stream-request-value.md).

    `collections` (ids) or `scope` (an id) or neither (every collection); `uid` the manifest
    uid the client knows (the node must know at least that one); `sid` the stream id,
    required when the connection enabled stream ids; `purge_seqno` as the client last saw it.
    """

    collections: frozenset[int] | None = None
    scope: int | None = None
    uid: int | None = None
    sid: int | None = None
    purge_seqno: int | None = None

    @property
    def passthrough(self) -> bool:
        """No collection or scope filter: every collection of the vbucket."""
        return self.collections is None and self.scope is None

    def to_bytes(self) -> bytes:
        obj: dict[str, Any] = {}
        if self.uid is not None:
            obj["uid"] = hex_id(self.uid)
        if self.sid is not None:
            obj["sid"] = self.sid
        if self.collections is not None:
            obj["collections"] = [hex_id(c) for c in sorted(self.collections)]
        if self.scope is not None:
            obj["scope"] = hex_id(self.scope)
        if self.purge_seqno is not None:
            obj["purge_seqno"] = str(self.purge_seqno)
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def parse(cls, value: bytes | memoryview | str) -> "StreamFilter":
        """Parse a stream-request value. An empty value is the pass-through filter. Raises
        CollectionsError naming what is wrong (the node answers EINVAL)."""
        if isinstance(value, memoryview):
            value = bytes(value)
        if not value:
            return cls()
        try:
            obj = json.loads(value)
        except ValueError:
            raise CollectionsError("stream request value is not JSON") from None
        if not isinstance(obj, dict):
            raise CollectionsError("stream request value must be a JSON object")
        colls = obj.get("collections")
        scope = obj.get("scope")
        if colls is not None and scope is not None:
            raise CollectionsError("stream request value has both collections and scope")
        cset = None
        if colls is not None:
            if not isinstance(colls, list) or not colls:
                raise CollectionsError("collections must be a non-empty list of hex ids")
            cset = frozenset(parse_hex_id(c, "collection id") for c in colls)
        sid = obj.get("sid")
        if sid is not None and (not isinstance(sid, int) or isinstance(sid, bool)
                                or not 0 < sid <= 0xFFFF):
            raise CollectionsError("sid must be a number 1..65535")
        purge = obj.get("purge_seqno")
        if purge is not None:
            try:
                purge = int(purge)
            except (TypeError, ValueError):
                raise CollectionsError("purge_seqno must be a decimal string") from None
        return cls(cset,
                   parse_hex_id(scope, "scope id") if scope is not None else None,
                   parse_hex_id(obj["uid"], "manifest uid") if obj.get("uid") is not None
                   else None,
                   sid, purge)

    def admits(self, cid: int, manifest: Manifest | None = None,
               scope_of: dict[int, int] | None = None) -> bool:
        """Does this filter let collection `cid` through? A scope filter needs to know the
        collection's scope: from `scope_of` ({cid: scope id}) or the manifest."""
        if self.collections is not None:
            return cid in self.collections
        if self.scope is not None:
            if scope_of is not None and cid in scope_of:
                return scope_of[cid] == self.scope
            return manifest is not None and manifest.scope_of(cid) == self.scope
        return True


def collection_ids(values: Iterable[int]) -> frozenset[int]:
    return frozenset(int(v) for v in values)
