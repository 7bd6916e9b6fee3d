"""Verification of one run: does every message that left a source have a ledger row,
and does every ledger row account for a message that reached its destination?

Two halves, as in chispa's `row_comparer`: the summary (one aggregation over the run's
ledger rows joined to the driver's queue counters: one row per queue transfer), then
plain dicts. Great Expectations then validates the summary and the messages, and
renders its Data Docs next to `verification.json`.

The summary has two engines with the same columns and figures (tests/spark/test_verify.py
runs every case through both): `summarize` in Spark, for any size, and `summarize_arrow`
on the driver with pyarrow, for runs up to `LOCAL_MAX_ROWS` rows, where GE then validates
pandas frames. A small run verified in Spark pays for a dozen Spark jobs (windows,
shuffles, GE's metric passes) that take longer than the rows do; on the driver it takes
about a second. `verify_ledger_run` picks the engine from the run's row count.

Example:
    verification = verify_run(run_id, messages, counters, "/tmp/run-42/verification")
    if not verification.verified:
        print("\\n".join(verification.failed_expectations))
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import importlib
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rmq_spark.ledger import tables
from rmq_spark.ledger.schema import MESSAGES, QUEUES, TRANSFER_KEY, spark_schema

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.expectations.expectation import Expectation

log = logging.getLogger(__name__)

# Transfer statuses. A ledger row whose transfer is missing from the counters was moved
# by something the plan does not know about; it gets its own status so it fails.
STATUS_MOVED = "moved"
STATUS_UNPLANNED = "unplanned"

# The driver's broker readings, per queue transfer, besides TRANSFER_KEY.
DEPTH_COLUMNS: tuple[str, ...] = (
    "source_depth_before",
    "source_depth_after",
    "destination_depth_before",
    "destination_depth_after",
)
COUNTER_COLUMNS: tuple[str, ...] = (*TRANSFER_KEY, *DEPTH_COLUMNS, "status", "error")
# Optional counter: True when other publishers send to the destination queue during the
# run (routes[].destination.shared). Its rise above the ledger's rows is then their
# messages (`live_arrivals`), not an unexplained copy; every other check is unchanged.
DESTINATION_SHARED = "destination_shared"
MESSAGE_COLUMNS: tuple[str, ...] = tuple(c.name for c in MESSAGES)

# Per-queue counts of message-level problems, kept in the summary so a failed
# message-level expectation can name the queues it is about.
NULL_BODY_SHA256 = "null_body_sha256"
NULL_PROPERTIES_SHA256 = "null_properties_sha256"
CONFIRMED_BEFORE_CONSUMED = "confirmed_before_consumed"
PROBLEM_COUNTS: tuple[str, ...] = (
    NULL_BODY_SHA256,
    NULL_PROPERTIES_SHA256,
    CONFIRMED_BEFORE_CONSUMED,
)

SUMMARY_COLUMNS: tuple[str, ...] = (
    *TRANSFER_KEY,
    "status",
    "error",
    *DEPTH_COLUMNS,
    "ledger_rows",
    "confirmed_rows",
    "uncertain_rows",
    "duplicates",
    "distinct_messages",
    "bytes",
    "source_drop",
    "destination_rise",
    "lost",
    "unexpected",
    DESTINATION_SHARED,
    "live_arrivals",
    "missing_at_destination",
    "redelivered_rows",
    "retried_rows",
    "reordered",
    "order_kept",
    "min_position",
    "max_position",
    "distinct_positions",
    "positions_contiguous",
    *PROBLEM_COUNTS,
)

# The columns the message-level expectations read (the driver engine loads only these
# into pandas) and the ones the driver engine's summary reads.
MESSAGE_CHECK_COLUMNS: tuple[str, ...] = (
    "run_id",
    "body_sha256",
    "properties_sha256",
    "consumed_at",
    "confirmed_at",
)
SUMMARY_INPUT_COLUMNS: tuple[str, ...] = (
    *TRANSFER_KEY,
    "position",
    "publish_seq",
    "publish_attempts",
    "redelivered",
    "body_size",
    "body_sha256",
    "properties_sha256",
    "consumed_at",
    "confirmed_at",
    "task_attempt",
    "session",
)
# Runs with at most this many ledger rows are verified on the driver (pyarrow + GE on
# pandas, roughly 150 bytes of driver memory per row); larger ones in Spark.
LOCAL_MAX_ROWS = 1_000_000
ENGINE_SPARK, ENGINE_DRIVER = "spark", "driver"

RESULTS_FILE = "verification.json"
DATA_DOCS_DIR = "data_docs"
DATA_DOCS_SITE = "rmq_spark"
GX_DATASOURCE = "ledger"
SUMMARY_ASSET = "queue_summary"
MESSAGES_ASSET = "messages"
WHOLE_DATAFRAME = "whole_dataframe"
# BASIC keeps the unexpected samples to a few values; COMPLETE would collect up to
# GE's MAX_RESULT_RECORDS rows of a multi-million-row table to the driver.
RESULT_FORMAT: dict[str, Any] = {"result_format": "BASIC", "partial_unexpected_count": 5}
# How many offending queues one failure line names before it says "and N more".
MAX_QUEUES_NAMED = 10

_GX_LOGGER = "great_expectations"

# Expectation type → the summary count naming the queues a message-level failure is about.
_NOT_NULL = "expect_column_values_to_not_be_null"
_IN_SET = "expect_column_values_to_be_in_set"
_PAIR_EQUAL = "expect_column_pair_values_to_be_equal"
_A_GREATER_THAN_B = "expect_column_pair_values_a_to_be_greater_than_b"
_MESSAGE_PROBLEM_COUNT: dict[tuple[str, str], str] = {
    (_NOT_NULL, "body_sha256"): NULL_BODY_SHA256,
    (_NOT_NULL, "properties_sha256"): NULL_PROPERTIES_SHA256,
    (_A_GREATER_THAN_B, "confirmed_at"): CONFIRMED_BEFORE_CONSUMED,
}


@dataclass(frozen=True)
class QueueVerdict:
    """One queue transfer of the run, as the ledger and the broker counters saw it."""

    source_cluster: str
    source_vhost: str
    source_queue: str
    destination_cluster: str
    destination_vhost: str
    destination_queue: str
    status: str
    error: str | None
    ledger_rows: int
    uncertain_rows: int  # published, but the confirm never came (connection lost)
    distinct_messages: int
    duplicates: int  # repeated confirmed rows + uncertain publishes that did arrive
    bytes: int
    source_drop: int
    destination_rise: int
    lost: int
    unexpected: int
    positions_contiguous: bool
    order_kept: bool
    passed: bool
    live_arrivals: int = 0  # other publishers' messages in a shared destination

    @property
    def label(self) -> str:
        return transfer_label(asdict(self))


@dataclass(frozen=True)
class Verification:
    """The outcome of `verify_run`; the caller decides what a failure means for the exit code."""

    run_id: str
    queues: tuple[QueueVerdict, ...]
    messages: int  # sum of distinct_messages
    bytes: int
    lost: int
    duplicates: int
    unexpected: int
    verified: bool  # every GE expectation passed
    failed_expectations: tuple[str, ...]  # expectation type + column(s) + observed
    results_path: str  # verification.json
    data_docs_path: str | None  # index.html
    engine: str = ENGINE_SPARK  # where the summary and GE ran: spark, or driver (pyarrow/pandas)
    live_arrivals: int = 0  # other publishers' messages in shared destinations


# --- Spark part -------------------------------------------------------------------------


def summarize(messages: DataFrame, counters: DataFrame) -> DataFrame:
    """One row per queue transfer: ledger counts joined to the driver's broker counters.

    Transfers without ledger rows appear with zero counts; ledger rows whose transfer is
    not in `counters` appear with status "unplanned" and null depths. Columns are
    SUMMARY_COLUMNS, rows ordered by TRANSFER_KEY.
    """
    _require_columns("messages", messages, MESSAGE_COLUMNS)
    _require_columns("counters", counters, COUNTER_COLUMNS)
    key = list(TRANSFER_KEY)

    # A crash between the durable ledger row and the source ack makes the broker redeliver
    # the message and the mover publish it again: a later, redelivered row with the same
    # checksums. Only confirmed rows count here: an uncertain row (no confirm time) may
    # never have arrived; the destination's rise says how many of those did.
    # publish_seq only breaks ties so the choice of "first" is deterministic.
    confirmed = F.col("confirmed_at").isNotNull()
    same_message = Window.partitionBy(
        *key, "body_sha256", "properties_sha256", confirmed.alias("_confirmed")
    ).orderBy("position", "publish_seq")
    is_duplicate = (
        confirmed
        & (F.row_number().over(same_message) > 1)
        & F.coalesce(F.col("redelivered"), F.lit(False))
    )
    # With one consumer and no redelivery or retry, publish order is source order: within
    # one session of one task attempt, publish_seq must grow with position.
    same_session = Window.partitionBy(*key, "task_attempt", "session").orderBy("position")
    out_of_order = F.col("publish_seq") < F.lag("publish_seq").over(same_session)
    flagged = messages.withColumn("_duplicate", is_duplicate).withColumn(
        "_out_of_order", F.coalesce(out_of_order, F.lit(False))
    )

    def count_where(condition: Any) -> Any:
        return F.coalesce(F.sum(F.when(condition, 1).otherwise(0)), F.lit(0)).cast(T.LongType())

    ledger = flagged.groupBy(*key).agg(
        F.count(F.lit(1)).alias("ledger_rows"),
        count_where(confirmed).alias("confirmed_rows"),
        count_where(F.col("_duplicate")).alias("confirmed_duplicates"),
        count_where(F.coalesce(F.col("redelivered"), F.lit(False))).alias("redelivered_rows"),
        count_where(F.col("publish_attempts") > 1).alias("retried_rows"),
        count_where(F.col("_out_of_order")).alias("reordered"),
        F.sum(F.when(confirmed & ~F.col("_duplicate"), F.col("body_size"))).alias("bytes"),
        F.min("position").alias("min_position"),
        F.max("position").alias("max_position"),
        F.countDistinct("position").alias("distinct_positions"),
        count_where(F.col("body_sha256").isNull()).alias(NULL_BODY_SHA256),
        count_where(F.col("properties_sha256").isNull()).alias(NULL_PROPERTIES_SHA256),
        count_where(F.col("confirmed_at") < F.col("consumed_at")).alias(CONFIRMED_BEFORE_CONSUMED),
    )
    shared = (
        F.col(DESTINATION_SHARED).cast(T.BooleanType())
        if DESTINATION_SHARED in counters.columns
        else F.lit(False)
    )
    planned = counters.select(*COUNTER_COLUMNS, shared.alias(DESTINATION_SHARED))
    # Full outer: a planned transfer with no rows must still be checked, and a row of an
    # unplanned transfer must not vanish from the verification.
    joined = planned.join(ledger, on=key, how="full_outer")

    zero = F.lit(0).cast(T.LongType())
    is_shared = F.coalesce(F.col(DESTINATION_SHARED), F.lit(False))
    ledger_rows = F.coalesce(F.col("ledger_rows"), zero)
    confirmed_rows = F.coalesce(F.col("confirmed_rows"), zero)
    uncertain_rows = ledger_rows - confirmed_rows
    distinct_messages = confirmed_rows - F.coalesce(F.col("confirmed_duplicates"), zero)
    source_drop = F.col("source_depth_before") - F.col("source_depth_after")
    destination_rise = F.col("destination_depth_after") - F.col("destination_depth_before")
    # Of the uncertain publishes, this many reached the destination (clamped to what the
    # rows can explain; the rest shows as unexpected or missing).
    uncertain_arrived = F.least(F.greatest(destination_rise - confirmed_rows, zero), uncertain_rows)
    duplicates = F.coalesce(F.col("confirmed_duplicates"), zero) + F.coalesce(
        uncertain_arrived, zero
    )
    redelivered_or_retried = (F.coalesce(F.col("redelivered_rows"), zero) > 0) | (
        F.coalesce(F.col("retried_rows"), zero) > 0
    )
    contiguous = (ledger_rows == 0) | (
        (F.col("min_position") == 0) & (F.col("distinct_positions") == F.col("max_position") + 1)
    )
    return joined.select(
        *key,
        F.coalesce(F.col("status"), F.lit(STATUS_UNPLANNED)).alias("status"),
        F.col("error"),
        *DEPTH_COLUMNS,
        ledger_rows.alias("ledger_rows"),
        confirmed_rows.alias("confirmed_rows"),
        uncertain_rows.alias("uncertain_rows"),
        duplicates.alias("duplicates"),
        distinct_messages.alias("distinct_messages"),
        F.coalesce(F.col("bytes"), zero).alias("bytes"),
        source_drop.alias("source_drop"),
        destination_rise.alias("destination_rise"),
        # greatest() skips nulls: an unknown depth counts as nothing lost here, and is
        # caught by the pair-equality expectations, which treat null as a mismatch.
        F.greatest(source_drop - distinct_messages, zero).alias("lost"),
        F.when(is_shared, zero)
        .otherwise(F.greatest(destination_rise - ledger_rows, zero))
        .alias("unexpected"),
        is_shared.alias(DESTINATION_SHARED),
        F.when(is_shared, F.greatest(destination_rise - ledger_rows, zero))
        .otherwise(zero)
        .alias("live_arrivals"),
        F.greatest(confirmed_rows - destination_rise, zero).alias("missing_at_destination"),
        F.coalesce(F.col("redelivered_rows"), zero).alias("redelivered_rows"),
        F.coalesce(F.col("retried_rows"), zero).alias("retried_rows"),
        F.coalesce(F.col("reordered"), zero).alias("reordered"),
        (redelivered_or_retried | (F.coalesce(F.col("reordered"), zero) == 0)).alias("order_kept"),
        F.col("min_position"),
        F.col("max_position"),
        F.coalesce(F.col("distinct_positions"), zero).alias("distinct_positions"),
        F.coalesce(contiguous, F.lit(False)).alias("positions_contiguous"),
        *(F.coalesce(F.col(name), zero).alias(name) for name in PROBLEM_COUNTS),
    ).orderBy(*key)


def _require_columns(name: str, df: DataFrame, required: Sequence[str]) -> None:
    missing = [column for column in required if column not in df.columns]
    if missing:
        raise ValueError(
            f"{name} DataFrame lacks column(s) {', '.join(missing)}; "
            f"required: {', '.join(required)}; found: {', '.join(df.columns)}"
        )


# --- the driver engine: the same summary with pyarrow -----------------------------------


def summarize_arrow(
    messages: pa.Table, counters: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """`summarize` on the driver: the same rows (as dicts, SUMMARY_COLUMNS, same order).

    `messages` holds at least SUMMARY_INPUT_COLUMNS of the run's ledger rows; `counters`
    one mapping per queue transfer with COUNTER_COLUMNS. Every figure follows the Spark
    expression of the same name in `summarize`, nulls included.
    """
    missing = [c for c in SUMMARY_INPUT_COLUMNS if c not in messages.column_names]
    if missing:
        raise ValueError(
            f"messages table lacks column(s) {', '.join(missing)}; required: "
            f"{', '.join(SUMMARY_INPUT_COLUMNS)}; found: {', '.join(messages.column_names)}"
        )
    for index, row in enumerate(counters):
        absent = [c for c in COUNTER_COLUMNS if c not in row]
        if absent:
            raise ValueError(
                f"counters row {index} lacks {', '.join(absent)}; required: "
                f"{', '.join(COUNTER_COLUMNS)}"
            )
    key = list(TRANSFER_KEY)
    confirmed = _flags(pc.is_valid(messages["confirmed_at"]))
    redelivered = _flags(messages["redelivered"])
    # One small integer per transfer: sorting on it is much cheaper than on seven strings.
    # (A null key part joins as NUL: key columns are not nullable in the ledger anyway.)
    joined = pc.binary_join_element_wise(
        *(messages[name] for name in key), "\x1f", null_handling="replace", null_replacement="\x00"
    )
    transfer = pc.dictionary_encode(joined.combine_chunks()).indices
    # As in `summarize`: a confirmed, redelivered row repeating an earlier confirmed row's
    # checksums (earlier by position, then publish_seq) is a duplicate.
    first = _first_of_group(
        pa.table(
            {
                "_transfer": transfer,
                "body_sha256": messages["body_sha256"],
                "properties_sha256": messages["properties_sha256"],
                "_confirmed": pa.array(confirmed),
                "position": messages["position"],
                "publish_seq": messages["publish_seq"],
            }
        ),
        ["_transfer", "body_sha256", "properties_sha256", "_confirmed"],
        ["position", "publish_seq"],
    )
    duplicate = confirmed & redelivered & ~first
    out_of_order = _descents(
        pa.table(
            {
                "_transfer": transfer,
                "task_attempt": messages["task_attempt"],
                "session": messages["session"],
                "position": messages["position"],
                "publish_seq": messages["publish_seq"],
            }
        ),
        ["_transfer", "task_attempt", "session"],
        "position",
        "publish_seq",
    )

    def as_count(flags: np.ndarray) -> pa.Array:
        return pa.array(flags.astype(np.int64))

    table = pa.table(
        {
            **{name: messages[name] for name in key},
            "_row": as_count(np.ones(messages.num_rows, dtype=bool)),
            "_confirmed": as_count(confirmed),
            "_duplicate": as_count(duplicate),
            "_redelivered": as_count(redelivered),
            "_retried": as_count(_flags(pc.greater(messages["publish_attempts"], 1))),
            "_reordered": as_count(out_of_order),
            "_bytes": pc.if_else(
                pa.array(confirmed & ~duplicate),
                messages["body_size"],
                pa.scalar(None, pa.int64()),
            ),
            "position": messages["position"],
            NULL_BODY_SHA256: as_count(_flags(pc.is_null(messages["body_sha256"]))),
            NULL_PROPERTIES_SHA256: as_count(_flags(pc.is_null(messages["properties_sha256"]))),
            CONFIRMED_BEFORE_CONSUMED: as_count(
                _flags(pc.less(messages["confirmed_at"], messages["consumed_at"]))
            ),
        }
    )
    aggregated = table.group_by(key).aggregate(
        [
            ("_row", "sum"),
            ("_confirmed", "sum"),
            ("_duplicate", "sum"),
            ("_redelivered", "sum"),
            ("_retried", "sum"),
            ("_reordered", "sum"),
            ("_bytes", "sum"),
            ("position", "min"),
            ("position", "max"),
            ("position", "count_distinct"),
            (NULL_BODY_SHA256, "sum"),
            (NULL_PROPERTIES_SHA256, "sum"),
            (CONFIRMED_BEFORE_CONSUMED, "sum"),
        ]
    )
    ledger = {tuple(row[k] for k in key): row for row in aggregated.to_pylist()}
    planned = {tuple(row[k] for k in key): row for row in counters}
    return [
        _summary_row(k, planned.get(k), ledger.get(k))
        for k in sorted({*planned, *ledger}, key=_nulls_first)
    ]


def _flags(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean column as a numpy array, null as False (Spark's coalesce(x, false))."""
    return np.asarray(pc.fill_null(values, False).to_numpy(zero_copy_only=False), dtype=bool)


