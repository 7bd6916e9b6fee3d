"""verify: the per-queue summary and the Great Expectations verdict of a run.

GE costs a few seconds per verify_run, so the runs are module-scoped: one run whose
transfers all pass, one with one transfer per kind of failure (each failure must name
its own queue and no other), and one with no ledger rows at all. Every run goes through
both engines (Spark, and the driver's pyarrow + pandas), which must agree on everything.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from bench.verification import RUN_ID as BENCH_RUN_ID
from bench.verification import Shape, run_counters, write_run
from rmq_spark.ledger import durable, layout, tables
from rmq_spark.ledger.schema import MESSAGES, arrow_schema, spark_schema
from rmq_spark.model import TransferKey
from rmq_spark.verify import (
    DESTINATION_SHARED,
    ENGINE_DRIVER,
    ENGINE_SPARK,
    FENCES,
    SOURCE_REMOVED,
    SUMMARY_COLUMNS,
    QueueVerdict,
    Verification,
    summarize,
    summarize_arrow,
    verify_ledger_run,
    verify_run,
    verify_run_arrow,
)

ENGINES = [ENGINE_SPARK, ENGINE_DRIVER]

RUN_ID = "run-2024-01-01"
T0 = dt.datetime(2024, 1, 1, 12, 0, 0)
BODY_A, BODY_B, BODY_C = "a" * 64, "b" * 64, "c" * 64
PROPS = "p" * 64

COUNTER_SCHEMA = T.StructType(
    [
        *(
            T.StructField(name, T.StringType(), False)
            for name in (
                "run_id",
                "source_cluster",
                "source_vhost",
                "source_queue",
                "destination_cluster",
                "destination_vhost",
                "destination_queue",
            )
        ),
        T.StructField("source_depth_before", T.LongType(), False),
        T.StructField("source_depth_after", T.LongType(), False),
        T.StructField("destination_depth_before", T.LongType(), False),
        T.StructField("destination_depth_after", T.LongType(), False),
        T.StructField("status", T.StringType(), False),
        T.StructField("error", T.StringType(), True),
        T.StructField(SOURCE_REMOVED, T.LongType(), True),
        T.StructField(FENCES, T.LongType(), True),
    ]
)


def key(queue: str) -> dict[str, str]:
    return {
        "run_id": RUN_ID,
        "source_cluster": "old",
        "source_vhost": "/",
        "source_queue": queue,
        "destination_cluster": "new",
        "destination_vhost": "/",
        "destination_queue": queue,
    }


def label(queue: str) -> str:
    return TransferKey.of(key(queue)).label()


def message(
    queue: str,
    position: int,
    body_sha256: str | None = BODY_A,
    *,
    redelivered: bool = False,
    body_size: int = 10,
    confirmed: bool = True,
    publish_seq: int | None = None,
    attempts: int = 1,
    session: int = 0,
    decision: str | None = None,
) -> dict[str, Any]:
    return {
        **key(queue),
        "position": position,
        "publish_seq": position + 1 if publish_seq is None else publish_seq,
        "publish_attempts": attempts,
        "redelivered": redelivered,
        "body_size": body_size,
        "body_sha256": body_sha256,
        "properties_sha256": PROPS,
        "message_id": None,
        "consumed_at": T0 + dt.timedelta(seconds=position),
        "confirmed_at": T0 + dt.timedelta(seconds=position, milliseconds=5) if confirmed else None,
        "task_attempt": "1.0.0",
        "session": session,
        "decision": decision,
        "publish_exchange": None,
        "publish_routing_key": None,
        "reason": None,
    }


def counter(
    queue: str,
    *,
    source: tuple[int, int],
    destination: tuple[int, int],
    status: str = "moved",
    error: str | None = None,
    removed: int | None = None,
    fences: int | None = None,
) -> dict[str, Any]:
    return {
        **key(queue),
        "source_depth_before": source[0],
        "source_depth_after": source[1],
        "destination_depth_before": destination[0],
        "destination_depth_after": destination[1],
        "status": status,
        "error": error,
        SOURCE_REMOVED: removed,
        FENCES: fences,
    }


def messages_df(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    # Nullable copy of the ledger schema: the bad-data cases need rows the writer's
    # schema would refuse.
    schema = T.StructType(
        [T.StructField(f.name, f.dataType, True) for f in spark_schema(MESSAGES).fields]
    )
    names = schema.fieldNames()
    return spark.createDataFrame([tuple(row[n] for n in names) for row in rows], schema)


def counters_df(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    names = COUNTER_SCHEMA.fieldNames()
    return spark.createDataFrame([tuple(row[n] for n in names) for row in rows], COUNTER_SCHEMA)


def messages_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The driver engine's input: the same rows as Arrow, nullable like `messages_df`."""
    schema = pa.schema([field.with_nullable(True) for field in arrow_schema(MESSAGES)])
    return pa.Table.from_pylist(rows, schema=schema)


