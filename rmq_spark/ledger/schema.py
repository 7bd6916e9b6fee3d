"""The ledger's tables, defined once.

Each table is a tuple of `Column`s; the Arrow schema (executor writes through
deltalake) and the Spark schema (driver reads) are both derived from it, so the
two can never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import types as T

# Arrow type → Spark type name; the only types the ledger uses.
_STRING, _INT64, _BOOL, _TIMESTAMP, _DOUBLE = "string", "int64", "bool", "timestamp", "double"

_ARROW_TYPES: dict[str, pa.DataType] = {
    _STRING: pa.string(),
    _INT64: pa.int64(),
    _BOOL: pa.bool_(),
    _TIMESTAMP: pa.timestamp("us", tz="UTC"),
    _DOUBLE: pa.float64(),
}


@dataclass(frozen=True)
class Column:
    name: str
    kind: str
    nullable: bool
    doc: str


def _c(name: str, kind: str, doc: str, *, nullable: bool = False) -> Column:
    return Column(name, kind, nullable, doc)


_TRANSFER_KEY = (
    _c("run_id", _STRING, "The run this row belongs to (partition column of messages)."),
    _c("source_cluster", _STRING, "Config name of the source cluster."),
    _c("source_vhost", _STRING, "Source vhost."),
    _c("source_queue", _STRING, "Source queue."),
    _c("destination_cluster", _STRING, "Config name of the destination cluster."),
    _c("destination_vhost", _STRING, "Destination vhost."),
    _c("destination_queue", _STRING, "Destination queue."),
)

# Columns that identify one queue transfer inside a run.
TRANSFER_KEY: tuple[str, ...] = tuple(c.name for c in _TRANSFER_KEY)

MESSAGES: tuple[Column, ...] = (
    *_TRANSFER_KEY,
    _c(
        "position",
        _INT64,
        "0-based place of the delivery in this run's drain order of the source queue. "
        "A retried task continues after the highest position already in the ledger.",
    ),
    _c(
        "publish_seq",
        _INT64,
        "Publisher-confirm sequence number on the destination channel of this session.",
    ),
    _c(
        "publish_attempts",
        _INT64,
        "How often it was published: more than 1 after the destination nacked it.",
    ),
    _c("redelivered", _BOOL, "The broker's redelivered flag on the consumed delivery."),
    _c("body_size", _INT64, "Body length in bytes."),
    _c("body_sha256", _STRING, "Hex sha256 of the exact body bytes."),
    _c(
        "properties_sha256",
        _STRING,
        "Hex sha256 of the content-header property bytes exactly as received; a replayed "
        "row's, as published (the parked bytes, or with `--to origin` the header policy's "
        "rewrite of them).",
    ),
    _c("message_id", _STRING, "The message-id property, if set.", nullable=True),
    _c("consumed_at", _TIMESTAMP, "When the delivery reached the mover (UTC)."),
    _c(
        "confirmed_at",
        _TIMESTAMP,
        "When the destination confirmed it (UTC). Null: the destination connection was lost "
        "before its confirm, so it may or may not have arrived; the source redelivers it.",
        nullable=True,
    ),
    _c(
        "task_attempt",
        _STRING,
        "Spark stage.partition.attempt that moved it ('local' outside Spark).",
    ),
    _c(
        "session",
        _INT64,
        "Connection session within the task attempt: 0, then +1 after each reconnect.",
    ),
    _c(
        "decision",
        _STRING,
        "moved (published to the destination) | kept (a selective move published it back "
        "to the tail of its source queue; its publish_seq numbers that link's confirms) | "
        "replayed (`rmq-spark replay` published a parked row; source and position are the "
        "parked row's) | recognised (a resumed session acked, without publishing, the "
        "redelivery of a message an earlier session had moved; reason names that row). Null "
        "in rows written before the column existed: moved.",
        nullable=True,
    ),
    _c(
        "publish_exchange",
        _STRING,
        "The exchange a moved message was published through when its decision routed it "
        "(a redrive: '' for the default exchange, or the exchange x-death recorded). Null: "
        "to the transfer's destination queue (kept: back to its source), as in rows "
        "written before the column existed.",
        nullable=True,
    ),
    _c(
        "publish_routing_key",
        _STRING,
        "The routing key it was published with when its decision routed it (a redrive: the "
        "origin queue, or the key x-death recorded); null as for publish_exchange.",
        nullable=True,
    ),
    _c(
        "reason",
        _STRING,
        "Why a decision kept it (not selected, no x-death, origin queue gone, unreadable "
        "properties), or a redriven message's death reason (rejected, expired, maxlen, "
        "delivery_limit), or a replayed row's parked run id. Null for a plain move's rows "
        "and rows written before the column existed.",
        nullable=True,
    ),
)

QUEUES: tuple[Column, ...] = (
    *_TRANSFER_KEY,
    _c("partition", _INT64, "Spark partition the planner assigned the queue to."),
    _c("status", _STRING, "moved | failed | skipped."),
    _c("error", _STRING, "Why the transfer failed, when it did.", nullable=True),
    _c("source_depth_before", _INT64, "Ready messages in the source before the run."),
    _c("source_depth_after", _INT64, "Ready messages in the source after the run."),
    _c("destination_depth_before", _INT64, "Ready messages in the destination before the run."),
    _c("destination_depth_after", _INT64, "Ready messages in the destination after the run."),
    _c("ledger_rows", _INT64, "Rows of this queue in the messages table."),
    _c("duplicates", _INT64, "Rows that repeat an earlier row (redelivered, same checksums)."),
    _c(
        "lost",
        _INT64,
        "What left the source and is not in the ledger: the larger of its depth drop and "
        "its consumer counters' count above the messages moved.",
    ),
    _c(
        "source_removed",
        _INT64,
        "What consumers removed from the source during this driver's run, by its "
        "management counters (ack, deliver_no_ack, get_no_ack); null when the broker "
        "keeps none, they reset, or an earlier driver of the run planned the queue.",
        nullable=True,
    ),
    _c("unexpected", _INT64, "Destination rise not accounted for by ledger rows."),
    _c(
        "reordered_by_priority",
        _INT64,
        "Moved messages that set the priority property, into a destination that delivers "
        "by it (a quorum queue on RabbitMQ 4.x): consumers see them in priority order, not "
        "source order. 0 when the destination keeps arrival order; null when not known "
        "(not moved by this driver) and in rows written before this column existed.",
        nullable=True,
    ),
)

RUNS: tuple[Column, ...] = (
    _c("run_id", _STRING, "Run identifier."),
    _c("started_at", _TIMESTAMP, "Driver start (UTC)."),
    _c("finished_at", _TIMESTAMP, "Driver end (UTC)."),
    _c("config_digest", _STRING, "sha256 of the validated config, secrets excluded."),
    _c("spark_app_id", _STRING, "Spark application id."),
    _c("queues", _INT64, "Queue transfers in the plan."),
    _c("messages", _INT64, "Distinct messages moved."),
    _c("bytes", _INT64, "Body bytes moved."),
    _c("lost", _INT64, "Messages that left a source without a ledger row."),
    _c("duplicates", _INT64, "Messages published more than once (named in messages)."),
    _c("unexpected", _INT64, "Destination messages without a ledger row."),
    _c("verified", _BOOL, "Every expectation passed."),
    _c("seconds", _DOUBLE, "Wall time of the run."),
    _c("verification_path", _STRING, "Where the verification JSON and Data Docs are."),
    _c(
        "rabbitmq_versions",
        _STRING,
        "JSON object: each configured cluster -> the RabbitMQ version its management API "
        "reported at plan time; null in rows written before this column existed.",
        nullable=True,
    ),
)

# Written before anything moves, so a re-run with the same run id after a driver crash
# verifies the whole run against the depths the first plan saw.
PLANS: tuple[Column, ...] = (
    *_TRANSFER_KEY,
    _c("route", _STRING, "Config route that selected the queue."),
    _c("source_type", _STRING, "classic | quorum | stream."),
    _c("source_node", _STRING, "Node hosting the source queue at plan time."),
    _c("messages", _INT64, "Ready messages in the source when first planned."),
    _c("message_bytes", _INT64, "Ready bytes in the source (sampled by the management API)."),
    _c("destination_messages", _INT64, "Ready messages in the destination when first planned."),
    _c("destination_created", _BOOL, "The destination was missing and rmq-spark created it."),
    _c("destination_node", _STRING, "Node hosting the destination (its leader), if it existed."),
    _c("config_digest", _STRING, "sha256 of the config the run was planned with."),
    _c("planned_at", _TIMESTAMP, "When the driver planned it (UTC)."),
)

TABLES: dict[str, tuple[Column, ...]] = {
    "runs": RUNS,
    "queues": QUEUES,
    "messages": MESSAGES,
    "plans": PLANS,
}

# Only the messages table is partitioned: analysts and the commit step look at one run.
PARTITION_BY: dict[str, list[str]] = {"messages": ["run_id"], "queues": [], "runs": [], "plans": []}


def arrow_schema(columns: tuple[Column, ...]) -> pa.Schema:
    """The Arrow schema of a table, as the executor writes it."""
    return pa.schema([pa.field(c.name, _ARROW_TYPES[c.kind], nullable=c.nullable) for c in columns])


def spark_schema(columns: tuple[Column, ...]) -> T.StructType:
    """The Spark schema of a table, as the driver reads it."""
    from pyspark.sql import types as T

    spark_types: dict[str, T.DataType] = {
        _STRING: T.StringType(),
        _INT64: T.LongType(),
        _BOOL: T.BooleanType(),
        _TIMESTAMP: T.TimestampType(),
        _DOUBLE: T.DoubleType(),
    }
    return T.StructType(
        [T.StructField(c.name, spark_types[c.kind], nullable=c.nullable) for c in columns]
    )
