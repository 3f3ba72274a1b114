"""A failed Spark task reaches the driver as text; the dcptool error raised inside it comes
back as a typed TaskFailed carrying its cause (no search for module names)."""
from __future__ import annotations

import errno
import os
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


def test_an_os_error_comes_back_with_its_file_and_errno():
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/arch/b1/vb-0003.seg")
    exc = _as_spark_reports_it(_fails_with(full), 0)
    err = task_failure(exc, "backup task", "the partial backup is kept")
    assert err.message == "backup task failed: No space left on device: /arch/b1/vb-0003.seg"
    assert err.hint == "free some space; the partial backup is kept"
    assert err.cause_type == "builtins.OSError" and err.errno == errno.ENOSPC
    assert "java" not in err.message


def test_other_exceptions_come_back_with_their_class_and_message():
    exc = _as_spark_reports_it(_fails_with(ZeroDivisionError("division by zero")), 0)
    err = task_failure(exc, "merge task", "h")
    assert err.cause_type == "builtins.ZeroDivisionError"
    assert err.message == "merge task failed: ZeroDivisionError: division by zero"
    plain = task_failure(ValueError("one\ntwo\n"), "verify task", None)
    assert plain.message == "verify task failed: two" and plain.hint is None


#: what the driver gets when a Python worker fails before the task body runs (abridged from
#: a real run: a worker that imported another package named dcptool)
WORKER_FAILED = """An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) (127.0.0.1 executor driver): org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/usr/lib/python3/pyspark/worker.py", line 1100, in main
    func, profiler, deserializer, serializer = read_command(pickleSer, infile)
                                               ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'dcptool.pipeline'

	at org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:572)
	at org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:784)
	... 1 more
Driver stacktrace:
	at org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2856)
	at java.base/java.lang.Thread.run(Thread.java:840)
"""


def test_a_worker_failure_is_named_by_its_python_exception_not_a_java_frame():
    err = task_failure(RuntimeError(WORKER_FAILED), "backup task", "h")
    assert err.message == "backup task failed: ModuleNotFoundError: No module named 'dcptool.pipeline'"
    java_only = task_failure(RuntimeError("org.x.SparkException: lost\n\tat java.base/a.b(C.java:1)\n"
                                          "\t... 3 more\n"), "export", None)
    assert java_only.message == "export failed: org.x.SparkException: lost"


def test_a_task_error_raised_in_this_process_and_pickled():
    with pytest.raises(TaskError) as info:
        reporting_failures(_fails_with(StreamError("gone")))(None)
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.cause_type, again.message) == ("dcptool.client.errors.StreamError", "gone")
    err = task_failure(again, "backup task", "h")
    assert err.message == "backup task failed: gone"


def test_a_successful_task_returns_its_value():
    assert reporting_failures(lambda x: x + 1)(1) == 2
