"""A moving redrive: one transfer from the DLQ, its messages to their origin queues.

Why one transfer and not one per origin: a DLQ has one order, and only one consumer
keeps it; the origins are where each message's decision sends it, not queues to drain.
So the DLQ is the transfer's source AND its nominal destination (its cluster and vhost:
dead-lettering never crosses vhosts), and the engine publishes each moved message
through the exchange and key its decision names (`RedriveSpec` builds the decider on the
executor; `wire.PublishFrames` routes). Kept messages go back to the DLQ's tail in order,
behind the selective move's fence, so only the messages present at the start are
examined. The source ack waits for the confirm and the durable ledger row as in every
move (`window.TransferWindow`).

The run: exact readings of the DLQ and the origin queues (depth, consumers), recorded in
the ledger (`readings.py`: a driver killed mid-move is resumed with the same `--run-id`
from them), the one Spark task (`partition_tasks.run_tasks`, as `rmq-spark transfer`'s
movers run), the ledger's commit, readings again, and the verdicts of `tally.py` from the
committed rows.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING

from rmq_spark.config import JobConfig, Limits
from rmq_spark.errors import ConfigError
from rmq_spark.ledger import store, tables
from rmq_spark.ledger.committers import committer_for
from rmq_spark.model import MoveOutcome, TransferKey
from rmq_spark.partition_tasks import run_tasks
from rmq_spark.pipeline import executor_settings
from rmq_spark.redrive.decider import RedriveSpec
from rmq_spark.redrive.preflight import DeadLetterQueue
from rmq_spark.redrive.readings import read_queues, starting_readings
from rmq_spark.redrive.tally import (
    DestinationVerdict,
    SourceVerdict,
    decision_counts,
    destination_verdicts,
    source_verdict,
)
from rmq_spark.transfer.executor import move_partition
from rmq_spark.transfer.outcomes import OUTCOME_SCHEMA, outcome_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROUTE = "redrive"
_LEDGER_COLUMNS = [
    "position",
    "decision",
    "publish_exchange",
    "publish_routing_key",
    "reason",
    "confirmed_at",
    "redelivered",
    "body_sha256",
    "properties_sha256",
    "message_id",
]


@dataclass(frozen=True)
class RedriveResult:
    """What a redrive did and what proves it (the console prints it, `tally.py` says why)."""

    run_id: str
    dlq: DeadLetterQueue
    outcome: MoveOutcome
    counts: Counter[tuple[str, str, str]]
    source: SourceVerdict
    destinations: tuple[DestinationVerdict, ...]
    seconds: float
    source_after: int = 0  # the DLQ's exact depth after the run

    @property
    def verified(self) -> bool:
        return (
            self.outcome.status == "moved"
            and self.source.passed
            and all(d.missing == 0 for d in self.destinations)
        )

    @property
    def unproven(self) -> tuple[DestinationVerdict, ...]:
        """Destinations only the broker's confirms vouch for (module doc of `tally.py`)."""
        return tuple(d for d in self.destinations if not d.proven and d.missing == 0)


def transfer_key(dlq: DeadLetterQueue) -> TransferKey:
    """A redrive's one transfer: the DLQ is its source and its nominal destination."""
    return TransferKey(dlq.cluster, dlq.vhost, dlq.queue, dlq.cluster, dlq.vhost, dlq.queue)


