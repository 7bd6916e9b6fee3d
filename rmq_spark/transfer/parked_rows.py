"""The `parked` table's rows: what a park keeps of each message, and how it is made durable.

Executor side, no pika and no Spark. A park's destination is a Delta table of messages
(`rmq-spark park`, docs/parking.md) instead of a queue. Its rows are written in two steps:

1. **Staged, on the ack's path.** Each batch the session publishes becomes one *staged*
   Parquet file (`_staged/run_id=<run>/` under the table's directory, which Delta readers
   and VACUUM skip, as they skip every `_` directory), complete and durable or not at all
   (`durable.write_row_groups`: temp name, fsync, rename, directory fsync; on an object
   store one PUT). That write is the park's "confirm" (`parked.ParkedTableLink`). A staged
   row is everything but the selection columns: the bytes, where the message came from,
   the checksums. Nothing is decoded: decoding every property block cost a park about
   46 us a message on the one thread the mover's loop shares, and held the source's
   acks back (bench.park: 0.55-0.60 of a move's rate on RabbitMQ 4.3).
2. **Completed, at the commit.** `with_selection_columns` decodes the staged rows'
   property blocks into the selection columns; `parked_completion.py` writes a
   transfer's staged files, in groups of up to 64 MiB, as the table's data files, in
   Spark tasks, and the driver adds them to the table's log in one commit
   (`park/table.py`).

A row holds the message as it arrived (the exact content-header property bytes and the
body), where it came from (source cluster, vhost, queue, position, the exchange and
routing key it was delivered with), the selection language's columns decoded from those
bytes (docs/selection.md: `headers`, `x_death`, ... so Spark SQL, DuckDB or polars can
choose without decoding), and checksums. With `park.exclude_body` the body is null and
`body_excluded` says so: such rows can be inspected, not replayed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from rmq_spark.arrow_columns import column
from rmq_spark.config import PARKED
from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store
from rmq_spark.ledger.durable import write_row_groups
from rmq_spark.model import Delivery, TransferKey
from rmq_spark.selection.columns import BY_NAME, Message, message_table
from rmq_spark.selection.fields import TEXT_PROPERTIES

TABLE = "parked"
# A parked transfer's nominal destination cluster in the ledger (`TransferKey`): the
# table, with the source's vhost and queue. `rmq-spark park` refuses a cluster of this name.
PARKED_CLUSTER = PARKED
# Partitioned by run only (module doc of park/table.py says why).
PARTITION_BY = ("run_id",)
SCHEMA_VERSION = 1

# The selection language's columns a row carries, decoded from its property bytes.
# `exchange`, `routing_key`, `redelivered`, `body` and `body_size` are columns of their
# own below; `body_text` is not stored (a second copy of every text body): Spark SQL's
# `CAST(body AS STRING)` or DuckDB's `decode(body)` give it.
SELECTION_COLUMNS: tuple[str, ...] = tuple(
    name
    for name in BY_NAME
    if name not in {"exchange", "routing_key", "redelivered", "body", "body_size", "body_text"}
)

_TIME = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("source_cluster", pa.string(), nullable=False),
        pa.field("source_vhost", pa.string(), nullable=False),
        pa.field("source_queue", pa.string(), nullable=False),
        pa.field("position", pa.int64(), nullable=False),
        pa.field("exchange", pa.string()),
        pa.field("routing_key", pa.string()),
        pa.field("redelivered", pa.bool_()),
        pa.field("consumed_at", _TIME),
        pa.field("task_attempt", pa.string()),
        pa.field("schema_version", pa.int32()),
        pa.field("body_size", pa.int64()),
        pa.field("body_sha256", pa.string()),
        pa.field("properties_sha256", pa.string()),
        pa.field("properties", pa.binary()),
        pa.field("body", pa.binary()),
        pa.field("body_excluded", pa.bool_()),
        *(pa.field(name, BY_NAME[name].type) for name in SELECTION_COLUMNS),
    ]
)
# Data files carry every column but the partition column, as Delta expects.
DATA_SCHEMA = pa.schema([field for field in SCHEMA if field.name not in PARTITION_BY])
# Bodies per row group of a data file. A batch's rows are built and encoded a group at a
# time, so a batch of 16 MiB bodies (a 64 MiB window holds four) costs one body's Arrow
# copy and pages beside the window, not the batch's: bench.memory --park.
ROW_GROUP_BYTES = 8 << 20
# A staged file's columns: the table's, but the partition column and the selection ones.
STAGED_SCHEMA = pa.schema([field for field in DATA_SCHEMA if field.name not in SELECTION_COLUMNS])
# The directory of staged files, beside the run partitions (Delta skips `_` directories).
STAGED_DIR = "_staged"
# Min/max statistics for the columns a reader filters on; none for the bytes (a
# statistic of a 16 MiB body holds copies of the smallest and largest, and no query
# filters on a body's order).
STATISTICS_COLUMNS = [name for name in DATA_SCHEMA.names if name not in {"body", "properties"}]
# Dictionary encoding only where values repeat (where a row came from, its routing, the
# text properties a queue's messages share); trying it on digests, bodies, positions and
# times cost ~2 us a message to write for no smaller file (the rows of 20,000 demo
# messages, 1,310 bytes a row either way).
DICTIONARY_COLUMNS = [
    "source_cluster",
    "source_vhost",
    "source_queue",
    "exchange",
    "routing_key",
    "task_attempt",
    *(
        name
        for name in SELECTION_COLUMNS
        if name in TEXT_PROPERTIES and name not in {"message_id", "correlation_id"}
    ),
]
STAGED_DICTIONARY_COLUMNS = [name for name in DICTIONARY_COLUMNS if name in STAGED_SCHEMA.names]

# (exchange, routing key) of a delivery tag: what the source link told (`inbound.OnRoute`);
# None for a tag it did not tell.
RouteOf = Callable[[int], tuple[str, str] | None]


def run_partition(ledger_path: str, run_id: str) -> Any:
    """The table's directory of one run's data files (a Path, or a StorePath)."""
    return store.root(ledger_path) / TABLE / f"run_id={run_id}"


def staged_partition(ledger_path: str, run_id: str) -> Any:
    """The directory of one run's staged files (a Path, or a StorePath)."""
    return store.root(ledger_path) / TABLE / STAGED_DIR / f"run_id={run_id}"


