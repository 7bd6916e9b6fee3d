"""A park: each selected source queue's messages into the ledger's `parked` table.

The stages: the ledger's tables (the parked one too); the source half of discovery
(`discovery.discover_parked`); exact readings of each source (depth, consumers); the
movers as Spark tasks (`partition_tasks.run_tasks`, as `rmq-spark transfer` runs them,
inside `federation.paused_federation` as a move's are),
each transfer's destination the table (`transfer/parked.py`, staged rows); the ledger's
messages commit, then the parked table's (its staged rows completed in Spark tasks,
`park/table.py`); readings again; the verdicts of `verdicts.py`
from the committed rows of both tables; the run's `queues` and `runs` rows.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from rmq_spark.broker.counts import queue_readings
from rmq_spark.broker.federation import paused_federation
from rmq_spark.broker.management import management_clients
from rmq_spark.config import JobConfig
from rmq_spark.ledger import store, tables
from rmq_spark.ledger.committers import committer_for
from rmq_spark.ledger.layout import KEY_COLUMNS
from rmq_spark.model import MoveOutcome, QueueTransfer, TransferKey, task_count
from rmq_spark.park.table import commit_parked, completed_in_tasks, ensure_parked_table
from rmq_spark.park.verdicts import ParkVerdict, Reading, park_verdict
from rmq_spark.partition_tasks import run_tasks
from rmq_spark.pipeline import executor_settings
from rmq_spark.planning.discovery import discover_parked
from rmq_spark.planning.rate_limits import route_rate_limits
from rmq_spark.planning.selections import route_selections
from rmq_spark.transfer.executor import ParkSettings, move_partition
from rmq_spark.transfer.outcomes import OUTCOME_SCHEMA, outcome_of
from rmq_spark.transfer.parked_table import read_parked

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_LEDGER_COLUMNS = [
    *KEY_COLUMNS,
    "position",
    "decision",
    "confirmed_at",
    "body_sha256",
    "properties_sha256",
]
_PARKED_COLUMNS = [
    "source_cluster",
    "source_vhost",
    "source_queue",
    "position",
    "body_sha256",
    "properties_sha256",
]


@dataclass(frozen=True)
class ParkedQueue:
    """One source queue's park: its transfer, outcome, readings and verdict."""

    transfer: QueueTransfer
    outcome: MoveOutcome
    before: Reading
    after: Reading
    verdict: ParkVerdict


@dataclass(frozen=True)
class ParkResult:
    """What a park did and what proves it (`command.py` prints it)."""

    run_id: str
    queues: tuple[ParkedQueue, ...]
    seconds: float
    exclude_body: bool

    @property
    def verified(self) -> bool:
        return all(q.outcome.status == "moved" and q.verdict.verified for q in self.queues)

    @property
    def parked(self) -> int:
        return sum(q.verdict.parked for q in self.queues)

    @property
    def kept(self) -> int:
        return sum(q.verdict.kept for q in self.queues)

    @property
    def lost(self) -> int:
        return sum(q.verdict.lost for q in self.queues)

    @property
    def duplicates(self) -> int:
        return sum(q.verdict.duplicates for q in self.queues)

    @property
    def bytes(self) -> int:
        return sum(q.outcome.bytes for q in self.queues)


def _readings(config: JobConfig, transfers: Iterable[QueueTransfer]) -> dict[TransferKey, Reading]:
    by_vhost: dict[tuple[str, str], list[QueueTransfer]] = defaultdict(list)
    for t in transfers:
        by_vhost[(t.source_cluster, t.source_vhost)].append(t)
    found: dict[TransferKey, Reading] = {}
    for (cluster, vhost), group in by_vhost.items():
        read = queue_readings(
            cluster, config.clusters[cluster], vhost, [t.source_queue for t in group]
        )
        for t in group:
            depth, consumers = read.get(t.source_queue, (0, 0))
            found[t.key] = Reading(depth, consumers)
    return found


def plan_groups(transfers: Sequence[QueueTransfer], tasks: int) -> list[list[dict[str, Any]]]:
    """The movers' plan rows, dealt round-robin into `tasks` groups (task i moves group i)."""
    groups: list[list[dict[str, Any]]] = [[] for _ in range(max(1, min(tasks, len(transfers))))]
    for index, transfer in enumerate(transfers):
        partition = index % len(groups)
        groups[partition].append({"partition": partition, **asdict(transfer)})
    return groups


