"""The per-queue summary in Spark, for runs of any size (`summarize_arrow` is its
driver twin; tests/spark/test_verify.py runs every case through both)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rmq_spark.ledger.layout import KEY_COLUMNS
from rmq_spark.ledger.schema import TRANSFER_KEY
from rmq_spark.model import TransferKey
from rmq_spark.verify.columns import (
    CONFIRMED_BEFORE_CONSUMED,
    COUNTER_COLUMNS,
    DECISION,
    DEPTH_COLUMNS,
    DESTINATION_SHARED,
    FENCES,
    KEPT,
    MESSAGE_COLUMNS,
    NULL_BODY_SHA256,
    NULL_PROPERTIES_SHA256,
    PROBLEM_COUNTS,
    RECOGNISED,
    SOURCE_REMOVED,
    STATUS_UNPLANNED,
    WITNESS_COUNTERS,
    WITNESS_DEPTH,
    WITNESS_NONE,
)

# Gaps collected per run at most (a ledger with more is named by its first ones).
MAX_GAPS_COLLECTED = 10_000


def summarize(messages: DataFrame, counters: DataFrame) -> DataFrame:
    """One row per queue transfer: ledger counts joined to the driver's broker counters.

    Transfers without ledger rows appear with zero counts; ledger rows whose transfer is
    not in `counters` appear with status "unplanned" and null depths. Columns are
    SUMMARY_COLUMNS, rows ordered by TRANSFER_KEY. One small job runs at once (the
    count of confirmed, redelivered rows, which decides whether duplicates are looked
    for); the rest is lazy.
    """
    _require_columns("messages", messages, [c for c in MESSAGE_COLUMNS if c != DECISION])
    _require_columns("counters", counters, COUNTER_COLUMNS)
    key = list(TRANSFER_KEY)
    ledger = _with_counts(
        _with_counts(
            _ledger_counts(messages, key), _duplicate_counts(messages, key), key, _DUPLICATE_COUNTS
        ),
        _null_checksum_counts(messages, key),
        key,
        (NULL_BODY_SHA256, NULL_PROPERTIES_SHA256),
    )
    shared = (
        F.col(DESTINATION_SHARED).cast(T.BooleanType())
        if DESTINATION_SHARED in counters.columns
        else F.lit(False)
    )
    removed_counter = (
        F.col(SOURCE_REMOVED).cast(T.LongType())
        if SOURCE_REMOVED in counters.columns
        else F.lit(None).cast(T.LongType())
    )
    fences_counter = (
        F.coalesce(F.col(FENCES).cast(T.LongType()), F.lit(0).cast(T.LongType()))
        if FENCES in counters.columns
        else F.lit(0).cast(T.LongType())
    )
    planned = counters.select(
        *COUNTER_COLUMNS,
        shared.alias(DESTINATION_SHARED),
        removed_counter.alias(SOURCE_REMOVED),
        fences_counter.alias(FENCES),
    )
    # Full outer: a planned transfer with no rows must still be checked, and a row of an
    # unplanned transfer must not vanish from the verification.
    joined = planned.join(ledger, on=key, how="full_outer")

    zero = F.lit(0).cast(T.LongType())
    is_shared = F.coalesce(F.col(DESTINATION_SHARED), F.lit(False))
    ledger_rows = F.coalesce(F.col("ledger_rows"), zero)
    confirmed_rows = F.coalesce(F.col("confirmed_rows"), zero)
    uncertain_rows = ledger_rows - confirmed_rows
    # A selective move's kept rows went back to the source, not to the destination: the
    # destination's figures count the moved rows only, and what left the source (acked)
    # is the moved, the kept and the fences.
    confirmed_duplicates = F.coalesce(F.col("confirmed_duplicates"), zero)
    kept_messages = F.coalesce(F.col("kept_confirmed"), zero) - F.coalesce(
        F.col("kept_duplicates"), zero
    )
    # A recognised row repeating an earlier one is a message moved once, by that row:
    # it made no copy of its own (a recognised row without an earlier one counts as a
    # copy the destination must hold).
    recognised = F.coalesce(F.col("recognised_duplicates"), zero)
    moved_rows = ledger_rows - F.coalesce(F.col("kept_rows"), zero) - recognised
    moved_confirmed = confirmed_rows - F.coalesce(F.col("kept_confirmed"), zero) - recognised
    moved_uncertain = moved_rows - moved_confirmed
    distinct_messages = confirmed_rows - confirmed_duplicates - kept_messages
    acked = distinct_messages + kept_messages + F.coalesce(F.col(FENCES), zero)
    source_drop = F.col("source_depth_before") - F.col("source_depth_after")
    destination_rise = F.col("destination_depth_after") - F.col("destination_depth_before")
    # Of the uncertain publishes, this many reached the destination (clamped to what the
    # rows can explain; the rest shows as unexpected or missing).
    uncertain_arrived = F.least(
        F.greatest(destination_rise - moved_confirmed, zero), moved_uncertain
    )
    duplicates = confirmed_duplicates - recognised + F.coalesce(uncertain_arrived, zero)
    redelivered_or_retried = (F.coalesce(F.col("redelivered_rows"), zero) > 0) | (
        F.coalesce(F.col("retried_rows"), zero) > 0
    )
    # What left the source: the consumer counters when they saw at least what was
    # moved (above it, another consumer took messages), else the depth drop. An
    # excess the depths contradict proves nothing (columns.py says why).
    removed = F.col(SOURCE_REMOVED)
    contradicted = F.coalesce((removed > acked) & (source_drop == distinct_messages), F.lit(False))
    counted = removed.isNotNull() & (removed >= acked) & ~contradicted
    taken = F.when(counted, removed - acked)
    witness = (
        F.when(counted, F.lit(WITNESS_COUNTERS))
        .when(~contradicted & (source_drop >= distinct_messages), F.lit(WITNESS_DEPTH))
        .otherwise(F.lit(WITNESS_NONE))
    )
    contiguous = (ledger_rows == 0) | (
        (F.col("min_position") == 0) & (F.col("distinct_positions") == F.col("max_position") + 1)
    )
    summary = joined.select(
        *key,
        F.coalesce(F.col("status"), F.lit(STATUS_UNPLANNED)).alias("status"),
        F.col("error"),
        *DEPTH_COLUMNS,
        ledger_rows.alias("ledger_rows"),
        confirmed_rows.alias("confirmed_rows"),
        uncertain_rows.alias("uncertain_rows"),
        duplicates.alias("duplicates"),
        recognised.alias("recognised"),
        distinct_messages.alias("distinct_messages"),
        kept_messages.alias("kept_messages"),
        (
            F.coalesce(F.col("confirmed_bytes"), zero) - F.coalesce(F.col("duplicate_bytes"), zero)
        ).alias("bytes"),
        source_drop.alias("source_drop"),
        destination_rise.alias("destination_rise"),
        # greatest() skips nulls: an unknown depth counts as nothing lost here, and is
        # caught by the pair-equality expectations, which treat null as a mismatch.
        F.greatest(source_drop - distinct_messages, F.coalesce(taken, zero), zero).alias("lost"),
        removed.alias(SOURCE_REMOVED),
        taken.alias("taken_by_others"),
        witness.alias("source_witness"),
        F.when(is_shared, zero)
        .otherwise(F.greatest(destination_rise - moved_rows, zero))
        .alias("unexpected"),
        is_shared.alias(DESTINATION_SHARED),
        F.when(is_shared, F.greatest(destination_rise - moved_rows, zero))
        .otherwise(zero)
        .alias("live_arrivals"),
        F.greatest(moved_confirmed - destination_rise, zero).alias("missing_at_destination"),
        F.coalesce(F.col("redelivered_rows"), zero).alias("redelivered_rows"),
        F.coalesce(F.col("retried_rows"), zero).alias("retried_rows"),
        F.coalesce(F.col("reordered"), zero).alias("reordered"),
        (redelivered_or_retried | (F.coalesce(F.col("reordered"), zero) == 0)).alias("order_kept"),
        F.col("min_position"),
        F.col("max_position"),
        F.coalesce(F.col("distinct_positions"), zero).alias("distinct_positions"),
        F.coalesce(contiguous, F.lit(False)).alias("positions_contiguous"),
        *(F.coalesce(F.col(name), zero).alias(name) for name in PROBLEM_COUNTS),
    )
    # One row per transfer: sorted in one partition. orderBy's range partitioning
    # would sample its input first, running the windows and the aggregation twice.
    return summary.repartition(1).sortWithinPartitions(*key)


def _confirmed() -> Any:
    return F.col("confirmed_at").isNotNull()


def _recognised(messages: DataFrame) -> Any:
    """A resumed session's row of a redelivery an earlier session had moved, acked
    without a publish (transfer/recognition.py)."""
    if DECISION not in messages.columns:
        return F.lit(False)
    return F.coalesce(F.col(DECISION) == F.lit(RECOGNISED), F.lit(False))


def _kept(messages: DataFrame) -> Any:
    """A selective move's kept rows (published back to the source); null is "moved"."""
    if DECISION not in messages.columns:
        return F.lit(False)
    return F.coalesce(F.col(DECISION) == F.lit(KEPT), F.lit(False))


