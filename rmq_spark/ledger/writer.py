"""Executor side: make message rows durable before the source is acked.

Executors have no SparkSession, so rows go out through pyarrow. Each flush
appends the rows to the transfer's Arrow IPC stream and fsyncs it: once `write`
returns, the rows survive a crash of the process and of the machine. Streams
become Parquet data files in the messages table's run partition (written under a
temporary name, fsynced, renamed into place) every ROLL_ROWS rows and when a large
transfer ends; a small transfer's stream moves into the partition as it is (a
finished stream). Neither is in the Delta log yet; `tables.commit_run` turns
streams left by dead tasks into data files, compacts the small files and finished
streams, and adds every data file of a run in one commit (per run, not per window),
so a crashed task attempt's rows count too.

Before a batch of deliveries is published, its rows (without a confirm time) are
appended to an intent log and fsynced. If the process dies before the confirmed
rows are written, `tables.commit_run` turns the intents that have no row into
"uncertain" rows: a copy that reached the destination is then named, not silent.
"""

from __future__ import annotations

import operator
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from rmq_spark.arrow_columns import column as arrow_column
from rmq_spark.arrow_columns import repeated_text
from rmq_spark.errors import LedgerError
from rmq_spark.ledger import layout, removal
from rmq_spark.ledger.durable import fsync_dir, stream_to_data_file, write_data_file
from rmq_spark.ledger.layout import (
    DATA_SCHEMA,
    STREAM_SUFFIX,
    run_intents_dir,
    run_partition_dir,
    run_rows_dir,
)
from rmq_spark.ledger.store import StorePath
from rmq_spark.model import Delivery, TransferKey


def rows_table(key: TransferKey, task_attempt: str, deliveries: Sequence[Delivery]) -> pa.Table:
    """Ledger data-file rows (every MESSAGES column but run_id) for these deliveries.

    Called for every intent batch and every ledger flush, on the mover's CPU: one
    C-level pass reads the per-delivery fields, each column is built from buffers
    (`arrow_columns.column`: no pa.array, which would import pandas), and the columns
    that are the same on every row (the transfer key, the task attempt) are slices of
    cached arrays.
    """
    count = len(deliveries)
    constant = {
        "source_cluster": key.source_cluster,
        "source_vhost": key.source_vhost,
        "source_queue": key.source_queue,
        "destination_cluster": key.destination_cluster,
        "destination_vhost": key.destination_vhost,
        "destination_queue": key.destination_queue,
        "task_attempt": task_attempt,
    }
    # Transposed rows: one tuple per column (none at all when there are no rows).
    columns = list(zip(*map(_per_row_fields, deliveries), strict=True))
    per_row = dict(zip(_PER_ROW_COLUMNS, columns, strict=True)) if count else {}
    arrays = []
    for field in DATA_SCHEMA:
        if field.name in constant:
            arrays.append(_repeated(field, constant[field.name], count))
        else:
            arrays.append(arrow_column(field.type, per_row.get(field.name, ())))
    return pa.Table.from_arrays(arrays, schema=DATA_SCHEMA)


# Column name -> Delivery attribute, for the columns that differ from row to row.
_PER_ROW_ATTRIBUTES = {
    "position": "position",
    "publish_seq": "seq",
    "publish_attempts": "attempts",
    "redelivered": "redelivered",
    "body_size": "body_size",
    "body_sha256": "body_sha256",
    "properties_sha256": "properties_sha256",
    "message_id": "message_id",
    "consumed_at": "consumed_at",
    "confirmed_at": "confirmed_at",
    "session": "session",
    "decision": "decision",
    "publish_exchange": "publish_exchange",
    "publish_routing_key": "publish_routing_key",
    "reason": "reason",
}
_PER_ROW_COLUMNS = tuple(_PER_ROW_ATTRIBUTES)
_per_row_fields = operator.attrgetter(*_PER_ROW_ATTRIBUTES.values())
_REPEATED: dict[tuple[str, str], pa.Array] = {}


def _repeated(field: pa.Field, value: str, count: int) -> pa.Array:
    """`value` `count` times: a zero-copy slice of a cached array.

    A task moving many small queues meets new names at every transfer, so a miss must be
    cheap: the array is built by `repeated_text` (no pass over its copies) and only as
    long as the next power of two from 256 up (a transfer's batches grow to its window
    in a few rebuilds). Built from 4,096 Python copies it cost ~1.5 CPU-ms a transfer of
    5 messages, a tenth of the mover's whole cost of such a queue.
    """
    cached = _REPEATED.get((field.name, value))
    if cached is None or len(cached) < count:
        if len(_REPEATED) > 256:  # many transfers in one worker: keep it small
            _REPEATED.clear()
        size = 1 << max(count - 1, 255).bit_length()
        if field.type == pa.string():
            cached = repeated_text(value, size)
        else:
            cached = arrow_column(field.type, (value,) * size)
        _REPEATED[(field.name, value)] = cached
    return cached.slice(0, count)


