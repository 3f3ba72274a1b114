"""What every command module shares: registration (`command`), answers that wait for the
disk (`answer_later`) and the NOT_MY_VBUCKET answer of a request for a vbucket not active here.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

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