def run_redrive(
    spark: SparkSession,
    config: JobConfig,
    dlq: DeadLetterQueue,
    spec: RedriveSpec,
    *,
    origins: Sequence[str],
    messages_per_second: float | None,
    run_id: str,
) -> RedriveResult:
    """Move the DLQ's selected messages to their origins, keep the rest; verify.

    `origins`: the queues the dry run's decisions send messages to (their depths are the
    destinations' witness). Raises RmqSparkError subclasses before anything moves when
    the ledger or a broker is unusable.
    """
    started, started_at = time.monotonic(), datetime.now(UTC)
    ledger_path = store.use_ledger(config.ledger)
    tables.ensure_tables(config.ledger.path)
    recorded = tables.read_arrow(config.ledger.path, "runs", columns=["run_id"])["run_id"]
    if run_id in recorded.to_pylist():
        raise ConfigError(
            f"--run-id {run_id}: that redrive is recorded as finished in the ledger; "
            "a new redrive needs a new run id (a killed one is resumed with its own)"
        )
    # A run whose driver died is resumed from its first readings (`readings.py`).
    before = starting_readings(config, ledger_path, dlq, run_id, [dlq.queue, *origins])
    watched = list(before)
    origins = [queue for queue in watched if queue != dlq.queue]
    rate = messages_per_second
    limits = {} if rate is None else {ROUTE: Limits(messages_per_second=rate)}
    # One transfer: max_active (queues at once per task) cannot change what it does.
    settings = executor_settings(
        spark, config, run_id, ledger_path, rate_limits=limits, deciders={ROUTE: spec}
    )
    row: dict[str, object] = {
        "route": ROUTE,
        **asdict(transfer_key(dlq)),
        "messages": before[dlq.queue].depth,
    }
    log.info("redrive %s: run %s moving", dlq.label, run_id)
    task = partial(move_partition, groups=[[row]], settings=settings)
    [outcome] = [outcome_of(r) for r in run_tasks(spark, 1, task, OUTCOME_SCHEMA)]
    tables.commit_run(config.ledger.path, run_id, committer_for(spark))
    after = read_queues(config, dlq, watched)
    rows = tables.read_arrow(
        config.ledger.path, "messages", run_id=run_id, columns=_LEDGER_COLUMNS
    ).to_pylist()
    own_fence = 1 if outcome.fences else 0
    result = RedriveResult(
        run_id=run_id,
        dlq=dlq,
        outcome=outcome,
        counts=decision_counts(rows, dlq.queue),
        source=source_verdict(
            rows,
            before[dlq.queue],
            after[dlq.queue],
            stale_fences=max(outcome.fences - own_fence, 0),
        ),
        destinations=tuple(
            destination_verdicts(
                rows,
                dlq.queue,
                {q: before[q] for q in origins if q in before},
                after,
                expiring=spec.restore_expiration,
            )
        ),
        seconds=time.monotonic() - started,
        source_after=after[dlq.queue].depth,
    )
    record_redrive(config, result, spark, rows=len(rows), started_at=started_at)
    return result


def record_redrive(
    config: JobConfig,
    result: RedriveResult,
    spark: SparkSession,
    *,
    rows: int,
    started_at: datetime,
) -> None:
    """The redrive's `queues` row (its one transfer; the destination's depths are the
    origins' summed, its figures `tally.py`'s) and its `runs` row, so `rmq-spark report`
    draws it like any run (its decisions section by destination and reason)."""
    dlq, source, outcome = result.dlq, result.source, result.outcome
    depth_before = depth_after = 0
    for d in result.destinations:
        if d.before is not None and d.after is not None:
            depth_before, depth_after = depth_before + d.before.depth, depth_after + d.after.depth
    committer = committer_for(spark)
    key = {"run_id": result.run_id, **asdict(transfer_key(dlq))}
    tables.append_rows(
        config.ledger.path,
        "queues",
        [
            {
                **key,
                "partition": 0,
                "status": outcome.status,
                "error": outcome.error,
                "source_depth_before": source.drop + result.source_after,
                "source_depth_after": result.source_after,
                "destination_depth_before": depth_before,
                "destination_depth_after": depth_after,
                "ledger_rows": rows,
                "duplicates": source.duplicates,
                "lost": source.lost,
                "source_removed": None,
                "unexpected": 0,
                "reordered_by_priority": None,
            }
        ],
        committer,
    )
    tables.append_rows(
        config.ledger.path,
        "runs",
        [
            {
                "run_id": result.run_id,
                "started_at": started_at,
                "finished_at": datetime.now(UTC),
                "config_digest": config.digest(),
                "spark_app_id": spark.conf.get("spark.app.id", None),
                "queues": 1,
                "messages": source.moved,
                "bytes": outcome.bytes,
                "lost": source.lost,
                "duplicates": source.duplicates,
                "unexpected": 0,
                "verified": result.verified,
                "seconds": result.seconds,
                "verification_path": "",
                "rabbitmq_versions": None,
            }
        ],
        committer,
    )
