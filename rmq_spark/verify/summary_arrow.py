"""The per-queue summary on the driver with pyarrow and numpy: the same rows and
figures as `summary_spark.summarize`, for runs up to LOCAL_MAX_ROWS rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
    NULL_BODY_SHA256,
    NULL_PROPERTIES_SHA256,
    PROBLEM_COUNTS,
    RECOGNISED,
    SOURCE_REMOVED,
    STATUS_UNPLANNED,
    SUMMARY_COLUMNS,
    SUMMARY_INPUT_COLUMNS,
    WITNESS_COUNTERS,
    WITNESS_DEPTH,
    WITNESS_NONE,
)
from rmq_spark.verify.gaps import missing_ranges


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
    # A selective move's kept rows (published back to the source); null is "moved".
    kept = (
        _flags(pc.equal(messages[DECISION], KEPT))
        if DECISION in messages.column_names
        else np.zeros(messages.num_rows, dtype=bool)
    )
    # A resumed session's rows of redeliveries an earlier one moved (recognition.py).
    recognised = (
        _flags(pc.equal(messages[DECISION], RECOGNISED))
        if DECISION in messages.column_names
        else np.zeros(messages.num_rows, dtype=bool)
    )
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
                "_kept": pa.array(kept),  # each link numbers its own publishes
                "position": messages["position"],
                "publish_seq": messages["publish_seq"],
            }
        ),
        ["_transfer", "task_attempt", "session", "_kept"],
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
            "_kept": as_count(kept),
            "_kept_confirmed": as_count(kept & confirmed),
            "_kept_distinct": as_count(kept & confirmed & ~duplicate),
            "_recognised": as_count(recognised & duplicate),
            "_redelivered": as_count(redelivered),
            "_retried": as_count(_flags(pc.greater(messages["publish_attempts"], 1))),
            "_reordered": as_count(out_of_order),
            "_bytes": pc.if_else(
                pa.array(confirmed & ~duplicate & ~kept),
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
            ("_kept", "sum"),
            ("_kept_confirmed", "sum"),
            ("_kept_distinct", "sum"),
            ("_recognised", "sum"),
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


def _per_key_null_placement() -> bool:
    """Whether this pyarrow takes (name, order, null_placement) sort keys: newer ones do
    and deprecate the global option (25.0); older ones, as Databricks Runtime 17.3's
    19.0.1, have only the global one."""
    try:
        pc.SortOptions(sort_keys=[("column", "ascending", "at_start")])
    except ValueError:
        return False
    return True


_PER_KEY_NULLS = _per_key_null_placement()


def _sorted_indices(table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    # Nulls first, like Spark's ascending sort.
    if _PER_KEY_NULLS:
        keys = [(name, "ascending", "at_start") for name in columns]
        return np.asarray(pc.sort_indices(table, sort_keys=keys))
    ascending = [(name, "ascending") for name in columns]
    return np.asarray(pc.sort_indices(table, sort_keys=ascending, null_placement="at_start"))


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
    # A selective move's kept rows went back to the source, not to the destination: the
    # destination's figures count the moved rows only, and what left the source (acked)
    # is the moved, the kept and the fences.
    kept_messages = count("_kept_distinct_sum")
    # A recognised row repeating an earlier one is a message moved once, by that row:
    # it made no copy of its own (a recognised row without an earlier one counts as a
    # copy the destination must hold).
    recognised = count("_recognised_sum")
    moved_rows = ledger_rows - count("_kept_sum") - recognised
    moved_confirmed = confirmed_rows - count("_kept_confirmed_sum") - recognised
    moved_uncertain = moved_rows - moved_confirmed
    distinct_messages = confirmed_rows - confirmed_duplicates - kept_messages
    acked = distinct_messages + kept_messages + int(counters.get(FENCES) or 0)
    source_drop = minus(counters.get("source_depth_before"), counters.get("source_depth_after"))
    destination_rise = minus(
        counters.get("destination_depth_after"), counters.get("destination_depth_before")
    )
    # Spark's greatest() and least() skip nulls, so an unknown rise explains nothing.
    arrived = max(minus(destination_rise, moved_confirmed) or 0, 0)
    uncertain_arrived = min(arrived, moved_uncertain)
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
    # What left the source: the consumer counters when they saw at least what was
    # moved (above it, another consumer took messages), else the depth drop. An
    # excess the depths contradict proves nothing (columns.py says why).
    removed = counters.get(SOURCE_REMOVED)
    excess = removed - acked if removed is not None and removed >= acked else None
    contradicted = bool(excess) and source_drop == distinct_messages
    taken = None if contradicted else excess
    counted = taken is not None
    if counted:
        witness = WITNESS_COUNTERS
    elif not contradicted and source_drop is not None and source_drop >= distinct_messages:
        witness = WITNESS_DEPTH
    else:
        witness = WITNESS_NONE
    status = counters.get("status")
    shared = bool(counters.get(DESTINATION_SHARED) or False)
    above_ledger = max(minus(destination_rise, moved_rows) or 0, 0)
    row: dict[str, Any] = {name: value for name, value in zip(TRANSFER_KEY, key, strict=True)}
    row |= {
        "status": status if status is not None else STATUS_UNPLANNED,
        "error": counters.get("error"),
        **{name: counters.get(name) for name in DEPTH_COLUMNS},
        "ledger_rows": ledger_rows,
        "confirmed_rows": confirmed_rows,
        "uncertain_rows": uncertain_rows,
        "duplicates": confirmed_duplicates - recognised + uncertain_arrived,
        "recognised": recognised,
        "distinct_messages": distinct_messages,
        "kept_messages": kept_messages,
        "bytes": count("_bytes_sum"),
        "source_drop": source_drop,
        "destination_rise": destination_rise,
        "lost": max(minus(source_drop, distinct_messages) or 0, taken or 0, 0),
        SOURCE_REMOVED: removed,
        "taken_by_others": taken,
        "source_witness": witness,
        "unexpected": 0 if shared else above_ledger,
        DESTINATION_SHARED: shared,
        "live_arrivals": above_ledger if shared else 0,
        "missing_at_destination": max(minus(moved_confirmed, destination_rise) or 0, 0),
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


def gaps_arrow(
    messages: pa.Table, keys: Sequence[TransferKey]
) -> dict[TransferKey, list[tuple[int, int]]]:
    """The positions missing from each of `keys`' ledger rows (`gaps.missing_ranges`)."""
    gaps = {}
    for transfer in keys:
        wanted = pc.equal(messages["source_cluster"], transfer.source_cluster)
        for name in KEY_COLUMNS:
            wanted = pc.and_(wanted, pc.equal(messages[name], getattr(transfer, name)))
        positions = messages.filter(wanted)["position"]
        gaps[transfer] = missing_ranges(pc.unique(positions).to_pylist())
    return gaps
