"""Typed client errors. Each carries what a user needs to act: host, user, bucket, vbucket, seqno.

The CLI prints `str(exc)` as one line; library callers can catch the specific class.
Passwords never appear in any message.
"""
from __future__ import annotations

from dcptool.errors import DcptoolError


class ClientError(DcptoolError):
    """Any failure talking to a node."""

    def __init__(self, message: str, *, host: str | None = None, hint: str | None = None,
                 exit_code: int | None = None) -> None:
        super().__init__(message, hint=hint, exit_code=exit_code)
        self.host = host


class ConnectError(ClientError):
    """The node could not be reached: unknown host, connection refused, TLS failure."""


class ConnectionClosed(ClientError):
    """The node closed the connection (or it broke) while we were talking to it."""


class ClientTimeout(ClientError):
    """Nothing arrived from the node within the allowed time."""


class AuthenticationError(ClientError):
    """The node refused the login."""

    def __init__(self, message: str, *, host: str | None = None, username: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, host=host, hint=hint)
        self.username = username


class UnknownBucketError(ClientError):
    """SELECT_BUCKET named a bucket the node does not have (or the user may not use)."""

    def __init__(self, message: str, *, host: str | None = None, bucket: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(message, host=host, hint=hint)
        self.bucket = bucket


class NotMyVbucketError(ClientError):
    """The node does not hold (an active or replica copy of) this vbucket."""

    def __init__(self, message: str, *, host: str | None = None, vbucket: int | None = None,
                 config: bytes = b"") -> None:
        super().__init__(message, host=host)
        self.vbucket = vbucket
        #: the cluster map JSON the node may attach to the response
        self.config = config


class ProtocolViolation(ClientError):
    """The node sent something the protocol does not allow (or we cannot decode)."""


class RequestFailed(ClientError):
    """A request got an error status that has no more specific class."""

    def __init__(self, message: str, *, host: str | None = None, status: int | None = None,
                 opcode: int | None = None, vbucket: int | None = None) -> None:
        super().__init__(message, host=host)
        self.status = status
        self.opcode = opcode
        self.vbucket = vbucket


class StreamError(ClientError):
    """A vbucket stream could not be opened or ended in a way the caller must hear about."""

    def __init__(self, message: str, *, host: str | None = None, vbucket: int | None = None,
                 seqno: int | None = None, status: int | None = None,
                 reason: int | None = None) -> None:
        super().__init__(message, host=host)
        self.vbucket = vbucket
        self.seqno = seqno
        self.status = status
        self.reason = reason


class RollbackError(StreamError):
    """The node asked for a rollback and the session was told not to roll back."""


class StateFileError(ClientError):
    """A session state file cannot be read or written."""
