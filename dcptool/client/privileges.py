"""Pre-flight privilege checks: is the user allowed to do what the command is about to do?

A node answers EACCESS to a request whose privilege the user lacks (the reference node's
roles are in `dcptool.node.access`; Couchbase Server's RBAC does the same). A command
that finds out only when its work is under way fails late and noisily: a backup after
Spark started, a restore once per document. So each command that needs a privilege first
calls `check_privileges(opts, what, *privileges)`: one connection, one side-effect free
request per privilege, each of which a real server also refuses with EACCESS:

    DcpProducer     DCP_OPEN producer (the connection is closed at once)
    Read            GET_META of a key nobody writes (KEY_ENOENT when allowed)
    Write           REPLACE of a key nobody writes (KEY_ENOENT when allowed: nothing is
                    written)
    MetaWrite       SET_WITH_META to vbucket 65535, which no bucket holds
                    (NOT_MY_VBUCKET when allowed: nothing is written)
    WatermarkRead   HWT_LIST
    WatermarkWrite  HWT_REMOVE of a name nobody registers (KEY_ENOENT when allowed)
    NodeManagement  CLUSTER_STATUS
    MetaRead        GET_ALL_VB_SEQNOS

The request's privilege is checked before the key, the vbucket or the name is looked at,
so any answer but EACCESS means the user holds it (a node without dcptool's extensions
answers UNKNOWN_COMMAND to the HWT and cluster requests: nothing to check there). A
missing privilege is a `PrivilegeError`: one line naming the user, the privilege and the
roles that grant it, exit status 1.

`privilege_lost(...)` builds the same error for an EACCESS met in the middle of a run (the
user's role changed), so the run ends with one line too.
"""
from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Iterable, Protocol

from dcptool.protocol.constants import DcpOpenFlag, Opcode, Status
from dcptool.protocol.messages import (
    DcpOpen, GenericRequest, GetAllVbSeqnos, GetMeta, HwtRequest, Replace, SetWithMeta,
)

from .errors import ClientError

if TYPE_CHECKING:
    from .connection import Connection


class ConnectsAs(Protocol):
    """What the privilege checks need of the connection options (`options.ConnOptions`):
    who connects where, and a connection as that user."""

    username: str
    bucket: str

    @property
    def address(self) -> str: ...

    def connect(self) -> "Connection": ...


DCP_PRODUCER = "DcpProducer"
READ = "Read"
WRITE = "Write"
META_WRITE = "MetaWrite"
META_READ = "MetaRead"
WATERMARK_READ = "WatermarkRead"
WATERMARK_WRITE = "WatermarkWrite"
NODE_MANAGEMENT = "NodeManagement"

#: privilege -> the reference node's roles that grant it (`dcptool node user add --role`);
#: the same table as dcptool.node.access.ROLES, seen from the privilege (a test keeps
#: the two in step)
NODE_ROLES: dict[str, tuple[str, ...]] = {
    DCP_PRODUCER: ("backup", "admin"),
    READ: ("reader", "admin"),
    WRITE: ("writer", "admin"),
    META_WRITE: ("restore", "admin"),
    META_READ: ("admin", "backup", "restore", "reader", "writer", "scope_admin"),
    WATERMARK_READ: ("backup", "admin"),
    WATERMARK_WRITE: ("backup", "admin"),
    NODE_MANAGEMENT: ("admin",),
}
#: privilege -> Couchbase Server 7.x roles that grant it on a bucket (the HWT and
#: cluster privileges are the reference node's own)
SERVER_ROLES: dict[str, tuple[str, ...]] = {
    DCP_PRODUCER: ("data_dcp_reader", "data_backup"),
    READ: ("data_reader",),
    WRITE: ("data_writer",),
    META_WRITE: ("data_backup",),
    META_READ: ("data_reader", "data_dcp_reader", "data_backup"),
}

#: a key no one writes: the Read and Write probes' KEY_ENOENT
_PROBE_KEY_PREFIX = "_dcptool-privilege-probe-"
#: a vbucket no bucket holds (at most 1024 vbuckets): SET_WITH_META's NOT_MY_VBUCKET
_NO_VBUCKET = 0xFFFF
#: a watermark name no one registers (names are printable: NUL never appears)
_NO_WATERMARK = "\x00dcptool-privilege-probe"
CLUSTER_STATUS = 0xEA


class PrivilegeError(ClientError):
    """The user lacks a privilege the command needs (exit status 1)."""

    def __init__(self, message: str, *, host: str | None = None, username: str | None = None,
                 privileges: Iterable[str] = ()) -> None:
        super().__init__(message, host=host)
        self.username = username
        #: the privileges missing, the command's main one first
        self.privileges = tuple(privileges)
        self.privilege = self.privileges[0] if self.privileges else None

    def __reduce__(self):  # Spark ships errors between processes
        return (_rebuild, (self.message, self.host, self.username, self.privileges))


