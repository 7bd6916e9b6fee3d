"""Over Spark Connect the executors' pre-flight is an Arrow task: a server whose Python
lacks pyarrow fails it before any code of ours runs, and the pre-flight still says
what is missing (no Spark: the task failure is Spark Connect's error text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rmq_spark.errors import ExecutorEnvironmentError
from rmq_spark.partition_tasks import _rdd_task, missing_arrow
from rmq_spark.planning import executor_preflight

# The shape of a task failure whose Python worker lacks pyarrow: the worker's traceback
# inside Spark's message (not captured from a real server: see docs/deploying/spark-connect.md).
WORKER_WITHOUT_ARROW = (
    "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback "
    '(most recent call last):\n  File "pyspark/worker.py", line 3324, in main\n'
    "ModuleNotFoundError: No module named 'pyarrow'"
)


class TaskFailedError(Exception):
    """Stands in for pyspark's SparkConnectGrpcException / PythonException."""


def test_an_arrow_worker_without_pyarrow_is_told_apart() -> None:
    assert missing_arrow(TaskFailedError(WORKER_WITHOUT_ARROW))
    assert not missing_arrow(TaskFailedError("No module named 'pika'"))


def test_the_pre_flight_names_pyarrow_and_the_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def failing(*_: Any, **__: Any) -> Any:
        raise TaskFailedError(WORKER_WITHOUT_ARROW)

    monkeypatch.setattr(executor_preflight, "probe_tasks", lambda spark: 2)
    monkeypatch.setattr(executor_preflight, "run_tasks", failing)

    with pytest.raises(ExecutorEnvironmentError) as raised:
        executor_preflight.check_executors(object(), str(tmp_path))  # type: ignore[arg-type]

    assert "lacks the Python module(s) pyarrow" in str(raised.value)
    assert executor_preflight.ARCHIVE_HINT in str(raised.value)
    assert list(tmp_path.iterdir()) == []  # no sentinel left behind


def test_another_task_failure_is_not_taken_for_missing_pyarrow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def failing(*_: Any, **__: Any) -> Any:
        raise TaskFailedError("executor lost")

    monkeypatch.setattr(executor_preflight, "probe_tasks", lambda spark: 2)
    monkeypatch.setattr(executor_preflight, "run_tasks", failing)

    with pytest.raises(TaskFailedError):
        executor_preflight.check_executors(object(), str(tmp_path))  # type: ignore[arg-type]


def test_the_rdd_hook_hands_the_task_its_indices() -> None:
    rows = list(_rdd_task(iter([3]), task=lambda indices: [{"seen": list(indices)}]))
    assert rows == [{"seen": [3]}]