def run_verification(
    engine: str,
    spark: SparkSession,
    messages: list[dict[str, Any]],
    counters: list[dict[str, Any]],
    out_dir: Path,
) -> Verification:
    if engine == ENGINE_SPARK:
        return verify_run(
            RUN_ID, messages_df(spark, messages), counters_df(spark, counters), out_dir
        )
    return verify_run_arrow(RUN_ID, messages_table(messages), counters, out_dir)


def verdict(verification: Verification, queue: str) -> QueueVerdict:
    (found,) = [v for v in verification.queues if v.key.source_queue == queue]
    return found


def failures_naming(verification: Verification, queue: str) -> list[str]:
    return [line for line in verification.failed_expectations if label(queue) in line]


# --- a run whose transfers all pass ----------------------------------------------------


def passing_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    messages = [
        *(message("clean", p, body_size=100 + p) for p in range(3)),
        # A resumed session recognised the redelivery of position 1 (moved, recorded, its
        # ack lost with the session): acked without a publish, no copy of its own.
        message("recognised", 0, BODY_A, body_size=7),
        message("recognised", 1, BODY_B, body_size=11),
        message(
            "recognised",
            2,
            BODY_B,
            redelivered=True,
            body_size=11,
            publish_seq=0,
            attempts=0,
            session=1,
            decision="recognised",
        ),
        message("recognised", 3, BODY_C, body_size=13, publish_seq=1, session=1),
        # The third row is the broker's redelivery of the first, published again.
        message("dup", 0, BODY_A, body_size=7),
        message("dup", 1, BODY_B, body_size=11),
        message("dup", 2, BODY_A, redelivered=True, body_size=7),
        # The destination connection was lost before position 1's confirm; the source
        # redelivered it in the next session. Did the first copy arrive? The depth says.
        *(
            row
            for queue in ("uncertain-arrived", "uncertain-vanished")
            for row in (
                message(queue, 0, BODY_A),
                message(queue, 1, BODY_B, confirmed=False),
                message(queue, 2, BODY_B, redelivered=True, publish_seq=1, session=1),
            )
        ),
        # Position 0 was nacked once and published again after position 1: reordered, but
        # by a retry, so order is not promised.
        message("retried", 0, BODY_A, publish_seq=3, attempts=2),
        message("retried", 1, BODY_B, publish_seq=2),
        message("retried", 2, BODY_C, publish_seq=4),
        # A selective move: 0 and 3 moved (the destination link's seqs 1, 2), the rest kept
        # (published back to the source on the kept link: its own seqs 1..4).
        *(
            message("selective", p, decision="moved", publish_seq=seq)
            for p, seq in ((0, 1), (3, 2))
        ),
        *(
            message("selective", p, decision="kept", publish_seq=seq)
            for p, seq in ((1, 1), (2, 2), (4, 3), (5, 4))
        ),
        # A live source: 4 moved while 2 arrived (the depth fell by 2 only).
        *(message(queue, p) for queue in ("live-counted", "live-unproven") for p in range(4)),
        # The depth fell by the 4 moved, the counters saw 5 removed: a removal from before
        # the run counted late, or another consumer's take matched by an arrival.
        *(message("contradicted", p) for p in range(4)),
    ]
    counters = [
        counter("live-counted", source=(3, 1), destination=(0, 4), removed=4),
        counter("live-unproven", source=(3, 1), destination=(0, 4)),
        counter("contradicted", source=(5, 1), destination=(0, 4), removed=5),
        counter("clean", source=(3, 0), destination=(5, 8)),
        counter("dup", source=(2, 0), destination=(0, 3)),
        counter("recognised", source=(3, 0), destination=(0, 3), removed=3),
        counter("empty", source=(0, 0), destination=(4, 4)),
        counter("uncertain-arrived", source=(2, 0), destination=(0, 3)),
        counter("uncertain-vanished", source=(2, 0), destination=(0, 2)),
        counter("retried", source=(3, 0), destination=(0, 3)),
        # The kept 4 are back in the source: it fell by the 2 moved; its consumer counters
        # saw the 2 moved, the 4 kept and the fence acked.
        counter("selective", source=(6, 4), destination=(0, 2), removed=7, fences=1),
    ]
    return messages, counters


