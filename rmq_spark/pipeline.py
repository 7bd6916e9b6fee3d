"""The transfer job on the driver, one function per stage.

    discover ─► plan groups ─► run_tasks(move) ─► commit ledger ─► verify ─► record

Each stage is a plain function of its inputs; `run_transfer` only strings them
together, so a notebook or a test can run any stage alone.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rmq_spark import verify
from rmq_spark.broker import removals
from rmq_spark.broker.colocation import node_uris
from rmq_spark.broker.delivery_limit import budget_problem, task_attempts
from rmq_spark.broker.federation import paused_federation
from rmq_spark.broker.management import ManagementClient, management_clients
from rmq_spark.config import JobConfig, Limits, validate_run_id
from rmq_spark.errors import ConfigError, DeliveryLimitError, RmqSparkError
from rmq_spark.ledger import schema, store, tables
from rmq_spark.ledger.brakes import BrakeRecord, HeldBack, write_brakes
from rmq_spark.ledger.committers import committer_for
from rmq_spark.model import MoveOutcome, QueueTransfer, TransferKey
from rmq_spark.partition_tasks import cancelled_if_failed, run_tasks
from rmq_spark.planning.discovery import discover, measure_depths
from rmq_spark.planning.executor_preflight import check_executors
from rmq_spark.planning.plan import assign_partitions, plan_groups
from rmq_spark.planning.queue_arguments import delivers_by_priority
from rmq_spark.planning.rate_limits import describe_limits, limits_in_force, route_rate_limits
from rmq_spark.planning.selections import route_selections
from rmq_spark.progress import ProgressReporter, depth_sampler
from rmq_spark.transfer.executor import ExecutorSettings, move_partition
from rmq_spark.transfer.outcomes import OUTCOME_SCHEMA, outcome_of
from rmq_spark.verify import (
    DESTINATION_SHARED,
    FENCES,
    SOURCE_REMOVED,
    Verification,
    verify_ledger_run,
)

log = logging.getLogger(__name__)

# The partition of a transfer an earlier driver of the same run id finished.
NOT_MOVED_NOW = -1
_TRANSFER_FIELDS = tuple(f.name for f in fields(QueueTransfer))

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
    #: cluster name -> RabbitMQ version (management API) at plan time.
    rabbitmq_versions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PreparedRun:
    """A run's pre-flight, done: what to move now, and the run's whole plan."""

    started_at: datetime
    started: float  # time.monotonic() at the start
    to_move: list[QueueTransfer]
    transfers: list[QueueTransfer]
    #: cluster name -> RabbitMQ version its management API reports.
    rabbitmq_versions: dict[str, str] = field(default_factory=dict)


def prepare_run(
    config: JobConfig,
    run_id: str,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> PreparedRun:
    """Pre-flight and plan, which need no Spark: `rmq-spark transfer` runs this while
    Spark starts. Raises RmqSparkError subclasses; nothing has moved if it does."""
    validate_run_id(run_id)
    store.use_ledger(config.ledger)
    started_at, started = clock(), time.monotonic()
    # Cheapest first: the ledger path, then every cluster, vhost and queue of the
    # plan (discover raises one error listing every problem).
    tables.ensure_tables(config.ledger.path)
    with management_clients(config) as clients:
        to_move = discover(config, clients)
        versions = rabbitmq_versions(clients)
    # The run's whole plan: what an earlier, crashed driver of this run id planned
    # (with the depths it saw first), plus what is new. Durable before anything moves.
    transfers = record_plan(config, run_id, to_move, clock())
    return PreparedRun(started_at, started, to_move, transfers, versions)


def rabbitmq_versions(clients: Mapping[str, ManagementClient]) -> dict[str, str]:
    """cluster name -> the RabbitMQ version its management API reports (sorted by name).

    Recorded with the run: what a mover may rely on differs between 3.x and 4.x (how
    properties are encoded on delivery, queue arguments, delivery limits).
    """
    return {
        name: str(clients[name].overview().get("rabbitmq_version", "unknown"))
        for name in sorted(clients)
    }


def run_transfer(
    spark: SparkSession,
    config: JobConfig,
    *,
    run_id: str,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    prepared: PreparedRun | Future[PreparedRun] | None = None,
) -> RunResult:
    """Discover, move, commit, verify and record one run. Raises RmqSparkError subclasses.

    `prepared`: this run's `prepare_run`, if the caller did it already, or a future of
    it still running (then the executors are probed meanwhile, `probe_beside`).
    """
    validate_run_id(run_id)
    ledger_path = config.ledger.path
    where = store.use_ledger(config.ledger)  # the URI, or the absolute directory
    # Before anything moves: every executor can import the movers' libraries and
    # writes its ledger files where this driver reads them.
    if isinstance(prepared, Future):
        prepared = probe_beside(spark, where, prepared)
    else:
        prepared = prepared or prepare_run(config, run_id, clock)
        check_executors(spark, where)
    started_at, started = prepared.started_at, prepared.started
    to_move, transfers = prepared.to_move, prepared.transfers
    assignment = assign_partitions(to_move, config.max_active, config.mover.queues_per_task)
    check_delivery_limits(to_move, config.mover.reconnect_attempts, spark_task_attempts(spark))
    plan = plan_groups(to_move, assignment)
    log.info("run %s: %d queues in %d partitions", run_id, len(to_move), len(set(assignment)))

    # Verification's Great Expectations import takes seconds: started here, while the
    # movers run, unless the caller already did (`rmq-spark transfer`, with Spark).
    verify.preload_great_expectations()
    # federation: pause keeps federated source queues from pulling from upstream while
    # the movers consume them; restored on the way out, also after a failure.
    # The sources' consumer counters as the movers start (`broker/removals.py`): on a
    # source others keep publishing to, they prove what left it. Only for transfers
    # this driver plans: a resumed one's depths span earlier drivers too.
    fresh = fresh_transfers(to_move, transfers)
    with (
        management_clients(config) as clients,
        paused_federation(config, clients, to_move),
        ProgressReporter(to_move, depth_sampler(config, to_move), limits=limits_in_force(config)),
    ):
        removed_before = removals.read_removed(clients, fresh)
        outcomes = move(
            spark,
            plan,
            config,
            run_id,
            node_uris(config, clients),
            rate_limits=route_rate_limits(config, len(to_move)),
        )
    # The depths the movers left are counted while the ledger commits (a passive
    # declare per queue and side: 10,000 queues took ~5 s after a commit of ~15 s), on
    # a thread of their own. The sources' counters lag the movers' acks by a
    # statistics interval or more: they are read again meanwhile, until they catch up
    # or those depths settle the transfer without them (`removals.proven_by_depth`).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmq-spark-depths-after") as pool:
        depths_after = pool.submit(measure_depths, config, transfers)
        with removals.settling(
            config, removed_before, outcomes, transfers, depths_after
        ) as removals_after:
            record_brakes(config, run_id, outcomes)
            # Spark's own Delta writer where the session has it (Databricks), else delta-rs.
            committer = committer_for(spark)
            log.info("run %s: ledger commits with %s", run_id, committer.name)
            tables.commit_run(ledger_path, run_id, committer)
            after = depths_after.result()
            removed = removals_after.result()
    partition_of = {t.key: p for t, p in zip(to_move, assignment, strict=True)}
    shared = {
        route.name for route in config.routes if not route.parks and route.queue_destination.shared
    }
    counters = counters_rows(
        run_id,
        transfers,
        partition_of,
        outcomes,
        after,
        shared_routes=shared,
        removed=removed,
        versions=prepared.rabbitmq_versions,
    )
    verification = verify_on_ledger(spark, ledger_path, run_id, counters)
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
        rabbitmq_versions=prepared.rabbitmq_versions,
    )
    return RunResult(
        run_id=run_id,
        transfers=tuple(transfers),
        partitions=tuple(partition_of.get(t.key, NOT_MOVED_NOW) for t in transfers),
        outcomes=tuple(outcomes),
        verification=verification,
        seconds=seconds,
        rabbitmq_versions=prepared.rabbitmq_versions,
    )


def fresh_transfers(
    to_move: Sequence[QueueTransfer], transfers: Sequence[QueueTransfer]
) -> list[TransferKey]:
    """The transfers this driver moves that no earlier driver of the run planned: the
    run's plan keeps an earlier driver's own row (`record_plan`), not the one just
    discovered."""
    planned = {t.key: t for t in transfers}
    return [t.key for t in to_move if planned.get(t.key) is t]


def verify_on_ledger(
    spark: SparkSession, ledger_path: str, run_id: str, counters: Sequence[Mapping[str, Any]]
) -> Verification:
    """Verify the run; verification.json goes to <ledger>/verification/run_id=<run>.

    On an object store, Great Expectations writes to a local temporary directory and
    verification.json is uploaded (one PUT); its Data Docs are not kept there.
    """
    target = store.root(ledger_path) / "verification" / f"run_id={run_id}"
    if not store.is_object_store(ledger_path):
        return verify_ledger_run(spark, ledger_path, run_id, counters, target)
    with tempfile.TemporaryDirectory(prefix="rmq-spark-verification-") as local:
        verification = verify_ledger_run(spark, ledger_path, run_id, counters, local)
        results = Path(verification.results_path)
        (target / results.name).write_bytes(results.read_bytes())
    return dataclasses.replace(
        verification, results_path=str(target / results.name), data_docs_path=None
    )


def probe_beside(
    spark: SparkSession,
    ledger_path: str,
    pending: Future[PreparedRun],
    check: Callable[[SparkSession, str], None] = check_executors,
) -> PreparedRun:
    """Probe the executors (`check`) while the pre-flight (`pending`, on a thread) still
    waits on the brokers: it needs only Spark and the ledger path, and took 1.1 s after a
    1,000-queue pre-flight. The pre-flight's error comes first when both fail (its
    checks are the cheaper ones to act on); nothing has moved either way.

    A pre-flight that fails while the probe runs cancels the probe's Spark job, so a
    wrong password is told at once, not after the executors' Python workers have
    started (3 s on a fresh local session here, 18 s on a slow CI machine; on a cluster
    still allocating executors, minutes).
    """
    if pending.done() and pending.exception() is not None:
        return pending.result()  # raises: no probe needed
    try:
        with cancelled_if_failed(spark, pending):
            check(spark, ledger_path)
    except Exception:  # the probe's refusal, or its job cancelled by a failed pre-flight
        pending.result()
        raise
    return pending.result()


def spark_task_attempts(spark: SparkSession) -> int:
    """How many times Spark may run a mover task (each attempt may return what it holds)."""
    return task_attempts(
        str(spark.conf.get("spark.master", "local")),
        spark.conf.get("spark.task.maxFailures", None),
    )


def check_delivery_limits(
    transfers: Sequence[QueueTransfer], reconnect_attempts: int, attempts: int
) -> None:
    """Refuse, before anything moves, quorum sources whose delivery limit the movers'
    lost sessions could exceed (`delivery_limit.budget_problem`); one line each."""
    problems: tuple[RmqSparkError, ...] = tuple(
        DeliveryLimitError(
            f"cluster {t.source_cluster} vhost {t.source_vhost!r} queue "
            f"{t.source_queue!r}: {problem}"
        )
        for t in transfers
        if (
            problem := budget_problem(
                t.source_delivery_limit,
                reconnect_attempts=reconnect_attempts,
                task_attempts=attempts,
            )
        )
    )
    if problems:
        lines = "\n  ".join(str(p) for p in problems)
        error = DeliveryLimitError(
            f"pre-flight found {len(problems)} problem(s); nothing was moved:\n  {lines}"
        )
        error.problems = problems
        raise error


def record_plan(
    config: JobConfig, run_id: str, discovered: Sequence[QueueTransfer], now: datetime
) -> list[QueueTransfer]:
    """Append the newly planned transfers to the plans table; return the run's whole plan.

    A re-run of a run id continues it: transfers planned by an earlier driver keep
    their first depths (so verification covers the whole run), even when their source
    is now empty and discovery no longer selects them.
    """
    digest = config.digest()
    found = {t.key: t for t in discovered}
    earlier: dict[TransferKey, QueueTransfer] = {}
    for row in tables.read_rows(config.ledger.path, "plans", run_id):
        if row["config_digest"] != digest:
            raise ConfigError(
                f"run id {run_id} was planned with another config (digest "
                f"{row['config_digest'][:12]}, now {digest[:12]}); resume it with the same "
                "config, or start a new run id"
            )
        # The plans table leaves out what only the movers need (the delivery limit).
        transfer = QueueTransfer(**{f: row[f] for f in _TRANSFER_FIELDS if f in row})
        if transfer.key in found:  # nor the destination's type: as discovery found it now
            transfer = replace(transfer, destination_type=found[transfer.key].destination_type)
        earlier.setdefault(transfer.key, transfer)
    new = [t for t in discovered if t.key not in earlier]
    tables.append_rows(
        config.ledger.path,
        "plans",
        [
            {**_plan_fields(t), "run_id": run_id, "config_digest": digest, "planned_at": now}
            for t in new
        ],
    )
    if earlier:
        log.info(
            "run %s resumed: %d queue(s) planned earlier, %d new",
            run_id,
            len(earlier),
            len(new),
        )
    return [*earlier.values(), *new]


def _plan_fields(transfer: QueueTransfer) -> dict[str, Any]:
    """The transfer's fields as a plans row holds them. Every field is a str, int, bool
    or None, so `dataclasses.asdict`'s deep copy (~0.13 ms a transfer: 1.3 s of a
    10,000-queue pre-flight) would copy nothing more."""
    return {name: getattr(transfer, name) for name in _TRANSFER_FIELDS}


def executor_settings(
    spark: SparkSession, config: JobConfig, run_id: str, ledger_path: str, **own: Any
) -> ExecutorSettings:
    """What every run's movers take from the config (a transfer's, a park's, a redrive's):
    the ledger, the clusters, the window, the mover's limits and Spark's task attempts;
    `own` adds the kind of run's own (rate limits, selections, deciders, park)."""
    return ExecutorSettings(
        run_id=run_id,
        ledger_path=ledger_path,
        ledger_store=(
            store.options_of(config.ledger.path) if config.ledger.on_object_store else None
        ),
        clusters=dict(config.clusters),
        window_messages=config.window.messages,
        window_start_messages=config.window.first_messages,
        window_bytes=config.window.bytes,
        mover=config.mover,
        max_active=config.max_active,
        task_attempts=spark_task_attempts(spark),
        **own,
    )