class IntentLog:
    """Rows of deliveries about to be published, appended and fsynced per batch.

    One Arrow IPC stream file per transfer and task attempt, created with the first
    batch: a transfer that publishes nothing (an empty queue, a refused one) creates,
    fsyncs and removes no file. A batch torn by a crash is never read back: its
    deliveries were not published, since publishing waits for `append` to return.

    On an object store (no append there) each batch is one object of its own, a
    one-batch stream named after the log and the batch's number, so that listing the
    directory gives a log's batches in order.
    """

    def __init__(self, ledger_path: str, run_id: str, key: TransferKey, task_attempt: str) -> None:
        self._dir = run_intents_dir(ledger_path, run_id)
        self._key = key
        self._task_attempt = task_attempt
        self._file: BinaryIO | None = None
        self._stream: pa.ipc.RecordBatchStreamWriter | None = None
        self._objects: list[StorePath] = []  # an object store's batches written
        self._batches = 0  # an object store's batches numbered so far
        self._log_id = uuid.uuid4().hex
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(f"ledger {self._dir}: cannot start the intent log ({exc})") from exc

    def _open(self) -> tuple[BinaryIO, pa.ipc.RecordBatchStreamWriter]:
        try:
            name = f"{self._key.file_prefix}{self._task_attempt}-{uuid.uuid4().hex}.arrows"
            file = open(self._dir / name, "wb")  # noqa: SIM115 - lives as long as the log
            stream = pa.ipc.new_stream(file, DATA_SCHEMA)
            # Before the first intent counts as logged: the file survives a crash.
            fsync_dir(self._dir)
        except OSError as exc:
            raise LedgerError(f"ledger {self._dir}: cannot start the intent log ({exc})") from exc
        self._file, self._stream = file, stream
        return file, stream

    def append(self, deliveries: Sequence[Delivery]) -> None:
        self.append_later(deliveries)()

    def append_later(self, deliveries: Sequence[Delivery]) -> Callable[[], None]:
        """The append of this batch, numbered now (on an object store the number is
        the batch's place in the log, and batches of a transfer may be written by
        several threads at once, `lanes.TransferLanes`)."""
        if isinstance(self._dir, StorePath) and deliveries:
            number, self._batches = self._batches, self._batches + 1
            return partial(self._put, deliveries, number)
        return partial(self._append_to_file, deliveries)

    def _append_to_file(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        file, stream = self._file, self._stream
        if file is None or stream is None:
            file, stream = self._open()
        try:
            stream.write_table(rows_table(self._key, self._task_attempt, deliveries))
            file.flush()
            os.fsync(file.fileno())
        except OSError as exc:
            raise LedgerError(
                f"ledger: cannot log intents for {self._key.label()} ({exc})"
            ) from exc

    def _put(self, deliveries: Sequence[Delivery], number: int) -> None:
        """One batch as one object; logged once the PUT returned."""
        name = (
            f"{self._key.file_prefix}{self._task_attempt}-{self._log_id}-"
            f"{number:08d}{STREAM_SUFFIX}"
        )
        content = stream_bytes(rows_table(self._key, self._task_attempt, deliveries))
        try:
            (self._dir / name).write_bytes(content)
        except OSError as exc:
            raise LedgerError(
                f"ledger: cannot log intents for {self._key.label()} in {self._dir} ({exc})"
            ) from exc
        self._objects.append(self._dir / name)

    def close(self, *, finished: bool) -> None:
        """Close the log; a mover that finished (rather than died) removes it.

        A finished mover has written a row for every publish that may have arrived
        (confirmed, or uncertain after a lost connection); its other intents were
        refused by the destination, so they must not become uncertain rows.
        """
        if finished:
            # At once, not one after another: a long queue leaves hundreds of batches.
            removal.remove_all(self._objects)
        self._objects = []
        if self._file is None or self._stream is None:
            return
        self._stream.close()
        self._file.close()
        if finished:
            Path(self._file.name).unlink(missing_ok=True)


def stream_bytes(table: pa.Table) -> bytes:
    """`table` as one Arrow IPC stream (an intent batch's object)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, DATA_SCHEMA) as stream:
        stream.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


class MessageLedgerWriter:
    """Writes one queue transfer's message rows; each `write` is durable on return.

    Rows are appended to an Arrow IPC stream (one per transfer and task attempt,
    under ``rows/``) and fsynced: a flush costs one append and one fsync, where a
    Parquet file per flush cost a file, a rename and a directory fsync, on the
    path every source ack waits on. Every ROLL_ROWS rows the stream becomes one
    Parquet data file in the run partition; when the transfer ends (`close`) it moves
    there as it is if small (the commit compacts it), else becomes one too. A stream
    left by a task that died is converted by `tables.commit_run`.

    On an object store each `write` is one Parquet data file of its own (one PUT, the
    durability point; there is no append), which the driver's commit compacts; such
    writes may run on several threads at once (`Settlement`, overlapping flushes).
    """

    def __init__(self, ledger_path: str, run_id: str, key: TransferKey, task_attempt: str) -> None:
        self._dir = run_partition_dir(ledger_path, run_id)
        self._rows_dir = run_rows_dir(ledger_path, run_id)
        self._key = key
        self._task_attempt = task_attempt
        for directory in (self._dir, self._rows_dir):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LedgerError(
                    f"ledger {ledger_path}: cannot create {directory} ({exc.strerror})"
                ) from exc
        self._file: BinaryIO | None = None
        self._stream: pa.ipc.RecordBatchStreamWriter | None = None
        self._stream_rows = 0
        self.rows_written = 0
        # An object store's writes of one transfer may overlap (`lanes.TransferLanes`):
        # each is an object of its own, only this count is shared.
        self._count_lock = threading.Lock()

    def write(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        if isinstance(self._dir, StorePath):
            self._put(deliveries)
            return
        try:
            if self._stream is None or self._file is None:
                self._file, self._stream = self._open_stream()
            self._stream.write_table(rows_table(self._key, self._task_attempt, deliveries))
            self._file.flush()
            os.fsync(self._file.fileno())
            self._stream_rows += len(deliveries)
            self.rows_written += len(deliveries)
            if self._stream_rows >= layout.ROLL_ROWS:
                self._roll()
        except OSError as exc:
            raise LedgerError(
                f"ledger {self._rows_dir}: cannot write rows for {self._key.label()} ({exc})"
            ) from exc

    def _put(self, deliveries: Sequence[Delivery]) -> None:
        name = f"{self._key.file_prefix}{self._task_attempt}-{uuid.uuid4().hex}.parquet"
        try:
            write_data_file(self._dir, name, rows_table(self._key, self._task_attempt, deliveries))
        except OSError as exc:
            raise LedgerError(
                f"ledger {self._dir}: cannot write rows for {self._key.label()} ({exc})"
            ) from exc
        with self._count_lock:
            self.rows_written += len(deliveries)

    def close(self) -> None:
        """The transfer ended: what is streamed moves into the run partition as it is
        (a finished stream) when it is small, else becomes a Parquet data file.

        The commit compacts every small file into a few large ones, so converting a
        small stream to Parquet here (a file created, written, fsynced, renamed, its
        directory fsynced, the stream read back and removed: ~3 ms a transfer on the
        durability lane) only made Parquet the commit then read back. The rename need not
        be durable: the stream's rows are, and a crash leaves it in one directory or the
        other (in `rows/` the commit converts it as a dead task's stream), or, where a
        FUSE mount renames by copying, in both (the commit keeps the longer copy).
        """
        try:
            if self._stream is not None and self._file is not None:
                if self._file.tell() < layout.SMALL_FILE_BYTES:
                    self._finish_stream()
                else:
                    self._roll()
        except OSError as exc:
            raise LedgerError(
                f"ledger {self._dir}: cannot write rows for {self._key.label()} ({exc})"
            ) from exc

    def _open_stream(self) -> tuple[BinaryIO, pa.ipc.RecordBatchStreamWriter]:
        name = f"{self._key.file_prefix}{self._task_attempt}-{uuid.uuid4().hex}{STREAM_SUFFIX}"
        file = open(self._rows_dir / name, "wb")  # noqa: SIM115 - closed by _roll
        stream = pa.ipc.new_stream(file, DATA_SCHEMA)
        fsync_dir(self._rows_dir)
        return file, stream

    def _finish_stream(self) -> None:
        """The stream moves into the run partition as it is (`close` says why)."""
        self._end_stream(lambda stream: os.replace(stream, self._dir / stream.name))

    def _roll(self) -> None:
        """The stream becomes a Parquet data file in the run partition."""
        # One directory fsync per transfer fewer: the data file is durable first.
        self._end_stream(lambda stream: stream_to_data_file(stream, self._dir, sync_removal=False))

    def _end_stream(self, end: Callable[[Path], object]) -> None:
        """Close the stream, hand its file to `end`, and start afresh at the next write."""
        assert self._stream is not None
        assert self._file is not None
        self._stream.close()
        self._file.close()
        end(Path(self._file.name))
        self._file = self._stream = None
        self._stream_rows = 0