def run_park(spark: SparkSession, config: JobConfig, *, run_id: str) -> ParkResult:
    """Park every message of the config's routes (those `select` picks, with one), verify.

    Raises RmqSparkError subclasses before anything moves when the config does not park,
    or the ledger or a broker is unusable.
    """
    config.require_parks()
    started, started_at = time.monotonic(), datetime.now(UTC)
    ledger_path = store.use_ledger(config.ledger)
    tables.ensure_tables(config.ledger.path)
    ensure_parked_table(config.ledger.path)
    with management_clients(config) as clients:
        transfers = discover_parked(config, clients)
        if not transfers:
            log.info("park %s: no queue to park", run_id)
            return ParkResult(run_id, (), time.monotonic() - started, config.park.exclude_body)
        before = _readings(config, transfers)
        settings = executor_settings(
            spark,
            config,
            run_id,
            ledger_path,
            rate_limits=route_rate_limits(config, len(transfers)),
            selections=route_selections(config),
            park=ParkSettings(exclude_body=config.park.exclude_body),
        )
        groups = plan_groups(transfers, task_count(config.max_active, config.mover.queues_per_task))
        log.info("park %s: %d queue(s) in %d task(s)", run_id, len(transfers), len(groups))
        task = partial(move_partition, groups=groups, settings=settings)
        # federation: pause, as for a move: a federated source's links would pull its
        # upstream's messages in while the movers drain it. Restored on the way out,
        # also after a failure; `rmq-spark restore-federation` after a crash.
        with paused_federation(config, clients, transfers):
            rows = run_tasks(spark, len(groups), task, OUTCOME_SCHEMA)
    outcomes = {o.key: o for o in map(outcome_of, rows)}
    tables.commit_run(config.ledger.path, run_id, committer_for(spark))
    commit_parked(
        config.ledger.path,
        run_id,
        completed_in_tasks(spark, settings.ledger_path, settings.ledger_store, run_id),
    )
    after = _readings(config, transfers)
    ledger_rows = tables.read_arrow(
        config.ledger.path, "messages", run_id=run_id, columns=_LEDGER_COLUMNS
    ).to_pylist()
    parked_rows = read_parked(config.ledger.path, run_id, _PARKED_COLUMNS).to_pylist()
    ledger_by: dict[TransferKey, list[dict[str, Any]]] = defaultdict(list)
    for row in ledger_rows:
        ledger_by[TransferKey.of(row)].append(row)
    parked_by: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in parked_rows:
        parked_by[(row["source_cluster"], row["source_vhost"], row["source_queue"])].append(row)
    queues = []
    for t in transfers:
        outcome = outcomes[t.key]
        own_fence = 1 if outcome.fences else 0
        queues.append(
            ParkedQueue(
                transfer=t,
                outcome=outcome,
                before=before[t.key],
                after=after[t.key],
                verdict=park_verdict(
                    ledger_by[t.key],
                    parked_by[(t.source_cluster, t.source_vhost, t.source_queue)],
                    before[t.key],
                    after[t.key],
                    stale_fences=max(outcome.fences - own_fence, 0),
                ),
            )
        )
    result = ParkResult(run_id, tuple(queues), time.monotonic() - started, config.park.exclude_body)
    record_park(config, result, spark, started_at=started_at, ledger_rows=ledger_by)
    return result


def record_park(
    config: JobConfig,
    result: ParkResult,
    spark: SparkSession,
    *,
    started_at: datetime,
    ledger_rows: dict[TransferKey, list[dict[str, Any]]],
) -> None:
    """The park's `queues` rows (the destination's depths are the table's rows) and its
    `runs` row, so the ledger's readers see it like any run."""
    committer = committer_for(spark)
    tables.append_rows(
        config.ledger.path,
        "queues",
        [
            {
                "run_id": result.run_id,
                **asdict(q.transfer.key),
                "partition": 0,
                "status": q.outcome.status,
                "error": q.outcome.error,
                "source_depth_before": q.before.depth,
                "source_depth_after": q.after.depth,
                "destination_depth_before": 0,
                "destination_depth_after": q.verdict.table_rows,
                "ledger_rows": len(ledger_rows[q.transfer.key]),
                "duplicates": q.verdict.duplicates,
                "lost": q.verdict.lost,
                "source_removed": None,
                "unexpected": q.verdict.unexpected,
                "reordered_by_priority": None,
            }
            for q in result.queues
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
                "queues": len(result.queues),
                "messages": result.parked,
                "bytes": result.bytes,
                "lost": result.lost,
                "duplicates": result.duplicates,
                "unexpected": sum(q.verdict.unexpected for q in result.queues),
                "verified": result.verified,
                "seconds": result.seconds,
                "verification_path": "",
                "rabbitmq_versions": None,
            }
        ],
        committer,
    )
