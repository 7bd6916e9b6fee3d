"""Executor pre-flight on local Spark: the probe tasks' sentinels round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmq_spark.errors import LedgerNotSharedError
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
