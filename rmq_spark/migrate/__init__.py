"""Classic → quorum queue migration in place, each hop a ledgered, verified transfer.

A queue cannot change its type, so a classic queue `Q` becomes a quorum queue of the
same name by moving its messages out and back:

    prepare   declare the temporary quorum queue T = `rmq-spark-migrating--Q`, whose
              `x-rmq-spark-migration` argument is the saved state (migration id, Q's
              durability, arguments, translated arguments and bindings), and the holding
              quorum queue H = `rmq-spark-holding--Q`
    hold      bind H with Q's bindings, then unbind Q: publishes through Q's exchanges
              land in H from now on, and Q only drains
    move-out  Q → T, a run_transfer run `<id>-out` (ledgered, verified)
    recreate  delete Q (only when empty), declare Q as a quorum queue with the
              translated arguments, unbound
    move-back T → Q, run `<id>-back`
    rebind    bind Q with the saved bindings, then unbind H: publishes reach Q again
    drain-holding  H → Q, run `<id>-held` (what was published during the swap)
    cleanup   delete H and T, each only when empty (T last: it holds the state)

State lives in RabbitMQ (T's marker argument, which queues exist and of which type)
and in the ledger (a hop whose run is recorded verified is not run again), so a re-run
after a crash in any phase finishes the migration: each phase checks what is already
done. Queues selected together share one migration id and run each hop as one Spark
job. `translate_arguments` and the selection are pure; the rest calls the management
API and `pipeline.run_transfer`.

Modules: `arguments` (the argument translation, pure), `selection` (which queues, the
saved state, pre-flight), `phases` (the broker-side steps), `hops` (one batch in phase
order, each hop a transfer run), `prove` (the ledger's proof). This module keeps the
public API: `migrate`, `MigrationOptions`, `MigrationResult`, and every name the CLI, jobs
and tests import from `rmq_spark.migrate` (re-exported).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from rmq_spark.broker.management import management_clients
from rmq_spark.config import JobConfig, validate_run_id
from rmq_spark.errors import MigrationError
from rmq_spark.ledger import store, tables
from rmq_spark.migrate.arguments import ArgumentDecision, MigrationOptions, translate_arguments
from rmq_spark.migrate.hops import HOP_BACK, HOP_HELD, HOP_OUT, PhaseHook, run_batch
from rmq_spark.migrate.phases import wait_for_no_consumers
from rmq_spark.migrate.prove import QueueOutcome, prove
from rmq_spark.migrate.selection import (
    HOLD_PREFIX,
    MARKER_ARGUMENT,
    TEMP_PREFIX,
    QueueMigration,
    join_check,
    migration_cluster,
    new_migration_id,
    plan_migration,
    raise_problems,
)
from rmq_spark.pipeline import RunResult, rabbitmq_versions

log = logging.getLogger(__name__)

PHASES = (
    "prepare",
    "hold",
    "move-out",
    "recreate",
    "move-back",
    "rebind",
    "drain-holding",
    "cleanup",
)


@dataclass(frozen=True)
class MigrationResult:
    queues: tuple[QueueOutcome, ...]
    runs: tuple[RunResult, ...]
    seconds: float
    # drain-holding runs into the final queues while publishers use them: how many of
    # the publishers' messages arrived during the hop (run id -> live arrivals)
    live_publishes: dict[str, int] = field(default_factory=dict)
    #: cluster name -> the RabbitMQ version its management API reports (as for a
    #: transfer run); a re-run that runs no hop still names it.
    rabbitmq_versions: dict[str, str] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return all(q.verified for q in self.queues) and all(
            r.verification.verified for r in self.runs
        )


def migrate(
    spark: SparkSession,
    config: JobConfig,
    *,
    options: MigrationOptions | None = None,
    migration_id: str | None = None,
    after_phase: PhaseHook | None = None,
) -> MigrationResult:
    """Migrate every selected classic queue in place and finish any migration in progress.

    `after_phase` is called with each phase's name once it is done (tests stop the
    procedure there to simulate a crash). Raises MigrationError (pre-flight, a failed
    phase) or another RmqSparkError.
    """
    options = options or MigrationOptions()
    started = time.monotonic()
    cluster = migration_cluster(config)
    mid = validate_run_id(migration_id or new_migration_id())
    store.use_ledger(config.ledger)
    tables.ensure_tables(config.ledger.path)
    with management_clients(config) as clients:
        client = clients[cluster]
        versions = rabbitmq_versions({cluster: client})
        plans = plan_migration(config, client, options, mid, rabbitmq_version=versions[cluster])
        raise_problems(plans)
        join_check(config, plans, mid)
        log_decisions(client.cluster_name, versions[cluster], plans)
        if options.consumers == "wait":
            wait_for_no_consumers(client, [p for p in plans if p.state == "new"], options)
        batches: dict[str, list[QueueMigration]] = defaultdict(list)
        for plan in plans:
            batches[plan.migration_id].append(plan)
        runs: list[RunResult] = []
        for batch_id, batch in sorted(batches.items()):
            batch.sort(key=lambda p: (p.vhost, p.queue))
            runs.extend(
                run_batch(
                    spark,
                    config,
                    client,
                    cluster=cluster,
                    mid=batch_id,
                    batch=batch,
                    after_phase=after_phase,
                )
            )
    outcomes = prove(config.ledger.path, plans)
    live = {r.run_id: r.verification.live_arrivals for r in runs if r.verification.live_arrivals}
    result = MigrationResult(
        tuple(outcomes), tuple(runs), time.monotonic() - started, live, versions
    )
    log.info(
        "migration: %d queue(s) in %.1f s, verified %s",
        len(outcomes),
        result.seconds,
        result.verified,
    )
    return result


def log_decisions(cluster: str, version: str, plans: Iterable[QueueMigration]) -> None:
    """One line per argument the quorum queue will not carry as it is, saying why."""
    for plan in plans:
        for decision in plan.decisions:
            if decision.action in ("dropped", "translated", "added"):
                log.info(
                    "cluster %s (RabbitMQ %s) %s: argument %s",
                    cluster,
                    version,
                    plan.where,
                    decision.describe(),
                )


__all__ = [
    "HOLD_PREFIX",
    "HOP_BACK",
    "HOP_HELD",
    "HOP_OUT",
    "MARKER_ARGUMENT",
    "PHASES",
    "TEMP_PREFIX",
    "ArgumentDecision",
    "MigrationError",
    "MigrationOptions",
    "MigrationResult",
    "PhaseHook",
    "QueueMigration",
    "QueueOutcome",
    "log_decisions",
    "migrate",
    "migration_cluster",
    "new_migration_id",
    "plan_migration",
    "prove",
    "raise_problems",
    "translate_arguments",
]
