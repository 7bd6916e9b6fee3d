"""The broker-side phases of a migration: prepare, hold, recreate, rebind, cleanup.

Each is idempotent: it checks what is already done, so a re-run after a crash
finishes the phase.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from rmq_spark.broker.counts import queue_depths, queue_is_empty
from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import (
    JobConfig,
)
from rmq_spark.errors import MigrationError
from rmq_spark.migrate.arguments import MigrationOptions
from rmq_spark.migrate.selection import MARKER_ARGUMENT, QueueMigration

log = logging.getLogger(__name__)

_CONSUMER_POLL_SECONDS = 1.0


def wait_for_no_consumers(
    client: ManagementClient, plans: list[QueueMigration], options: MigrationOptions
) -> None:
    deadline = time.monotonic() + options.consumer_wait_seconds
    for plan in plans:
        while True:
            queue = client.queue(plan.vhost, plan.queue) or {}
            consumers = int(queue.get("consumers") or 0)
            if not consumers:
                break
            if time.monotonic() > deadline:
                raise MigrationError(
                    f"cluster {client.cluster_name} {plan.where}: still {consumers} consumer(s) "
                    f"after {options.consumer_wait_seconds:.0f} s (--consumers wait)"
                )
            time.sleep(_CONSUMER_POLL_SECONDS)


def _queue_type(queue: Mapping[str, Any] | None) -> str | None:
    return None if queue is None else str(queue.get("type") or "classic")


def prepare(client: ManagementClient, plan: QueueMigration) -> None:
    """T with the saved state, and H, both quorum; idempotent (T's marker is kept)."""
    temp = client.queue(plan.vhost, plan.temp)
    if temp is None:
        if _queue_type(client.queue(plan.vhost, plan.queue)) != "classic":
            raise MigrationError(
                f"cluster {client.cluster_name} {plan.where}: expected the classic queue to "
                "start a migration; it is gone or changed type"
            )
        client.declare_queue(
            plan.vhost, plan.temp, durable=True, arguments=_helper_arguments(plan, marker=True)
        )
        log.info("%s: temporary queue %r declared", plan.where, plan.temp)
    if _queue_type(client.queue(plan.vhost, plan.queue)) == "classic":
        client.declare_queue(
            plan.vhost, plan.holding, durable=True, arguments=_helper_arguments(plan, marker=False)
        )


def _helper_arguments(plan: QueueMigration, *, marker: bool) -> dict[str, Any]:
    """Quorum, with the replica count, and no limit, TTL or dead-lettering of its own."""
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    size = plan.quorum_arguments.get("x-quorum-initial-group-size")
    if size is not None:
        arguments["x-quorum-initial-group-size"] = size
    if marker:
        arguments[MARKER_ARGUMENT] = plan.marker()
    return arguments


def hold(client: ManagementClient, plan: QueueMigration) -> None:
    """While Q is classic: H takes Q's bindings (bound first, so nothing is unroutable)."""
    if _queue_type(client.queue(plan.vhost, plan.queue)) != "classic":
        return
    saved = {_binding_key(b) for b in plan.bindings}
    added = [
        b for b in client.queue_bindings(plan.vhost, plan.queue) if _binding_key(b) not in saved
    ]
    if added:
        # Unbinding them would lose them: the saved state is what gets restored.
        names = ", ".join(f"{b['source']!r} key {b.get('routing_key', '')!r}" for b in added[:5])
        raise MigrationError(
            f"cluster {client.cluster_name} {plan.where}: bound since its migration "
            f"started (from {names}); remove the new binding(s), re-run, and add them to "
            "the quorum queue afterwards"
        )
    for binding in plan.bindings:
        client.bind_queue(
            plan.vhost,
            binding["source"],
            plan.holding,
            binding["routing_key"],
            binding["arguments"],
        )
    for binding in client.queue_bindings(plan.vhost, plan.queue):
        client.unbind_queue(plan.vhost, binding["source"], plan.queue, binding["properties_key"])


def _binding_key(binding: Mapping[str, Any]) -> tuple[str, str, str]:
    return (
        str(binding["source"]),
        str(binding.get("routing_key", "")),
        json.dumps(binding.get("arguments") or {}, sort_keys=True),
    )


def recreate(
    config: JobConfig, client: ManagementClient, cluster: str, plan: QueueMigration
) -> None:
    """Delete the (drained) classic Q and declare it again as a quorum queue, unbound."""
    queue = client.queue(plan.vhost, plan.queue)
    if _queue_type(queue) == "classic":
        left = queue_depths(cluster, config.clusters[cluster], plan.vhost, [plan.queue])
        if left.get(plan.queue):
            raise MigrationError(
                f"cluster {cluster} {plan.where}: {left[plan.queue]} message(s) reached the "
                "classic queue after its move out (a publisher using the default exchange "
                "with the queue's name?); stop it, move them into "
                f"{plan.temp!r} (rmq-spark transfer), then re-run"
            )
        client.delete_queue(plan.vhost, plan.queue, if_empty=True)
        log.info("%s: classic queue deleted", plan.where)
        queue = None
    if queue is None:
        client.declare_queue(plan.vhost, plan.queue, durable=True, arguments=plan.quorum_arguments)
        log.info("%s: declared as a quorum queue %s", plan.where, plan.quorum_arguments)


def rebind(client: ManagementClient, plan: QueueMigration) -> None:
    """Q takes the saved bindings back (bound first), then H lets go of them."""
    for binding in plan.bindings:
        client.bind_queue(
            plan.vhost, binding["source"], plan.queue, binding["routing_key"], binding["arguments"]
        )
    if client.queue(plan.vhost, plan.holding) is not None:
        for binding in client.queue_bindings(plan.vhost, plan.holding):
            client.unbind_queue(
                plan.vhost, binding["source"], plan.holding, binding["properties_key"]
            )


def cleanup(
    config: JobConfig, client: ManagementClient, cluster: str, plan: QueueMigration
) -> None:
    """Delete H, then T (the saved state) last; each only when exactly empty and unbound."""
    for helper in (plan.holding, plan.temp):
        if client.queue(plan.vhost, helper) is None:
            continue
        left = queue_depths(cluster, config.clusters[cluster], plan.vhost, [helper]).get(helper)
        if client.queue_bindings(plan.vhost, helper):
            raise MigrationError(
                f"cluster {cluster} {plan.where}: helper queue {helper!r} is still bound; "
                "re-run to finish the rebind"
            )
        # The count alone is not proof: a busy quorum leader is counted as empty.
        if left or not queue_is_empty(cluster, config.clusters[cluster], plan.vhost, helper):
            raise MigrationError(
                f"cluster {cluster} {plan.where}: helper queue {helper!r} still holds "
                f"{left or 'at least 1'} message(s); re-run to move them"
            )
        # Quorum queues refuse queue.delete with if-empty, hence the get just before;
        # no binding routes to a helper queue any more, so it stays empty.
        client.delete_queue(plan.vhost, helper, if_empty=False)
    log.info("%s: migrated", plan.where)