def move(
    spark: SparkSession,
    plan: Sequence[Sequence[dict[str, object]]],
    config: JobConfig,
    run_id: str,
    nodes: dict[str, dict[str, str]] | None = None,
    *,
    rate_limits: dict[str, Limits] | None = None,
) -> list[MoveOutcome]:
    """Run the movers on the executors, task i on `plan` group i; one outcome per queue.

    `nodes` (cluster -> node -> AMQP URI) lets each mover connect to the node that
    hosts its queues first (rmq_spark.broker.colocation). The settings and the groups
    travel in the tasks' closure (128 KB pickled for 1,000 queues), not in a broadcast.
    """
    settings = executor_settings(
        spark,
        config,
        run_id,
        store.use_ledger(config.ledger),
        node_uris=nodes or {},
        rate_limits=rate_limits or {},
        selections=route_selections(config),
    )
    task = partial(move_partition, groups=plan, settings=settings)
    return [outcome_of(row) for row in run_tasks(spark, len(plan), task, OUTCOME_SCHEMA)]


def record_brakes(config: JobConfig, run_id: str, outcomes: Sequence[MoveOutcome]) -> None:
    """For the report: the limits in force and how long each limited transfer was
    held back (ledger/brakes.py); nothing when the config sets no limit."""
    in_force = limits_in_force(config)
    if not in_force:
        return
    held = tuple(
        HeldBack(
            key=o.key,
            limits=describe_limits(o.rate_limits),
            held_seconds=round(o.rate_held_seconds, 3),
            depth_held_seconds=round(o.depth_held_seconds, 3),
        )
        for o in outcomes
        if o.rate_limits is not None
    )
    write_brakes(config.ledger.path, run_id, BrakeRecord(in_force, held))