def _count_where(condition: Any) -> Any:
    return F.coalesce(F.sum(F.when(condition, 1).otherwise(0)), F.lit(0)).cast(T.LongType())


# What `_duplicate_counts` adds to each transfer's counts (null: it has none).
_DUPLICATE_COUNTS = (
    "confirmed_duplicates",
    "kept_duplicates",
    "recognised_duplicates",
    "duplicate_bytes",
)
# Checksum groups of redelivered rows up to this many are broadcast to the semi join
# (~200 bytes each); more (a run of many lost sessions) are joined by a shuffle.
BROADCAST_REDELIVERED_MAX = 100_000


def _duplicate_counts(messages: DataFrame, key: list[str]) -> DataFrame | None:
    """Per transfer with duplicates: how many confirmed rows repeat an earlier one, how
    many of those are kept rows and how many recognised ones (acked without a publish:
    no copy of their own), and the bytes of the moved ones; None when no confirmed row
    was redelivered, so none can be a duplicate.

    A crash between the durable ledger row and the source ack makes the broker redeliver
    the message and the mover publish it again: a later, redelivered row with the same
    checksums. Only confirmed rows count here: an uncertain row (no confirm time) may
    never have arrived; the destination's rise says how many of those did.
    publish_seq only breaks ties so the choice of "first" is deterministic.

    Only a confirmed, redelivered row can be a duplicate, so only the checksum groups
    holding one are numbered (a window over every confirmed row shuffled and sorted
    them all). Counting those rows first is one narrow job (Parquet's statistics skip
    every row group without a redelivered row); the semi join matches nulls as the
    window's partitions do.
    """
    same = [*key, "body_sha256", "properties_sha256"]
    redelivered = F.coalesce(F.col("redelivered"), F.lit(False))
    confirmed = messages.where(_confirmed())
    repeated_rows = confirmed.where(redelivered)
    redeliveries = repeated_rows.count()
    if redeliveries == 0:
        return None
    repeated = repeated_rows.select(*same).distinct()
    if redeliveries <= BROADCAST_REDELIVERED_MAX:
        repeated = F.broadcast(repeated)
    in_repeated = functools.reduce(
        operator.and_, (confirmed[name].eqNullSafe(repeated[name]) for name in same)
    )
    candidates = confirmed.join(repeated, on=in_repeated, how="left_semi")
    first_copy = Window.partitionBy(*same).orderBy("position", "publish_seq")
    return (
        candidates.withColumn("_kept", _kept(messages))
        .withColumn("_copy", F.row_number().over(first_copy))
        .where((F.col("_copy") > 1) & redelivered)
        .groupBy(*key)
        .agg(
            F.count(F.lit(1)).alias("confirmed_duplicates"),
            _count_where(F.col("_kept")).alias("kept_duplicates"),
            _count_where(_recognised(messages)).alias("recognised_duplicates"),
            F.sum(F.when(~F.col("_kept"), F.col("body_size"))).alias("duplicate_bytes"),
        )
    )