def row_groups(deliveries: Sequence[Delivery]) -> Iterator[Sequence[Delivery]]:
    """The deliveries in order, in runs of at most ROW_GROUP_BYTES of bodies (a larger
    body alone)."""
    start, size = 0, 0
    for index, delivery in enumerate(deliveries):
        if index > start and size + delivery.body_size > ROW_GROUP_BYTES:
            yield deliveries[start:index]
            start, size = index, 0
        size += delivery.body_size
    if start < len(deliveries):
        yield deliveries[start:]


def staged_rows(
    key: TransferKey,
    task_attempt: str,
    deliveries: Sequence[Delivery],
    route_of: RouteOf,
    *,
    exclude_body: bool,
) -> pa.Table:
    """Staged rows (STAGED_SCHEMA) for deliveries that carry their bytes: no decoding."""
    routes = []
    for delivery in deliveries:
        if delivery.body is None or delivery.properties is None:
            raise ValueError(f"position {delivery.position}: no bytes to park")
        routes.append(route_of(delivery.tag))
    count = len(deliveries)
    columns: dict[str, list[Any]] = {
        "source_cluster": [key.source_cluster] * count,
        "source_vhost": [key.source_vhost] * count,
        "source_queue": [key.source_queue] * count,
        "position": [d.position for d in deliveries],
        "exchange": [None if route is None else route[0] for route in routes],
        "routing_key": [None if route is None else route[1] for route in routes],
        "redelivered": [d.redelivered for d in deliveries],
        "consumed_at": [d.consumed_at for d in deliveries],
        "task_attempt": [task_attempt] * count,
        "schema_version": [SCHEMA_VERSION] * count,
        "body_size": [d.body_size for d in deliveries],
        "body_sha256": [d.body_sha256 for d in deliveries],
        "properties_sha256": [d.properties_sha256 for d in deliveries],
        "properties": [d.properties for d in deliveries],
        "body": [None if exclude_body else d.body for d in deliveries],
        "body_excluded": [exclude_body] * count,
    }
    return pa.Table.from_arrays(
        # arrow_columns.py: no pandas
        [column(field.type, columns[field.name]) for field in STAGED_SCHEMA],
        schema=STAGED_SCHEMA,
    )


