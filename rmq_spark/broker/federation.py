"""Federation-safe drain: pause the federation of the queues being moved while moving.

Why: a federated queue's link pulls messages from its upstream as soon as the
downstream queue has a consumer, and the movers are consumers. Draining a DR
cluster's orphans would pull fresh messages from the upstream cluster into the very
queues being drained. With `federation: pause`, the links of the moved queues that
are under a federation policy are stopped before the movers start and run again when
they are done, also after a failure.

How (`federation_plan.py`): a temporary policy of higher priority matching exactly
those queues, the original's definition without its federation keys, whatever the
original selects (an upstream, a named set, `all`); exchanges and other queues
matched by the original keep it. The state lives in RabbitMQ itself: the overrides
are recognised by name (`rmq-spark-paused-<n>--<policy>`), the original policies are
never changed, so a restore (`rmq-spark restore-federation`, or any run's end) only
deletes the overrides, and a re-run puts them again for the queues it moves.
Upstreams cloned by earlier builds (`federation_clones.py`) are restored too.

`pause`, `restore` and `paused_federation` run the plan through the management API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from rmq_spark.broker.federation_clones import restore_clones
from rmq_spark.broker.federation_guard import consuming_movers, lingering_consumers
from rmq_spark.broker.federation_links import LINK_STOP_TIMEOUT_SECONDS, wait_for_links_to_stop
from rmq_spark.broker.federation_plan import (
    PLACEHOLDER_UPSTREAM,
    Override,
    PausePlan,
    Policy,
    overridden_policy,
    pause_plan,
    restore_plan,
)
from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import JobConfig
from rmq_spark.errors import FederationError, RmqSparkError
from rmq_spark.model import QueueTransfer

log = logging.getLogger(__name__)


def source_clusters(config: JobConfig) -> list[str]:
    """The clusters the routes drain, in config order: the ones whose federation pauses."""
    return list(dict.fromkeys(route.source.cluster for route in config.routes))


def plan_for(client: ManagementClient, queues: Iterable[tuple[str, str]]) -> PausePlan:
    """What pausing these (vhost, queue) of the cluster takes; reads, changes nothing."""
    wanted = sorted(set(queues))
    listed: dict[tuple[str, str], str | None] = {}
    for vhost in sorted({v for v, _ in wanted}):
        names = {q for v, q in wanted if v == vhost}
        for row in client.queues(vhost, columns="name,policy"):
            if row.get("name") in names:
                listed[(vhost, str(row["name"]))] = row.get("policy") or None
    plan = pause_plan(listed, [Policy.from_row(row) for row in client.policies()])
    return _with_placeholder_check(client, plan)


def _with_placeholder_check(client: ManagementClient, plan: PausePlan) -> PausePlan:
    """An upstream named like the placeholder would be federated with: refuse then."""
    if not any(
        o.definition.get("federation-upstream") == PLACEHOLDER_UPSTREAM for o in plan.overrides
    ):
        return plan
    taken = {
        str(row.get("vhost"))
        for row in client.parameters("federation-upstream")
        if row.get("name") == PLACEHOLDER_UPSTREAM
    }
    clashes = tuple(
        f"vhost {o.vhost!r}: an upstream is named {PLACEHOLDER_UPSTREAM!r}, which the "
        f"override of policy {o.original!r} names as the upstream no one defines"
        for o in plan.overrides
        if o.vhost in taken and o.definition.get("federation-upstream") == PLACEHOLDER_UPSTREAM
    )
    return PausePlan(plan.overrides, plan.stale, plan.problems + clashes)


def pause(
    client: ManagementClient,
    queues: Iterable[tuple[str, str]],
    *,
    link_timeout: float = LINK_STOP_TIMEOUT_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[tuple[str, str]]:
    """Pause the federation of these (vhost, queue); return those that were federated.

    Refuses (changing nothing) when a queue cannot be paused. Returns once no
    federation link of a paused queue is left.
    """
    cluster = client.cluster_name
    plan = plan_for(client, queues)
    if plan.problems:
        lines = "\n  ".join(f"cluster {cluster} {problem}" for problem in plan.problems)
        raise FederationError(
            "federation: pause cannot pause these queues; nothing was changed or moved "
            f"(or set federation: keep):\n  {lines}"
        )
    for override in plan.overrides:
        _call(client, "pause", override.vhost, override.name, override)
        log.info(
            "cluster %s vhost %r: federation of %d queue(s) under policy %r paused: %s",
            cluster,
            override.vhost,
            len(override.queues),
            override.original,
            override.describe(),
        )
    for vhost, name in plan.stale:
        _call(client, "pause", vhost, name, None)
    paused = plan.paused_queues()
    wait_for_links_to_stop(client, paused, link_timeout, sleep=sleep, clock=clock)
    return paused


def restore(client: ManagementClient) -> list[tuple[str, str]]:
    """Undo every pause on the cluster: (vhost, what was restored) of each."""
    restored: list[tuple[str, str]] = []
    for override in restore_plan(Policy.from_row(row) for row in client.policies()):
        _call(client, "restore", override.vhost, override.name, None)
        original = overridden_policy(override.name)
        restored.append(
            (
                override.vhost,
                f"federation of policy {original!r} (override {override.name!r} deleted)",
            )
        )
    restored.extend(
        (vhost, f"federation upstream {name!r}") for vhost, name in restore_clones(client)
    )
    for vhost, what in restored:
        log.info("cluster %s vhost %r: %s restored", client.cluster_name, vhost, what)
    return restored


def restore_federation(
    config: JobConfig,
    clients: Mapping[str, ManagementClient],
    *,
    unless_consuming: bool = False,
) -> list[tuple[str, str, str]]:
    """Undo every pause on every source cluster: (cluster, vhost, what) of each.

    `unless_consuming` (`restore-federation`, after a crash): refuse, restoring
    nothing, while a mover still consumes on a source cluster (a run still moving, or
    the processes of a killed one not gone yet), or a paused queue still counts a
    consumer whose connection is gone (`federation_guard.py`): its queues' links
    would pull into the queues it drains. Tries every cluster even when one fails, then raises one
    error naming each failure.
    """
    if unless_consuming:
        open_movers = [
            f"cluster {cluster}: {name}"
            for cluster in source_clusters(config)
            for name in [
                *consuming_movers(clients[cluster]),
                *lingering_consumers(
                    clients[cluster],
                    config.clusters[cluster],
                    restore_plan(Policy.from_row(row) for row in clients[cluster].policies()),
                ),
            ]
        ]
        if open_movers:
            lines = "\n  ".join(open_movers)
            raise FederationError(
                "not restoring federation: rmq-spark movers still consume on the source "
                "cluster(s), and the links would pull into the queues they drain; nothing "
                "was changed. Wait until their run ends, or, for a killed run, until the "
                "broker closes its connections (at once, or after the heartbeat timeout), "
                f"then run this again:\n  {lines}"
            )
    restored: list[tuple[str, str, str]] = []
    problems: list[RmqSparkError] = []
    for cluster in source_clusters(config):
        try:
            restored.extend((cluster, vhost, what) for vhost, what in restore(clients[cluster]))
        except RmqSparkError as exc:
            problems.append(exc)
    if problems:
        lines = "\n  ".join(str(p) for p in problems)
        error = FederationError(
            "could not restore federation; the pause stays as policies named "
            "rmq-spark-paused-<n>--<policy>: run `rmq-spark restore-federation --config FILE` "
            f"once this is fixed:\n  {lines}"
        )
        error.problems = tuple(problems)
        raise error from problems[0]
    return restored


def pause_preview(
    config: JobConfig,
    clients: Mapping[str, ManagementClient],
    transfers: Sequence[QueueTransfer],
) -> dict[tuple[str, str, str], Override]:
    """(cluster, vhost, queue) -> the override a run would put (the dry run's view)."""
    if config.federation != "pause":
        return {}
    preview: dict[tuple[str, str, str], Override] = {}
    for cluster in source_clusters(config):
        queues = [
            (t.source_vhost, t.source_queue) for t in transfers if t.source_cluster == cluster
        ]
        if queues:
            for override in plan_for(clients[cluster], queues).overrides:
                preview.update({(cluster, override.vhost, q): override for q in override.queues})
    return preview


@contextmanager
def paused_federation(
    config: JobConfig,
    clients: Mapping[str, ManagementClient],
    transfers: Sequence[QueueTransfer],
) -> Iterator[list[tuple[str, str, str]]]:
    """With `federation: pause`, the moved queues' federation is paused inside the block.

    Yields (cluster, vhost, queue) of the paused queues (nothing with `keep`).
    Restores on the way out, also when the block or the pausing itself failed.
    When restoring fails after the block failed, the error names both.

    >>> with paused_federation(config, clients, to_move):  # doctest: +SKIP
    ...     outcomes = move(spark, plan, config, run_id)
    """
    if config.federation != "pause":
        yield []
        return
    paused: list[tuple[str, str, str]] = []
    try:
        for cluster in source_clusters(config):
            queues = [
                (t.source_vhost, t.source_queue) for t in transfers if t.source_cluster == cluster
            ]
            paused.extend((cluster, vhost, q) for vhost, q in pause(clients[cluster], queues))
        log.info("federation: %d federated queue(s) paused while moving", len(paused))
        yield paused
    except Exception as exc:
        try:
            restore_federation(config, clients)
        except RmqSparkError as restore_error:
            raise FederationError(f"{restore_error}\n  (the run had failed first: {exc})") from exc
        raise
    except BaseException:
        # Interrupted (Ctrl-C, SystemExit): restore, but let the interruption win.
        try:
            restore_federation(config, clients)
        except RmqSparkError as restore_error:
            log.error("%s", restore_error)
        raise
    restored = restore_federation(config, clients)
    log.info("federation: %d pause(s) undone", len(restored))


def _call(
    client: ManagementClient, doing: str, vhost: str, name: str, override: Override | None
) -> None:
    """PUT the override (or DELETE the policy `name` when None)."""
    try:
        if override is None:
            client.delete_policy(vhost, name)
        else:
            client.put_policy(
                vhost,
                name,
                pattern=override.pattern,
                apply_to="queues",
                priority=override.priority,
                definition=override.definition,
            )
    except RmqSparkError as exc:
        verb = "delete" if override is None else "define"
        raise FederationError(
            f"cluster {client.cluster_name} vhost {vhost!r}: could not {verb} policy {name!r} "
            f"to {doing} federation ({exc})"
        ) from exc
