"""Connection set-up: HELLO, SASL, SELECT_BUCKET, VERSION, NOOP, QUIT, GET_ERROR_MAP.

SELECT_BUCKET selects any bucket of the node (EACCESS for a user with no privilege on the
name, else KEY_ENOENT for an unknown bucket, as kv_engine answers); the connection's privileges are then
its user's for that bucket. A login selects the bucket named like the user, if any."""
from __future__ import annotations

import logging
import struct

from dcptool import __version__
from dcptool.protocol.constants import Datatype, Feature, Opcode, Status

from .. import errormap
from ..access import Privilege
from ..auth import MECHANISM_LIST, SaslSession
from dcptool.logsafe import shown
from .common import command

log = logging.getLogger("dcptool.node.auth")

_U16 = struct.Struct(">H")

#: HELLO features this node implements (echoed when asked for)
SUPPORTED_FEATURES = frozenset({
    Feature.TCP_NODELAY, Feature.MUTATION_SEQNO, Feature.XATTR, Feature.XERROR,
    Feature.SELECT_BUCKET, Feature.JSON, Feature.ALT_REQUEST_SUPPORT, Feature.SNAPPY,
    Feature.COLLECTIONS, Feature.VATTR, Feature.SUBDOC_DOCUMENT_MACRO_SUPPORT,
    Feature.DUPLEX, Feature.CLUSTERMAP_CHANGE_NOTIFICATION,
    Feature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF,
})
#: feature -> features it needs (asking for it without them is EINVAL)
_REQUIRES = {
    Feature.CLUSTERMAP_CHANGE_NOTIFICATION: {Feature.DUPLEX},
    Feature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF: {Feature.DUPLEX},
    0x15: {Feature.XATTR},  # VAttr
    0x18: {Feature.XATTR},  # SubdocDocumentMacroSupport
    0x22: {Feature.XATTR},  # RangeScanIncludeXattr
    0x24: {Feature.XATTR, Feature.JSON, Feature.SNAPPY_EVERYWHERE},
}

#: what VERSION answers; clients parse the leading X.Y.Z
SERVER_VERSION = f"7.6.0-dcptool-{__version__}"


@command(Opcode.HELLO, pre_auth=True, bucket=False)
def hello(conn, frame, msg) -> None:
    asked = set(msg.features)
    for feat, needs in _REQUIRES.items():
        if feat in asked and not needs <= asked:
            conn.reply(frame, Status.EINVAL)
            return
    enabled = sorted(f for f in asked if f in SUPPORTED_FEATURES)
    config = getattr(conn.node, "config", None)
    if config is not None and not config.collections_enabled:
        enabled = [f for f in enabled if f != Feature.COLLECTIONS]
    conn.features = frozenset(enabled)
    conn.agent = msg.user_agent
    conn.xerror = Feature.XERROR in conn.features
    conn.json = Feature.JSON in conn.features
    conn.xattr = Feature.XATTR in conn.features
    conn.snappy = Feature.SNAPPY in conn.features
    conn.mutation_seqno = Feature.MUTATION_SEQNO in conn.features
    # every key of this connection carries its collection id (LEB128) from now on
    conn.collections = Feature.COLLECTIONS in conn.features
    conn.reply(frame, value=b"".join(_U16.pack(f) for f in enabled))


@command(Opcode.SASL_LIST_MECHS, pre_auth=True, bucket=False)
def sasl_list_mechs(conn, frame, msg) -> None:
    conn.reply(frame, value=" ".join(MECHANISM_LIST).encode())


def _sasl_result(conn, frame, result) -> None:
    status, payload, username = result
    node = conn.node
    guard = getattr(node, "login_guard", None)
    if status == "ok":
        conn.logged_in(username)
        conn.privileges = node.users.privileges(username)
        conn.sasl = None
        if guard is not None:
            guard.succeeded(username, conn.peer_host)
        # kv_engine selects the bucket named like the user
        if conn.bucket is None and username in node.buckets:
            conn.bucket = node.buckets[username]
            conn.privileges = node.users.privileges(username, bucket=username)
        conn.reply(frame, value=payload)
    elif status == "continue":
        conn.reply(frame, Status.AUTH_CONTINUE, value=payload)
    else:
        sasl = conn.sasl
        conn.sasl = None
        node.auth_failures += 1
        count = delay = 0
        if guard is not None and not sasl.bad_param:
            count, delay = guard.failed(sasl.username, conn.peer_host)
        _log_failure(conn, sasl.mechanism, sasl.username, sasl.reason, count, delay)
        # kv_engine answers a malformed message (BAD_PARAM) EINVAL, a failed login AUTH_ERROR
        conn.reply(frame, Status.EINVAL if sasl.bad_param else Status.AUTH_ERROR)


