"""The Spark-Delta committer's parts, with real local Spark (which has no Delta jars here:
Maven Central is unreachable). Everything up to the DataFrameWriter's `format("delta")`
runs for real: the choice of committer, the rows handed to the writer (the same rows the
delta-rs path commits) and the writer call with its options and partitioning."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from rmq_spark.ledger import schema, tables
from rmq_spark.ledger.committers import (
    DELTA_RS,
    ROWS_WRITE,
    CommitKey,
    commit_app_id,
    committer_for,
    message_rows_frame,
    messages_write,
    rows_frame,
)
from rmq_spark.ledger.durable import stream_to_data_file
from rmq_spark.ledger.layout import STREAM_SUFFIX, run_partition_dir
from rmq_spark.ledger.writer import IntentLog, MessageLedgerWriter
from rmq_spark.model import Delivery, TransferKey
from rmq_spark.spark_session import spark_has_delta

KEY = TransferKey("dr", "/", "orders", "main", "/", "orders")
OTHER = TransferKey("dr", "b", "billing", "main", "b", "billing")
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 0, 0, 1, 250_000, tzinfo=UTC)
MESSAGE_COLUMNS = [c.name for c in schema.MESSAGES]


def delivery(position: int, *, confirmed: bool = True) -> Delivery:
    return Delivery(
        tag=position + 1,
        seq=position + 7,
        position=position,
        redelivered=position == 1,
        body_size=position * 100,
        body_sha256=f"body-{position}",
        properties_sha256=f"props-{position % 2}",
        message_id=None if position == 0 else f"m{position}",
        consumed_at=T0,
        confirmed_at=T1 if confirmed else None,
        session=position % 2,
        attempts=1,
    )


def executor_ledger(ledger: Path) -> None:
    """Rows as executors leave them: a finished transfer, a dead task's rows stream
    and its unconfirmed intents (which commit turns into uncertain rows)."""
    tables.ensure_tables(str(ledger))
    finished = MessageLedgerWriter(str(ledger), "r1", KEY, "1.0.0")
    finished.write([delivery(p) for p in range(3)])
    finished.close()
    intents = IntentLog(str(ledger), "r1", OTHER, "1.1.0")
    intents.append([delivery(p, confirmed=False) for p in range(4)])
    intents.close(finished=False)
    MessageLedgerWriter(str(ledger), "r1", OTHER, "1.1.0").write([delivery(0), delivery(1)])


def in_utc(row: dict[str, Any]) -> dict[str, Any]:
    """Spark collects timestamps as naive local times, Arrow as aware UTC ones."""
    return {
        name: value.astimezone(UTC) if isinstance(value, datetime) else value
        for name, value in row.items()
    }


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(map(in_utc, rows), key=lambda row: (row["source_queue"], row["position"]))


def test_without_delta_jars_the_session_commits_with_delta_rs(
    spark: SparkSession, tmp_path: Path
) -> None:
    assert not spark_has_delta(spark)
    assert committer_for(spark) is DELTA_RS
    # The premise: this session cannot write Delta itself.
    frame = spark.createDataFrame([], schema.spark_schema(schema.MESSAGES))
    with pytest.raises(Py4JJavaError, match=r"DATA_SOURCE_NOT_FOUND.*delta"):
        messages_write(CommitKey(commit_app_id("r1"), 0)).save(frame, str(tmp_path / "t"))


def test_the_rows_handed_to_sparks_writer_are_those_delta_rs_commits(
    spark: SparkSession, tmp_path: Path
) -> None:
    executor_ledger(tmp_path / "spark")
    shutil.copytree(tmp_path / "spark", tmp_path / "delta-rs")
    handed: list[tuple[list[Path], CommitKey]] = []

    class HandedToSpark:
        """The Spark committer up to its write: what `add_data_files` would save."""

        name = "handed to Spark"

        def add_data_files(
            self, table_path: str, run_id: str, files: Sequence[Path], key: CommitKey
        ) -> None:
            handed.append((list(files), key))

        def append(self, table_path: str, table: str, rows: object) -> None:
            raise AssertionError("not called by commit_run")

    committed_rows = tables.commit_run(str(tmp_path / "spark"), "r1", HandedToSpark())
    assert tables.commit_run(str(tmp_path / "delta-rs"), "r1") == committed_rows == 7

    ((files, key),) = handed
    frame = message_rows_frame(spark, "r1", files)
    assert frame.columns == MESSAGE_COLUMNS
    assert [f.dataType for f in frame.schema.fields] == [
        f.dataType for f in schema.spark_schema(schema.MESSAGES).fields
    ]
    by_spark = ordered([row.asDict() for row in frame.collect()])
    by_delta_rs = ordered(tables.read_arrow(str(tmp_path / "delta-rs"), "messages").to_pylist())
    assert by_spark == by_delta_rs
    assert [row["confirmed_at"] is None for row in by_spark].count(True) == 2  # uncertain
    assert key == CommitKey("rmq-spark/messages/r1", 0)


def test_the_writer_call_saves_the_run_partition(spark: SparkSession, tmp_path: Path) -> None:
    executor_ledger(tmp_path)
    tables.rows_from_streams(str(tmp_path), "r1")
    partition = run_partition_dir(str(tmp_path), "r1")
    # Spark reads Parquet: the finished transfer's stream as the commit's compaction
    # would hand it over, a data file.
    for finished in partition.glob(f"part-*{STREAM_SUFFIX}"):
        stream_to_data_file(finished, partition)
    files = sorted(partition.glob("part-*.parquet"))
    frame = message_rows_frame(spark, "r1", files)
    # The same DataFrameWriter call as the Delta commit, in a format this Spark has.
    write = dataclasses.replace(messages_write(CommitKey(commit_app_id("r1"), 0)), format="parquet")

    write.save(frame, str(tmp_path / "out"))
    write.save(frame, str(tmp_path / "out"))  # append: parquet has no txn to skip it

    assert [p.name for p in (tmp_path / "out").glob("run_id=*")] == ["run_id=r1"]
    saved = spark.read.parquet(str(tmp_path / "out")).select(*MESSAGE_COLUMNS)
    assert saved.count() == 2 * frame.count() == 10


def test_a_runs_row_reaches_spark_with_the_merged_column(
    spark: SparkSession, tmp_path: Path
) -> None:
    versions = json.dumps({"dr": "4.3.6", "main": "4.0.5"})
    row = {
        "run_id": "r1",
        "started_at": T0,
        "finished_at": T1,
        "config_digest": "c",
        "spark_app_id": "app",
        "queues": 2,
        "messages": 5,
        "bytes": 500,
        "lost": 0,
        "duplicates": 1,
        "unexpected": 0,
        "verified": True,
        "seconds": 1.25,
        "verification_path": "v",
        "rabbitmq_versions": versions,
    }
    captured = []

    class Capture:
        name = "capture"

        def append(self, table_path: str, table: str, rows: Any) -> None:
            captured.append(rows_frame(spark, table, rows))

    tables.append_rows(str(tmp_path), "runs", [row], Capture())  # type: ignore[arg-type]

    (frame,) = captured
    assert frame.columns == [c.name for c in schema.RUNS]
    assert [in_utc(r.asDict()) for r in frame.collect()] == [row]
    write = dataclasses.replace(ROWS_WRITE, format="parquet")
    write.save(frame, str(tmp_path / "runs-out"))
    saved = spark.read.parquet(str(tmp_path / "runs-out")).collect()
    assert [r["rabbitmq_versions"] for r in saved] == [versions]
