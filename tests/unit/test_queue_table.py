"""The console's queue table stays short for thousands of queues: failed queues first,
passed ones up to the limit, one line for the rest."""

from __future__ import annotations

import io

from rmq_spark.model import MoveOutcome, QueueTransfer, TransferKey
from rmq_spark.pipeline import RunResult, reordered_by_priority
from rmq_spark.report.console import print_queue_table
from rmq_spark.verify.verdicts import QueueVerdict, Verification


def verdict(name: str, *, passed: bool = True) -> QueueVerdict:
    return QueueVerdict(
        key=TransferKey("dr", "v", name, "main", "v", name),
        status="moved",
        error=None,
        ledger_rows=2,
        uncertain_rows=0,
        distinct_messages=2,
        duplicates=0,
        bytes=2048,
        source_drop=2,
        destination_rise=2 if passed else 1,
        lost=0 if passed else 1,
        unexpected=0,
        positions_contiguous=True,
        order_kept=True,
        passed=passed,
    )


def run(verdicts: list[QueueVerdict]) -> RunResult:
    verification = Verification(
        run_id="r1",
        queues=tuple(verdicts),
        messages=2 * len(verdicts),
        bytes=2048 * len(verdicts),
        lost=0,
        duplicates=0,
        unexpected=0,
        verified=True,
        failed_expectations=(),
        results_path="verification.json",
        data_docs_path=None,
    )
    return RunResult("r1", (), (), (), verification, 1.0)


def printed(result: RunResult, limit: int) -> str:
    out = io.StringIO()
    print_queue_table(result, out, limit=limit)
    return out.getvalue()


def test_failed_queues_come_first_and_the_rest_is_one_line() -> None:
    verdicts = [verdict(f"q{i:03d}") for i in range(100)]
    verdicts[70] = verdict("q070", passed=False)

    text = printed(run(verdicts), limit=5)

    rows = [line for line in text.splitlines() if "dr/v/q" in line]
    assert [row.split()[1] for row in rows] == ["dr/v/q070", *[f"dr/v/q{i:03d}" for i in range(4)]]
    assert "... and 95 more queues, all verified (the report lists them)" in text


def test_a_run_within_the_limit_shows_every_queue_and_no_summary_line() -> None:
    text = printed(run([verdict("a"), verdict("b")]), limit=5)

    assert "dr/v/a" in text
    assert "dr/v/b" in text
    assert "more queues" not in text


def transfer_into(queue: str, destination_type: str) -> QueueTransfer:
    return QueueTransfer(
        route="r",
        source_cluster="dr",
        source_vhost="v",
        source_queue=queue,
        source_type="classic",
        source_node="rabbit@dr",
        destination_cluster="main",
        destination_vhost="v",
        destination_queue=queue,
        messages=10,
        message_bytes=0,
        destination_messages=0,
        destination_type=destination_type,
    )


def outcome_of(transfer: QueueTransfer, priority_messages: int) -> MoveOutcome:
    return MoveOutcome(
        key=transfer.key,
        status="moved",
        error=None,
        messages=10,
        bytes=100,
        first_position=0,
        next_position=10,
        seconds=1.0,
        sessions=1,
        priority_messages=priority_messages,
    )


def test_the_console_says_how_many_moved_messages_a_quorum_destination_on_4x_reorders() -> None:
    quorum, classic = transfer_into("qq", "quorum"), transfer_into("cq", "classic")
    base = run([verdict("qq"), verdict("cq")])
    result = RunResult(
        "r1",
        (quorum, classic),
        (0, 0),
        (outcome_of(quorum, 4), outcome_of(classic, 6)),
        base.verification,
        1.0,
        rabbitmq_versions={"dr": "4.3.6", "main": "4.3.6"},
    )

    text = printed(result, limit=5)

    assert (
        "priority order: 4 of 10 moved messages set a priority; the quorum queue main/v/qq "
        "(RabbitMQ 4.3.6) delivers them by it, not in source order"
    ) in " ".join(text.split())
    assert "main/v/cq (RabbitMQ" not in text


def test_the_queues_table_counts_reordering_only_where_the_destination_orders_by_priority() -> None:
    quorum, classic = transfer_into("qq", "quorum"), transfer_into("cq", "classic")
    on_4 = {"main": "4.0.5"}

    assert reordered_by_priority(quorum, outcome_of(quorum, 4), on_4) == 4
    assert reordered_by_priority(classic, outcome_of(classic, 4), on_4) == 0
    assert reordered_by_priority(quorum, outcome_of(quorum, 4), {"main": "3.10.8"}) == 0
    assert reordered_by_priority(quorum, None, on_4) is None  # not moved by this driver
    unknown = transfer_into("old", "")  # planned by an earlier build
    assert reordered_by_priority(unknown, outcome_of(unknown, 4), on_4) is None
