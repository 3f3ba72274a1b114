"""Failures of Spark tasks, carried to the driver as typed errors.

Spark hands the driver a failed task's traceback as text only, and that text ends in the
JVM's stack frames. A task body therefore runs under `reporting_failures`: an exception
raised inside (a DcptoolError, an OSError such as a full disk, anything else) becomes a
`TaskError` whose text is one line holding the error's class, message, hint, exit code and
errno as JSON. The driver's `task_failure` decodes that line back into a `TaskFailed`
carrying the cause. A failure outside the task body (a Python worker that cannot start, say)
is reported by the Python exception its traceback ends with, never by a Java frame.
"""
from __future__ import annotations

import functools
import json
import re
from errno import ENOSPC
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

    def __init__(self, cause_type: str, message: str, hint: str | None, exit_code: int,
                 errno: int | None = None):
        self.cause_type = cause_type
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        self.errno = errno
        super().__init__(MARK + json.dumps({"type": cause_type, "message": message,
                                            "hint": hint, "exit_code": exit_code,
                                            "errno": errno}))

    def __reduce__(self):
        return (TaskError, (self.cause_type, self.message, self.hint, self.exit_code,
                            self.errno))

    @classmethod
    def of(cls, err: BaseException) -> "TaskError":
        name = f"{type(err).__module__}.{type(err).__qualname__}"
        if isinstance(err, DcptoolError):
            return cls(name, err.message, err.hint, err.exit_code)
        if isinstance(err, OSError):
            return cls(name, os_message(err), None, 1, err.errno)
        return cls(name, f"{type(err).__name__}: {err}" if str(err) else type(err).__name__,
                   None, 1)


def os_message(err: OSError) -> str:
    """An OSError as one line: "No space left on device: PATH"."""
    what = err.strerror or str(err) or type(err).__name__
    return f"{what}: {err.filename}" if err.filename is not None else what


class TaskFailed(DcptoolError):
    """A Spark task failed; `cause_type` names the error raised in the task (None when it
    was not a dcptool error) and `cause_message` is that error's own message."""

    def __init__(self, message: str, *, hint: str | None, cause_type: str | None,
                 cause_message: str, errno: int | None = None):
        super().__init__(message, hint=hint)
        self.cause_type = cause_type
        self.cause_message = cause_message
        self.errno = errno


def reporting_failures(fn: Callable[[T], R]) -> Callable[[T], R]:
    """Wrap a task body so that any exception leaves it as a TaskError (a KeyboardInterrupt
    or a SystemExit leaves as it is)."""

    @functools.wraps(fn)
    def run(*args: Any) -> R:
        try:
            return fn(*args)
        except TaskError:
            raise
        except Exception as err:  # noqa: BLE001 - its cause goes to the driver, typed
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


#: a line of a JVM stack trace, or of the summaries around one
_JAVA_LINE = re.compile(r"\s+at \S|\s*\.\.\. \d+ more$|\s*Caused by: |\s*Suppressed: ")


#: how a traceback names one of dcptool's error classes
_DCPTOOL_CLASS = re.compile(r"^dcptool(?:\.\w+)+: ")


def python_cause(text: str) -> str | None:
    """The exception line a Python traceback inside `text` ends with (Spark puts a worker's
    traceback between the JVM's lines), or None when `text` holds no Python traceback."""
    lines = text.splitlines()
    start = max((i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln),
                default=-1)
    if start < 0:
        return None
    for ln in lines[start + 1:]:
        if ln.strip() and not ln.startswith((" ", "\t")):  # not a frame, its source, a caret
            # a dcptool error's message says it all: without its class's name
            return _DCPTOOL_CLASS.sub("", ln.strip(), count=1)
    return None


def last_line(text: str) -> str | None:
    """The last line of `text` that is not a JVM stack frame."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not _JAVA_LINE.match(ln)]
    return lines[-1].strip() if lines else None


def _hint_for(doc: dict[str, Any], hint: str | None) -> str | None:
    if doc.get("errno") == ENOSPC:
        return "free some space; " + hint if hint else "free some space and run it again"
    return hint


def task_failure(exc: BaseException, what: str, hint: str | None) -> TaskFailed:
    """The one-line error for a failed task (`what`: "backup task", ...): the exception
    raised inside it (its message, for a dcptool error or an OSError; its class and message
    for any other), else the Python exception its traceback ends with, else the last line of
    the failure's text that is not a JVM stack frame."""
    if isinstance(exc, TaskError):
        doc: dict[str, Any] | None = {"type": exc.cause_type, "message": exc.message,
                                      "errno": exc.errno}
    else:
        doc = _decode(str(exc))
    if doc is not None:
        msg = str(doc.get("message") or "").splitlines()
        cause = msg[0] if msg else str(doc.get("type"))
        if doc.get("type") == _PRIVILEGE_ERROR:
            # a missing privilege is the whole story: rerunning does not help
            return TaskFailed(cause, hint=None, cause_type=doc.get("type"), cause_message=cause)
        return TaskFailed(f"{what} failed: {cause}", hint=_hint_for(doc, hint),
                          cause_type=doc.get("type"), cause_message=cause,
                          errno=doc.get("errno"))
    text = str(exc)
    last = python_cause(text) or last_line(text) or type(exc).__name__
    return TaskFailed(f"{what} failed: {last[:300]}", hint=hint, cause_type=None,
                      cause_message=last)


__all__ = ["TaskError", "TaskFailed", "last_line", "os_message", "python_cause",
           "reporting_failures", "task_failure"]
