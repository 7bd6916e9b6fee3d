"""Great Expectations: its preload, the two suites, the validation (with GE's
pandas fingerprint turned off only while it runs) and verification.json."""

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmq_spark.verify.columns import (
    ENGINE_SPARK,
    STATUS_MOVED,
)
from rmq_spark.verify.phases import Phases
from rmq_spark.verify.verdicts import (
    Verification,
)

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.expectations.expectation import Expectation
    from pyspark.sql import DataFrame


log = logging.getLogger(__name__)

RESULTS_FILE = "verification.json"
DATA_DOCS_DIR = "data_docs"
DATA_DOCS_SITE = "rmq_spark"
GX_DATASOURCE = "ledger"  # the messages: Spark or pandas, by engine
SUMMARY_DATASOURCE = "summary"  # the per-transfer summary: pandas on both engines
SUMMARY_ASSET = "queue_summary"
MESSAGES_ASSET = "messages"
WHOLE_DATAFRAME = "whole_dataframe"
# BASIC keeps the unexpected samples to a few values; COMPLETE would collect up to
# GE's MAX_RESULT_RECORDS rows of a multi-million-row table to the driver.
RESULT_FORMAT: dict[str, Any] = {"result_format": "BASIC", "partial_unexpected_count": 5}

_GX_LOGGER = "great_expectations"


# What `validate_with_gx` and the expectation lists import: GE's package import alone
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
    Importing is idempotent: `validate_with_gx` imports the same modules and, if the
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


def _summary_expectations() -> list[Expectation]:
    # Imported from their modules: `great_expectations.expectations` re-exports them
    # implicitly, which mypy --strict does not accept.
    from great_expectations.expectations.core.expect_column_values_to_be_in_set import (
        ExpectColumnValuesToBeInSet,
    )
    from great_expectations.expectations.core.expect_column_values_to_not_be_null import (
        ExpectColumnValuesToNotBeNull,
    )

    return [
        # Nothing left the source but what the ledger holds: no more than was moved fell
        # out of its depth, and its consumer counters, where the broker keeps them, saw
        # no consumer but the movers (`lost`: the larger shortfall of the two). Equality
        # of the drop and the moved count would assume nothing arrived meanwhile.
        ExpectColumnValuesToBeInSet(column="lost", value_set=[0]),
        ExpectColumnValuesToNotBeNull(column="source_drop"),
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


def _ephemeral_context(engine: str, docs_dir: Path) -> tuple[Any, Any, Any]:
    """A fresh in-memory GE context rendering Data Docs into `docs_dir`, its pandas
    data source for the summary and its data source for `engine`'s messages."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

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
    # persist=False: GE's own persist() would never be undone, and verify_run reads the
    # Parquet files directly (their statistics answer some checks without a scan).
    messages = (
        context.data_sources.add_spark(name=GX_DATASOURCE, persist=False)
        if engine == ENGINE_SPARK
        else context.data_sources.add_pandas(name=GX_DATASOURCE)
    )
    return context, context.data_sources.add_pandas(name=SUMMARY_DATASOURCE), messages


def validate_with_gx(
    run_id: str,
    engine: str,
    summary: pd.DataFrame,
    messages: DataFrame | pd.DataFrame,
    docs_dir: Path,
    *,
    phases: Phases | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Run both suites in a fresh ephemeral context; return their JSON and the index.html.

    `engine` says what `messages` is: a Spark DataFrame (ENGINE_SPARK) or pandas
    (ENGINE_DRIVER). The summary, one row per transfer and already on the driver, is
    a pandas frame on both: on Spark each of its expectations' metrics was a Spark job
    over those few rows. The suites are the same. `phases` times each suite and the docs.
    """
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    phases = phases if phases is not None else Phases()
    with phases.timed("expectations: context"):
        context, summary_source, messages_source = _ephemeral_context(engine, docs_dir)
    # Both suites share one run identifier, so Data Docs lists them under the run's name.
    gx_run = RunIdentifier(run_name=run_id, run_time=dt.datetime.now(dt.UTC))

    results: list[dict[str, Any]] = []
    for asset_name, source, frame, expectations in (
        (SUMMARY_ASSET, summary_source, summary, _summary_expectations()),
        (MESSAGES_ASSET, messages_source, messages, _message_expectations(run_id)),
    ):
        with phases.timed(f"expectations: {asset_name}"):
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

    # build_data_docs renders every suite and validation result in the (in-memory)
    # stores, which hold exactly this run's.
    with phases.timed("data docs"):
        sites = context.build_data_docs(site_names=[DATA_DOCS_SITE])
    index_html = docs_dir / "index.html"
    log.debug("GE rendered Data Docs of run %s: %s", run_id, sites.get(DATA_DOCS_SITE))
    return results, str(index_html) if index_html.is_file() else None


@contextlib.contextmanager
def pandas_fingerprints_off() -> Iterator[None]:
    """GE's pandas batch fingerprints off while the block runs, then as they were.

    GE fingerprints every pandas batch under 1 GB it is given: an md5 over pandas' row
    hashes, 3.5 s of the 10 s a 1M-row run took to verify on a 2-core box. The
    fingerprint is a batch marker in the results, which nothing here reads. A module
    global of GE's, so it is set only around our validation, never left for other
    users of GE in the process.
    """
    # The package first, whole: reaching a subpackage while the preload thread is
    # halfway through GE's import fails with a circular ImportError; `import
    # great_expectations` waits for that thread instead.
    import great_expectations  # noqa: F401
    from great_expectations.execution_engine import pandas_execution_engine

    previous = pandas_execution_engine.HASH_THRESHOLD
    pandas_execution_engine.HASH_THRESHOLD = 0
    try:
        yield
    finally:
        pandas_execution_engine.HASH_THRESHOLD = previous


@contextlib.contextmanager
def quiet_gx() -> Iterator[None]:
    """Hold GE's loggers at WARNING while it runs, whatever the application's root level."""
    logger = logging.getLogger(_GX_LOGGER)
    previous = logger.level
    if logger.getEffectiveLevel() < logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(previous)


def write_results(
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
            "kept": verification.kept,
            "bytes": verification.bytes,
            "lost": verification.lost,
            "duplicates": verification.duplicates,
            "unexpected": verification.unexpected,
            "live_arrivals": verification.live_arrivals,
        },
        "engine": verification.engine,
        # Where the verification's time went, phase by phase (`phases.Phases`).
        "seconds": dict(verification.phases),
        "failed_expectations": list(verification.failed_expectations),
        "queues": [
            {**verdict.record(), "summary": dict(row)}
            for verdict, row in zip(verification.queues, summary_rows, strict=True)
        ],
        "data_docs_path": verification.data_docs_path,
        "great_expectations": list(gx_results),
    }
    Path(verification.results_path).write_text(
        json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8"
    )
