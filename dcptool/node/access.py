"""Who may do what: the one place the node decides privileges.

Every command names the privilege it needs when it is registered
(`@command(opcode, privilege=Privilege....)` in `dcptool.node.commands`), or checks it in
its handler with `has_privilege` when the answer depends on the request (DCP_OPEN: a
producer or a consumer). `@requires(...)` does the same for one handler. A user who lacks
the privilege gets EACCESS (a client without XERROR is disconnected instead, as kv_engine
does). Commands allowed before login (HELLO, SASL, VERSION, NOOP, ...) need none.

Users carry roles (`users.json`); a role is a set of privileges. A user without roles in
the file is an administrator (files written before roles existed).

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

#: role -> privileges
ROLES: dict[str, frozenset[Privilege]] = {
    "admin": frozenset(Privilege),
    "backup": _BASE | {Privilege.DCP_PRODUCER, Privilege.WATERMARK_READ,
                       Privilege.WATERMARK_WRITE},
    "restore": _BASE | {Privilege.META_WRITE},
    "reader": _BASE | {Privilege.READ},
    "writer": _BASE | {Privilege.WRITE},
    "scope_admin": _BASE | {Privilege.MANAGE_COLLECTIONS},
}
#: the roles of a user whose entry names none
DEFAULT_ROLES = ("admin",)


def check_roles(roles: Iterable[str]) -> list[str]:
    """The roles, validated and in a stable order; ValueError names an unknown one."""
    out = []
    for r in roles:
        r = r.strip().lower()
        if r not in ROLES:
            raise ValueError(f"unknown role {r!r} (roles: {', '.join(ROLES)})")
        if r not in out:
            out.append(r)
    if not out:
        raise ValueError(f"no role given (roles: {', '.join(ROLES)})")
    return sorted(out, key=list(ROLES).index)


def privileges_of(roles: Iterable[str]) -> frozenset[Privilege]:
    """The union of the roles' privileges (unknown roles grant nothing)."""
    out: frozenset[Privilege] = frozenset()
    for r in roles:
        out |= ROLES.get(r, frozenset())
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