def _null_checksum_counts(messages: DataFrame, key: list[str]) -> DataFrame:
    """Per transfer with a null checksum: its rows without a body and without a
    properties checksum. Only rows with a null are read: Parquet's null counts skip
    every row group without one, so the checksums (most of a row's bytes) are not
    decoded for the summary at all."""
    no_body, no_properties = F.col("body_sha256").isNull(), F.col("properties_sha256").isNull()
    return (
        messages.where(no_body | no_properties)
        .groupBy(*key)
        .agg(
            _count_where(no_body).alias(NULL_BODY_SHA256),
            _count_where(no_properties).alias(NULL_PROPERTIES_SHA256),
        )
    )


def _with_counts(
    counts: DataFrame, extra: DataFrame | None, key: list[str], names: Sequence[str]
) -> DataFrame:
    """`counts` with the columns `names` of `extra` (per transfer; null where it has no
    row, or all null when `extra` is None), matched on the key as groupBy groups it: a
    null key part matches a null."""
    if extra is None:
        none = F.lit(None).cast(T.LongType())
        return counts.select("*", *(none.alias(name) for name in names))
    theirs = extra.select(
        *(F.col(name).alias(f"_extra_{name}") for name in key), *(F.col(n) for n in names)
    )
    same_key = functools.reduce(
        operator.and_, (counts[name].eqNullSafe(theirs[f"_extra_{name}"]) for name in key)
    )
    return counts.join(theirs, on=same_key, how="left").drop(*(f"_extra_{name}" for name in key))


