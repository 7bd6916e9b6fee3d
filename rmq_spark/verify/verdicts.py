"""Spark-free: the verdict on each queue transfer and the failure lines, from plain
summary rows (as chispa's row_comparer works on collected rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rmq_spark.model import TransferKey
from rmq_spark.verify.columns import (
    CONFIRMED_BEFORE_CONSUMED,
    ENGINE_SPARK,
    NULL_BODY_SHA256,
    NULL_PROPERTIES_SHA256,
    PROBLEM_COUNTS,
    SOURCE_REMOVED,
    STATUS_MOVED,
    SUMMARY_COLUMNS,
    WITNESS_DEPTH,
)
from rmq_spark.verify.gaps import MISSING_POSITIONS

# How many offending queues one failure line names before it says "and N more".
MAX_QUEUES_NAMED = 10

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

    key: TransferKey  # the transfer this verdict is about (what the pipeline matches on)
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
    # What proves what left the source: "counters" (its consumer counters), "depth" (its
    # depth drop), "none" (more moved than its depth fell, and no counters to say why).
    source_witness: str = WITNESS_DEPTH
    # A selective move's messages published back to their source (routes[].select).
    kept_messages: int = 0
    # Redeliveries a resumed session acked without a publish: an earlier session had
    # moved them (transfer/recognition.py); not in `duplicates`.
    recognised: int = 0

    @property
    def label(self) -> str:
        return self.key.label()

    def record(self) -> dict[str, Any]:
        """The verdict as flat JSON-ready fields (verification.json's `queues`): the
        key's six names first, as columns of their own."""
        fields = asdict(self)
        del fields["key"]
        return {**asdict(self.key), **fields}


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
    kept: int = 0  # a selective move's messages published back to their source
    recognised: int = 0  # redeliveries acked without a publish: moved by an earlier session
    # Queues whose source received messages during the run with no counters to prove
    # that no other consumer took some (`source_witness` "none"); they still pass.
    sources_unproven: int = 0
    # (phase, seconds) in the order they ran (`phases.Phases`): where the time went.
    phases: tuple[tuple[str, float], ...] = ()


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
        and row["lost"] == 0
        and row["unexpected"] == 0
        and row["missing_at_destination"] == 0
        and bool(row["positions_contiguous"])
        and bool(row["order_kept"])
        and all(row[name] == 0 for name in PROBLEM_COUNTS)
    )
    return QueueVerdict(
        key=TransferKey.of(row),
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
        source_witness=row["source_witness"],
        kept_messages=row.get("kept_messages") or 0,
        recognised=row.get("recognised") or 0,
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
            f"{TransferKey.of(row).label()} ({a}={row[a]}, {b}={row[b]})"
            for row in summary_rows
            if row[a] is None or row[b] is None or row[a] != row[b]
        ]
    if kind == _NOT_NULL and kwargs.get("column") in SUMMARY_COLUMNS:
        column = kwargs["column"]
        return [
            f"{TransferKey.of(row).label()} ({column} unknown)"
            for row in summary_rows
            if row[column] is None
        ]
    if kind == _IN_SET and "column" in kwargs and kwargs["column"] in SUMMARY_COLUMNS:
        column, allowed = kwargs["column"], kwargs["value_set"]
        return [
            f"{TransferKey.of(row).label()} ({column}={row[column]}"
            + (f", error: {row['error']}" if column == "status" and row["error"] else "")
            + (
                f", distinct_messages={row['distinct_messages']}, source_drop="
                f"{row['source_drop']}, {SOURCE_REMOVED}={row[SOURCE_REMOVED]}"
                if column == "lost"
                else ""
            )
            + (
                f", missing positions {row[MISSING_POSITIONS]}"
                if column == "positions_contiguous" and row.get(MISSING_POSITIONS)
                else ""
            )
            + ")"
            for row in summary_rows
            if row[column] not in allowed
        ]
    count = _MESSAGE_PROBLEM_COUNT.get((kind, kwargs.get("column", kwargs.get("column_A", ""))))
    if count is None:
        return []
    return [
        f"{TransferKey.of(row).label()} ({count}={row[count]})"
        for row in summary_rows
        if row[count]
    ]


def _name_queues(queues: list[str]) -> str:
    named = "; ".join(queues[:MAX_QUEUES_NAMED])
    rest = len(queues) - MAX_QUEUES_NAMED
    return named + (f"; and {rest} more" if rest > 0 else "")
