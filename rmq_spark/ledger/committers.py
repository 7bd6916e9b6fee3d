"""The last step of a driver's ledger write: turning chosen rows into one Delta commit.

Two committers do it. `DeltaRsCommitter` (delta-rs, no JVM jars) adds the executors'
Parquet data files to the log by reference. `SparkDeltaCommitter` hands the same rows
to Spark's own Delta writer, which copies them into files of its own; it is chosen when
the running session has Delta's classes (every Databricks runtime, `--packages`), so
that commits go through the storage layer Spark's Delta is built for (on Databricks,
the volume's object storage rather than its FUSE mount).

What a commit holds is decided in `tables` for both: which data files (and so which
rows), the idempotency key (`CommitKey`), the schema and the table path. A committer
only writes it, so the Spark path, which cannot run here without Delta's jars, is
these few lines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import AddAction, RemoveAction

from rmq_spark.ledger import schema, store
from rmq_spark.ledger.layout import DATA_COLUMNS
from rmq_spark.ledger.storage import storage_options
from rmq_spark.spark_session import spark_has_delta

if TYPE_CHECKING:  # Spark's writer is chosen only when a session exists
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

MESSAGES_PARTITION_BY = tuple(schema.PARTITION_BY["messages"])


@dataclass(frozen=True)
class CommitKey:
    """Delta's idempotency key of one commit: its SetTransaction (app id, version).

    Recorded in the commit itself; a commit whose version is not above the table's
    recorded version for its app id has already happened.
    """

    app_id: str
    version: int


def commit_app_id(run_id: str) -> str:
    """The app id under which a run's message commits are numbered (one per run)."""
    return f"rmq-spark/messages/{run_id}"


class DeltaCommitter(Protocol):
    """Writes one Delta commit to a ledger table."""

    name: str

    def add_data_files(
        self, table_path: str, run_id: str, files: Sequence[Path], key: CommitKey
    ) -> None:
        """Commit these data files' rows of `run_id` to the messages table, carrying `key`."""

    def append(self, table_path: str, table: str, rows: pa.Table) -> None:
        """Append a few rows (runs, queues, plans), merging in columns the table lacks."""


class DeltaRsCommitter:
    """delta-rs: the executors' data files are added to the log as they are."""

    name = "delta-rs"

    def add_data_files(
        self, table_path: str, run_id: str, files: Sequence[Path], key: CommitKey
    ) -> None:
        table = DeltaTable(table_path, storage_options=storage_options(table_path))
        actions: list[AddAction | RemoveAction] = []
        for file in files:
            stat = file.stat()
            actions.append(
                AddAction(
                    path=f"run_id={run_id}/{file.name}",
                    size=stat.st_size,
                    partition_values={"run_id": run_id},
                    modification_time=int(stat.st_mtime * 1000),
                    data_change=True,
                    stats=json.dumps({"numRecords": store.read_metadata(file).num_rows}),
                )
            )
        table.create_write_transaction(
            actions,
            mode="append",
            schema=schema.arrow_schema(schema.MESSAGES),
            partition_by=list(MESSAGES_PARTITION_BY),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(key.app_id, key.version)]
            ),
        )

    def append(self, table_path: str, table: str, rows: pa.Table) -> None:
        # merge: a ledger made before a nullable column was added (runs.rabbitmq_versions)
        # gains it on its next append instead of refusing the row.
        write_deltalake(
            table_path,
            rows,
            mode="append",
            schema_mode="merge",
            storage_options=storage_options(table_path),
        )


DELTA_RS = DeltaRsCommitter()


@dataclass(frozen=True)
class SparkDeltaWrite:
    """How Spark's DataFrameWriter is called for one commit: the only Delta-specific
    step of the Spark path, kept as data so the call is checked without Delta's jars."""

    mode: str
    options: Mapping[str, str] = field(default_factory=dict)
    partition_by: tuple[str, ...] = ()
    format: str = "delta"

    def save(self, frame: DataFrame, path: str) -> None:
        writer = frame.write.format(self.format).mode(self.mode).options(**self.options)
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(path)


def messages_write(key: CommitKey) -> SparkDeltaWrite:
    """Delta's idempotent write: skipped inside the transaction if the table already
    records `key.version` (or a later one) for `key.app_id`."""
    return SparkDeltaWrite(
        mode="append",
        options={"txnAppId": key.app_id, "txnVersion": str(key.version)},
        partition_by=MESSAGES_PARTITION_BY,
    )


# Delta's schema evolution on append, as delta-rs' schema_mode="merge".
ROWS_WRITE = SparkDeltaWrite(mode="append", options={"mergeSchema": "true"})


def message_rows_frame(spark: SparkSession, run_id: str, files: Sequence[Path]) -> DataFrame:
    """The rows of these executor data files, with their run id, in the messages
    table's column order: what the delta-rs path's commit makes the table hold."""
    from pyspark.sql import functions as F

    if not files:
        return spark.createDataFrame([], schema.spark_schema(schema.MESSAGES))
    data = spark.read.schema(schema.spark_schema(DATA_COLUMNS)).parquet(*map(str, files))
    return data.select(
        *[
            F.lit(run_id).alias(c.name) if c.name == "run_id" else F.col(c.name)
            for c in schema.MESSAGES
        ]
    )


def rows_frame(spark: SparkSession, table: str, rows: pa.Table) -> DataFrame:
    """Rows built for delta-rs (`rows` has the table's Arrow schema) as a DataFrame."""
    return spark.createDataFrame(rows, schema.spark_schema(schema.TABLES[table]))


class SparkDeltaCommitter:
    """Spark's own Delta writer: the rows are copied into files Spark writes."""

    name = "Spark's Delta writer"

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark

    def add_data_files(
        self, table_path: str, run_id: str, files: Sequence[Path], key: CommitKey
    ) -> None:
        messages_write(key).save(message_rows_frame(self._spark, run_id, files), table_path)

    def append(self, table_path: str, table: str, rows: pa.Table) -> None:
        ROWS_WRITE.save(rows_frame(self._spark, table, rows), table_path)


def committer_for(spark: SparkSession | None) -> DeltaCommitter:
    """Spark's Delta writer when this session has Delta's classes, else delta-rs."""
    if spark is not None and spark_has_delta(spark):
        return SparkDeltaCommitter(spark)
    return DELTA_RS
