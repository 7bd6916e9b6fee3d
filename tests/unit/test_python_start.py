"""An executor Python that cannot start becomes one line naming it and the cause."""

from __future__ import annotations

from rmq_spark.errors import ExecutorEnvironmentError
from rmq_spark.planning.python_start import python_start_error

# The shape of PySpark's Py4JJavaError text for a probe whose interpreter is missing.
STAGE_FAILURE = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 0.0 "
    "failed 4 times, most recent failure: Lost task 1.3 in stage 0.0 (TID 7) (10.0.0.7 executor 2)"
    ': java.io.IOException: Cannot run program "./environment/bin/python" (in directory '
    '"/yarn/nm/usercache/etl/appcache/application_1/container_1_01_000002"): error=2, '
    "No such file or directory\n"
    "\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)\n"
)


def test_a_missing_interpreter_is_named_with_its_host_and_cause() -> None:
    error = python_start_error(STAGE_FAILURE)

    assert isinstance(error, ExecutorEnvironmentError)
    assert str(error).startswith(
        "the executors' Python ./environment/bin/python cannot start on host 10.0.0.7 "
        "(executor 2): No such file or directory (error=2); ship "
    )
    assert "\n" not in str(error)


def test_a_python_without_its_shared_libraries_is_named() -> None:
    text = (
        "Python worker exited unexpectedly: ./environment/bin/python3.11: error while loading "
        "shared libraries: libssl.so.3: cannot open shared object file: No such file or directory"
    )

    error = python_start_error(RuntimeError(text))

    assert error is not None
    assert str(error).startswith(
        "the executors' Python ./environment/bin/python3.11 cannot start: error while loading "
        "shared libraries: libssl.so.3: cannot open shared object file"
    )


def test_a_permission_problem_keeps_its_own_cause() -> None:
    text = 'java.io.IOException: Cannot run program "python3": error=13, Permission denied'

    error = python_start_error(text)

    assert error is not None
    assert "Python python3 cannot start: Permission denied (error=13)" in str(error)


def test_other_failures_are_not_classified() -> None:
    assert python_start_error("Job aborted: Task failed: ConnectionResetError") is None
    assert python_start_error("") is None
