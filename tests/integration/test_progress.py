"""Live progress while the job runs: structured log lines when not on a terminal."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmq_spark.config import load_config
from rmq_spark.pipeline import run_transfer
from tests.integration.support import Brokers, fresh_vhost, seed, write_config


def test_progress_is_logged_and_ends_at_the_total(
    brokers: Brokers,
    password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    vhost = fresh_vhost(brokers, "progress")
    for queue in ("a", "b"):
        seed(brokers.dr, vhost, queue, 1500)
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger")
    )

    with caplog.at_level(logging.INFO, logger="rmq_spark.progress"):
        result = run_transfer(spark, config, run_id="progress-1")

    assert result.verification.verified
    lines = [r.getMessage() for r in caplog.records if r.name == "rmq_spark.progress"]
    assert lines, "no progress line was logged"
    assert lines[-1].startswith("progress moved=3000/3000 queues_done=2/2 rate=")
