"""Typed errors that carry what a user needs to act; the CLI turns them into one line."""
from __future__ import annotations


class DcptoolError(Exception):
    """A failure to report to the user as one line (no traceback).

    `exit_code` is the process exit status the CLI uses; `hint` is an optional second
    sentence telling the user what to do.
    """

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UsageError(DcptoolError):
    """Bad arguments or input given by the user."""

    exit_code = 2


class Interrupted(DcptoolError):
    """Ctrl-C ended the run; the message says what it left (a partial backup, say)."""

    exit_code = 130


_interrupted = [False]


def mark_interrupted() -> None:
    """Ctrl-C reached this process: whatever error follows is a consequence of it (a Spark
    job's lost connection to its killed JVM, a task's refused connection, ...)."""
    _interrupted[0] = True


def was_interrupted() -> bool:
    """Whether Ctrl-C reached this process (see mark_interrupted)."""
    return _interrupted[0]