def with_selection_columns(staged: pa.Table) -> pa.Table:
    """The data-file rows (DATA_SCHEMA) of staged rows: the selection columns decoded
    from each row's property bytes (the body is not needed for any of them)."""
    messages = [
        Message("", "", bool(redelivered), properties, b"")
        for redelivered, properties in zip(
            staged.column("redelivered").to_pylist(),
            staged.column("properties").to_pylist(),
            strict=True,
        )
    ]
    decoded = message_table(messages, SELECTION_COLUMNS)
    return pa.Table.from_arrays(
        [
            decoded.column(field.name).combine_chunks()
            if field.name in SELECTION_COLUMNS
            else staged.column(field.name)
            for field in DATA_SCHEMA
        ],
        schema=DATA_SCHEMA,
    )


class ParkedRowsWriter:
    """Writes one transfer's staged rows: each `write` is one staged file, durable on return.

    Files are named after the transfer (`TransferKey.file_prefix`), the batch's first
    position and the task attempt, so a retried task's files sit beside the earlier
    attempt's and the commit completes both.
    """

    def __init__(
        self,
        ledger_path: str,
        run_id: str,
        key: TransferKey,
        task_attempt: str,
        *,
        exclude_body: bool = False,
    ) -> None:
        self._dir = staged_partition(ledger_path, run_id)
        self._key = key
        self._task_attempt = task_attempt
        self.exclude_body = exclude_body
        self.rows_written = 0
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerError(
                f"ledger {ledger_path}: cannot create {self._dir} ({exc.strerror})"
            ) from exc

    def write(self, deliveries: Sequence[Delivery], route_of: RouteOf) -> None:
        if not deliveries:
            return
        # The first position, zero-padded, after the transfer's prefix: a transfer's
        # staged files in name order are in position order, and so is the data file
        # the commit completes from them (`parked_completion.group_staged`).
        first = deliveries[0].position
        name = (
            f"{self._key.file_prefix}{first:020d}-{self._task_attempt}-{uuid.uuid4().hex}.parquet"
        )
        try:
            write_row_groups(
                self._dir,
                name,
                STAGED_SCHEMA,
                self._row_groups(deliveries, route_of),
                # Read back whole by the commit, never filtered: no statistics.
                statistics=False,
                dictionary=STAGED_DICTIONARY_COLUMNS,
            )
        except OSError as exc:
            raise LedgerError(
                f"ledger {self._dir}: cannot park rows of {self._key.label()} ({exc})"
            ) from exc
        self.rows_written += len(deliveries)

    def _row_groups(self, deliveries: Sequence[Delivery], route_of: RouteOf) -> Iterator[pa.Table]:
        """The batch's rows, a group of at most ROW_GROUP_BYTES of bodies at a time (one
        delivery at least), each built only when the file's writer asks for it. The
        commit reads a staged file back a row group at a time, so the groups also bound
        its memory."""
        for group in row_groups(deliveries):
            rows = staged_rows(
                self._key, self._task_attempt, group, route_of, exclude_body=self.exclude_body
            )
            yield rows
            del rows  # written: free before the next group is built
