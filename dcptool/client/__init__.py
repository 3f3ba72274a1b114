"""The DCP client: a blocking connection and a DCP consumer session.

`client/` knows nothing of archives. The layers:

- `Connection` (connection.py): connect, HELLO, SASL, SELECT_BUCKET, request/response.
- `DcpSession` (session.py): the sans-I/O consumer state machine (streams, flow control,
  NOOP, rollback, re-requests); bytes in, event tuples out (events.py).
- `DcpConsumer` (consumer.py): the blocking driver of a session over a connection.
- `Position` (position.py): the resumable offset of a vbucket; `SessionState`
  (state.py): positions as an atomically written JSON file.
- `get_failover_logs`, `get_vbucket_seqnos`, `latest_positions`,
  `get_collections_manifest` (ops.py).
"""
from .connection import (
    DEFAULT_FEATURES,
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    Connection,
    parse_cluster_url,
    raise_for_status,
)
from .consumer import DcpConsumer
from .errors import (
    AuthenticationError,
    ClientError,
    ClientTimeout,
    ConnectError,
    ConnectionClosed,
    NotMyVbucketError,
    ProtocolViolation,
    RequestFailed,
    RollbackError,
    StateFileError,
    StreamError,
    UnknownBucketError,
)
from .events import (
    DELETION,
    EVENT_NAMES,
    EXPIRATION,
    MUTATION,
    RECORD_KINDS,
    ROLLBACK,
    SEQNO_ADVANCED,
    SNAPSHOT,
    STREAM_END,
    STREAM_OPEN,
    SYSTEM_EVENT,
    RollbackInfo,
)
from .ops import get_collections_manifest, get_failover_logs, get_vbucket_seqnos, latest_positions
from .position import ZERO, Position
from .session import DcpSession, SessionConfig
from .state import SessionState, load_state, save_state

__all__ = [
    "Connection", "parse_cluster_url", "raise_for_status", "DEFAULT_FEATURES", "DEFAULT_PORT",
    "DEFAULT_TLS_PORT", "DcpConsumer", "DcpSession", "SessionConfig", "Position", "ZERO",
    "SessionState", "load_state", "save_state", "get_failover_logs", "get_vbucket_seqnos",
    "latest_positions", "RollbackInfo", "MUTATION", "DELETION", "EXPIRATION", "SNAPSHOT",
    "STREAM_END", "STREAM_OPEN", "ROLLBACK", "SEQNO_ADVANCED", "SYSTEM_EVENT",
    "get_collections_manifest", "RECORD_KINDS", "EVENT_NAMES",
    "AuthenticationError", "ClientError", "ClientTimeout", "ConnectError", "ConnectionClosed",
    "NotMyVbucketError", "ProtocolViolation", "RequestFailed", "RollbackError",
    "StateFileError", "StreamError", "UnknownBucketError",
]
