"""Failures of Spark tasks, carried to the driver as typed errors.

Spark hands the driver a failed task's traceback as text only. A task body therefore runs
under `reporting_failures`: a DcptoolError raised inside becomes a `TaskError` whose text
is one line holding the error's class, message, hint and exit code as JSON. The driver's
`task_failure` decodes that line back into a `TaskFailed` carrying the cause; any other
exception is reported by the last line of its text.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Callable, TypeVar

from dcptool.client.privileges import PrivilegeError
from dcptool.errors import DcptoolError

#: PrivilegeError's name as a TaskError carries it
_PRIVILEGE_ERROR = f"{PrivilegeError.__module__}.{PrivilegeError.__qualname__}"
#: the start of a TaskError's text; what follows on the line is its JSON
MARK = "dcptool-task-error "

T = TypeVar("T")
R = TypeVar("R")


class TaskError(Exception):
    """Raised by a task for a DcptoolError: its text encodes the cause for the driver."""

    def __init__(self, cause_type: str, message: str, hint: str | None, exit_code: int):
        self.cause_type = cause_type
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        super().__init__(MARK + json.dumps({"type": cause_type, "message": message,
                                            "hint": hint, "exit_code": exit_code}))

    def __reduce__(self):
        return (TaskError, (self.cause_type, self.message, self.hint, self.exit_code))

    @classmethod
    def of(cls, err: DcptoolError) -> "TaskError":
        return cls(f"{type(err).__module__}.{type(err).__qualname__}", err.message, err.hint,
                   err.exit_code)


class TaskFailed(DcptoolError):
    """A Spark task failed; `cause_type` names the error raised in the task (None when it
    was not a dcptool error) and `cause_message` is that error's own message."""

    def __init__(self, message: str, *, hint: str | None, cause_type: str | None,
                 cause_message: str):
        super().__init__(message, hint=hint)
        self.cause_type = cause_type
        self.cause_message = cause_message


def reporting_failures(fn: Callable[[T], R]) -> Callable[[T], R]:
    """Wrap a task body so that a DcptoolError leaves it as a TaskError."""

    @functools.wraps(fn)
    def run(arg: T) -> R:
        try:
            return fn(arg)
        except DcptoolError as err:
            raise TaskError.of(err) from err

    return run


def _decode(text: str) -> dict[str, Any] | None:
    idx = text.rfind(MARK)
    if idx < 0:
        return None
    try:
        doc, _end = json.JSONDecoder().raw_decode(text, idx + len(MARK))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def task_failure(exc: BaseException, what: str, hint: str) -> TaskFailed:
    """The one-line error for a failed task (`what`: "backup task", ...): the dcptool error
    raised inside it when there was one, else the last line of the failure's text."""
    if isinstance(exc, TaskError):
        doc: dict[str, Any] | None = {"type": exc.cause_type, "message": exc.message}
    else:
        doc = _decode(str(exc))
    if doc is not None:
        msg = str(doc.get("message") or "").splitlines()
        cause = msg[0] if msg else str(doc.get("type"))
        if doc.get("type") == _PRIVILEGE_ERROR:
            # a missing privilege is the whole story: rerunning does not help
            return TaskFailed(cause, hint=None, cause_type=doc.get("type"), cause_message=cause)
        return TaskFailed(f"{what} failed: {cause}", hint=hint, cause_type=doc.get("type"),
                          cause_message=cause)
    lines = [line for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else type(exc).__name__
    return TaskFailed(f"{what} failed: {last[:300]}", hint=hint, cause_type=None,
                      cause_message=last)


__all__ = ["TaskError", "TaskFailed", "reporting_failures", "task_failure"]
