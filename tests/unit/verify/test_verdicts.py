"""Verdicts and failure lines from plain summary rows: no Spark, no GE run."""

from __future__ import annotations

from typing import Any

import pytest

from rmq_spark.model import TransferKey
from rmq_spark.verify.columns import STATUS_MOVED, SUMMARY_COLUMNS
from rmq_spark.verify.verdicts import MAX_QUEUES_NAMED, describe_failures, queue_verdict

SLASHED = TransferKey("dr", "a/b", "c", "main", "a/b", "c")


def summary_row(key: TransferKey = SLASHED, moved: int = 10, **changes: Any) -> dict[str, Any]:
    """A summary row of a transfer that moved `moved` messages cleanly."""
    row: dict[str, Any] = dict.fromkeys(SUMMARY_COLUMNS, 0)
    row.update(
        run_id="r1",
        source_cluster=key.source_cluster,
        source_vhost=key.source_vhost,
        source_queue=key.source_queue,
        destination_cluster=key.destination_cluster,
        destination_vhost=key.destination_vhost,
        destination_queue=key.destination_queue,
        status=STATUS_MOVED,
        error=None,
        ledger_rows=moved,
        confirmed_rows=moved,
        distinct_messages=moved,
        bytes=moved * 100,
        source_drop=moved,
        destination_rise=moved,
        destination_shared=False,
        order_kept=True,
        min_position=0,
        max_position=moved - 1,
        distinct_positions=moved,
        positions_contiguous=True,
    )
    row.update(changes)
    return row


def failed_suite(kind: str, **kwargs: Any) -> dict[str, Any]:
    return {
        "suite_name": "queue_summary",
        "results": [
            {"success": True, "expectation_config": {"type": "ignored", "kwargs": {}}},
            {
                "success": False,
                "expectation_config": {"type": kind, "kwargs": kwargs},
                "result": {"observed_value": "x"},
            },
        ],
    }


def test_a_clean_transfer_passes_and_keeps_its_key() -> None:
    verdict = queue_verdict(summary_row())
    assert verdict.passed
    assert verdict.key == SLASHED
    assert verdict.label == "dr:a/b:c -> main:a/b:c"


@pytest.mark.parametrize(
    "changes",
    [
        {"status": "failed", "error": "lost"},
        {"lost": 1},
        {"unexpected": 1},
        {"missing_at_destination": 1},
        {"positions_contiguous": False},
        {"order_kept": False},
        {"source_drop": None},
        {"destination_rise": None},
        {"null_body_sha256": 1},
        {"confirmed_before_consumed": 2},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_each_problem_fails_the_transfer(changes: dict[str, Any]) -> None:
    assert not queue_verdict(summary_row(**changes)).passed


def test_unknown_depths_count_as_zero_in_the_verdict() -> None:
    verdict = queue_verdict(summary_row(source_drop=None, destination_rise=None, lost=None))
    assert (verdict.source_drop, verdict.destination_rise, verdict.lost) == (0, 0, 0)


def test_failure_line_names_the_offending_transfer_by_its_key() -> None:
    rows = [
        summary_row(SLASHED),
        summary_row(TransferKey("dr", "a", "b/c", "main", "a", "b/c"), distinct_messages=9, lost=1),
    ]
    lines = describe_failures(
        [failed_suite("expect_column_values_to_be_in_set", column="lost", value_set=[0])], rows
    )
    assert lines == (
        "queue_summary: expect_column_values_to_be_in_set(lost): observed x; dr:a:b/c -> "
        "main:a:b/c (lost=1, distinct_messages=9, source_drop=10, source_removed=0)",
    )


def test_a_source_without_counters_that_received_messages_passes_unproven() -> None:
    # 12 moved, the depth fell by 10: 2 arrived during the run; no counters to say more.
    verdict = queue_verdict(
        summary_row(distinct_messages=12, source_drop=10, source_witness="none", lost=0)
    )
    assert verdict.passed
    assert verdict.source_witness == "none"


def test_status_failure_line_carries_the_movers_error() -> None:
    rows = [summary_row(status="failed", error="nacked")]
    (line,) = describe_failures(
        [failed_suite("expect_column_values_to_be_in_set", column="status", value_set=["moved"])],
        rows,
    )
    assert line.endswith("dr:a/b:c -> main:a/b:c (status=failed, error: nacked)")


def test_failure_line_names_at_most_ten_transfers() -> None:
    rows = [
        summary_row(TransferKey("dr", "v", f"q{i:02d}", "main", "v", f"q{i:02d}"), unexpected=1)
        for i in range(MAX_QUEUES_NAMED + 2)
    ]
    (line,) = describe_failures(
        [failed_suite("expect_column_values_to_be_in_set", column="unexpected", value_set=[0])],
        rows,
    )
    assert "dr:v:q09 -> main:v:q09 (unexpected=1)" in line
    assert "q10" not in line
    assert line.endswith("; and 2 more")


def test_passing_results_give_no_lines() -> None:
    passing = {"suite_name": "messages", "results": [{"success": True}]}
    assert describe_failures([passing], [summary_row()]) == ()
