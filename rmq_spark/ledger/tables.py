"""Driver side: the ledger's Delta tables (runs, queues, messages).

Written with deltalake (delta-rs), which needs no JVM jars; read as Spark
DataFrames. When Spark has Delta's own reader (Databricks, --packages), it reads
the tables itself; otherwise the driver asks delta-rs for the snapshot's data
files and Spark reads those Parquet files, which for these append-only tables
(no deletion vectors, no column mapping) is the same snapshot.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import schema
from rmq_spark.ledger.writer import run_partition_dir
from rmq_spark.spark_session import spark_has_delta

log = logging.getLogger(__name__)


def table_path(ledger_path: str, table: str) -> str:
    return str(Path(ledger_path) / table)


def ensure_tables(ledger_path: str) -> None:
    """Create any missing ledger table; fails with one clear error if the path is unusable."""
    root = Path(ledger_path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".rmq-spark-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise LedgerError(f"ledger path {ledger_path}: not writable ({exc.strerror})") from exc
    for name, columns in schema.TABLES.items():
        path = table_path(ledger_path, name)
        try:
            DeltaTable(path)
        except TableNotFoundError:
            DeltaTable.create(
                path,
                schema=schema.arrow_schema(columns),
                partition_by=schema.PARTITION_BY[name] or None,
                mode="ignore",
            )


def commit_run(ledger_path: str, run_id: str) -> int:
    """Add the run's durable, not yet committed message files to the Delta log.

    One commit for the whole run. Idempotent: files already in the log are skipped,
    so it is safe after a crash and on a re-run. Returns the rows committed.
    """
    path = table_path(ledger_path, "messages")
    table = DeltaTable(path)
    partition = run_partition_dir(ledger_path, run_id)
    if not partition.is_dir():
        return 0
    committed = {unquote(uri).rsplit("/", 1)[-1] for uri in _files_of_run(table, run_id)}
    actions: list[AddAction | RemoveAction] = []
    rows = 0
    for file in sorted(partition.glob("part-*.parquet")):
        if file.name in committed:
            continue
        metadata = pq.read_metadata(file)
        stat = file.stat()
        actions.append(
            AddAction(
                path=f"run_id={run_id}/{file.name}",
                size=stat.st_size,
                partition_values={"run_id": run_id},
                modification_time=int(stat.st_mtime * 1000),
                data_change=True,
                stats=json.dumps({"numRecords": metadata.num_rows}),
            )
        )
        rows += metadata.num_rows
    if actions:
        table.create_write_transaction(
            actions,
            mode="append",
            schema=schema.arrow_schema(schema.MESSAGES),
            partition_by=["run_id"],
        )
        log.info("committed %d ledger files (%d rows) of run %s", len(actions), rows, run_id)
    return rows


def append_rows(ledger_path: str, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append a few rows (runs, queues) to a ledger table."""
    if not rows:
        return
    arrow_schema = schema.arrow_schema(schema.TABLES[table])
    data = pa.Table.from_pylist([dict(row) for row in rows], schema=arrow_schema)
    write_deltalake(table_path(ledger_path, table), data, mode="append")


def read_table(spark: SparkSession, ledger_path: str, table: str) -> DataFrame:
    """A ledger table as a Spark DataFrame, with Spark's Delta reader when it has one."""
    path = table_path(ledger_path, table)
    if spark_has_delta(spark):
        return spark.read.format("delta").load(path)
    spark_schema = schema.spark_schema(schema.TABLES[table])
    try:
        files = DeltaTable(path).file_uris()
    except TableNotFoundError as exc:
        raise LedgerError(f"ledger table {path} does not exist") from exc
    if not files:
        return spark.createDataFrame([], spark_schema)
    reader = spark.read.schema(spark_schema)
    if schema.PARTITION_BY[table]:
        reader = reader.option("basePath", path)
    return reader.parquet(*files).select(*[c.name for c in schema.TABLES[table]])


def read_run_messages(spark: SparkSession, ledger_path: str, run_id: str) -> DataFrame:
    from pyspark.sql import functions as F

    return read_table(spark, ledger_path, "messages").where(F.col("run_id") == run_id)


def _files_of_run(table: DeltaTable, run_id: str) -> list[str]:
    return table.file_uris(partition_filters=[("run_id", "=", run_id)])
