"""Who may do what: the one place the node decides privileges.

Commands that change or reveal node-wide state name the privilege they need with
`@requires(Privilege....)` (below their `@command(...)`). Today the node has one kind of
user, an administrator created by `dcptool node start`, and every authenticated user holds
every privilege; roles change only `has_privilege`.

Privilege names follow kv_engine's style; the HWT ones are dcptool's own.
"""
from __future__ import annotations

import enum
import functools
from typing import Callable

from dcptool.protocol.constants import Status


class Privilege(str, enum.Enum):
    #: list the high watermark table (HWT_LIST)
    WATERMARK_READ = "WatermarkRead"
    #: register and remove high watermarks (HWT_REGISTER, HWT_REMOVE)
    WATERMARK_WRITE = "WatermarkWrite"
    #: compact vbuckets and purge tombstones (COMPACT_DB)
    COMPACT = "Compact"


def has_privilege(conn, privilege: Privilege) -> bool:
    """Does the connection's user hold `privilege`? (Every authenticated user, for now.)"""
    return bool(conn.authenticated and conn.user is not None)


def requires(privilege: Privilege) -> Callable:
    """Decorate a command handler: answer EACCESS unless the user holds `privilege`."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def handler(conn, frame, *args):
            if not has_privilege(conn, privilege):
                conn.error(frame, Status.EACCESS)
                return
            return fn(conn, frame, *args)
        handler.privilege = privilege  # type: ignore[attr-defined]
        return handler
    return wrap
