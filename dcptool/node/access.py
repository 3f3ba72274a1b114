"""Who may do what: the one place the node decides privileges.

Every command names the privilege it needs when it is registered
(`@command(opcode, privilege=Privilege....)` in `dcptool.node.commands`), or checks it in
its handler with `has_privilege` when the answer depends on the request (DCP_OPEN: a
producer or a consumer). `@requires(...)` does the same for one handler. A user who lacks
the privilege gets EACCESS (a client without XERROR is disconnected instead, as kv_engine
does). Commands allowed before login (HELLO, SASL, VERSION, NOOP, ...) need none.

Users carry roles (`users.json`), their own and their groups'; a role is a set of
privileges, in one bucket or in every one. Roles are spelled as Couchbase Server spells
them (`data_reader[travel]`, `bucket_full_access[*]`, `ro_admin`); dcptool's own roles
(`admin`, `backup`, `restore`, `reader`, `writer`, `scope_admin`) hold in every bucket
unless given one (`backup[travel]`). A user without roles in the file is an
administrator (files written before roles existed).

Privilege names follow kv_engine's style; the HWT ones are dcptool's own.
"""
from __future__ import annotations

import enum
import functools
from typing import Callable, Iterable

from dcptool.protocol.constants import Status


class Privilege(str, enum.Enum):
    #: read documents (GET*, GET_META)
    READ = "Read"
    #: create, change and delete documents (SET, ADD, REPLACE, DELETE and their quiet forms)
    WRITE = "Write"
    #: write documents with their metadata kept (SET/ADD/DEL_WITH_META): restores, XDCR
    META_WRITE = "MetaWrite"
    #: bucket layout and history: cluster config, vbucket states and seqnos, failover logs,
    #: SELECT_BUCKET
    META_READ = "MetaRead"
    #: STAT
    SIMPLE_STATS = "SimpleStats"
    #: open a DCP producer and stream from it
    DCP_PRODUCER = "DcpProducer"
    #: open a DCP consumer (this node has no consumer endpoint; kept for completeness)
    DCP_CONSUMER = "DcpConsumer"
    #: list the high watermark table (HWT_LIST)
    WATERMARK_READ = "WatermarkRead"
    #: register and remove high watermarks (HWT_REGISTER, HWT_REMOVE)
    WATERMARK_WRITE = "WatermarkWrite"
    #: compact vbuckets and purge tombstones (COMPACT_DB)
    COMPACT = "Compact"
    #: change vbucket states and the cluster map, hold replication, read cluster status
    NODE_MANAGEMENT = "NodeManagement"
    #: create and drop scopes and collections (the REST port's scopes endpoints; Couchbase's
    #: bucket admin and "Manage Scopes" roles)
    MANAGE_COLLECTIONS = "ManageCollections"


#: what every role may do: find its way around the bucket
_BASE = frozenset({Privilege.META_READ, Privilege.SIMPLE_STATS})
_BACKUP = _BASE | {Privilege.DCP_PRODUCER, Privilege.WATERMARK_READ, Privilege.WATERMARK_WRITE}

#: dcptool's own roles -> privileges; without a bucket they hold in every bucket (as
#: before bucket-scoped roles), `backup[travel]` and the like narrow them to one
ROLES: dict[str, frozenset[Privilege]] = {
    "admin": frozenset(Privilege),
    "backup": _BACKUP,
    "restore": _BASE | {Privilege.META_WRITE},
    "reader": _BASE | {Privilege.READ},
    "writer": _BASE | {Privilege.WRITE},
    "scope_admin": _BASE | {Privilege.MANAGE_COLLECTIONS},
}
#: Couchbase Server's roles that hold node-wide (no bucket parameter) -> privileges
CLUSTER_ROLES: dict[str, frozenset[Privilege]] = {
    "ro_admin": _BASE | {Privilege.WATERMARK_READ},
    "security_admin": _BASE,
    "cluster_admin": _BASE | {Privilege.NODE_MANAGEMENT, Privilege.COMPACT,
                              Privilege.WATERMARK_READ, Privilege.MANAGE_COLLECTIONS},
    "replication_admin": _BASE,
}
#: Couchbase Server's roles that take a bucket (`role[bucket]`, `role[*]`), some narrowed
#: further to a scope or collection (`role[bucket:scope:collection]`) -> privileges in
#: that bucket
BUCKET_ROLES: dict[str, frozenset[Privilege]] = {
    "bucket_full_access": _BACKUP | {Privilege.READ, Privilege.WRITE, Privilege.META_WRITE},
    "bucket_admin": _BASE | {Privilege.MANAGE_COLLECTIONS, Privilege.COMPACT,
                             Privilege.WATERMARK_READ},
    "data_backup": _BACKUP | {Privilege.META_WRITE},
    "data_reader": _BASE | {Privilege.READ},
    "data_writer": _BASE | {Privilege.WRITE},
    "data_dcp_reader": _BASE | {Privilege.DCP_PRODUCER},
    "data_monitoring": _BASE,
    "replication_target": _BASE | {Privilege.META_WRITE},
    "scope_admin": _BASE | {Privilege.MANAGE_COLLECTIONS},
}
#: bucket roles that may be narrowed to a scope (and those to a collection)
SCOPE_ROLES = {"data_reader", "data_writer", "data_dcp_reader", "data_monitoring", "scope_admin"}
COLLECTION_ROLES = {"data_reader", "data_writer", "data_dcp_reader", "data_monitoring"}
#: the roles of a user whose entry names none
DEFAULT_ROLES = ("admin",)
#: Couchbase's 400 for a role it does not know or that lacks its bucket
UNKNOWN_ROLES = ("Cannot assign roles to {what} because the following roles are unknown, "
                 "malformed or role parameters are undefined: [{roles}]")

