"""What a DCP session hands its caller: compact tuples, `event[0]` is the kind.

Records (the hot path, one per document change), 10 fields (their positions are the
`EV_*` constants below: index events with those, never with bare numbers):

    (kind, vbucket, seqno, rev_seqno, cas, flags, expiry, datatype, key, value)

`kind` is MUTATION, DELETION or EXPIRATION (their DCP opcodes). With
`SessionConfig(collections=True)` `key` is always the collection-prefixed doc key
(`dcptool.protocol.collections.split_doc_key` takes it apart); otherwise it is the key as a
legacy connection sees it (default collection only, no prefix). For deletions and
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
    (SEQNO_ADVANCED, vbucket, seqno)               # a snapshot end whose last items the
                                                   # stream's filter hides (collections)
    (SYSTEM_EVENT, vbucket, SystemEvent)           # a scope or collection created or dropped
                                                   # (collections sessions only)
    (VBUCKET_STATE, vbucket, state, opaque)        # takeover streams: SET_VBUCKET_STATE
"""
from __future__ import annotations

from dataclasses import dataclass

from dcptool.protocol import wire
from dcptool.protocol.constants import Opcode

from .position import Position

MUTATION = wire.OP_DCP_MUTATION
DELETION = wire.OP_DCP_DELETION
EXPIRATION = wire.OP_DCP_EXPIRATION
SNAPSHOT = wire.OP_DCP_SNAPSHOT_MARKER
STREAM_END = wire.OP_DCP_STREAM_END
STREAM_OPEN = wire.OP_DCP_STREAM_REQ
SEQNO_ADVANCED = wire.OP_DCP_SEQNO_ADVANCED
VBUCKET_STATE = wire.OP_DCP_SET_VBUCKET_STATE
#: DCP_SYSTEM_EVENT's opcode (0x5f; wire.py, node-dcp's, may name it OP_DCP_SYSTEM_EVENT)
SYSTEM_EVENT = int(Opcode.DCP_SYSTEM_EVENT)
ROLLBACK = 0x100

# -- field positions: every reader of an event tuple indexes it with these ---------------------
# (plain int constants, not a NamedTuple: the session builds millions of these tuples and a
# tuple is the cheapest thing to build and to index)

#: every event
EV_KIND = 0
EV_VBUCKET = 1
#: a record (MUTATION, DELETION, EXPIRATION); for deletions and expirations EV_FLAGS is 0
#: and EV_EXPIRY holds the delete time
EV_SEQNO = 2
EV_REV_SEQNO = 3
EV_CAS = 4
EV_FLAGS = 5
EV_EXPIRY = 6
EV_DATATYPE = 7
EV_KEY = 8
EV_VALUE = 9
#: the number of fields of a record
RECORD_FIELDS = 10
#: SNAPSHOT
EV_SNAP_START = 2
EV_SNAP_END = 3
EV_SNAP_FLAGS = 4
#: STREAM_OPEN (EV_OPEN_POSITION is present when the session knows the position requested)
EV_OPEN_FAILOVER_LOG = 2
EV_OPEN_POSITION = 3
#: STREAM_END
EV_END_REASON = 2
EV_END_RETRYING = 3
#: ROLLBACK
EV_ROLLBACK_SEQNO = 2
EV_ROLLBACK_INFO = 3
#: SEQNO_ADVANCED
EV_ADVANCED_SEQNO = 2
#: SYSTEM_EVENT (a dcptool.protocol.collections.SystemEvent; its seqno is the event's)
EV_SYSTEM_EVENT = 2
#: VBUCKET_STATE (the opaque the answer must carry)
EV_STATE = 2
EV_STATE_OPAQUE = 3

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
    SYSTEM_EVENT: "system_event",
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