def _log_failure(conn, mechanism, username, reason: str, count: int = 0,
                 delay: float = 0.0) -> None:
    """One line per failed login: peer, mechanism, user and why; never a password or proof,
    and every client-supplied part escaped (`shown`)."""
    who = f" as {shown(username, 64)}" if username else ""
    then = ""
    if count > 1:
        then = f" ({count} failures in a row"
        then += f", next attempt waits {delay:g}s)" if delay else ")"
    log.warning("%s: SASL %s login failed%s: %s%s", conn.peer, shown(mechanism, 32), who,
                reason, then)


def _claimed_user(conn, opcode: int, msg) -> str | None:
    """The user a login attempt is for, as far as it is known before checking it."""
    if opcode == Opcode.SASL_AUTH:
        if msg.mechanism != "PLAIN":
            return None
        parts = bytes(msg.payload).split(b"\x00")
        return parts[1].decode("utf-8", "replace") if len(parts) == 3 else None
    sasl = conn.sasl
    return sasl.username if sasl is not None else None


def _when_allowed(conn, frame, msg, handler) -> bool:
    """True when the attempt may be checked now; otherwise it waits (the connection reads
    nothing meanwhile) until the failed logins of its user and address allow it."""
    guard = getattr(conn.node, "login_guard", None)
    if guard is None:
        return True
    if frame.opcode == Opcode.SASL_AUTH and msg.mechanism != "PLAIN":
        return True  # a SCRAM exchange checks nothing before its last step
    wait = guard.wait(_claimed_user(conn, frame.opcode, msg), conn.peer_host)
    if wait <= 0:
        return True
    guard.delayed += 1
    conn.defer(wait, lambda: handler(conn, frame, msg))
    return False


@command(Opcode.SASL_AUTH, pre_auth=True, bucket=False)
def sasl_auth(conn, frame, msg) -> None:
    if not _when_allowed(conn, frame, msg, sasl_auth):
        return
    conn.sasl = SaslSession(conn.node.users)
    _sasl_result(conn, frame, conn.sasl.start(msg.mechanism, msg.payload))


@command(Opcode.SASL_STEP, pre_auth=True, bucket=False)
def sasl_step(conn, frame, msg) -> None:
    if conn.sasl is None:
        conn.node.auth_failures += 1
        _log_failure(conn, msg.mechanism, None, "SASL_STEP without SASL_AUTH")
        conn.reply(frame, Status.AUTH_ERROR)
        return
    if not _when_allowed(conn, frame, msg, sasl_step):
        return
    _sasl_result(conn, frame, conn.sasl.step(msg.mechanism, msg.payload))


@command(Opcode.SELECT_BUCKET, bucket=False, privilege=Privilege.META_READ)
def select_bucket(conn, frame, msg) -> None:
    if msg.bucket == "@no bucket@":
        if conn.producer is not None:
            conn.reply(frame, Status.NOT_SUPPORTED)
            return
        conn.bucket = None
        conn.reply(frame)
        return
    # as kv_engine: a user with no privilege on the name is refused (EACCESS) before the
    # name is looked up, so the answer says nothing of buckets the user may not see
    privileges = conn.node.users.privileges(conn.user, bucket=msg.bucket)
    if not privileges:
        conn.reply(frame, Status.EACCESS)
        return
    bucket = conn.node.buckets.get(msg.bucket)
    if bucket is None:
        conn.reply(frame, Status.KEY_ENOENT)
        return
    if conn.producer is not None and bucket is not conn.bucket:
        conn.reply(frame, Status.NOT_SUPPORTED)
        return
    conn.bucket = bucket
    conn.privileges = privileges
    conn.reply(frame)


@command(Opcode.VERSION, pre_auth=True, bucket=False)
def version(conn, frame, msg) -> None:
    conn.reply(frame, value=SERVER_VERSION.encode())


@command(Opcode.NOOP, pre_auth=True, bucket=False)
def noop(conn, frame, msg) -> None:
    conn.reply(frame)


@command(Opcode.QUIT, pre_auth=True, bucket=False, decode=False)
def quit_(conn, frame) -> None:
    conn.close()


@command(Opcode.GET_ERROR_MAP, pre_auth=True, bucket=False)
def get_error_map(conn, frame, msg) -> None:
    if msg.version == 0:
        conn.reply(frame, Status.EINVAL)
        return
    conn.reply(frame, value=errormap.error_map_json(msg.version),
               datatype=Datatype.JSON if conn.json else 0)