def _rebuild(message, host, username, privileges) -> "PrivilegeError":
    return PrivilegeError(message, host=host, username=username, privileges=privileges)


def _join(names: Iterable[str], word: str) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" {word} " + names[-1]


def _or(names: Iterable[str]) -> str:
    return _join(names, "or")


def granted_by(*privileges: str) -> str:
    """Which roles grant all of `privileges`, as words: "the backup or admin role
    (Couchbase Server: data_dcp_reader or data_backup)"."""
    node = [r for r in NODE_ROLES.get(privileges[0], ("admin",))
            if all(r in NODE_ROLES.get(p, ("admin",)) for p in privileges)] or ["admin"]
    text = f"the {_or(node)} role"
    # Couchbase Server has no HWT or cluster privileges: the others decide
    on_server = [p for p in privileges if p in SERVER_ROLES]
    server = [r for r in SERVER_ROLES[on_server[0]]
              if all(r in SERVER_ROLES[p] for p in on_server)] if on_server else []
    if server:
        text += f" (Couchbase Server: {_or(server)})"
    return text


def privilege_error(username: str, privileges: str | Iterable[str], what: str, address: str,
                    bucket: str | None, *, lost: bool = False) -> PrivilegeError:
    """The one-line error for missing privileges: `what` is what the command does ("back
    up", "restore into", ...), followed by the bucket (or, without one, the node)."""
    names = [privileges] if isinstance(privileges, str) else list(privileges)
    where = f"bucket '{bucket}' on {address}" if bucket else address
    how = "lost" if lost else "lacks"
    them = "privilege" if len(names) == 1 else "privileges"
    grant = "grants it" if len(names) == 1 else "grants them"
    return PrivilegeError(f"user '{username}' {how} the {_join(names, 'and')} {them} needed "
                          f"to {what} {where}; {granted_by(*names)} {grant}",
                          host=address, username=username, privileges=names)


def privilege_lost(opts: ConnectsAs, privilege: str, what: str) -> PrivilegeError:
    """The error for an EACCESS in the middle of a run (the user's roles changed)."""
    return privilege_error(opts.username, privilege, what, opts.address, opts.bucket, lost=True)


def _probe_request(privilege: str):
    key = (_PROBE_KEY_PREFIX + uuid.uuid4().hex).encode()
    if privilege == DCP_PRODUCER:
        return DcpOpen(name=f"dcptool-privilege-probe:{os.getpid()}",
                       flags=int(DcpOpenFlag.PRODUCER))
    if privilege == READ:
        return GetMeta(key=key, vbucket=0)
    if privilege == WRITE:
        return Replace(key=key, value=b"", vbucket=0)
    if privilege == META_WRITE:
        return SetWithMeta(key=key, value=b"", vbucket=_NO_VBUCKET, rev_seqno=1,
                           meta_cas=1)
    if privilege == WATERMARK_READ:
        return HwtRequest.make(Opcode.HWT_LIST)
    if privilege == WATERMARK_WRITE:
        return HwtRequest.make(Opcode.HWT_REMOVE, {"name": _NO_WATERMARK})
    if privilege == NODE_MANAGEMENT:
        return GenericRequest(op=CLUSTER_STATUS)
    if privilege == META_READ:
        return GetAllVbSeqnos()
    raise ValueError(f"no probe for privilege {privilege!r}")


def holds(conn: "Connection", privilege: str) -> bool:
    """Does the connection's user hold `privilege`? (One side-effect free request; a
    DCP_OPEN leaves the connection a producer, so probe DcpProducer last or alone.)"""
    return conn.request(_probe_request(privilege)).status != Status.EACCESS


def check_privileges(opts: ConnectsAs, what: str, *privileges: str,
                     bucket: bool = True) -> None:
    """Raise `PrivilegeError` naming the `privileges` the user of `opts` lacks.

    `what` says what the command does ("back up", "read documents in", ...), followed by
    the bucket's name and the node (`bucket=False`: the node only). One connection for all
    (DcpProducer's DCP_OPEN is sent last: it turns the connection into a producer)."""
    wanted = list(dict.fromkeys(privileges))
    if not wanted:
        return
    with opts.connect() as conn:
        missing = {p for p in sorted(wanted, key=lambda p: p == DCP_PRODUCER)
                   if not holds(conn, p)}
    if missing:
        raise privilege_error(opts.username, [p for p in wanted if p in missing], what,
                              opts.address, opts.bucket if bucket else None)


__all__ = [
    "DCP_PRODUCER", "READ", "WRITE", "META_WRITE", "META_READ", "WATERMARK_READ",
    "WATERMARK_WRITE", "NODE_MANAGEMENT", "NODE_ROLES", "SERVER_ROLES", "PrivilegeError",
    "check_privileges", "granted_by", "holds", "privilege_error", "privilege_lost",
]
