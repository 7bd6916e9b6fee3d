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
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import schema, writer
from rmq_spark.ledger.storage import describe, storage_options
from rmq_spark.ledger.writer import read_stream, run_intents_dir, run_partition_dir, run_rows_dir
from rmq_spark.spark_session import spark_has_delta

log = logging.getLogger(__name__)


def table_path(ledger_path: str, table: str) -> str:
    return str(Path(ledger_path) / table)


def ensure_tables(ledger_path: str) -> None:
    """Create any missing ledger table; fails with one clear error if the path is unusable."""
    root = Path(ledger_path)
    expected = "expected a directory this user can create and write files in"
    if root.exists() and not root.is_dir():
        raise LedgerError(f"ledger.path {ledger_path}: {expected}, found a file")
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".rmq-spark-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise LedgerError(
            f"ledger.path {ledger_path}: {expected}; {exc.strerror} ({exc.filename})"
        ) from exc
    options = storage_options(str(root))
    if options:
        log.info(
            "ledger %s is on storage without hard links (FUSE): delta-rs commits with %s; "
            "run one job at a time on this ledger",
            ledger_path,
            describe(options),
        )
    for name, columns in schema.TABLES.items():
        path = table_path(ledger_path, name)
        try:
            try:
                DeltaTable(path, storage_options=storage_options(path))
            except TableNotFoundError:
                DeltaTable.create(
                    path,
                    storage_options=storage_options(path),
                    schema=schema.arrow_schema(columns),
                    partition_by=schema.PARTITION_BY[name] or None,
                    mode="ignore",
                )
        except (DeltaError, OSError) as exc:
            raise LedgerError(
                f"ledger table {path}: expected a Delta table or nothing there, "
                f"could not open or create it ({exc})"
            ) from exc


def commit_run(ledger_path: str, run_id: str) -> int:
    """Add the run's durable, not yet committed message files to the Delta log.

    One commit for the whole run. Idempotent: files already in the log are skipped,
    so it is safe after a crash and on a re-run. Returns the rows committed.
    First, rows streams left by tasks that died become data files, then intents
    that never got a row (the process died between publishing and writing) become
    uncertain rows, so every publish has a row.
    """
    path = table_path(ledger_path, "messages")
    table = DeltaTable(path, storage_options=storage_options(path))
    partition = run_partition_dir(ledger_path, run_id)
    rows_from_streams(ledger_path, run_id)
    rows_from_intents(ledger_path, run_id)
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


def rows_from_streams(ledger_path: str, run_id: str) -> int:
    """Turn the rows streams of transfers whose task died into data files.

    A transfer that ended converted its own; what is left was durable (and maybe
    acked) when its task died. Idempotent. Returns the rows written.
    """
    streams_dir = run_rows_dir(ledger_path, run_id)
    if not streams_dir.is_dir():
        return 0
    partition = run_partition_dir(ledger_path, run_id)
    partition.mkdir(parents=True, exist_ok=True)
    return sum(
        writer.stream_to_data_file(stream, partition)
        for stream in sorted(streams_dir.glob(f"part-*{writer.STREAM_SUFFIX}"))
    )


def rows_from_intents(ledger_path: str, run_id: str) -> int:
    """Write an uncertain row for every logged intent whose position has no row.

    Such a delivery was published (or about to be) when its task died: it may be in
    the destination, and the source will redeliver it. Idempotent. Returns the rows
    written.
    """
    intents_dir = run_intents_dir(ledger_path, run_id)
    if not intents_dir.is_dir():
        return 0
    partition = run_partition_dir(ledger_path, run_id)
    partition.mkdir(parents=True, exist_ok=True)
    by_transfer: dict[str, list[pa.Table]] = {}
    for intent_file in sorted(intents_dir.glob("part-*.arrows")):
        prefix = intent_file.name[: len("part-") + 17]  # "part-<16 hex>-"
        by_transfer.setdefault(prefix, []).append(read_stream(intent_file))
    written = 0
    for prefix, intents in by_transfer.items():
        logged = pa.concat_tables(intents)
        present: set[int] = set()
        for data_file in partition.glob(f"{prefix}*.parquet"):
            present.update(pq.read_table(data_file, columns=["position"])["position"].to_pylist())
        missing = pc.invert(
            pc.is_in(logged["position"], value_set=pa.array(sorted(present), pa.int64()))
        )
        orphans = logged.filter(missing)
        # A position is logged twice only by a crash mid-retry of a nack; keep one row.
        first_of_each: dict[int, int] = {}
        for index, position in enumerate(orphans["position"].to_pylist()):
            first_of_each.setdefault(position, index)
        orphans = orphans.take(pa.array(sorted(first_of_each.values()), pa.int64()))
        if orphans.num_rows:
            orphans = orphans.select(writer.DATA_SCHEMA.names).cast(writer.DATA_SCHEMA)
            writer.write_data_file(
                partition, f"{prefix}intents-{uuid.uuid4().hex}.parquet", orphans
            )
            written += orphans.num_rows
            log.warning(
                "run %s: %d publish(es) of %s were logged but never confirmed (their task "
                "died); written as uncertain rows",
                run_id,
                orphans.num_rows,
                prefix,
            )
    return written


