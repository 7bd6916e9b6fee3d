"""Executor side: make message rows durable before the source is acked.

Executors have no SparkSession, so rows go out through pyarrow. Each flush writes
one Parquet data file straight into the messages table's run partition, under a
temporary name, fsyncs it, and renames it into place: once `write` returns, the
rows survive a crash of the process and of the machine. The file is not yet in
the Delta log; `tables.commit_run` adds every such file of a run in one commit
(per run, not per window), so a crashed task attempt's rows are committed too.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import schema
from rmq_spark.window import Delivery

# Data files carry every column but the partition column, as Delta expects.
DATA_COLUMNS = tuple(c for c in schema.MESSAGES if c.name != "run_id")
DATA_SCHEMA = schema.arrow_schema(DATA_COLUMNS)
TEMP_PREFIX = ".staging-"


@dataclass(frozen=True)
class TransferKey:
    """Names one queue transfer; the TRANSFER_KEY columns without run_id."""

    source_cluster: str
    source_vhost: str
    source_queue: str
    destination_cluster: str
    destination_vhost: str
    destination_queue: str

    @property
    def file_prefix(self) -> str:
        """Data files of this transfer start with this, so a retried task finds its own."""
        digest = hashlib.sha256(self.describe().encode()).hexdigest()[:16]
        return f"part-{digest}-"

    def describe(self) -> str:
        return (
            f"{self.source_cluster}/{self.source_vhost}/{self.source_queue} -> "
            f"{self.destination_cluster}/{self.destination_vhost}/{self.destination_queue}"
        )


def run_partition_dir(ledger_path: str, run_id: str) -> Path:
    return Path(ledger_path) / "messages" / f"run_id={run_id}"


class MessageLedgerWriter:
    """Writes one queue transfer's message rows; each `write` is durable on return."""

    def __init__(self, ledger_path: str, run_id: str, key: TransferKey, task_attempt: str) -> None:
        self._dir = run_partition_dir(ledger_path, run_id)
        self._key = key
        self._task_attempt = task_attempt
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(
                f"ledger {ledger_path}: cannot create {self._dir} ({exc.strerror})"
            ) from exc
        self.rows_written = 0

    def write(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        table = self._to_arrow(deliveries)
        name = f"{self._key.file_prefix}{uuid.uuid4().hex}.parquet"
        temp = self._dir / f"{TEMP_PREFIX}{name}"
        try:
            with open(temp, "wb") as sink:
                pq.write_table(table, sink, compression="zstd")
                sink.flush()
                os.fsync(sink.fileno())
            os.replace(temp, self._dir / name)
            _fsync_dir(self._dir)
        except OSError as exc:
            raise LedgerError(
                f"ledger {self._dir}: cannot write rows for {self._key.describe()} ({exc})"
            ) from exc
        self.rows_written += len(deliveries)

    def _to_arrow(self, deliveries: Sequence[Delivery]) -> pa.Table:
        count = len(deliveries)
        key = self._key
        columns = {
            "source_cluster": [key.source_cluster] * count,
            "source_vhost": [key.source_vhost] * count,
            "source_queue": [key.source_queue] * count,
            "destination_cluster": [key.destination_cluster] * count,
            "destination_vhost": [key.destination_vhost] * count,
            "destination_queue": [key.destination_queue] * count,
            "position": [d.position for d in deliveries],
            "publish_seq": [d.seq for d in deliveries],
            "redelivered": [d.redelivered for d in deliveries],
            "body_size": [d.body_size for d in deliveries],
            "body_sha256": [d.body_sha256 for d in deliveries],
            "properties_sha256": [d.properties_sha256 for d in deliveries],
            "message_id": [d.message_id for d in deliveries],
            "consumed_at": [d.consumed_at for d in deliveries],
            "confirmed_at": [d.confirmed_at for d in deliveries],
            "task_attempt": [self._task_attempt] * count,
        }
        return pa.Table.from_pydict(columns, schema=DATA_SCHEMA)


def next_position(ledger_path: str, run_id: str, key: TransferKey) -> int:
    """Where a (retried) task continues numbering this transfer's drain order.

    Reads the durable data files of earlier attempts, committed to the Delta log or
    not, so positions stay unique across attempts of the same run.
    """
    directory = run_partition_dir(ledger_path, run_id)
    files = sorted(directory.glob(f"{key.file_prefix}*.parquet")) if directory.is_dir() else []
    highest = -1
    for path in files:
        positions = pq.read_table(path, columns=["position"]).column("position")
        if len(positions):
            highest = max(highest, pc.max(positions).as_py())
    return highest + 1


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX needs the directory fsynced)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
