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

The parts: `columns` (the names), `summary_spark` and `summary_arrow` (the two
engines), `verdicts` (pure: verdicts and failure lines from summary rows), and
`expectations` (Great Expectations and `verification.json`). This module strings them
together and is the API.

Example:
    verification = verify_run(run_id, messages, counters, "/tmp/run-42/verification")
    if not verification.verified:
        print("\\n".join(verification.failed_expectations))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from rmq_spark.ledger import tables
from rmq_spark.ledger.schema import QUEUES, spark_schema
from rmq_spark.verify.columns import (
    COUNTER_COLUMNS,
    DECISION,
    DEPTH_COLUMNS,
    DESTINATION_SHARED,
    ENGINE_DRIVER,
    ENGINE_SPARK,
    FENCES,
    LOCAL_MAX_ROWS,
    MESSAGE_CHECK_COLUMNS,
    MESSAGE_COLUMNS,
    PROBLEM_COUNTS,
    SOURCE_REMOVED,
    STATUS_MOVED,
    STATUS_UNPLANNED,
    SUMMARY_COLUMNS,
    SUMMARY_INPUT_COLUMNS,
    WITNESS_COUNTERS,
    WITNESS_DEPTH,
    WITNESS_NONE,
)
from rmq_spark.verify.expectations import (
    DATA_DOCS_DIR,
    RESULTS_FILE,
    pandas_fingerprints_off,
    preload_great_expectations,
    quiet_gx,
    validate_with_gx,
    write_results,
)
from rmq_spark.verify.gaps import add_missing_positions, not_contiguous
from rmq_spark.verify.phases import Phases
from rmq_spark.verify.summary_arrow import gaps_arrow, summarize_arrow
from rmq_spark.verify.summary_spark import gaps_spark, summarize
from rmq_spark.verify.verdicts import (
    QueueVerdict,
    Verification,
    describe_failures,
    queue_verdict,
)

if TYPE_CHECKING:  # pandas is imported where a frame is built (GE imports it anyway)
    import pandas as pd

__all__ = [
    "COUNTER_COLUMNS",
    "DATA_DOCS_DIR",
    "DECISION",
    "DEPTH_COLUMNS",
    "DESTINATION_SHARED",
    "ENGINE_DRIVER",
    "ENGINE_SPARK",
    "FENCES",
    "LOCAL_MAX_ROWS",
    "MESSAGE_CHECK_COLUMNS",
    "MESSAGE_COLUMNS",
    "PROBLEM_COUNTS",
    "RESULTS_FILE",
    "SOURCE_REMOVED",
    "STATUS_MOVED",
    "STATUS_UNPLANNED",
    "SUMMARY_COLUMNS",
    "SUMMARY_INPUT_COLUMNS",
    "WITNESS_COUNTERS",
    "WITNESS_DEPTH",
    "WITNESS_NONE",
    "QueueVerdict",
    "Verification",
    "describe_failures",
    "preload_great_expectations",
    "queue_verdict",
    "summarize",
    "summarize_arrow",
    "verify_ledger_run",
    "verify_run",
    "verify_run_arrow",
]

log = logging.getLogger(__name__)


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
    phases = Phases()
    with phases.timed("count rows"):
        dataset = tables.arrow_dataset(ledger_path, "messages", run_id)
        rows = dataset.count_rows()
    if rows <= local_max_rows:
        columns = list(dict.fromkeys([*SUMMARY_INPUT_COLUMNS, *MESSAGE_CHECK_COLUMNS]))
        if DECISION in dataset.schema.names:
            columns.append(DECISION)
        with phases.timed("read"):
            messages = tables.read_arrow(ledger_path, "messages", run_id=run_id, columns=columns)
        return verify_run_arrow(run_id, messages, counters, out_dir, phases=phases)
    log.info("run %s: %d ledger rows, verified in Spark", run_id, rows)
    counter_schema = (
        spark_schema(tuple(c for c in QUEUES if c.name in COUNTER_COLUMNS))
        .add(DESTINATION_SHARED, T.BooleanType(), nullable=False)
        .add(SOURCE_REMOVED, T.LongType(), nullable=True)
        .add(FENCES, T.LongType(), nullable=True)
    )
    # Lazy in Spark: "read" is the plan (listing the run's files); the rows are read
    # by each pass.
    with phases.timed("read"):
        messages = tables.read_run_messages(spark, ledger_path, run_id)
        counter_frame = spark.createDataFrame(
            [
                {
                    **{name: row[name] for name in COUNTER_COLUMNS},
                    DESTINATION_SHARED: bool(row.get(DESTINATION_SHARED, False)),
                    SOURCE_REMOVED: row.get(SOURCE_REMOVED),
                    FENCES: row.get(FENCES),
                }
                for row in counters
            ],
            counter_schema,
        )
    return verify_run(run_id, messages, counter_frame, out_dir, phases=phases)


