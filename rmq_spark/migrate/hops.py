"""The three hops of a migration batch, each a ledgered, verified `run_transfer` run,
and the phases between them in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.sql import SparkSession

from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import (
    DestinationSpec,
    JobConfig,
    RouteConfig,
    SourceSelector,
)
from rmq_spark.errors import MigrationError
from rmq_spark.ledger import tables
from rmq_spark.migrate.phases import cleanup, hold, prepare, rebind, recreate
from rmq_spark.migrate.selection import QueueMigration
from rmq_spark.pipeline import RunResult, run_transfer

log = logging.getLogger(__name__)

# The run id suffix of each hop's transfer run.
HOP_OUT, HOP_BACK, HOP_HELD = "out", "back", "held"
PhaseHook = Callable[[str], None]


def run_batch(
    spark: SparkSession,
    config: JobConfig,
    client: ManagementClient,
    *,
    cluster: str,
    mid: str,
    batch: list[QueueMigration],
    after_phase: PhaseHook | None,
) -> list[RunResult]:
    log.info("migration %s: %d queue(s)", mid, len(batch))
    hook = after_phase or (lambda _phase: None)
    runs: list[RunResult] = []

    def hop(name: str, pairs: list[tuple[str, str, str]]) -> None:
        result = _hop(
            spark, config, cluster, f"{mid}-{name}", pairs, live_destination=name == HOP_HELD
        )
        if result is not None:
            runs.append(result)

    for plan in batch:
        prepare(client, plan)
    hook("prepare")
    for plan in batch:
        hold(client, plan)
    hook("hold")
    hop(HOP_OUT, [(p.vhost, p.queue, p.temp) for p in batch])
    hook("move-out")
    for plan in batch:
        recreate(config, client, cluster, plan)
    hook("recreate")
    hop(HOP_BACK, [(p.vhost, p.temp, p.queue) for p in batch])
    hook("move-back")
    for plan in batch:
        rebind(client, plan)
    hook("rebind")
    hop(HOP_HELD, [(p.vhost, p.holding, p.queue) for p in batch])
    hook("drain-holding")
    for plan in batch:
        cleanup(config, client, cluster, plan)
    hook("cleanup")
    return runs


def _hop(
    spark: SparkSession,
    config: JobConfig,
    cluster: str,
    run_id: str,
    pairs: list[tuple[str, str, str]],
    *,
    live_destination: bool = False,
) -> RunResult | None:
    """One ledgered, verified transfer run for every (vhost, source, destination) pair.

    Skipped when the ledger records the run as verified; a crashed run is resumed by
    running the same run id again (the same routes, so the same config digest). A hop
    into the live queues (`live_destination`) declares them shared: publishers' messages
    arriving during the hop are counted as live arrivals, every other check holds.
    """
    done = [row for row in tables.read_rows(config.ledger.path, "runs", run_id) if row["verified"]]
    if done:
        log.info("run %s: already verified; not run again", run_id)
        return None
    routes = [
        RouteConfig(
            name=f"{run_id}-{index:05d}",
            source=SourceSelector(
                cluster=cluster,
                vhosts=[vhost],
                queues=[source],
                queue_types=["classic", "quorum"],
                min_messages=0,
            ),
            destination=DestinationSpec(
                cluster=cluster,
                queue=_literal(destination),
                create_missing=False,
                queue_type="quorum",
                priorities="drop",
                shared=live_destination,
            ),
        )
        for index, (vhost, source, destination) in enumerate(pairs)
    ]
    hop_config = config.model_copy(update={"routes": routes, "federation": "keep"})
    result = run_transfer(spark, hop_config, run_id=run_id)
    if result.verification.live_arrivals:
        log.info(
            "run %s: %d message(s) from live publishers reached the final queues during "
            "the hop (counted by verification as live arrivals)",
            run_id,
            result.verification.live_arrivals,
        )
    if not result.verification.verified:
        failed = "; ".join(result.verification.failed_expectations[:5])
        raise MigrationError(
            f"run {run_id}: verification failed ({failed}); nothing more was changed, see "
            f"{result.verification.results_path}"
        )
    return result


def _literal(name: str) -> str:
    """A queue name as a destination template (braces escaped)."""
    return name.replace("{", "{{").replace("}", "}}")