def append_rows(ledger_path: str, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append a few rows (runs, queues) to a ledger table."""
    if not rows:
        return
    arrow_schema = schema.arrow_schema(schema.TABLES[table])
    data = pa.Table.from_pylist([dict(row) for row in rows], schema=arrow_schema)
    path = table_path(ledger_path, table)
    # merge: a ledger made before a nullable column was added (runs.rabbitmq_versions)
    # gains it on its next append instead of refusing the row.
    write_deltalake(
        path, data, mode="append", schema_mode="merge", storage_options=storage_options(path)
    )


def read_table(spark: SparkSession, ledger_path: str, table: str) -> DataFrame:
    """A ledger table as a Spark DataFrame, with Spark's Delta reader when it has one."""
    path = table_path(ledger_path, table)
    if spark_has_delta(spark):
        return spark.read.format("delta").load(path)
    spark_schema = schema.spark_schema(schema.TABLES[table])
    try:
        files = DeltaTable(path, storage_options=storage_options(path)).file_uris()
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


def arrow_dataset(ledger_path: str, table: str, run_id: str | None = None) -> ds.Dataset:
    """A ledger table's current snapshot (or one run's part of it) as a pyarrow dataset.

    delta-rs lists the snapshot's data files and pyarrow reads them; these tables are
    append-only, without deletion vectors or column mapping, so the files are the
    snapshot (as in `read_table`). Not `DeltaTable.to_pyarrow_table`: with deltalake
    1.6 and pyarrow 26 the interpreter sometimes aborts at exit after it ("terminate
    called without an active exception", exit 134).
    """
    path = table_path(ledger_path, table)
    partition_columns = schema.PARTITION_BY[table]
    try:
        files = DeltaTable(path, storage_options=storage_options(path)).file_uris(
            partition_filters=[("run_id", "=", run_id)]
            if run_id is not None and "run_id" in partition_columns
            else None
        )
    except TableNotFoundError as exc:
        raise LedgerError(
            f"ledger table {path} does not exist: expected the ledger of an rmq-spark run "
            f"(tables {', '.join(schema.TABLES)}) at {ledger_path}"
        ) from exc
    except (DeltaError, OSError) as exc:
        raise LedgerError(f"ledger table {path}: could not read it ({exc})") from exc
    arrow = schema.arrow_schema(schema.TABLES[table])
    partitioning = (
        ds.partitioning(pa.schema([arrow.field(n) for n in partition_columns]), flavor="hive")
        if partition_columns
        else None
    )
    return ds.dataset(
        files,
        schema=arrow,
        format="parquet",
        partitioning=partitioning,
        partition_base_dir=path,
    )


def read_arrow(
    ledger_path: str,
    table: str,
    *,
    run_id: str | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """A ledger table (or one run's rows of it) as an Arrow table, without Spark.

    >>> read_arrow(".demo/ledger", "runs").to_pandas()  # doctest: +SKIP
    """
    return arrow_dataset(ledger_path, table, run_id).to_table(
        columns=list(columns) if columns is not None else None,
        filter=ds.field("run_id") == run_id if run_id is not None else None,
    )


def read_rows(ledger_path: str, table: str, run_id: str) -> list[dict[str, Any]]:
    """A run's rows of a small ledger table (runs, queues, plans); none if it is missing."""
    try:
        rows: list[dict[str, Any]] = read_arrow(ledger_path, table, run_id=run_id).to_pylist()
    except LedgerError:
        return []
    return rows
