"""The node's commands, one module per family (mini-redis style: parse, then apply).

Each handler is registered with `@command(opcode, ...)` (`commands.common`) and called as
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

from .common import CHECKED_IN_HANDLER, COMMANDS, Command, answer_later, command

# importing a family registers its commands (in this order: a later one would win an opcode)
from . import vbucket, kv, meta, session, stats  # noqa: F401
from . import compact, hwt  # noqa: F401
from . import dcp  # noqa: F401
from . import membership  # noqa: F401
from . import collections  # noqa: F401
from . import docops, subdoc  # noqa: F401

__all__ = ["CHECKED_IN_HANDLER", "COMMANDS", "Command", "answer_later", "command"]
