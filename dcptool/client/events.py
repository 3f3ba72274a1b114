"""What a DCP session hands its caller: compact tuples, `event[0]` is the kind.

Records (the hot path, one per document change), 10 fields:

    (kind, vbucket, seqno, rev_seqno, cas, flags, expiry, datatype, key, value)

`kind` is MUTATION, DELETION or EXPIRATION (their DCP opcodes). For deletions and
expirations `flags` is 0 and `expiry` holds the delete time (0 when the node sent none).
`key` is bytes; `value` is bytes, or a memoryview into the receive buffer when the
session was created with `copy_values=False` (valid only until the next feed).

With `typed=True` a record is instead `(kind, vbucket, message)` where message is the
codec's `DcpMutation`, `DcpDeletion` or `DcpExpiration`, and a snapshot is
`(SNAPSHOT, vbucket, DcpSnapshotMarker)`.

Other events:

    (SNAPSHOT, vbucket, start, end, flags)
    (STREAM_OPEN, vbucket, failover_log, position) # the node accepted the request made
                                                   # from `position`
    (STREAM_END, vbucket, reason, retrying)        # retrying: the session re-requested
    (ROLLBACK, vbucket, rollback_seqno, RollbackInfo)
    (SEQNO_ADVANCED, vbucket, seqno)
    (VBUCKET_STATE, vbucket, state, opaque)        # takeover streams: SET_VBUCKET_STATE
"""
from __future__ import annotations

from dataclasses import dataclass

from dcptool.protocol import wire

from .position import Position

MUTATION = wire.OP_DCP_MUTATION
DELETION = wire.OP_DCP_DELETION
EXPIRATION = wire.OP_DCP_EXPIRATION
SNAPSHOT = wire.OP_DCP_SNAPSHOT_MARKER
STREAM_END = wire.OP_DCP_STREAM_END
STREAM_OPEN = wire.OP_DCP_STREAM_REQ
SEQNO_ADVANCED = wire.OP_DCP_SEQNO_ADVANCED
VBUCKET_STATE = wire.OP_DCP_SET_VBUCKET_STATE
ROLLBACK = 0x100

#: kinds that carry a document change
RECORD_KINDS = frozenset({MUTATION, DELETION, EXPIRATION})

EVENT_NAMES = {
    MUTATION: "mutation",
    DELETION: "deletion",
    EXPIRATION: "expiration",
    SNAPSHOT: "snapshot",
    STREAM_END: "stream_end",
    STREAM_OPEN: "stream_open",
    SEQNO_ADVANCED: "seqno_advanced",
    VBUCKET_STATE: "vbucket_state",
    ROLLBACK: "rollback",
}


@dataclass(frozen=True, slots=True)
class RollbackInfo:
    """A rollback the node asked for, and where the session moved the vbucket.

    `rollback_seqno` is what the node sent (roll back to at most this); `before` is the
    position the stream was requested from; `after` the position it is re-requested from.
    """

    vbucket: int
    rollback_seqno: int
    before: Position
    after: Position