_BAD_NAME_CHARS = set('()<>@,;:\\"/[]?={}')
BAD_USERNAME = ("Username must not contain spaces, control or any of ()<>@,;:\\\"/[]?={} "
                "characters and must be valid utf8")
BAD_GROUP = ("Group name must not contain spaces, control or any of ()<>@,;:\\\"/[]?={} "
             "characters and must be valid utf8")


def bad_name(name: str) -> bool:
    """Is `name` no user or group name Couchbase Server accepts?"""
    return (not name or len(name) > 128 or any(c in _BAD_NAME_CHARS or c.isspace()
                                               or ord(c) < 0x20 or ord(c) == 0x7F
                                               for c in name))


_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%-")


class Role(tuple):
    """A role as Couchbase spells it: `name`, `name[bucket]`, `name[bucket:scope]`,
    `name[bucket:scope:collection]`; a part `*` means every one."""

    __slots__ = ()

    def __new__(cls, name: str, bucket: str | None = None, scope: str | None = None,
                collection: str | None = None) -> "Role":
        return tuple.__new__(cls, (name, bucket, scope, collection))

    name = property(lambda self: self[0])
    bucket = property(lambda self: self[1])
    scope = property(lambda self: self[2])
    collection = property(lambda self: self[3])

    def __str__(self) -> str:
        params = [p for p in (self.bucket, self.scope, self.collection) if p is not None]
        return f"{self.name}[{':'.join(params)}]" if params else self.name

    def to_json(self) -> dict:
        """Couchbase's shape in GET /settings/rbac/users and groups."""
        out = {"role": self.name}
        for key, value in (("bucket_name", self.bucket), ("scope_name", self.scope),
                           ("collection_name", self.collection)):
            if value is not None:
                out[key] = value
        return out

    def applies_to(self, bucket: str | None) -> bool:
        """Does the role hold in `bucket` (None: without naming one, i.e. in every one)?"""
        if self.bucket is None or self.bucket == "*":
            return True
        return bucket is not None and self.bucket == bucket

    def privileges(self, bucket: str | None) -> frozenset[Privilege]:
        """What the role grants in `bucket`; see `privileges_of`."""
        if self.name in CLUSTER_ROLES:
            return CLUSTER_ROLES[self.name]
        if not self.applies_to(bucket):
            return frozenset()
        narrowed = (self.scope not in (None, "*")) or (self.collection not in (None, "*"))
        if narrowed:
            # the node checks privileges per bucket: a role narrowed to one scope or
            # collection lets its holder find its way around the bucket, no more
            return _BASE
        if self.bucket is None and self.name in ROLES:
            return ROLES[self.name]
        return BUCKET_ROLES.get(self.name, ROLES.get(self.name, frozenset()))


def _valid_param(part: str, *, bucket: bool) -> bool:
    if part == "*":
        return True
    if not part or len(part) > (100 if bucket else 251):
        return False
    if bucket:
        return all(c in _NAME_OK for c in part) and not part.startswith(".")
    return all(c in _NAME_OK for c in part) and part[0] not in "_%" or part in (
        "_default", "_system")


