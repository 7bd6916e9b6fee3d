"""Executor pre-flight on local Spark: the probe tasks' sentinels round-trip."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from rmq_spark.errors import ConfigError, LedgerNotSharedError
from rmq_spark.partition_tasks import run_tasks
from rmq_spark.pipeline import PreparedRun, probe_beside
from rmq_spark.planning.executor_preflight import SENTINEL_DIR, check_executors, probe_tasks
from tests.support.faults import wait_until


def test_local_executors_share_the_ledger_and_leave_no_sentinel(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()

    check_executors(spark, str(ledger))

    assert probe_tasks(spark) >= 2  # local[2,4]: one task per core
    assert list(ledger.iterdir()) == []


def test_a_ledger_path_the_executors_cannot_write_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    ledger.write_text("a file where the ledger directory should be")

    with pytest.raises(LedgerNotSharedError) as raised:
        check_executors(spark, str(ledger))

    assert f"ledger.path {ledger}: the executor on host" in str(raised.value)
    assert "cannot write under it (NotADirectoryError" in str(raised.value)
    assert str(ledger / SENTINEL_DIR) in str(raised.value)  # where it tried


def prepared_run() -> PreparedRun:
    return PreparedRun(datetime.now(UTC), 0.0, [], [])


def test_the_probe_beside_the_pre_flight_returns_the_pre_flight(
    spark: SparkSession, tmp_path: Path
) -> None:
    done = prepared_run()
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert probe_beside(spark, str(tmp_path / "ledger"), pool.submit(lambda: done)) is done


def test_the_pre_flight_error_comes_before_the_probe_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    ledger.write_text("a file where the ledger directory should be")

    def refused() -> PreparedRun:
        raise ConfigError("ledger.path: found a file")

    with ThreadPoolExecutor(max_workers=1) as pool, pytest.raises(ConfigError):
        probe_beside(spark, str(ledger), pool.submit(refused))
    with ThreadPoolExecutor(max_workers=1) as pool, pytest.raises(LedgerNotSharedError):
        probe_beside(spark, str(ledger), pool.submit(prepared_run))


@pytest.mark.parametrize("fails", ["while the probe's task runs", "before the probe's job starts"])
def test_a_pre_flight_that_fails_meanwhile_cancels_the_probe(
    fails: str, spark: SparkSession, tmp_path: Path
) -> None:
    """A probe whose task cannot finish for STUCK_SECONDS is cancelled as soon as the
    pre-flight fails, and the pre-flight's error is raised. "before": the failure comes
    between the probe's start and its job's submission, which one cancellation misses."""
    started = tmp_path / "probe-started"
    probing, refused = threading.Event(), threading.Event()

    def stuck_probe(session: SparkSession, ledger_path: str) -> None:
        probing.set()
        if fails.startswith("before"):
            assert refused.wait(60), "the pre-flight did not fail"
        run_tasks(session, 1, partial(_stuck_task, started), pa.schema([("i", pa.int64())]))

    def refused_pre_flight() -> PreparedRun:
        assert probing.wait(60), "the probe did not start"
        if fails.startswith("while"):
            wait_until(started.exists, timeout=120, what="the probe's task to start")
        refused.set()
        raise ConfigError("cluster dr: the username or password was refused")

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool, pytest.raises(ConfigError):
        probe_beside(spark, str(tmp_path), pool.submit(refused_pre_flight), stuck_probe)

    assert time.monotonic() - began < STUCK_SECONDS / 3
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


STUCK_SECONDS = 120


def _stuck_task(started: Path, indices: object) -> list[dict[str, int]]:
    started.touch()
    time.sleep(STUCK_SECONDS)  # the task that never ends in time (cancelled, it is killed)
    return [{"i": 0}]
