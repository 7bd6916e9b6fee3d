"""Driver side: the ledger's Delta tables (runs, queues, messages, plans).

What each commit holds (which rows, its idempotency key, the schema) is decided here;
a committer (`committers`: delta-rs, which needs no JVM jars, or Spark's own Delta
writer when the session has Delta's classes) only writes it. Read as Spark
DataFrames. When Spark has Delta's own reader (Databricks, --packages), it reads
the tables itself; otherwise the driver asks delta-rs for the snapshot's data
files and Spark reads those Parquet files, which for these append-only tables
(no deletion vectors, no column mapping) is the same snapshot.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import compaction, durable, layout, resume, schema, store
from rmq_spark.ledger.committers import DELTA_RS, CommitKey, DeltaCommitter, commit_app_id
from rmq_spark.ledger.durable import read_stream
from rmq_spark.ledger.layout import run_intents_dir, run_partition_dir, run_rows_dir
from rmq_spark.ledger.storage import describe, open_table, storage_options
from rmq_spark.model import TransferKey
from rmq_spark.spark_session import spark_has_delta

if TYPE_CHECKING:  # the driver's Spark reads; `report` reads with delta-rs, without Spark
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


def table_path(ledger_path: str, table: str) -> str:
    return str(store.root(ledger_path) / table)


def ensure_tables(ledger_path: str) -> None:
    """Create any missing ledger table; fails with one clear error if the path is unusable."""
    if store.is_object_store(ledger_path):
        check_object_store(ledger_path)
        _create_tables(ledger_path)
        return
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
    _create_tables(ledger_path)


def check_object_store(ledger_path: str) -> None:
    """The driver can write, read back and remove an object under the ledger URI."""
    probe = store.StorePath(ledger_path) / f".rmq-spark-write-probe-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"rmq-spark")
        if probe.read_bytes() != b"rmq-spark":
            raise OSError("the object read back differs from the one written")
        probe.unlink()
    except OSError as exc:
        raise LedgerError(
            f"ledger.path {ledger_path}: expected an object store location this driver can "
            f"write, read and delete objects in ({store.describe_store(ledger_path)}); "
            f"writing {probe} failed: {exc}"
        ) from exc


def _create_tables(ledger_path: str) -> None:
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


def commit_run(ledger_path: str, run_id: str, committer: DeltaCommitter = DELTA_RS) -> int:
    """Commit the run's durable, not yet committed message rows to the Delta table.

    First, rows streams left by tasks that died become data files, then intents
    that never got a row (the process died between publishing and writing) become
    uncertain rows, so every publish has a row. Then the data files no commit holds
    yet are chosen, the small ones compacted into a few large files (`compaction`),
    and the choice written down as the run's next commit batch, committed in one
    Delta commit carrying the batch's `CommitKey`. Executor files a committed batch
    compacted are removed after the commit.

    Idempotent, with either committer: a batch is committed only if the table does
    not record its version yet (a driver that died between writing the batch and
    committing it has it committed now, under the same version), and a data file in
    a batch, or in the log (added by reference), is never chosen again. So it is safe
    after a crash and on a re-run (the kill points: `compaction`). Returns the rows
    committed.
    """
    path = table_path(ledger_path, "messages")
    table = DeltaTable(path, storage_options=storage_options(path))
    partition = run_partition_dir(ledger_path, run_id)
    batches = read_commit_batches(ledger_path, run_id)
    rows_from_streams(ledger_path, run_id, chosen=_chosen(batches))
    rows_from_intents(ledger_path, run_id)
    if not partition.is_dir():
        return 0
    # Compacted files of a driver that died before writing its batch: in no commit.
    compaction.remove(
        partition,
        [p.name for p in compaction.orphans(partition, _compacted(batches))],
    )
    app_id = commit_app_id(run_id)
    recorded = table.transaction_version(app_id)
    done = -1 if recorded is None else recorded
    in_log = {unquote(uri).rsplit("/", 1)[-1] for uri in _files_of_run(table, run_id)}
    rows = 0
    for batch in batches:
        if batch.version > done:
            log.warning(
                "run %s: commit batch %d was written but never committed (the driver "
                "stopped in between); committing it now",
                run_id,
                batch.version,
            )
            rows += _commit(committer, ledger_path, run_id, batch, in_log)
    chosen = in_log | _chosen(batches)
    sizes = {name: size for name, size in data_file_sizes(partition) if name not in chosen}
    pending = tuple(sizes)
    if pending:
        version = max([done, *(batch.version for batch in batches)]) + 1
        small = compaction.small_files(sizes)
        batch = CommitBatch(version, pending)
        # One small Parquet file is committed as it is; a finished stream never is.
        if len(small) > 1 or any(map(layout.is_finished_stream, small)):
            compacted = compaction.compact(partition, small, version, sizes=sizes)
            batch = CommitBatch(version, pending, compacted, tuple(small))
        write_commit_batch(ledger_path, run_id, batch)
        rows += _commit(committer, ledger_path, run_id, batch, in_log)
        batches.append(batch)
    # Every batch is committed now: the executor files compacted into them are copies.
    compaction.remove(partition, _chosen(batches, replaced_only=True))
    return rows


@dataclass(frozen=True)
class CommitBatch:
    """Data files of a run chosen for one commit, under one version of its CommitKey.

    Written durably before the commit: Spark's writer copies the rows into files of
    its own, so the Delta log cannot tell which executor files it already holds.
    `compacted` are files holding the rows of the executor files in `replaced`
    (a subset of `files`); the commit adds them instead of those.
    """

    version: int
    files: tuple[str, ...]
    compacted: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()

    @property
    def committed_files(self) -> tuple[str, ...]:
        """What the commit adds: the chosen files not compacted, and the compacted ones."""
        replaced = set(self.replaced)
        return tuple(name for name in self.files if name not in replaced) + self.compacted


def _chosen(batches: Sequence[CommitBatch], *, replaced_only: bool = False) -> set[str]:
    """Executor files some batch chose (or, `replaced_only`, compacted away)."""
    return {name for b in batches for name in (b.replaced if replaced_only else b.files)}


def _compacted(batches: Sequence[CommitBatch]) -> set[str]:
    return {name for batch in batches for name in batch.compacted}


def data_file_sizes(partition: Any) -> list[tuple[str, int]]:
    """The executors' data files in a run partition (not files Spark's writer made),
    sorted by name, with their sizes in bytes: one listing (on an object store, a
    request per thousand files)."""
    return sorted(
        (file.name, size)
        for file, size in store.sized_entries(partition)
        if layout.is_data_file(file.name)
    )


def commit_batches_dir(ledger_path: str, run_id: str) -> Any:
    return store.root(ledger_path) / "commits" / f"run_id={run_id}"


def read_commit_batches(ledger_path: str, run_id: str) -> list[CommitBatch]:
    directory = commit_batches_dir(ledger_path, run_id)
    batches = []
    for file in sorted(directory.glob("batch-*.json")) if directory.is_dir() else []:
        try:
            content = json.loads(file.read_text(encoding="utf-8"))
            batches.append(
                CommitBatch(
                    int(content["version"]),
                    tuple(content["files"]),
                    # Batches written before compaction name neither.
                    tuple(content.get("compacted", ())),
                    tuple(content.get("replaced", ())),
                )
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LedgerError(
                f"ledger commit batch {file}: expected JSON with a version and files ({exc}); "
                "it is written whole or not at all, so this file was changed by hand"
            ) from exc
    return sorted(batches, key=lambda batch: batch.version)


def write_commit_batch(ledger_path: str, run_id: str, batch: CommitBatch) -> None:
    directory = commit_batches_dir(ledger_path, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    content = {
        "version": batch.version,
        "files": list(batch.files),
        "compacted": list(batch.compacted),
        "replaced": list(batch.replaced),
    }
    durable.write_file(directory, f"batch-{batch.version:010d}.json", json.dumps(content).encode())


def _commit(
    committer: DeltaCommitter,
    ledger_path: str,
    run_id: str,
    batch: CommitBatch,
    in_log: set[str],
) -> int:
    partition = run_partition_dir(ledger_path, run_id)
    # A file the log already holds was added by reference (by delta-rs, after a batch
    # that Spark never committed): its rows are in the table.
    files = [partition / name for name in batch.committed_files if name not in in_log]
    rows = sum(int(store.read_metadata(file).num_rows) for file in files)
    key = CommitKey(commit_app_id(run_id), batch.version)
    committer.add_data_files(table_path(ledger_path, "messages"), run_id, files, key)
    log.info(
        "committed %d ledger files (%d rows, %d executor files compacted) of run %s with %s "
        "(batch %d)",
        len(files),
        rows,
        len(batch.replaced),
        run_id,
        committer.name,
        batch.version,
    )
    return rows


def rows_from_streams(ledger_path: str, run_id: str, *, chosen: Set[str] = frozenset()) -> int:
    """Turn the rows streams of transfers whose task died into data files.

    A transfer that ended converted its own or moved it into the run partition
    (`writer.MessageLedgerWriter.close`); what is left was durable (and maybe acked)
    when its task died. A stream whose data file, or whose finished self, a commit
    batch already chose is only removed: that file may be gone, compacted, and must not
    come back (a move into the partition that a crash undid is such a stream). A
    stream found both here and, finished, in the partition was being moved when a crash
    came on a file system that renames by copying (a FUSE mount: Databricks' volumes,
    blobfuse, s3fs): one copy is kept, the longer, since a torn copy is a prefix of the
    whole. Idempotent. Returns the rows written.
    """
    streams_dir = run_rows_dir(ledger_path, run_id)
    if not streams_dir.is_dir():
        return 0
    partition = run_partition_dir(ledger_path, run_id)
    partition.mkdir(parents=True, exist_ok=True)
    written = 0
    for stream in sorted(streams_dir.glob(f"part-*{layout.STREAM_SUFFIX}")):
        data_file = f"{stream.name.removesuffix(layout.STREAM_SUFFIX)}.parquet"
        finished = partition / stream.name
        if data_file in chosen or stream.name in chosen:
            stream.unlink()
        elif finished.exists():
            if finished.stat().st_size < stream.stat().st_size:
                os.replace(stream, finished)
            else:
                stream.unlink()
        else:
            written += durable.stream_to_data_file(stream, partition)
    return written


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
    # Grouped by the transfer the rows name, not by file prefix: an intent log written
    # by an earlier build carries the legacy prefix (TransferKey.legacy_file_prefix).
    by_transfer: dict[TransferKey, list[pa.Table]] = {}
    for intent_file in sorted(intents_dir.glob("part-*.arrows")):
        logged = read_stream(intent_file)
        for key in {TransferKey.of(row) for row in logged.select(layout.KEY_COLUMNS).to_pylist()}:
            by_transfer.setdefault(key, []).append(resume.rows_of(key, logged))
    written = 0
    compacted = resume.compacted_files(partition)
    for key, intents in by_transfer.items():
        logged = pa.concat_tables(intents)
        present = set(resume.compacted_positions(compacted, key)["position"].to_pylist())
        for prefix in layout.transfer_prefixes(key):
            # Its data files and, if it ended small, its finished stream.
            for file in partition.glob(f"{prefix}*"):
                if layout.is_data_file(file.name):
                    positions = resume.file_positions(file, key)
                    present.update(positions["position"].to_pylist())
        missing = pc.invert(
            pc.is_in(logged["position"], value_set=pa.array(sorted(present), pa.int64()))
        )
        orphans = logged.filter(missing)
        # A position is logged twice when a lost session withdrew it unsent and the next
        # session gave it again (`TransferWindow.next_position`): the later intent, in
        # log order within the attempt's one file, is the one that may have been sent.
        last_of_each: dict[int, int] = {}
        for index, position in enumerate(orphans["position"].to_pylist()):
            last_of_each[position] = index
        orphans = orphans.take(pa.array(sorted(last_of_each.values()), pa.int64()))
        if orphans.num_rows:
            orphans = orphans.select(layout.DATA_SCHEMA.names).cast(layout.DATA_SCHEMA)
            durable.write_data_file(
                partition, f"{key.file_prefix}intents-{uuid.uuid4().hex}.parquet", orphans
            )
            written += orphans.num_rows
            log.warning(
                "run %s: %d publish(es) of %s were logged but never confirmed (their task "
                "died); written as uncertain rows",
                run_id,
                orphans.num_rows,
                key.label(),
            )
    return written


def append_rows(
    ledger_path: str,
    table: str,
    rows: Sequence[Mapping[str, Any]],
    committer: DeltaCommitter = DELTA_RS,
) -> None:
    """Append a few rows (runs, queues, plans) to a ledger table, merging in a nullable
    column the table lacks (a ledger made before runs.rabbitmq_versions existed)."""
    if not rows:
        return
    arrow_schema = schema.arrow_schema(schema.TABLES[table])
    data = pa.Table.from_pylist([dict(row) for row in rows], schema=arrow_schema)
    committer.append(table_path(ledger_path, table), table, data)


def read_table(
    spark: SparkSession, ledger_path: str, table: str, *, run_id: str | None = None
) -> DataFrame:
    """A ledger table as a Spark DataFrame, with Spark's Delta reader when it has one.

    With `run_id`, the messages table's rows of that run only: without Delta's reader
    only the run's data files are listed and read (a partition filter on the Delta
    log), not every run's the ledger has kept.
    """
    from pyspark.sql import functions as F

    path = table_path(ledger_path, table)
    one_run = run_id is not None and "run_id" in schema.PARTITION_BY[table]
    if spark_has_delta(spark):
        frame = spark.read.format("delta").load(path)
        return frame.where(F.col("run_id") == F.lit(run_id)) if one_run else frame
    spark_schema = schema.spark_schema(schema.TABLES[table])
    if store.is_object_store(ledger_path):
        # Spark reads s3:// only with the cluster's Hadoop S3 connector, which a plain
        # pyspark lacks: the rows come through pyarrow instead (the driver's memory).
        rows = read_arrow(ledger_path, table, run_id=run_id if one_run else None)
        return spark.createDataFrame(rows, spark_schema)
    try:
        files = open_table(path).file_uris(
            partition_filters=[("run_id", "=", run_id)] if one_run else None
        )
    except TableNotFoundError as exc:
        raise LedgerError(f"ledger table {path} does not exist") from exc
    if not files:
        return spark.createDataFrame([], spark_schema)
    reader = spark.read.schema(spark_schema)
    if schema.PARTITION_BY[table]:
        reader = reader.option("basePath", path)
    frame = reader.parquet(*files).select(*[c.name for c in schema.TABLES[table]])
    return frame.where(F.col("run_id") == F.lit(run_id)) if one_run else frame


def read_run_messages(spark: SparkSession, ledger_path: str, run_id: str) -> DataFrame:
    """One run's rows of the messages table (`read_table` with `run_id`)."""
    return read_table(spark, ledger_path, "messages", run_id=run_id)


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
        files = open_table(path).file_uris(
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
    filesystem = None
    if store.is_object_store(ledger_path):  # s3://bucket/key -> bucket/key on its file system
        filesystem = store.filesystem_of(ledger_path)
        files = [store.StorePath(unquote(uri)).fs_path for uri in files]
        path = store.StorePath(path).fs_path
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
        filesystem=filesystem,
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
