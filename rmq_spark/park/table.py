"""Driver side: the `parked` Delta table in the ledger (create, commit a run, read).

Executors stage each parked batch as a Parquet file (`transfer/parked_rows.py` says why
in two steps); at the commit, after the ledger's `messages` commit, each staged file is
completed into the run partition's data file of the same name, in Spark tasks
(`completed_in_tasks`; `transfer/parked_completion.py`), and the driver adds the run's
data files to the Delta log by reference with delta-rs, in one commit per call. The
staged files the log then holds are removed.

**Partitioned by `run_id` alone.** A park is the unit of replay (`--parked RUN_ID`) and
of retention (a run's rows are dropped together), so a reader prunes to one run by its
directory; within a run, each data file holds one transfer's batch in position order,
so Parquet's row-group statistics on `source_queue` and `position` let Spark, DuckDB and
polars skip the rest. Source queues are not a partition column: RabbitMQ allows any
character in queue and vhost names (`/`, `=`, `%`, non-ASCII), which Hive-style
partition directories must escape, and readers disagree on how they unescape them.

Idempotent: a data file already in the log is never added again, nor completed again
from its staged file, so a driver that died between the messages commit and this one
(or part way through it) commits the rest on its re-run.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store
from rmq_spark.ledger.layout import TEMP_PREFIX
from rmq_spark.ledger.storage import storage_options
from rmq_spark.ledger.store import StoreOptions
from rmq_spark.partition_tasks import default_parallelism, run_tasks
from rmq_spark.transfer.parked_completion import (
    COMPLETED_SCHEMA,
    complete_files,
    complete_partition,
)
from rmq_spark.transfer.parked_rows import PARTITION_BY, SCHEMA, run_partition, staged_partition
from rmq_spark.transfer.parked_table import parked_files, table_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def ensure_parked_table(ledger_path: str) -> None:
    """Create the parked table if it is missing; one clear error if it cannot be."""
    path = table_path(ledger_path)
    try:
        try:
            found = DeltaTable(path, storage_options=storage_options(path))
        except TableNotFoundError:
            DeltaTable.create(
                path,
                storage_options=storage_options(path),
                schema=SCHEMA,
                partition_by=list(PARTITION_BY),
                mode="ignore",
            )
            return
    except (DeltaError, OSError) as exc:
        raise LedgerError(
            f"ledger table {path}: expected a Delta table or nothing there, could not open "
            f"or create it ({exc})"
        ) from exc
    schema = pa.schema(found.schema().to_arrow())  # type: ignore[arg-type]
    missing = [name for name in SCHEMA.names if name not in schema.names]
    if missing:
        raise LedgerError(
            f"ledger table {path}: expected the parked table's columns, found a table "
            f"without {', '.join(missing)} (another schema version?)"
        )


#: Completes the named staged files of a run into its data files (`complete_files`'s rows).
Completer = Callable[[Sequence[str]], list[dict[str, Any]]]


def completed_in_tasks(
    spark: SparkSession, ledger_path: str, ledger_store: StoreOptions | None, run_id: str
) -> Completer:
    """A completer of the run's staged files in Spark tasks, as many as the executors
    offer cores (a one-queue park's files too), the files dealt round-robin: the
    decoding, about 70 us a message, runs on every core at once."""

    def complete(names: Sequence[str]) -> list[dict[str, Any]]:
        tasks = min(default_parallelism(spark), len(names))
        groups = [list(names[index::tasks]) for index in range(tasks)]
        task = partial(
            complete_partition,
            groups=groups,
            ledger_path=ledger_path,
            ledger_store=ledger_store,
            run_id=run_id,
        )
        return run_tasks(spark, len(groups), task, COMPLETED_SCHEMA)

    return complete


def commit_parked(ledger_path: str, run_id: str, complete: Completer | None = None) -> int:
    """Complete the run's staged files not yet in the log (`complete`: in this process by
    default), add its data files not yet in the log in one commit, then remove the
    staged files the log holds; the rows added."""
    path = table_path(ledger_path)
    table = DeltaTable(path, storage_options=storage_options(path))
    partition = run_partition(ledger_path, run_id)
    staged = [
        entry
        for entry in store.entries(staged_partition(ledger_path, run_id))
        if entry.name.endswith(".parquet") and not entry.name.startswith(TEMP_PREFIX)
    ]
    in_log = {
        unquote(uri).rsplit("/", 1)[-1]
        for uri in table.file_uris(partition_filters=[("run_id", "=", run_id)])
    }
    to_complete = sorted(entry.name for entry in staged if entry.name not in in_log)
    if to_complete:
        (complete or partial(complete_files, ledger_path, run_id))(to_complete)
    rows = _add_data_files(table, partition, run_id, in_log)
    _remove_staged(staged)
    return rows


def _remove_staged(staged: list[Any]) -> None:
    """Remove staged files once the log holds their data files (all of them, now). Not
    fsynced: one a crash brings back is in the log, so the next commit removes it."""
    for entry in staged:
        entry.unlink(missing_ok=True)
    if staged and not isinstance(staged[0], store.StorePath):
        # Kept while it holds anything else: a killed write's temporary file, say.
        with contextlib.suppress(OSError):
            staged[0].parent.rmdir()


def _add_data_files(table: DeltaTable, partition: Any, run_id: str, in_log: set[str]) -> int:
    """Add the run partition's data files not in the log, in one commit; their rows."""
    if not partition.is_dir():
        return 0
    pending = sorted(
        entry
        for entry in store.entries(partition)
        if entry.name.endswith(".parquet")
        and not entry.name.startswith(TEMP_PREFIX)
        and entry.name not in in_log
    )
    if not pending:
        return 0
    app_id = f"rmq-spark/parked/{run_id}"
    version = (table.transaction_version(app_id) or 0) + 1
    actions: list[AddAction | RemoveAction] = []
    rows = 0
    for file in pending:
        stat = file.stat()
        count = int(store.read_metadata(file).num_rows)
        rows += count
        actions.append(
            AddAction(
                path=f"run_id={run_id}/{file.name}",
                size=stat.st_size,
                partition_values={"run_id": run_id},
                modification_time=int(stat.st_mtime * 1000),
                data_change=True,
                stats=json.dumps({"numRecords": count}),
            )
        )
    table.create_write_transaction(
        actions,
        mode="append",
        schema=SCHEMA,
        partition_by=list(PARTITION_BY),
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
    )
    log.info("committed %d parked files (%d rows) of run %s", len(actions), rows, run_id)
    return rows


def read_parked_spark(spark: SparkSession, ledger_path: str) -> DataFrame:
    """The parked table as a Spark DataFrame: Spark's Delta reader when the session has
    Delta's classes, else the snapshot's Parquet files (append-only: the same rows)."""
    from rmq_spark.spark_session import spark_has_delta

    path = table_path(ledger_path)
    if spark_has_delta(spark):
        return spark.read.format("delta").load(path)
    files = parked_files(ledger_path)
    if not files:
        raise LedgerError(f"ledger table {path} holds no parked rows yet")
    frame: DataFrame = spark.read.option("basePath", path).parquet(*files)
    return frame.select(*SCHEMA.names)