def counters_rows(
    run_id: str,
    transfers: Sequence[QueueTransfer],
    partition_of: Mapping[TransferKey, int],
    outcomes: Sequence[MoveOutcome],
    after: dict[QueueTransfer, tuple[int, int]],
    *,
    shared_routes: Collection[str] = (),
    removed: Mapping[TransferKey, int | None] | None = None,
    versions: Mapping[str, str] | None = None,
) -> list[dict[str, object]]:
    """Broker counters before/after and the outcome, per transfer (_COUNTERS_SCHEMA).

    A transfer an earlier driver of this run planned and this one did not move (its
    source was drained by then) is "moved": verification checks that from the ledger.
    The queues table's ledger columns (rows, duplicates, lost, unexpected) are added
    from the verification.
    """
    by_key = {outcome.key: outcome for outcome in outcomes}
    rows = []
    for transfer in transfers:
        key = transfer.key
        outcome = by_key.get(key)
        if key not in partition_of:
            status, error = "moved", None
        elif outcome is None:
            status, error = "failed", "no outcome from the executor"
        else:
            status, error = outcome.status, outcome.error
        rows.append(
            {
                "run_id": run_id,
                "source_cluster": transfer.source_cluster,
                "source_vhost": transfer.source_vhost,
                "source_queue": transfer.source_queue,
                "destination_cluster": transfer.destination_cluster,
                "destination_vhost": transfer.destination_vhost,
                "destination_queue": transfer.destination_queue,
                "partition": partition_of.get(key, NOT_MOVED_NOW),
                "status": status,
                "error": error,
                "source_depth_before": transfer.messages,
                "source_depth_after": after[transfer][0],
                "destination_depth_before": transfer.destination_messages,
                "destination_depth_after": after[transfer][1],
                DESTINATION_SHARED: transfer.route in shared_routes,
                SOURCE_REMOVED: (removed or {}).get(key),
                "reordered_by_priority": reordered_by_priority(transfer, outcome, versions or {}),
                FENCES: outcome.fences if outcome is not None else 0,
            }
        )
    return rows


