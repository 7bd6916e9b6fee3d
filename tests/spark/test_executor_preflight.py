"""Executor pre-flight on local Spark: the probe tasks' sentinels round-trip."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmq_spark.errors import ConfigError, LedgerNotSharedError
from rmq_spark.pipeline import PreparedRun, probe_beside
from rmq_spark.planning.executor_preflight import SENTINEL_DIR, check_executors, probe_tasks


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
