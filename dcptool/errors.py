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
