"""A failed Spark task reaches the driver as text; the dcptool error raised inside it comes
back as a typed TaskFailed carrying its cause (no search for module names)."""
from __future__ import annotations

import pickle
import traceback

import pytest

from dcptool.archive.errors import CorruptFileError
from dcptool.client.errors import StreamError
from dcptool.pipeline.tasks import TaskError, TaskFailed, reporting_failures, task_failure


def _as_spark_reports_it(fn, arg) -> Exception:
    """Run a task body as a Spark executor would and return the driver's view of the
    failure: an exception holding only the traceback's text."""
    try:
        reporting_failures(fn)(arg)
    except Exception:
        return RuntimeError("An exception was thrown from the Python worker.\n"
                            + traceback.format_exc() + "\n\tat org.apache.spark...\n")
    raise AssertionError("the task did not fail")


def _fails_with(err):
    def task(_arg):
        raise err
    return task


def test_a_dcptool_error_comes_back_typed_with_its_message():
    exc = _as_spark_reports_it(_fails_with(StreamError("vbucket 3: could not resume\nmore")), 0)
    err = task_failure(exc, "backup task", "rerun it")
    assert isinstance(err, TaskFailed)
    assert err.message == "backup task failed: vbucket 3: could not resume"
    assert err.hint == "rerun it"
    assert err.cause_type == "dcptool.client.errors.StreamError"
    assert err.cause_message == "vbucket 3: could not resume"


def test_an_archive_error_names_its_file():
    exc = _as_spark_reports_it(_fails_with(CorruptFileError("/a/b.mpk.zst", "bad frame",
                                                            offset=12)), 0)
    err = task_failure(exc, "restore task", "rerun it")
    assert err.message == "restore task failed: /a/b.mpk.zst at byte 12: bad frame"
    assert err.cause_type == "dcptool.archive.errors.CorruptFileError"


def test_other_failures_report_the_last_line():
    exc = _as_spark_reports_it(_fails_with(ZeroDivisionError("division by zero")), 0)
    err = task_failure(exc, "merge task", "h")
    assert err.cause_type is None
    assert err.message == "merge task failed: \tat org.apache.spark..."
    plain = task_failure(ValueError("one\ntwo\n"), "verify task", None)
    assert plain.message == "verify task failed: two" and plain.hint is None


def test_a_task_error_raised_in_this_process_and_pickled():
    with pytest.raises(TaskError) as info:
        reporting_failures(_fails_with(StreamError("gone")))(None)
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.cause_type, again.message) == ("dcptool.client.errors.StreamError", "gone")
    err = task_failure(again, "backup task", "h")
    assert err.message == "backup task failed: gone"


def test_a_successful_task_returns_its_value():
    assert reporting_failures(lambda x: x + 1)(1) == 2
