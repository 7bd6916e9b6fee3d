"""Session-wide fixtures: one local Spark per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from rmq_spark.spark_session import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(
        "rmq-spark-tests",
        master="local[2,4]",  # ",4": failed tasks are retried, as on a cluster
        extra_conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
    )
    yield session
    session.stop()
