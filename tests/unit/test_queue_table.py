"""The console's queue table stays short for thousands of queues: failed queues first,
passed ones up to the limit, one line for the rest."""

from __future__ import annotations

import io

from rmq_spark.model import TransferKey
from rmq_spark.pipeline import RunResult
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
