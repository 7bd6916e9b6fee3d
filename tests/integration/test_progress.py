"""Live progress while the job runs: structured log lines when not on a terminal, bars
when RMQ_SPARK_TERMINAL says a terminal is at the end of the pipe."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from rmq_spark.config import load_config
from rmq_spark.pipeline import run_transfer
from rmq_spark.progress import TERMINAL_ENV
from tests.support.brokers import Brokers, fresh_vhost, seed, write_config


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


@pytest.mark.usefixtures("password_env")
def test_progress_bars_are_drawn_when_a_terminal_is_announced(
    brokers: Brokers,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What spark-submit.sh exports on a terminal; the driver's stderr here is pytest's
    # capture, no tty, as under spark-submit.
    monkeypatch.setenv(TERMINAL_ENV, "1")
    monkeypatch.setenv("COLUMNS", "120")
    vhost = fresh_vhost(brokers, "progress-bars")
    for queue in ("a", "b"):
        seed(brokers.dr, vhost, queue, 1500)
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger")
    )

    result = run_transfer(spark, config, run_id="progress-bars-1")

    assert result.verification.verified
    err = capsys.readouterr().err
    assert "\x1b[1A" in err, "the bars were not redrawn in place"
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)
    *_, last_frame = plain.split("\r")
    counts = {
        line.split()[0]: line.split()[2]
        for line in last_frame.strip().splitlines()
        if line.split()[0] in ("total", f"dr/{vhost}/a", f"dr/{vhost}/b")
    }
    assert counts == {
        "total": "3000/3000",
        f"dr/{vhost}/a": "1500/1500",
        f"dr/{vhost}/b": "1500/1500",
    }
    assert all(len(line) <= 120 for line in plain.splitlines())
    assert "progress moved=" not in err  # bars instead of log lines, not both