def reordered_by_priority(
    transfer: QueueTransfer, outcome: MoveOutcome | None, versions: Mapping[str, str]
) -> int | None:
    """Of the transfer's moved messages, those its destination delivers by priority
    (`queue_arguments.delivers_by_priority`); None when that is not known."""
    version = versions.get(transfer.destination_cluster, "")
    reorders = delivers_by_priority(transfer.destination_type, version)
    if outcome is None or reorders is None:
        return None
    return outcome.priority_messages if reorders else 0


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
    rabbitmq_versions: Mapping[str, str] | None = None,
) -> None:
    """Append the run's queues rows (with verification figures) and its runs row."""
    verdicts = {v.key: v for v in verification.queues}
    queue_rows = []
    for row in counters:
        verdict = verdicts[TransferKey.of(row)]
        queue_rows.append(
            {
                **row,
                "ledger_rows": verdict.ledger_rows,
                "duplicates": verdict.duplicates,
                "lost": verdict.lost,
                "unexpected": verdict.unexpected,
            }
        )
    committer = committer_for(spark)
    tables.append_rows(config.ledger.path, "queues", queue_rows, committer)
    tables.append_rows(
        config.ledger.path,
        "runs",
        [
            {
                "run_id": run_id,
                "started_at": started_at,
                "finished_at": finished_at,
                "config_digest": config.digest(),
                "spark_app_id": spark.conf.get("spark.app.id", None),
                "queues": len(counters),
                "messages": verification.messages,
                "bytes": verification.bytes,
                "lost": verification.lost,
                "duplicates": verification.duplicates,
                "unexpected": verification.unexpected,
                "verified": verification.verified,
                "seconds": seconds,
                "verification_path": verification.results_path,
                "rabbitmq_versions": json.dumps(dict(rabbitmq_versions or {}), sort_keys=True),
            }
        ],
        committer,
    )