@pytest.fixture(scope="module", params=ENGINES)
def passing_run(
    request: pytest.FixtureRequest, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Verification:
    messages, counters = passing_rows()
    return run_verification(
        request.param,
        spark,
        messages,
        counters,
        tmp_path_factory.mktemp("passing") / "verification",
    )


def test_clean_transfer_passes(passing_run: Verification) -> None:
    clean = verdict(passing_run, "clean")
    assert clean.passed
    assert (clean.ledger_rows, clean.distinct_messages, clean.duplicates) == (3, 3, 0)
    assert (clean.lost, clean.unexpected, clean.bytes) == (0, 0, 100 + 101 + 102)
    assert clean.positions_contiguous


def test_redelivered_republished_row_is_one_duplicate_and_passes(
    passing_run: Verification,
) -> None:
    dup = verdict(passing_run, "dup")
    assert (dup.ledger_rows, dup.duplicates, dup.distinct_messages) == (3, 1, 2)
    assert (dup.source_drop, dup.destination_rise) == (2, 3)
    assert (dup.lost, dup.unexpected) == (0, 0)
    assert dup.bytes == 7 + 11
    assert dup.passed


def test_a_recognised_redelivery_is_one_message_and_no_copy(passing_run: Verification) -> None:
    recognised = verdict(passing_run, "recognised")
    assert (recognised.ledger_rows, recognised.distinct_messages) == (4, 3)
    assert (recognised.duplicates, recognised.recognised) == (0, 1)
    assert (recognised.source_drop, recognised.destination_rise) == (3, 3)
    assert (recognised.lost, recognised.unexpected, recognised.bytes) == (0, 0, 7 + 11 + 13)
    assert recognised.passed


def test_transfer_without_rows_appears_with_zeros_and_passes(passing_run: Verification) -> None:
    empty = verdict(passing_run, "empty")
    assert empty == QueueVerdict(
        key=TransferKey("old", "/", "empty", "new", "/", "empty"),
        status="moved",
        error=None,
        ledger_rows=0,
        uncertain_rows=0,
        distinct_messages=0,
        duplicates=0,
        bytes=0,
        source_drop=0,
        destination_rise=0,
        lost=0,
        unexpected=0,
        positions_contiguous=True,
        order_kept=True,
        passed=True,
    )


def test_uncertain_publish_that_arrived_is_a_named_duplicate(passing_run: Verification) -> None:
    arrived = verdict(passing_run, "uncertain-arrived")
    assert (arrived.ledger_rows, arrived.uncertain_rows, arrived.distinct_messages) == (3, 1, 2)
    assert (arrived.duplicates, arrived.lost, arrived.unexpected) == (1, 0, 0)
    assert arrived.passed


def test_uncertain_publish_that_never_arrived_is_no_duplicate(passing_run: Verification) -> None:
    vanished = verdict(passing_run, "uncertain-vanished")
    assert (vanished.duplicates, vanished.distinct_messages, vanished.lost) == (0, 2, 0)
    assert vanished.passed


def test_reordering_by_a_nack_retry_is_not_an_order_failure(passing_run: Verification) -> None:
    retried = verdict(passing_run, "retried")
    assert retried.order_kept
    assert retried.passed


def test_kept_rows_are_back_in_the_source_neither_lost_nor_at_the_destination(
    passing_run: Verification,
) -> None:
    selective = verdict(passing_run, "selective")
    assert (selective.distinct_messages, selective.kept_messages) == (2, 4)
    assert (selective.source_drop, selective.destination_rise) == (2, 2)
    assert (selective.lost, selective.unexpected, selective.duplicates) == (0, 0, 0)
    assert selective.source_witness == "counters"  # moved + kept + the fence
    assert selective.order_kept  # each link's seqs grow with position
    assert selective.bytes == 2 * 10
    assert selective.passed


def test_passing_run_is_verified_with_totals(passing_run: Verification) -> None:
    assert passing_run.verified
    assert passing_run.failed_expectations == ()
    assert (passing_run.messages, passing_run.duplicates, passing_run.lost) == (29, 2, 0)
    assert (passing_run.kept, passing_run.recognised) == (4, 1)
    assert passing_run.bytes == 303 + 18 + 31 + 2 * (10 + 10) + 30 + 3 * 4 * 10 + 2 * 10
    assert passing_run.unexpected == 0


def test_results_json_and_data_docs_are_written(passing_run: Verification) -> None:
    document = json.loads(Path(passing_run.results_path).read_text(encoding="utf-8"))
    assert document["run_id"] == RUN_ID
    assert document["verified"] is True
    assert (document["totals"]["messages"], document["totals"]["kept"]) == (29, 4)
    assert [q["source_queue"] for q in document["queues"]] == [
        "clean",
        "contradicted",
        "dup",
        "empty",
        "live-counted",
        "live-unproven",
        "recognised",
        "retried",
        "selective",
        "uncertain-arrived",
        "uncertain-vanished",
    ]
    assert {r["suite_name"] for r in document["great_expectations"]} == {
        "queue_summary",
        "messages",
    }
    assert passing_run.data_docs_path is not None
    index = Path(passing_run.data_docs_path)
    assert index.name == "index.html"
    assert index.parent.parent == Path(passing_run.results_path).parent
    assert RUN_ID in index.read_text(encoding="utf-8")
    assert list(index.parent.glob(f"validations/*/{RUN_ID}/*/*.html"))


# --- a run with one failing transfer per kind of failure --------------------------------


def failing_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    messages = [
        message("ok", 0),
        # The source dropped 3 but only 2 rows made it to the ledger.
        message("missing", 0, BODY_A),
        message("missing", 1, BODY_B),
        message("gap", 0, BODY_A),
        message("gap", 1, BODY_B),
        message("gap", 3, BODY_C),
        message("failed", 0),
        message("nullsum", 0, None),
        # No redelivery, no retry, yet published out of source order.
        message("reordered", 0, BODY_A, publish_seq=2),
        message("reordered", 1, BODY_B, publish_seq=1),
        # One row, but two messages arrived: one nobody can explain.
        message("unexplained", 0, BODY_A),
        # A row says a redelivery was moved earlier, and no earlier row holds it: its
        # copy must be in the destination, and it is not.
        message("recognised-alone", 0, BODY_A),
        message(
            "recognised-alone",
            1,
            BODY_B,
            redelivered=True,
            publish_seq=0,
            attempts=0,
            session=1,
            decision="recognised",
        ),
        # A live source: another consumer took 1 while 2 arrived; the depth fell by 3,
        # less than the 4 moved, and only the consumer counters (5 removed) see the take.
        *(message("stolen", p) for p in range(4)),
    ]
    counters = [
        counter("stolen", source=(5, 2), destination=(0, 4), removed=5),
        counter("ok", source=(1, 0), destination=(0, 1)),
        counter("missing", source=(3, 0), destination=(0, 2)),
        counter("gap", source=(3, 0), destination=(0, 3)),
        counter("failed", source=(5, 4), destination=(0, 1), status="failed", error="nack"),
        counter("nullsum", source=(1, 0), destination=(0, 1)),
        counter("reordered", source=(2, 0), destination=(0, 2)),
        counter("unexplained", source=(1, 0), destination=(0, 2)),
        counter("recognised-alone", source=(2, 0), destination=(0, 1)),
    ]
    return messages, counters


@pytest.fixture(scope="module", params=ENGINES)
def failing_run(
    request: pytest.FixtureRequest, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Verification:
    messages, counters = failing_rows()
    return run_verification(
        request.param,
        spark,
        messages,
        counters,
        tmp_path_factory.mktemp("failing") / "verification",
    )


def test_failing_run_is_not_verified(failing_run: Verification) -> None:
    assert not failing_run.verified
    assert verdict(failing_run, "ok").passed
    assert failures_naming(failing_run, "ok") == []
    assert json.loads(Path(failing_run.results_path).read_text("utf-8"))["verified"] is False


def test_missing_ledger_row_is_lost_and_named(failing_run: Verification) -> None:
    missing = verdict(failing_run, "missing")
    assert not missing.passed
    assert (missing.source_drop, missing.distinct_messages, missing.lost) == (3, 2, 1)
    assert missing.unexpected == 0
    (line,) = failures_naming(failing_run, "missing")
    assert "expect_column_values_to_be_in_set(lost)" in line
    assert "lost=1, distinct_messages=2, source_drop=3" in line


def test_another_consumer_on_a_live_source_is_lost_by_the_counters(
    failing_run: Verification,
) -> None:
    stolen = verdict(failing_run, "stolen")
    assert not stolen.passed
    assert (stolen.source_drop, stolen.distinct_messages, stolen.lost) == (3, 4, 1)
    assert stolen.source_witness == "counters"
    (line,) = failures_naming(failing_run, "stolen")
    assert "expect_column_values_to_be_in_set(lost)" in line
    assert "source_removed=5" in line
    assert failing_run.lost == 2  # "missing" and "stolen"


def test_a_live_source_passes_on_its_counters_or_says_it_is_unproven(
    passing_run: Verification,
) -> None:
    counted = verdict(passing_run, "live-counted")
    unproven = verdict(passing_run, "live-unproven")
    assert counted.passed
    assert unproven.passed
    assert (counted.source_drop, counted.distinct_messages, counted.lost) == (2, 4, 0)
    assert (counted.source_witness, unproven.source_witness) == ("counters", "none")
    assert verdict(passing_run, "clean").source_witness == "depth"
    assert passing_run.sources_unproven == 2  # live-unproven and contradicted


def test_counters_the_depths_contradict_leave_the_source_unproven_not_lost(
    passing_run: Verification,
) -> None:
    contradicted = verdict(passing_run, "contradicted")
    assert contradicted.passed
    assert (contradicted.source_drop, contradicted.distinct_messages) == (4, 4)
    assert (contradicted.lost, contradicted.source_witness) == (0, "none")


def test_a_recognised_row_without_its_earlier_copy_is_missing_at_the_destination(
    failing_run: Verification,
) -> None:
    alone = verdict(failing_run, "recognised-alone")
    assert not alone.passed
    assert (alone.distinct_messages, alone.recognised, alone.duplicates) == (2, 0, 0)
    (line,) = failures_naming(failing_run, "recognised-alone")
    assert "missing_at_destination" in line


def test_gap_in_positions_fails(failing_run: Verification) -> None:
    gap = verdict(failing_run, "gap")
    assert not gap.passed
    assert not gap.positions_contiguous
    assert (gap.lost, gap.unexpected) == (0, 0)
    (line,) = failures_naming(failing_run, "gap")
    assert "expect_column_values_to_be_in_set(positions_contiguous)" in line
    assert "missing positions 2 (1 position(s))" in line  # both engines name the hole


def test_failed_status_fails(failing_run: Verification) -> None:
    failed = verdict(failing_run, "failed")
    assert not failed.passed
    assert (failed.lost, failed.unexpected) == (0, 0)
    (line,) = failures_naming(failing_run, "failed")
    assert "expect_column_values_to_be_in_set(status)" in line
    assert "status=failed, error: nack" in line


def test_reordering_without_redelivery_fails(failing_run: Verification) -> None:
    reordered = verdict(failing_run, "reordered")
    assert not reordered.order_kept
    assert not reordered.passed
    (line,) = failures_naming(failing_run, "reordered")
    assert "expect_column_values_to_be_in_set(order_kept)" in line


def test_arrival_without_a_row_is_unexpected(failing_run: Verification) -> None:
    unexplained = verdict(failing_run, "unexplained")
    assert (unexplained.unexpected, unexplained.lost) == (1, 0)
    assert not unexplained.passed
    (line,) = failures_naming(failing_run, "unexplained")
    assert "expect_column_values_to_be_in_set(unexpected)" in line


def test_null_checksum_fails(failing_run: Verification) -> None:
    nullsum = verdict(failing_run, "nullsum")
    assert not nullsum.passed
    (line,) = failures_naming(failing_run, "nullsum")
    assert line.startswith("messages: expect_column_values_to_not_be_null(body_sha256): 1 of 17")


# --- no ledger rows at all ---------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_run_without_rows_or_depth_changes_passes(
    engine: str, spark: SparkSession, tmp_path: Path
) -> None:
    verification = run_verification(
        engine, spark, [], [counter("idle", source=(0, 0), destination=(2, 2))], tmp_path
    )
    assert verification.engine == engine
    assert verification.verified
    assert verification.failed_expectations == ()
    assert verdict(verification, "idle").passed
    assert (verification.messages, verification.bytes, verification.lost) == (0, 0, 0)
    assert verification.data_docs_path == str(tmp_path / "data_docs" / "index.html")


# --- summarize alone ------------------------------------------------------------------


def test_summarize_counts_rows_duplicates_and_depths(spark: SparkSession) -> None:
    messages = messages_df(
        spark,
        [
            message("q", 0, BODY_A, body_size=5),
            message("q", 1, BODY_A, redelivered=True, body_size=5),
            # Same body, not redelivered: a second message the producer sent, not a copy.
            message("q", 2, BODY_A, body_size=5),
            message("stray", 0, BODY_B),
        ],
    )
    counters = counters_df(
        spark,
        [
            counter("q", source=(4, 1), destination=(0, 3)),
            counter("none", source=(0, 0), destination=(0, 1)),
        ],
    )
    columns = [
        "source_queue",
        "status",
        "ledger_rows",
        "duplicates",
        "distinct_messages",
        "bytes",
        "source_drop",
        "destination_rise",
        "lost",
        "unexpected",
        "positions_contiguous",
    ]
    expected = spark.createDataFrame(
        [
            ("none", "moved", 0, 0, 0, 0, 0, 1, 0, 1, True),
            ("q", "moved", 3, 1, 2, 10, 3, 3, 1, 0, True),
            # Rows of a transfer the counters do not know: unplanned, depths unknown.
            ("stray", "unplanned", 1, 0, 1, 10, None, None, 0, 0, True),
        ],
        "source_queue string, status string, ledger_rows long, duplicates long, "
        "distinct_messages long, bytes long, source_drop long, destination_rise long, "
        "lost long, unexpected long, positions_contiguous boolean",
    )
    summary = summarize(messages, counters)
    assert tuple(summary.columns) == SUMMARY_COLUMNS
    assert_df_equality(summary.select(*columns), expected, ignore_nullable=True)


def test_summarize_names_missing_input_columns(spark: SparkSession) -> None:
    counters = counters_df(spark, []).drop("status")
    with pytest.raises(ValueError, match="counters DataFrame lacks column"):
        summarize(messages_df(spark, []), counters)


def test_summarize_arrow_counts_rows_duplicates_and_depths() -> None:
    summary = summarize_arrow(
        messages_table(
            [
                message("q", 0, BODY_A, body_size=5),
                message("q", 1, BODY_A, redelivered=True, body_size=5),
                message("q", 2, BODY_A, body_size=5),
                message("stray", 0, BODY_B),
            ]
        ),
        [
            counter("q", source=(4, 1), destination=(0, 3)),
            counter("none", source=(0, 0), destination=(0, 1)),
        ],
    )
    assert all(tuple(row) == SUMMARY_COLUMNS for row in summary)
    columns: tuple[str, ...] = (
        "source_queue",
        "status",
        "ledger_rows",
        "duplicates",
        "distinct_messages",
    )
    columns += ("bytes", "source_drop", "destination_rise", "lost", "unexpected")
    assert [tuple(row[c] for c in (*columns, "positions_contiguous")) for row in summary] == [
        ("none", "moved", 0, 0, 0, 0, 0, 1, 0, 1, True),
        ("q", "moved", 3, 1, 2, 10, 3, 3, 1, 0, True),
        ("stray", "unplanned", 1, 0, 1, 10, None, None, 0, 0, True),
    ]


def stray_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Edge cases of nulls and order: rows without counters, null positions and seqs."""
    messages = [
        message("stray", 0, BODY_B),
        {**message("nullpos", 0), "position": None},
        {**message("nullpos", 1, BODY_B), "publish_seq": None},
        {**message("nullpos", 2, BODY_C), "redelivered": None, "publish_attempts": None},
        message("late", 0, BODY_A, confirmed=False),
        {**message("late", 1, BODY_B), "confirmed_at": T0 - dt.timedelta(seconds=1)},
        message("late", 2, BODY_A, redelivered=True, session=1, publish_seq=1),
        message("late", 3, BODY_A, redelivered=True, session=1, publish_seq=2),
        {**message("late", 4, BODY_C, session=1, publish_seq=3), "properties_sha256": None},
    ]
    counters = [
        counter("nullpos", source=(3, 0), destination=(0, 3)),
        counter("late", source=(4, 0), destination=(1, 4)),
        counter("none", source=(0, 0), destination=(0, 0), status="failed", error="boom"),
    ]
    return messages, counters


def redelivery_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Duplicates where the Spark engine numbers only the checksum groups that hold a
    redelivered row: null checksums, kept copies, uncertain first copies, a tie."""
    messages = [
        # Null checksums group together, as in a window: the redelivered copy repeats.
        message("nulls", 0, None, body_size=3),
        message("nulls", 1, None, redelivered=True, body_size=3),
        # Redelivered, but the first of its checksums: no duplicate (and no group).
        message("first", 0, BODY_A, redelivered=True, body_size=4),
        message("first", 1, BODY_B, body_size=5),
        # A kept row redelivered and kept again: a kept duplicate, no bytes either way.
        message("kept", 0, BODY_A, decision="kept", body_size=6),
        message("kept", 1, BODY_A, decision="kept", redelivered=True, body_size=6),
        message("kept", 2, BODY_B, decision="moved", body_size=7),
        message("kept", 3, BODY_B, decision="moved", redelivered=True, body_size=7),
        # The earlier copy is uncertain: the confirmed redelivery is the first confirmed.
        message("uncertain-first", 0, BODY_C, confirmed=False, body_size=8),
        message("uncertain-first", 1, BODY_C, redelivered=True, body_size=8),
        # Three copies, two redelivered: two duplicates, one copy's bytes.
        *(
            message("thrice", p, BODY_A, redelivered=p > 0, body_size=9, publish_seq=p + 1)
            for p in range(3)
        ),
        # The same checksums in another transfer are not this one's copies.
        message("other", 0, BODY_A, redelivered=True, body_size=2),
    ]
    counters = [
        counter(queue, source=(2, 0), destination=(0, 2)) for queue in ("nulls", "first", "other")
    ]
    counters += [
        counter("uncertain-first", source=(1, 0), destination=(0, 1)),
        counter("kept", source=(4, 2), destination=(0, 2), removed=4),
        counter("thrice", source=(1, 0), destination=(0, 3)),
    ]
    return messages, counters


def test_only_redelivered_copies_of_confirmed_rows_are_duplicates(spark: SparkSession) -> None:
    messages, counters = redelivery_rows()
    summary = {
        row["source_queue"]: row
        for row in summarize(messages_df(spark, messages), counters_df(spark, counters)).collect()
    }
    figures = {
        queue: (
            row["duplicates"],
            row["distinct_messages"],
            row["kept_messages"],
            row["bytes"],
        )
        for queue, row in summary.items()
    }
    assert figures == {
        "nulls": (1, 1, 0, 3),
        "first": (0, 2, 0, 4 + 5),
        "kept": (2, 1, 1, 7),
        "uncertain-first": (0, 1, 0, 8),
        "thrice": (2, 1, 0, 9),
        "other": (0, 1, 0, 2),
    }


@pytest.mark.parametrize("rows", [passing_rows, failing_rows, stray_rows, redelivery_rows])
def test_both_engines_give_the_same_summary(spark: SparkSession, rows: Any) -> None:
    messages, counters = rows()
    by_spark = [
        row.asDict()
        for row in summarize(messages_df(spark, messages), counters_df(spark, counters)).collect()
    ]
    assert summarize_arrow(messages_table(messages), counters) == by_spark


@pytest.mark.parametrize("engine", ENGINES)
def test_rows_nobody_planned_fail_with_unknown_depths(
    engine: str, spark: SparkSession, tmp_path: Path
) -> None:
    messages, counters = stray_rows()
    verification = run_verification(engine, spark, messages, counters, tmp_path)
    assert not verification.verified
    stray = verdict(verification, "stray")
    assert (stray.status, stray.passed) == ("unplanned", False)
    lines = failures_naming(verification, "stray")
    assert any(
        "expect_column_values_to_not_be_null(source_drop)" in line
        and "(source_drop unknown)" in line
        for line in lines
    )
    assert any("expect_column_values_to_not_be_null(destination_rise)" in line for line in lines)
    assert any(
        line.startswith("messages: expect_column_values_to_not_be_null(properties_sha256): 1 of 9")
        for line in verification.failed_expectations
    )
    assert any(
        line.startswith(
            "messages: expect_column_pair_values_a_to_be_greater_than_b(confirmed_at, consumed_at)"
        )
        and label("late") in line
        for line in verification.failed_expectations
    )


def test_ledger_run_is_verified_on_the_driver_when_small_and_in_spark_when_large(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = str(tmp_path / "ledger")
    tables.ensure_tables(ledger)
    messages, counters = passing_rows()
    partition = layout.run_partition_dir(ledger, RUN_ID)
    partition.mkdir(parents=True)
    data = pa.Table.from_pylist(
        [{k: v for k, v in row.items() if k != "run_id"} for row in messages],
        schema=layout.DATA_SCHEMA,
    )
    durable.write_data_file(partition, "part-0000000000000000-a.parquet", data)
    assert tables.commit_run(ledger, RUN_ID) == len(messages)
    on_driver = verify_ledger_run(spark, ledger, RUN_ID, counters, tmp_path / "driver")
    in_spark = verify_ledger_run(
        spark, ledger, RUN_ID, counters, tmp_path / "spark", local_max_rows=len(messages) - 1
    )
    assert (on_driver.engine, in_spark.engine) == (ENGINE_DRIVER, ENGINE_SPARK)
    assert on_driver.verified
    assert in_spark.verified
    assert on_driver.queues == in_spark.queues
    assert (on_driver.messages, on_driver.bytes, on_driver.duplicates) == (
        in_spark.messages,
        in_spark.bytes,
        in_spark.duplicates,
    )


# --- a destination other publishers use ----------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "not-shared"])
def test_other_publishers_into_a_shared_destination_are_live_arrivals(
    engine: str, spark: SparkSession, tmp_path: Path, shared: bool
) -> None:
    rows = [message("live", position) for position in range(3)]
    # 3 moved, and 2 more arrived from a publisher using the destination meanwhile.
    counters = [
        {
            **counter("live", source=(3, 0), destination=(0, 5)),
            DESTINATION_SHARED: shared,
        }
    ]
    if engine == ENGINE_SPARK:
        schema = T.StructType(
            [*COUNTER_SCHEMA.fields, T.StructField(DESTINATION_SHARED, T.BooleanType(), False)]
        )
        names = schema.fieldNames()
        frame = spark.createDataFrame([tuple(row[n] for n in names) for row in counters], schema)
        verification = verify_run(RUN_ID, messages_df(spark, rows), frame, tmp_path)
    else:
        verification = verify_run_arrow(RUN_ID, messages_table(rows), counters, tmp_path)

    live = verdict(verification, "live")
    assert live.lost == 0
    if shared:
        assert (live.unexpected, live.live_arrivals) == (0, 2)
        assert live.passed
        assert verification.verified
        assert verification.live_arrivals == 2
    else:  # the same rise on a destination nobody else uses is two unexplained copies
        assert (live.unexpected, live.live_arrivals) == (2, 0)
        assert not live.passed
        assert not verification.verified


# --- a ledger written as the executors write it --------------------------------------------


def test_a_runs_messages_are_read_from_its_own_data_files_only(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = str(tmp_path / "ledger")
    shape = Shape(queues=2, messages=30, message_bytes=8)
    for run_id in ("earlier", "later"):
        write_run(ledger, run_id, shape)
    frame = tables.read_run_messages(spark, ledger, "later")
    assert frame.count() == shape.rows
    assert {row["run_id"] for row in frame.select("run_id").distinct().collect()} == {"later"}
    files = frame.inputFiles()
    assert files
    assert all("/run_id=later/" in file for file in files)


def test_a_run_written_by_executors_verifies_the_same_on_both_engines(
    spark: SparkSession, tmp_path: Path
) -> None:
    ledger = str(tmp_path / "ledger")
    shape = Shape(queues=3, messages=2_500, message_bytes=16)
    assert write_run(ledger, BENCH_RUN_ID, shape) == shape.rows
    counters = run_counters(BENCH_RUN_ID, shape)
    on_driver = verify_ledger_run(spark, ledger, BENCH_RUN_ID, counters, tmp_path / "driver")
    in_spark = verify_ledger_run(
        spark, ledger, BENCH_RUN_ID, counters, tmp_path / "spark", local_max_rows=0
    )
    assert (on_driver.engine, in_spark.engine) == (ENGINE_DRIVER, ENGINE_SPARK)
    assert on_driver.verified
    assert in_spark.verified
    assert in_spark.queues == on_driver.queues
    assert (in_spark.messages, in_spark.duplicates, in_spark.lost) == (shape.rows, 0, 0)
    summaries = [
        [
            queue["summary"]
            for queue in json.loads(Path(v.results_path).read_text("utf-8"))["queues"]
        ]
        for v in (on_driver, in_spark)
    ]
    assert summaries[0] == summaries[1]
    phases = dict(in_spark.phases)
    assert {"count rows", "summary", "expectations: messages", "data docs"} <= set(phases)
    written = json.loads(Path(in_spark.results_path).read_text("utf-8"))["seconds"]
    assert written == phases
