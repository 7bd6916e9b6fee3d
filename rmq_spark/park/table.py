"""Driver side: the `parked` Delta table in the ledger (create, commit a run, read).

Executors stage each parked batch as a Parquet file (`transfer/parked_rows.py` says why
in two steps); at the commit, after the ledger's `messages` commit, each transfer's
staged files are completed in groups of up to 64 MiB into the run partition's data
files, in Spark tasks (`completed_in_tasks`; `transfer/parked_completion.py`), and the
driver adds the run's data files to the Delta log by reference with delta-rs, in one
commit per call. The staged files, all held by data files then, are removed.

**Partitioned by `run_id` alone.** A park is the unit of replay (`--parked RUN_ID`) and
of retention (a run's rows are dropped together), so a reader prunes to one run by its
directory; within a run, each data file holds one transfer's rows in position order,
so Parquet's row-group statistics on `source_queue` and `position` let Spark, DuckDB and
polars skip the rest. Source queues are not a partition column: RabbitMQ allows any
character in queue and vhost names (`/`, `=`, `%`, non-ASCII), which Hive-style
partition directories must escape, and readers disagree on how they unescape them.

Idempotent: a data file already in the log is never added again, and a staged file a
data file holds (its footer says which) is never completed again, so a driver that died
between the messages commit and this one (or part way through it) commits the rest on
its re-run.
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
import pyarrow.parquet as pq
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
    complete_groups,
    complete_partition,
    group_staged,
    staged_names_of,
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


#: Completes groups of a run's staged files into its data files (`complete_groups`' rows).
Completer = Callable[[Sequence[Sequence[str]]], list[dict[str, Any]]]


def completed_in_tasks(
    spark: SparkSession, ledger_path: str, ledger_store: StoreOptions | None, run_id: str
) -> Completer:
    """A completer of the run's groups of staged files in Spark tasks, as many as the
    executors offer cores (a one-queue park's groups too), the groups dealt
    round-robin: the decoding, about 70 us a message, runs on every core at once."""

    def complete(found: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
        tasks = min(default_parallelism(spark), len(found))
        task = partial(
            complete_partition,
            groups=[list(found[index::tasks]) for index in range(tasks)],
            ledger_path=ledger_path,
            ledger_store=ledger_store,
            run_id=run_id,
        )
        return run_tasks(spark, tasks, task, COMPLETED_SCHEMA)

    return complete


def commit_parked(ledger_path: str, run_id: str, complete: Completer | None = None) -> int:
    """Complete the run's staged files no data file holds yet (`complete`: in this
    process by default), add its data files not yet in the log in one commit, then
    remove the staged files (all held now); the rows added."""
    path = table_path(ledger_path)
    table = DeltaTable(path, storage_options=storage_options(path))
    partition = run_partition(ledger_path, run_id)
    staged = [
        (entry, size)
        for entry, size in store.sized_entries(staged_partition(ledger_path, run_id))
        if entry.name.endswith(".parquet") and not entry.name.startswith(TEMP_PREFIX)
    ]
    footers = _footers(partition)
    held = _staged_held(footers)
    pending = group_staged([(entry.name, size) for entry, size in staged if entry.name not in held])
    if pending:
        (complete or partial(complete_groups, ledger_path, run_id))(pending)
        footers = _footers(partition)  # with the data files just completed
        # The staged files are the acked messages' only copy: removed below only once
        # a data file holds each of them.
        unheld = sorted({name for group in pending for name in group} - _staged_held(footers))
        if unheld:
            raise LedgerError(
                f"ledger {partition}: the completion left {len(unheld)} staged file(s) in "
                f"no data file (the first: {unheld[0]}); they are kept, and the next "
                "commit of the run completes them"
            )
    in_log = {
        unquote(uri).rsplit("/", 1)[-1]
        for uri in table.file_uris(partition_filters=[("run_id", "=", run_id)])
    }
    rows = _add_data_files(table, footers, run_id, in_log)
    _remove_staged([entry for entry, _ in staged])
    return rows


def _footers(partition: Any) -> dict[Any, pq.FileMetaData]:
    """The run partition's data files (in the log or not yet), each with its footer."""
    return {
        entry: store.read_metadata(entry)
        for entry in sorted(store.entries(partition))
        if entry.name.endswith(".parquet") and not entry.name.startswith(TEMP_PREFIX)
    }


def _staged_held(footers: dict[Any, pq.FileMetaData]) -> set[str]:
    """The staged files these data files hold, from their footers."""
    return {
        name for entry, footer in footers.items() for name in staged_names_of(footer, entry.name)
    }


def _remove_staged(staged: list[Any]) -> None:
    """Remove staged files once the log holds their data files (all of them, now). Not
    fsynced: one a crash brings back is in the log, so the next commit removes it."""
    for entry in staged:
        entry.unlink(missing_ok=True)
    if staged and not isinstance(staged[0], store.StorePath):
        # Kept while it holds anything else: a killed write's temporary file, say.
        with contextlib.suppress(OSError):
            staged[0].parent.rmdir()


def _add_data_files(
    table: DeltaTable, footers: dict[Any, pq.FileMetaData], run_id: str, in_log: set[str]
) -> int:
    """Add the data files not in the log, in one commit; their rows."""
    pending = [entry for entry in footers if entry.name not in in_log]
    if not pending:
        return 0
    app_id = f"rmq-spark/parked/{run_id}"
    version = (table.transaction_version(app_id) or 0) + 1
    actions: list[AddAction | RemoveAction] = []
    rows = 0
    for file in pending:
        stat = file.stat()
        count = int(footers[file].num_rows)
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