def _ledger_counts(messages: DataFrame, key: list[str]) -> DataFrame:
    """Per transfer in the ledger: its rows' counts (but the duplicates' and the null
    checksums', which `_duplicate_counts` and `_null_checksum_counts` add), positions
    and order.

    Every flag is computed before the rows are partitioned by transfer, so only narrow
    rows are shuffled; both windows and the aggregation then reuse that partitioning.
    """
    confirmed = _confirmed()
    kept = _kept(messages)
    narrow = messages.select(
        *key,
        "task_attempt",
        "session",
        "position",
        "publish_seq",
        kept.alias("_kept"),
        confirmed.alias("_confirmed"),
        F.coalesce(F.col("redelivered"), F.lit(False)).alias("_redelivered"),
        (F.col("publish_attempts") > 1).alias("_retried"),
        F.when(confirmed & ~kept, F.col("body_size")).alias("_bytes"),
        (F.col("confirmed_at") < F.col("consumed_at")).alias("_confirmed_early"),
    ).repartition(*key)
    # With one consumer and no redelivery or retry, publish order is source order: within
    # one session of one task attempt, publish_seq must grow with position.
    # Each link numbers its own publishes: kept rows are compared with kept rows.
    same_session = Window.partitionBy(*key, "task_attempt", "session", "_kept").orderBy("position")
    out_of_order = F.col("publish_seq") < F.lag("publish_seq").over(same_session)
    # countDistinct(position) without its own shuffle: in position order (nulls first),
    # a position other than the previous row's is a new one.
    by_position = Window.partitionBy(*key).orderBy("position")
    previous = F.lag("position").over(by_position)
    new_position = F.col("position").isNotNull() & (
        previous.isNull() | (previous != F.col("position"))
    )
    flagged = narrow.withColumn("_out_of_order", F.coalesce(out_of_order, F.lit(False))).withColumn(
        "_new_position", new_position
    )
    kept_flag, confirmed_flag = F.col("_kept"), F.col("_confirmed")
    return flagged.groupBy(*key).agg(
        F.count(F.lit(1)).alias("ledger_rows"),
        _count_where(confirmed_flag).alias("confirmed_rows"),
        _count_where(kept_flag).alias("kept_rows"),
        _count_where(kept_flag & confirmed_flag).alias("kept_confirmed"),
        _count_where(F.col("_redelivered")).alias("redelivered_rows"),
        _count_where(F.col("_retried")).alias("retried_rows"),
        _count_where(F.col("_out_of_order")).alias("reordered"),
        F.sum("_bytes").alias("confirmed_bytes"),
        F.min("position").alias("min_position"),
        F.max("position").alias("max_position"),
        _count_where(F.col("_new_position")).alias("distinct_positions"),
        _count_where(F.col("_confirmed_early")).alias(CONFIRMED_BEFORE_CONSUMED),
    )


def gaps_spark(
    messages: DataFrame, keys: Sequence[TransferKey]
) -> dict[TransferKey, list[tuple[int, int]]]:
    """`summary_arrow.gaps_arrow` in Spark: the positions missing from each of `keys`'
    ledger rows, as ranges (first, last), found with lag() over distinct positions."""
    key = list(KEY_COLUMNS)
    wanted = messages.sparkSession.createDataFrame(
        [tuple(getattr(transfer, name) for name in key) for transfer in keys],
        T.StructType([T.StructField(name, T.StringType()) for name in key]),
    )
    positions = (
        messages.join(F.broadcast(wanted), on=key, how="left_semi")
        .where(F.col("position").isNotNull())
        .select(*key, "position")
        .distinct()
    )
    previous = F.coalesce(
        F.lag("position").over(Window.partitionBy(*key).orderBy("position")), F.lit(-1)
    )
    gaps = (
        positions.select(*key, (previous + 1).alias("first"), (F.col("position") - 1).alias("last"))
        .where(F.col("first") <= F.col("last"))
        .orderBy(*key, "first")
        .limit(MAX_GAPS_COLLECTED)
    )
    found: dict[TransferKey, list[tuple[int, int]]] = {transfer: [] for transfer in keys}
    for row in gaps.collect():
        found[TransferKey.of(row.asDict())].append((int(row["first"]), int(row["last"])))
    return found


def _require_columns(name: str, df: DataFrame, required: Sequence[str]) -> None:
    missing = [column for column in required if column not in df.columns]
    if missing:
        raise ValueError(
            f"{name} DataFrame lacks column(s) {', '.join(missing)}; "
            f"required: {', '.join(required)}; found: {', '.join(df.columns)}"
        )