def parse_role(text: str) -> Role:
    """One role; ValueError (the text) when unknown, malformed or missing its bucket."""
    raw = text.strip()
    name, bracket, rest = raw.partition("[")
    name = name.strip().lower()
    params: list[str] = []
    if bracket:
        if not rest.endswith("]"):
            raise ValueError(raw)
        params = rest[:-1].split(":")
        if not all(_valid_param(p, bucket=i == 0) for i, p in enumerate(params)):
            raise ValueError(raw)
    if name in ROLES and name not in BUCKET_ROLES or name == "scope_admin" and not params:
        if len(params) > 1 or (name == "admin" and params):
            raise ValueError(raw)
        return Role(name, *params)
    if name in CLUSTER_ROLES:
        if params:
            raise ValueError(raw)
        return Role(name)
    if name in BUCKET_ROLES:
        limit = 3 if name in COLLECTION_ROLES else 2 if name in SCOPE_ROLES else 1
        if not params or len(params) > limit:
            raise ValueError(raw)
        if "*" in params[:-1] and params[-1] != "*":  # data_reader[*:s] names nothing
            raise ValueError(raw)
        return Role(name, *params)
    raise ValueError(raw)


def split_roles(text: str) -> list[str]:
    """`a[b],c[d:e]` -> ["a[b]", "c[d:e]"] (commas inside brackets do not split)."""
    out, depth, cur = [], 0, []
    for c in text:
        if c == "[":
            depth += 1
        elif c == "]":
            depth = max(0, depth - 1)
        if c == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    out.append("".join(cur))
    return [r.strip() for r in out if r.strip()]


def role_names() -> list[str]:
    """Every role name this node knows, dcptool's first."""
    return list(dict.fromkeys([*ROLES, *CLUSTER_ROLES, *BUCKET_ROLES]))


def check_roles(roles: Iterable[str], *, what: str = "user", allow_empty: bool = False
                ) -> list[str]:
    """The roles as their canonical strings, validated and in a stable order; ValueError
    with Couchbase's wording names every unknown or malformed one."""
    parsed: list[Role] = []
    bad: list[str] = []
    for r in roles:
        for one in split_roles(r):
            try:
                role = parse_role(one)
            except ValueError:
                bad.append(one)
                continue
            if role not in parsed:
                parsed.append(role)
    if bad:
        raise ValueError(UNKNOWN_ROLES.format(what=what, roles=",".join(bad)))
    if not parsed and not allow_empty:
        raise ValueError(f"no role given (roles: {', '.join(role_names())})")
    order = role_names()
    parsed.sort(key=lambda r: (order.index(r.name), str(r)))
    return [str(r) for r in parsed]


def privileges_of(roles: Iterable[str], bucket: str | None = None) -> frozenset[Privilege]:
    """The union of the roles' privileges in `bucket` (unknown roles grant nothing).

    bucket=None: what the roles grant without naming a bucket: node-wide roles, and
    roles given for every bucket (`data_reader[*]`, dcptool's unscoped `reader`, ...). A
    user whose roles name buckets only still may find its way around the node (MetaRead,
    SimpleStats), as any Couchbase user with a role may read /pools.
    """
    out: frozenset[Privilege] = frozenset()
    any_role = False
    for text in roles:
        try:
            role = parse_role(text)
        except ValueError:
            continue
        any_role = True
        out |= role.privileges(bucket)
    if bucket is None and any_role:
        out |= _BASE
    return out


def has_privilege(conn, privilege: Privilege) -> bool:
    """Does the connection's user hold `privilege`?"""
    if not (conn.authenticated and conn.user is not None):
        return False
    return privilege in getattr(conn, "privileges", ())


def guard(fn: Callable, privilege: Privilege) -> Callable:
    """`fn` answering EACCESS unless the user holds `privilege` (handlers take the
    connection, the frame and maybe the decoded message)."""
    @functools.wraps(fn)
    def handler(conn, frame, *args):
        if conn.authenticated and privilege in getattr(conn, "privileges", ()):
            return fn(conn, frame, *args)
        conn.error(frame, Status.EACCESS)
    handler.privilege = privilege  # type: ignore[attr-defined]
    return handler


def requires(privilege: Privilege) -> Callable:
    """Decorate a command handler: answer EACCESS unless the user holds `privilege`."""
    def wrap(fn: Callable) -> Callable:
        return guard(fn, privilege)
    return wrap
