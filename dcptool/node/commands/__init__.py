"""The node's commands, one module per family (mini-redis style: parse, then apply).

Each handler is registered with `@command(opcode, ...)` and called as
`fn(conn, frame, msg)` (or `fn(conn, frame)` with `decode=False`, for hot paths that read
the frame directly). Flags say when a command may run:

* `pre_auth`: allowed before SASL succeeded (HELLO, SASL, ERROR_MAP, VERSION, NOOP);
* `needs_bucket`: a bucket must be selected;
* `dcp`: only on a connection that did DCP_OPEN (EINVAL elsewhere, like kv_engine).

Every command that may run after login names the privilege it needs (`privilege=`, see
`dcptool.node.access`); `privilege=CHECKED_IN_HANDLER` when the handler checks it itself
because the answer depends on the request.
A command whose work waits for the disk (compaction, HWT writes) answers later through
`answer_later`, which runs a coroutine on the loop and sends what it replied.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from dcptool.protocol.constants import Status

from ..access import Privilege, guard

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


from . import cluster, kv, meta, session, stats  # noqa: E402,F401  (register commands)
from . import compact, hwt  # noqa: E402,F401
from . import dcp as _dcp  # noqa: E402,F401
from . import cluster_admin  # noqa: E402,F401
