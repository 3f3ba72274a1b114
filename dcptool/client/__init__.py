"""The DCP client: a blocking connection and a DCP consumer session.

`client/` knows nothing of archives. See `dcptool.client.connection` for the
connection and `dcptool.client.session` for the sans-I/O consumer session.
"""
from .connection import (
    DEFAULT_FEATURES,
    DEFAULT_PORT,
    DEFAULT_TLS_PORT,
    Connection,
    parse_cluster_url,
    raise_for_status,
)
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

__all__ = [
    "Connection", "parse_cluster_url", "raise_for_status", "DEFAULT_FEATURES", "DEFAULT_PORT",
    "DEFAULT_TLS_PORT", "AuthenticationError", "ClientError", "ClientTimeout", "ConnectError",
    "ConnectionClosed", "NotMyVbucketError", "ProtocolViolation", "RequestFailed", "RollbackError",
    "StateFileError", "StreamError", "UnknownBucketError",
]