def _nulls_first(values: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
    """A sort key ordering like Spark's ascending orderBy: nulls first."""
    return tuple((value is not None, value) for value in values)


def _same_as_previous(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """Per row of a sorted table: every column equals the previous row's (null == null)."""
    same = np.zeros(table.num_rows, dtype=bool)
    if table.num_rows < 2:
        return same
    together = np.ones(table.num_rows - 1, dtype=bool)
    for name in columns:
        column = table[name]
        current, previous = column.slice(1), column.slice(0, table.num_rows - 1)
        equal = pc.fill_null(pc.equal(current, previous), False)
        both_null = pc.and_(pc.is_null(current), pc.is_null(previous))
        together &= _flags(pc.or_(equal, both_null))
    same[1:] = together
    return same


def _sorted_indices(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    return np.asarray(
        # Nulls first, like Spark's ascending sort.
        pc.sort_indices(table, sort_keys=[(name, "ascending", "at_start") for name in columns])
    )


def _first_of_group(table: pa.Table, group: Sequence[str], order: Sequence[str]) -> np.ndarray:
    """Per row (table order): it is row_number() == 1 of its group ordered by `order`."""
    indices = _sorted_indices(table, [*group, *order])
    first_sorted = ~_same_as_previous(table.select(list(group)).take(indices), group)
    first = np.empty(table.num_rows, dtype=bool)
    first[indices] = first_sorted
    return first


def _descents(table: pa.Table, group: Sequence[str], order: str, value: str) -> np.ndarray:
    """Per row (table order): `value` < lag(`value`) within its group ordered by `order`."""
    indices = _sorted_indices(table, [*group, order])
    ordered = table.select([*group, value]).take(indices)
    same = _same_as_previous(ordered, group)
    values = ordered[value]
    below = np.zeros(table.num_rows, dtype=bool)
    if table.num_rows > 1:
        below[1:] = _flags(pc.less(values.slice(1), values.slice(0, table.num_rows - 1)))
    descent = np.empty(table.num_rows, dtype=bool)
    descent[indices] = same & below
    return descent


def _summary_row(
    key: tuple[Any, ...], planned: Mapping[str, Any] | None, ledger: Mapping[str, Any] | None
) -> dict[str, Any]:
    """One summary row from a transfer's counters and ledger aggregates (either may be
    missing: the full outer join of `summarize`)."""
    counters = planned or {}
    found = ledger or {}

    def count(name: str) -> int:
        value = found.get(name)
        return int(value) if value is not None else 0

    def minus(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else a - b

    ledger_rows = count("_row_sum")
    confirmed_rows = count("_confirmed_sum")
    confirmed_duplicates = count("_duplicate_sum")
    uncertain_rows = ledger_rows - confirmed_rows
    distinct_messages = confirmed_rows - confirmed_duplicates
    source_drop = minus(counters.get("source_depth_before"), counters.get("source_depth_after"))
    destination_rise = minus(
        counters.get("destination_depth_after"), counters.get("destination_depth_before")
    )
    # Spark's greatest() and least() skip nulls, so an unknown rise explains nothing.
    arrived = max(minus(destination_rise, confirmed_rows) or 0, 0)
    uncertain_arrived = min(arrived, uncertain_rows)
    redelivered_rows = count("_redelivered_sum")
    retried_rows = count("_retried_sum")
    reordered = count("_reordered_sum")
    min_position, max_position = found.get("position_min"), found.get("position_max")
    distinct_positions = count("position_count_distinct")
    contiguous = ledger_rows == 0 or (
        min_position is not None
        and max_position is not None
        and min_position == 0
        and distinct_positions == max_position + 1
    )
    status = counters.get("status")
    shared = bool(counters.get(DESTINATION_SHARED) or False)
    above_ledger = max(minus(destination_rise, ledger_rows) or 0, 0)
    row: dict[str, Any] = {name: value for name, value in zip(TRANSFER_KEY, key, strict=True)}
    row |= {
        "status": status if status is not None else STATUS_UNPLANNED,
        "error": counters.get("error"),
        **{name: counters.get(name) for name in DEPTH_COLUMNS},
        "ledger_rows": ledger_rows,
        "confirmed_rows": confirmed_rows,
        "uncertain_rows": uncertain_rows,
        "duplicates": confirmed_duplicates + uncertain_arrived,
        "distinct_messages": distinct_messages,
        "bytes": count("_bytes_sum"),
        "source_drop": source_drop,
        "destination_rise": destination_rise,
        "lost": max(minus(source_drop, distinct_messages) or 0, 0),
        "unexpected": 0 if shared else above_ledger,
        DESTINATION_SHARED: shared,
        "live_arrivals": above_ledger if shared else 0,
        "missing_at_destination": max(minus(confirmed_rows, destination_rise) or 0, 0),
        "redelivered_rows": redelivered_rows,
        "retried_rows": retried_rows,
        "reordered": reordered,
        "order_kept": redelivered_rows > 0 or retried_rows > 0 or reordered == 0,
        "min_position": min_position,
        "max_position": max_position,
        "distinct_positions": distinct_positions,
        "positions_contiguous": contiguous,
        **{name: count(f"{name}_sum") for name in PROBLEM_COUNTS},
    }
    return {name: row[name] for name in SUMMARY_COLUMNS}


# --- Spark-free part: verdicts and failure descriptions ---------------------------------


def transfer_label(row: Mapping[str, Any]) -> str:
    """`cluster:vhost:queue -> cluster:vhost:queue`, how failure lines name a transfer.

    Colons, not slashes: the default vhost is "/".
    """
    return (
        f"{row['source_cluster']}:{row['source_vhost']}:{row['source_queue']} -> "
        f"{row['destination_cluster']}:{row['destination_vhost']}:{row['destination_queue']}"
    )


def queue_verdict(row: Mapping[str, Any]) -> QueueVerdict:
    """The verdict on one summary row (a plain dict, as collected from `summarize`).

    A null depth (not measured, or an unplanned transfer) fails the queue and shows as 0.
    """
    source_drop = row["source_drop"]
    destination_rise = row["destination_rise"]
    passed = (
        row["status"] == STATUS_MOVED
        and source_drop is not None
        and destination_rise is not None
        and row["distinct_messages"] == source_drop
        and row["unexpected"] == 0
        and row["missing_at_destination"] == 0
        and bool(row["positions_contiguous"])
        and bool(row["order_kept"])
        and all(row[name] == 0 for name in PROBLEM_COUNTS)
    )
    return QueueVerdict(
        source_cluster=row["source_cluster"],
        source_vhost=row["source_vhost"],
        source_queue=row["source_queue"],
        destination_cluster=row["destination_cluster"],
        destination_vhost=row["destination_vhost"],
        destination_queue=row["destination_queue"],
        status=row["status"],
        error=row["error"],
        ledger_rows=row["ledger_rows"],
        uncertain_rows=row["uncertain_rows"],
        distinct_messages=row["distinct_messages"],
        duplicates=row["duplicates"],
        bytes=row["bytes"],
        source_drop=source_drop or 0,
        destination_rise=destination_rise or 0,
        lost=row["lost"] or 0,
        unexpected=row["unexpected"] or 0,
        positions_contiguous=bool(row["positions_contiguous"]),
        order_kept=bool(row["order_kept"]),
        passed=passed,
        live_arrivals=row["live_arrivals"] or 0,
    )


def describe_failures(
    validation_results: Sequence[Mapping[str, Any]],
    summary_rows: Sequence[Mapping[str, Any]],
) -> tuple[str, ...]:
    """One line per failed expectation: type, column(s), what GE observed, and the queues.

    `validation_results` are GE suite results as JSON dicts; the queues are found in
    `summary_rows`, since GE's samples of unexpected values do not say which queue they
    came from.
    """
    lines: list[str] = []
    for suite_result in validation_results:
        for result in suite_result["results"]:
            if result["success"]:
                continue
            config = result["expectation_config"]
            kind, kwargs = config["type"], config["kwargs"]
            columns = [kwargs[k] for k in ("column", "column_A", "column_B") if k in kwargs]
            line = f"{suite_result['suite_name']}: {kind}({', '.join(columns)})"
            observed = result.get("result") or {}
            if "unexpected_count" in observed:
                line += (
                    f": {observed['unexpected_count']} of {observed['element_count']} "
                    f"unexpected, e.g. {observed.get('partial_unexpected_list')}"
                )
            elif "observed_value" in observed:
                line += f": observed {observed['observed_value']}"
            exception = result.get("exception_info") or {}
            if exception.get("raised_exception"):
                line += f": raised {exception.get('exception_message')}"
            queues = _offending_queues(kind, kwargs, summary_rows)
            if queues:
                line += "; " + _name_queues(queues)
            lines.append(line)
    return tuple(lines)


def _offending_queues(
    kind: str, kwargs: Mapping[str, Any], summary_rows: Sequence[Mapping[str, Any]]
) -> list[str]:
    if kind == _PAIR_EQUAL:
        a, b = kwargs["column_A"], kwargs["column_B"]
        return [
            f"{transfer_label(row)} ({a}={row[a]}, {b}={row[b]})"
            for row in summary_rows
            if row[a] is None or row[b] is None or row[a] != row[b]
        ]
    if kind == _NOT_NULL and kwargs.get("column") in SUMMARY_COLUMNS:
        column = kwargs["column"]
        return [
            f"{transfer_label(row)} ({column} unknown)"
            for row in summary_rows
            if row[column] is None
        ]
    if kind == _IN_SET and "column" in kwargs and kwargs["column"] in SUMMARY_COLUMNS:
        column, allowed = kwargs["column"], kwargs["value_set"]
        return [
            f"{transfer_label(row)} ({column}={row[column]}"
            + (f", error: {row['error']}" if column == "status" and row["error"] else "")
            + ")"
            for row in summary_rows
            if row[column] not in allowed
        ]
    count = _MESSAGE_PROBLEM_COUNT.get((kind, kwargs.get("column", kwargs.get("column_A", ""))))
    if count is None:
        return []
    return [f"{transfer_label(row)} ({count}={row[count]})" for row in summary_rows if row[count]]


def _name_queues(queues: list[str]) -> str:
    named = "; ".join(queues[:MAX_QUEUES_NAMED])
    rest = len(queues) - MAX_QUEUES_NAMED
    return named + (f"; and {rest} more" if rest > 0 else "")


# --- Great Expectations -----------------------------------------------------------------

# What `_validate_with_gx` and the expectation lists import: GE's package import alone
# takes seconds (its expectation registry pulls in scipy and pandas).
_GX_MODULES: tuple[str, ...] = (
    "great_expectations",
    "great_expectations.core.run_identifier",
    "great_expectations.data_context.types.base",
    "great_expectations.expectations.core.expect_column_pair_values_to_be_equal",
    "great_expectations.expectations.core.expect_column_values_to_be_in_set",
    "great_expectations.expectations.core.expect_column_values_to_not_be_null",
    "great_expectations.expectations.core.expect_column_pair_values_a_to_be_greater_than_b",
)


@functools.cache
def preload_great_expectations() -> threading.Thread:
    """Start importing Great Expectations on a background thread, once per process;
    returns the thread.

    `rmq-spark transfer` starts it while Spark starts, and the pipeline (for callers
    with a session of their own) before the move, so verification does not spend
    those seconds (~2 CPU-s) after the move.
    Importing is idempotent: `_validate_with_gx` imports the same modules and, if the
    thread is still at it, waits for it (Python's import lock). Not a daemon: the
    interpreter does not stop halfway through an import at exit.
    """
    thread = threading.Thread(target=_import_gx, name="rmq-spark-preload-gx")
    thread.start()
    return thread


def _import_gx() -> None:
    started = time.monotonic()
    try:
        for name in _GX_MODULES:
            importlib.import_module(name)
    except ImportError as exc:
        # Verification imports it again and reports the error where it matters.
        log.warning("preloading Great Expectations failed: %s", exc)
        return
    log.debug("Great Expectations imported in %.1fs", time.monotonic() - started)


def verify_ledger_run(
    spark: SparkSession,
    ledger_path: str,
    run_id: str,
    counters: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    local_max_rows: int = LOCAL_MAX_ROWS,
) -> Verification:
    """Verify a run committed to the ledger at `ledger_path`, on the engine its size calls for.

    Up to `local_max_rows` ledger rows: `verify_run_arrow` (pyarrow reads the run's
    files; no Spark job). More: `verify_run` in Spark. The row count comes from the
    Parquet footers. `counters` are the pipeline's rows (COUNTER_COLUMNS, more allowed).
    """
    dataset = tables.arrow_dataset(ledger_path, "messages", run_id)
    rows = dataset.count_rows()
    if rows <= local_max_rows:
        columns = list(dict.fromkeys([*SUMMARY_INPUT_COLUMNS, *MESSAGE_CHECK_COLUMNS]))
        messages = tables.read_arrow(ledger_path, "messages", run_id=run_id, columns=columns)
        return verify_run_arrow(run_id, messages, counters, out_dir)
    log.info("run %s: %d ledger rows, verified in Spark", run_id, rows)
    counter_schema = spark_schema(tuple(c for c in QUEUES if c.name in COUNTER_COLUMNS)).add(
        DESTINATION_SHARED, T.BooleanType(), nullable=False
    )
    return verify_run(
        run_id,
        tables.read_run_messages(spark, ledger_path, run_id),
        spark.createDataFrame(
            [
                {
                    **{name: row[name] for name in COUNTER_COLUMNS},
                    DESTINATION_SHARED: bool(row.get(DESTINATION_SHARED, False)),
                }
                for row in counters
            ],
            counter_schema,
        ),
        out_dir,
    )


def verify_run(
    run_id: str, messages: DataFrame, counters: DataFrame, out_dir: str | Path
) -> Verification:
    """Verify one run in Spark and write `verification.json` and Data Docs under `out_dir`.

    `messages` holds the run's ledger rows (MESSAGES columns); `counters` one row per
    queue transfer with TRANSFER_KEY, DEPTH_COLUMNS, status and error. Returns the
    Verification; raises only for malformed input.
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    # The summary and each GE metric pass read `messages` again; cache it unless the
    # caller already did (and then leave their cache alone).
    cached_here = messages.storageLevel == StorageLevel.NONE
    if cached_here:
        messages = messages.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        summary = summarize(messages, counters)
        collected = summary.collect()
        summary_rows = [row.asDict() for row in collected]
        # GE validates the collected rows, not the summary plan, so the joins and windows
        # behind it run once however many metrics GE computes.
        summary_frame = messages.sparkSession.createDataFrame(collected, schema=summary.schema)
        with _quiet_gx():
            results, index_html = _validate_with_gx(
                run_id, ENGINE_SPARK, summary_frame, messages, out / DATA_DOCS_DIR
            )
    finally:
        if cached_here:
            messages.unpersist()
    return _verification(
        run_id,
        ENGINE_SPARK,
        summary_rows,
        results=results,
        index_html=index_html,
        out=out,
        started=started,
    )


def verify_run_arrow(
    run_id: str,
    messages: pa.Table,
    counters: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
) -> Verification:
    """`verify_run` on the driver: pyarrow summary, GE on pandas frames; same Verification.

    `messages` holds the run's ledger rows with at least SUMMARY_INPUT_COLUMNS and
    MESSAGE_CHECK_COLUMNS; `counters` one mapping per queue transfer (COUNTER_COLUMNS).
    """
    import pandas as pd

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    missing = [c for c in MESSAGE_CHECK_COLUMNS if c not in messages.column_names]
    if missing:
        raise ValueError(
            f"messages table lacks column(s) {', '.join(missing)}; required: "
            f"{', '.join(MESSAGE_CHECK_COLUMNS)}; found: {', '.join(messages.column_names)}"
        )
    summary_rows = summarize_arrow(messages, counters)
    # object columns keep Python's values as they are (ints stay ints, None stays None
    # rather than NaN), so GE sees what the Spark engine's rows hold.
    summary_frame = pd.DataFrame(summary_rows, columns=list(SUMMARY_COLUMNS), dtype=object)
    message_frame = messages.select(list(MESSAGE_CHECK_COLUMNS)).to_pandas()
    with _quiet_gx():
        results, index_html = _validate_with_gx(
            run_id, ENGINE_DRIVER, summary_frame, message_frame, out / DATA_DOCS_DIR
        )
    return _verification(
        run_id,
        ENGINE_DRIVER,
        summary_rows,
        results=results,
        index_html=index_html,
        out=out,
        started=started,
    )


def _verification(
    run_id: str,
    engine: str,
    summary_rows: Sequence[Mapping[str, Any]],
    *,
    results: Sequence[Mapping[str, Any]],
    index_html: str | None,
    out: Path,
    started: float,
) -> Verification:
    """The verdicts, totals and failure lines; written to verification.json and logged."""
    verdicts = tuple(queue_verdict(row) for row in summary_rows)
    verification = Verification(
        run_id=run_id,
        queues=verdicts,
        messages=sum(v.distinct_messages for v in verdicts),
        bytes=sum(v.bytes for v in verdicts),
        lost=sum(v.lost for v in verdicts),
        duplicates=sum(v.duplicates for v in verdicts),
        unexpected=sum(v.unexpected for v in verdicts),
        live_arrivals=sum(v.live_arrivals for v in verdicts),
        verified=all(result["success"] for result in results),
        failed_expectations=describe_failures(results, summary_rows),
        results_path=str(out / RESULTS_FILE),
        data_docs_path=index_html,
        engine=engine,
    )
    _write_results(verification, summary_rows, results)
    log.info(
        "run %s verified=%s: %d queues, %d messages, %d bytes, lost %d, duplicates %d, "
        "unexpected %d (%s engine, %.1fs); results in %s",
        run_id,
        verification.verified,
        len(verdicts),
        verification.messages,
        verification.bytes,
        verification.lost,
        verification.duplicates,
        verification.unexpected,
        engine,
        time.monotonic() - started,
        verification.results_path,
    )
    for line in verification.failed_expectations:
        log.warning("run %s failed expectation %s", run_id, line)
    return verification


def _summary_expectations() -> list[Expectation]:
    # Imported from their modules: `great_expectations.expectations` re-exports them
    # implicitly, which mypy --strict does not accept.
    from great_expectations.expectations.core.expect_column_pair_values_to_be_equal import (
        ExpectColumnPairValuesToBeEqual,
    )
    from great_expectations.expectations.core.expect_column_values_to_be_in_set import (
        ExpectColumnValuesToBeInSet,
    )
    from great_expectations.expectations.core.expect_column_values_to_not_be_null import (
        ExpectColumnValuesToNotBeNull,
    )

    # "neither": a null depth is a mismatch, not a row to skip.
    return [
        ExpectColumnPairValuesToBeEqual(
            column_A="distinct_messages", column_B="source_drop", ignore_row_if="neither"
        ),
        # Every arrival is explained by a row (confirmed, or uncertain and named) ...
        ExpectColumnValuesToBeInSet(column="unexpected", value_set=[0]),
        # ... and every confirmed row is in the destination.
        ExpectColumnValuesToBeInSet(column="missing_at_destination", value_set=[0]),
        ExpectColumnValuesToNotBeNull(column="destination_rise"),
        ExpectColumnValuesToBeInSet(column="status", value_set=[STATUS_MOVED]),
        ExpectColumnValuesToBeInSet(column="positions_contiguous", value_set=[True]),
        ExpectColumnValuesToBeInSet(column="order_kept", value_set=[True]),
        # In-set skips nulls as "missing"; a null here must fail too.
        ExpectColumnValuesToNotBeNull(column="positions_contiguous"),
    ]


def _message_expectations(run_id: str) -> list[Expectation]:
    from great_expectations.expectations.core.expect_column_pair_values_a_to_be_greater_than_b import (  # noqa: E501
        ExpectColumnPairValuesAToBeGreaterThanB,
    )
    from great_expectations.expectations.core.expect_column_values_to_be_in_set import (
        ExpectColumnValuesToBeInSet,
    )
    from great_expectations.expectations.core.expect_column_values_to_not_be_null import (
        ExpectColumnValuesToNotBeNull,
    )

    # All of these are map expectations: on Spark their counts are one bundled df.agg and
    # their samples a filter().limit(n).collect(); nothing converts the table to pandas.
    return [
        ExpectColumnValuesToBeInSet(column="run_id", value_set=[run_id]),
        ExpectColumnValuesToNotBeNull(column="body_sha256"),
        ExpectColumnValuesToNotBeNull(column="properties_sha256"),
        # confirmed_at is null on uncertain rows (lost connection); those are accounted
        # for by the summary's destination rise, not here.
        ExpectColumnPairValuesAToBeGreaterThanB(
            column_A="confirmed_at",
            column_B="consumed_at",
            or_equal=True,
            ignore_row_if="either_value_is_missing",
        ),
    ]


def _validate_with_gx(
    run_id: str,
    engine: str,
    summary: DataFrame | pd.DataFrame,
    messages: DataFrame | pd.DataFrame,
    docs_dir: Path,
) -> tuple[list[dict[str, Any]], str | None]:
    """Run both suites in a fresh ephemeral context; return their JSON and the index.html.

    `engine` says what the frames are: Spark DataFrames (ENGINE_SPARK) or pandas
    (ENGINE_DRIVER); the suites are the same.
    """
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )
    from great_expectations.execution_engine import pandas_execution_engine

    # GE fingerprints every pandas batch under 1 GB it is given: an md5 over pandas' row
    # hashes, 3.5 s of the 10 s a 1M-row run took to verify on a 2-core box. The
    # fingerprint is a batch marker in the results, which nothing here reads.
    pandas_execution_engine.HASH_THRESHOLD = 0
    started = time.monotonic()
    config = DataContextConfig(
        # Without init_temp_docs_sites=False the ephemeral context adds a second docs
        # site in a fresh temp directory and builds it too.
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        data_docs_sites={
            DATA_DOCS_SITE: {
                "class_name": "SiteBuilder",
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(docs_dir),
                },
            }
        },
        # Metric calculation shows tqdm bars unless the context turns them off.
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
        analytics_enabled=False,
    )
    context = gx.get_context(project_config=config, mode="ephemeral")
    # persist=False: verify_run caches `messages` itself and releases the cache after;
    # GE's own persist() would never be undone.
    source = (
        context.data_sources.add_spark(name=GX_DATASOURCE, persist=False)
        if engine == ENGINE_SPARK
        else context.data_sources.add_pandas(name=GX_DATASOURCE)
    )
    # Both suites share one run identifier, so Data Docs lists them under the run's name.
    gx_run = RunIdentifier(run_name=run_id, run_time=dt.datetime.now(dt.UTC))

    results: list[dict[str, Any]] = []
    for asset_name, frame, expectations in (
        (SUMMARY_ASSET, summary, _summary_expectations()),
        (MESSAGES_ASSET, messages, _message_expectations(run_id)),
    ):
        batch_definition = source.add_dataframe_asset(
            name=asset_name
        ).add_batch_definition_whole_dataframe(WHOLE_DATAFRAME)
        suite = context.suites.add(gx.ExpectationSuite(name=asset_name))
        for expectation in expectations:
            suite.add_expectation(expectation)
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=asset_name, data=batch_definition, suite=suite)
        )
        result = definition.run(
            batch_parameters={"dataframe": frame}, result_format=RESULT_FORMAT, run_id=gx_run
        )
        results.append(result.to_json_dict())
    validated = time.monotonic()

    # build_data_docs renders every suite and validation result in the (in-memory)
    # stores, which hold exactly this run's.
    sites = context.build_data_docs(site_names=[DATA_DOCS_SITE])
    index_html = docs_dir / "index.html"
    log.debug(
        "GE validated run %s in %.1fs, rendered Data Docs %s in %.1fs",
        run_id,
        validated - started,
        sites.get(DATA_DOCS_SITE),
        time.monotonic() - validated,
    )
    return results, str(index_html) if index_html.is_file() else None


@contextlib.contextmanager
def _quiet_gx() -> Iterator[None]:
    """Hold GE's loggers at WARNING while it runs, whatever the application's root level."""
    logger = logging.getLogger(_GX_LOGGER)
    previous = logger.level
    if logger.getEffectiveLevel() < logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(previous)


def _write_results(
    verification: Verification,
    summary_rows: Sequence[Mapping[str, Any]],
    gx_results: Sequence[Mapping[str, Any]],
) -> None:
    document = {
        "run_id": verification.run_id,
        "verified": verification.verified,
        "totals": {
            "queues": len(verification.queues),
            "messages": verification.messages,
            "bytes": verification.bytes,
            "lost": verification.lost,
            "duplicates": verification.duplicates,
            "unexpected": verification.unexpected,
            "live_arrivals": verification.live_arrivals,
        },
        "engine": verification.engine,
        "failed_expectations": list(verification.failed_expectations),
        "queues": [
            {**asdict(verdict), "summary": dict(row)}
            for verdict, row in zip(verification.queues, summary_rows, strict=True)
        ],
        "data_docs_path": verification.data_docs_path,
        "great_expectations": list(gx_results),
    }
    Path(verification.results_path).write_text(
        json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8"
    )
