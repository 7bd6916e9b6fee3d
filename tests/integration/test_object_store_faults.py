"""The fault subset with the ledger on S3 (moto's server, `devtools.s3_server`): a
connection closed on both sides mid-window, and an executor's Python worker SIGKILLed
mid-job. The scenarios are the fault matrix's own (`tests/support/fault_scenarios.py`);
only the ledger block differs, so every row, intent and commit is an object. Each ends
with nothing lost, every destination copy accounted for by a ledger row, and the
duplicates named and bounded by the window.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from tests.support.brokers import Brokers
from tests.support.fault_scenarios import close_connections_mid_window, kill_a_worker_mid_job


def test_connections_closed_mid_window_on_an_s3_ledger_lose_nothing(
    brokers: Brokers, password_env: str, tmp_path: Path, s3_ledger: dict[str, object]
) -> None:
    close_connections_mid_window(brokers, tmp_path, ("dr", "main"), ledger=s3_ledger)


def test_a_killed_executor_worker_on_an_s3_ledger_is_retried_without_loss(
    brokers: Brokers,
    password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    s3_ledger: dict[str, object],
) -> None:
    kill_a_worker_mid_job(
        brokers,
        tmp_path,
        spark,
        run_id="s3-sigkill",
        ledger=s3_ledger,
    )
