"""The node's commands, one module per family (mini-redis style: parse, then apply).

Each handler is registered with `@command(opcode, ...)` and called as
`fn(conn, frame, msg)` (or `fn(conn, frame)` with `decode=False`, for hot paths that read
the frame directly). Flags say when a command may run:

* `pre_auth`: allowed before SASL succeeded (HELLO, SASL, ERROR_MAP, VERSION, NOOP);
* `needs_bucket`: a bucket must be selected;
* `dcp`: only on a connection that did DCP_OPEN (EINVAL elsewhere, like kv_engine).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(slots=True, frozen=True)
class Command:
    fn: Callable
    pre_auth: bool
    needs_bucket: bool
    decode: bool
    dcp: bool


COMMANDS: dict[int, Command] = {}


def command(*opcodes: int, pre_auth: bool = False, bucket: bool = True, decode: bool = True,
            dcp: bool = False):
    def register(fn):
        for op in opcodes:
            COMMANDS[int(op)] = Command(fn, pre_auth, bucket, decode, dcp)
        return fn
    return register


from . import cluster, kv, meta, session, stats  # noqa: E402,F401  (register commands)
from . import dcp as _dcp  # noqa: E402,F401