def verify_run(
    run_id: str,
    messages: DataFrame,
    counters: DataFrame,
    out_dir: str | Path,
    *,
    phases: Phases | None = None,
) -> Verification:
    """Verify one run in Spark and write `verification.json` and Data Docs under `out_dir`.

    `messages` holds the run's ledger rows (MESSAGES columns); `counters` one row per
    queue transfer with TRANSFER_KEY, DEPTH_COLUMNS, status and error. Returns the
    Verification; raises only for malformed input. `phases` collects the seconds of
    each step (a caller's earlier steps included).
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    phases = phases if phases is not None else Phases()

    # Not cached: each pass reads only the columns it needs from the Parquet files (GE's
    # null checks not even those: the footers' null counts skip every row group), where
    # a cache of every column cost a full decode and encode of the run's rows up front.
    with phases.timed("summary"):
        summary = summarize(messages, counters)
        collected = summary.collect()
    summary_rows = [row.asDict() for row in collected]
    unnumbered = not_contiguous(summary_rows)
    if unnumbered:
        with phases.timed("gaps"):
            add_missing_positions(summary_rows, gaps_spark(messages, unnumbered))
    # GE validates the collected rows, as the driver engine does (`summary_frame`): the
    # joins and windows behind them ran once, and its metrics need no Spark job.
    # Only the columns the message expectations read, as the driver engine hands GE.
    checked = messages.select(*MESSAGE_CHECK_COLUMNS)
    with quiet_gx(), pandas_fingerprints_off():
        results, index_html = validate_with_gx(
            run_id,
            ENGINE_SPARK,
            summary_frame(summary_rows),
            checked,
            out / DATA_DOCS_DIR,
            phases=phases,
        )
    return _verification(
        run_id,
        ENGINE_SPARK,
        summary_rows,
        results=results,
        index_html=index_html,
        out=out,
        started=started,
        phases=phases,
    )


def verify_run_arrow(
    run_id: str,
    messages: pa.Table,
    counters: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    phases: Phases | None = None,
) -> Verification:
    """`verify_run` on the driver: pyarrow summary, GE on pandas frames; same Verification.

    `messages` holds the run's ledger rows with at least SUMMARY_INPUT_COLUMNS and
    MESSAGE_CHECK_COLUMNS; `counters` one mapping per queue transfer (COUNTER_COLUMNS).
    """
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    phases = phases if phases is not None else Phases()
    missing = [c for c in MESSAGE_CHECK_COLUMNS if c not in messages.column_names]
    if missing:
        raise ValueError(
            f"messages table lacks column(s) {', '.join(missing)}; required: "
            f"{', '.join(MESSAGE_CHECK_COLUMNS)}; found: {', '.join(messages.column_names)}"
        )
    with phases.timed("summary"):
        summary_rows = summarize_arrow(messages, counters)
    unnumbered = not_contiguous(summary_rows)
    if unnumbered:
        with phases.timed("gaps"):
            add_missing_positions(summary_rows, gaps_arrow(messages, unnumbered))
    with phases.timed("to pandas"):
        message_frame = messages.select(list(MESSAGE_CHECK_COLUMNS)).to_pandas()
    # GE fingerprints every pandas batch (see pandas_fingerprints_off); not wanted here.
    with quiet_gx(), pandas_fingerprints_off():
        results, index_html = validate_with_gx(
            run_id,
            ENGINE_DRIVER,
            summary_frame(summary_rows),
            message_frame,
            out / DATA_DOCS_DIR,
            phases=phases,
        )
    return _verification(
        run_id,
        ENGINE_DRIVER,
        summary_rows,
        results=results,
        index_html=index_html,
        out=out,
        started=started,
        phases=phases,
    )


def summary_frame(summary_rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The summary rows as the pandas frame GE validates on either engine.

    object columns keep Python's values as they are (ints stay ints, None stays None
    rather than NaN): what the rows hold, whichever engine collected them.
    """
    import pandas as pd

    return pd.DataFrame(summary_rows, columns=list(SUMMARY_COLUMNS), dtype=object)


def _verification(
    run_id: str,
    engine: str,
    summary_rows: Sequence[Mapping[str, Any]],
    *,
    results: Sequence[Mapping[str, Any]],
    index_html: str | None,
    out: Path,
    started: float,
    phases: Phases,
) -> Verification:
    """The verdicts, totals and failure lines; written to verification.json and logged."""
    verdicts = tuple(queue_verdict(row) for row in summary_rows)
    verification = Verification(
        run_id=run_id,
        queues=verdicts,
        messages=sum(v.distinct_messages for v in verdicts),
        kept=sum(v.kept_messages for v in verdicts),
        recognised=sum(v.recognised for v in verdicts),
        bytes=sum(v.bytes for v in verdicts),
        lost=sum(v.lost for v in verdicts),
        duplicates=sum(v.duplicates for v in verdicts),
        unexpected=sum(v.unexpected for v in verdicts),
        live_arrivals=sum(v.live_arrivals for v in verdicts),
        sources_unproven=sum(1 for v in verdicts if v.passed and v.source_witness == WITNESS_NONE),
        verified=all(result["success"] for result in results),
        failed_expectations=describe_failures(results, summary_rows),
        results_path=str(out / RESULTS_FILE),
        data_docs_path=index_html,
        engine=engine,
        phases=phases.seconds(),
    )
    write_results(verification, summary_rows, results)
    log.info(
        "run %s verified=%s: %d queues, %d messages, %d bytes, lost %d, duplicates %d, "
        "recognised %d, unexpected %d (%s engine, %.1fs: %s); results in %s",
        run_id,
        verification.verified,
        len(verdicts),
        verification.messages,
        verification.bytes,
        verification.lost,
        verification.duplicates,
        verification.recognised,
        verification.unexpected,
        engine,
        time.monotonic() - started,
        phases.describe(),
        verification.results_path,
    )
    for line in verification.failed_expectations:
        log.warning("run %s failed expectation %s", run_id, line)
    return verification
