"""The transfer job on the driver, one function per stage.

    discover ─► plan DataFrame ─► mapPartitions(move) ─► commit ledger ─► verify ─► record

Each stage is a plain function of its inputs; `run_transfer` only strings them
together, so a notebook or a test can run any stage alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from rmq_spark import verify
from rmq_spark.config import JobConfig, validate_run_id
from rmq_spark.discovery import QueueTransfer, discover, measure_depths
from rmq_spark.executor import ExecutorSettings, move_partition
from rmq_spark.ledger import schema, tables
from rmq_spark.management import ManagementClient
from rmq_spark.mover import MoveOutcome
from rmq_spark.plan import assign_partitions, plan_dataframe
from rmq_spark.progress import ProgressReporter, amqp_sampler
from rmq_spark.verify import Verification, verify_run

log = logging.getLogger(__name__)

# The queues-table columns known before verification (what the brokers and movers
# said), plus the planner's partition.
_COUNTERS_SCHEMA = tuple(
    c for c in schema.QUEUES if c.name in verify.COUNTER_COLUMNS or c.name == "partition"
)


@dataclass(frozen=True)
class RunResult:
    """Everything the report needs about one run."""

    run_id: str
    transfers: tuple[QueueTransfer, ...]
    partitions: tuple[int, ...]
    outcomes: tuple[MoveOutcome, ...]
    verification: Verification
    seconds: float


def run_transfer(
    spark: SparkSession,
    config: JobConfig,
    *,
    run_id: str,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> RunResult:
    """Discover, move, commit, verify and record one run. Raises RmqSparkError subclasses."""
    validate_run_id(run_id)
    started_at, started = clock(), time.monotonic()
    ledger_path = config.ledger.path
    # Pre-flight, cheapest first: the ledger path, then every cluster, vhost and queue
    # of the plan (discover raises one error listing every problem). Nothing has
    # moved if either fails.
    tables.ensure_tables(ledger_path)
    with management_clients(config) as clients:
        transfers = discover(config, clients)
    assignment = assign_partitions(transfers, config.max_active)
    plan = plan_dataframe(spark, transfers, assignment)
    log.info("run %s: %d queues in %d partitions", run_id, len(transfers), len(set(assignment)))

    with ProgressReporter(transfers, amqp_sampler(config, transfers)):
        outcomes = move(spark, plan, config, run_id)
    tables.commit_run(ledger_path, run_id)

    after = measure_depths(config, transfers)
    counters = counters_rows(run_id, transfers, assignment, outcomes, after)
    verification = verify_run(
        run_id,
        tables.read_run_messages(spark, ledger_path, run_id),
        spark.createDataFrame(counters, schema.spark_schema(_COUNTERS_SCHEMA)),
        Path(ledger_path) / "verification" / f"run_id={run_id}",
    )
    seconds = time.monotonic() - started
    record_run(
        config,
        run_id=run_id,
        started_at=started_at,
        finished_at=clock(),
        seconds=seconds,
        counters=counters,
        verification=verification,
        spark=spark,
    )
    return RunResult(
        run_id=run_id,
        transfers=tuple(transfers),
        partitions=tuple(assignment),
        outcomes=tuple(outcomes),
        verification=verification,
        seconds=seconds,
    )


@contextmanager
def management_clients(config: JobConfig) -> Iterator[dict[str, ManagementClient]]:
    clients = {
        name: ManagementClient(name, cluster, timeout=config.management_timeout_seconds)
        for name, cluster in config.clusters.items()
    }
    try:
        yield clients
    finally:
        for client in clients.values():
            client.close()


def move(spark: SparkSession, plan: DataFrame, config: JobConfig, run_id: str) -> list[MoveOutcome]:
    """Run the movers on the executors; one outcome per planned queue."""
    settings = spark.sparkContext.broadcast(
        ExecutorSettings(
            run_id=run_id,
            ledger_path=str(Path(config.ledger.path).resolve()),
            clusters=dict(config.clusters),
            window_messages=config.window.messages,
            window_bytes=config.window.bytes,
            mover=config.mover,
        )
    )
    try:
        return plan.rdd.mapPartitions(partial(move_partition, settings=settings)).collect()
    finally:
        settings.unpersist()


def counters_rows(
    run_id: str,
    transfers: Sequence[QueueTransfer],
    assignment: Sequence[int],
    outcomes: Sequence[MoveOutcome],
    after: dict[QueueTransfer, tuple[int, int]],
) -> list[dict[str, object]]:
    """Broker counters before/after and the outcome, per transfer (_COUNTERS_SCHEMA).

    The queues table's ledger columns (rows, duplicates, lost, unexpected) are added
    from the verification.
    """
    by_key = {outcome.key.describe(): outcome for outcome in outcomes}
    rows = []
    for transfer, partition in zip(transfers, assignment, strict=True):
        outcome = by_key.get(transfer.describe())
        rows.append(
            {
                "run_id": run_id,
                "source_cluster": transfer.source_cluster,
                "source_vhost": transfer.source_vhost,
                "source_queue": transfer.source_queue,
                "destination_cluster": transfer.destination_cluster,
                "destination_vhost": transfer.destination_vhost,
                "destination_queue": transfer.destination_queue,
                "partition": partition,
                "status": outcome.status if outcome else "failed",
                "error": outcome.error if outcome else "no outcome from the executor",
                "source_depth_before": transfer.messages,
                "source_depth_after": after[transfer][0],
                "destination_depth_before": transfer.destination_messages,
                "destination_depth_after": after[transfer][1],
            }
        )
    return rows


def record_run(
    config: JobConfig,
    *,
    run_id: str,
    started_at: datetime,
    finished_at: datetime,
    seconds: float,
    counters: Sequence[dict[str, object]],
    verification: Verification,
    spark: SparkSession,
) -> None:
    """Append the run's queues rows (with verification figures) and its runs row."""
    verdicts = {(v.source_cluster, v.source_vhost, v.source_queue): v for v in verification.queues}
    queue_rows = []
    for row in counters:
        verdict = verdicts[
            (str(row["source_cluster"]), str(row["source_vhost"]), str(row["source_queue"]))
        ]
        queue_rows.append(
            {
                **row,
                "ledger_rows": verdict.ledger_rows,
                "duplicates": verdict.duplicates,
                "lost": verdict.lost,
                "unexpected": verdict.unexpected,
            }
        )
    tables.append_rows(config.ledger.path, "queues", queue_rows)
    tables.append_rows(
        config.ledger.path,
        "runs",
        [
            {
                "run_id": run_id,
                "started_at": started_at,
                "finished_at": finished_at,
                "config_digest": config.digest(),
                "spark_app_id": spark.sparkContext.applicationId,
                "queues": len(counters),
                "messages": verification.messages,
                "bytes": verification.bytes,
                "lost": verification.lost,
                "duplicates": verification.duplicates,
                "unexpected": verification.unexpected,
                "verified": verification.verified,
                "seconds": seconds,
                "verification_path": verification.results_path,
            }
        ],
    )
