"""Driver side: find the queues each route moves, and check their destinations.

Queue lists come from the management API; the depths a transfer is proven against
come from AMQP (exact, not sampled). Pre-flight problems are collected for the
whole plan and raised as one error before anything moves.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rmq_spark.amqp import queue_depths
from rmq_spark.config import JobConfig, RouteConfig
from rmq_spark.errors import DestinationIncompatibleError, DiscoveryError, RmqSparkError
from rmq_spark.management import ManagementClient

log = logging.getLogger(__name__)

# Queue arguments a destination created by rmq-spark inherits from its source.
_INHERITED_ARGUMENTS = ("x-queue-type", "x-max-priority", "x-queue-mode", "x-message-ttl")


@dataclass(frozen=True)
class QueueTransfer:
    """One row of the plan: a source queue and where its messages go."""

    route: str
    source_cluster: str
    source_vhost: str
    source_queue: str
    source_type: str
    source_node: str
    destination_cluster: str
    destination_vhost: str
    destination_queue: str
    messages: int  # exact ready count at plan time
    message_bytes: int  # sampled by the management API; planning only
    destination_messages: int  # exact ready count at plan time

    def describe(self) -> str:
        return (
            f"{self.source_cluster}/{self.source_vhost}/{self.source_queue} -> "
            f"{self.destination_cluster}/{self.destination_vhost}/{self.destination_queue}"
        )

    @property
    def average_message_bytes(self) -> float:
        return self.message_bytes / self.messages if self.messages else 0.0


def discover(config: JobConfig, clients: Mapping[str, ManagementClient]) -> list[QueueTransfer]:
    """Every queue transfer of every route, with destinations checked and exact depths."""
    candidates: list[tuple[QueueTransfer, dict[str, Any]]] = []
    for route in config.routes:
        candidates.extend(_route_candidates(route, clients[route.source.cluster]))
    _reject_loops_and_overlaps([c for c, _ in candidates])
    _prepare_destinations(config, clients, candidates)
    transfers = _with_exact_depths(config, [c for c, _ in candidates])
    selected = [t for t in transfers if t.messages >= _route(config, t.route).source.min_messages]
    log.info("discovered %d queue transfers (%d selected)", len(transfers), len(selected))
    return selected


def _route(config: JobConfig, name: str) -> RouteConfig:
    return next(route for route in config.routes if route.name == name)


def _route_candidates(
    route: RouteConfig, client: ManagementClient
) -> list[tuple[QueueTransfer, dict[str, Any]]]:
    selector = route.source
    vhosts = client.vhosts() if "*" in selector.vhosts else selector.vhosts
    queue_pattern = re.compile(selector.queue_pattern)
    policy_pattern = re.compile(selector.policy_pattern) if selector.policy_pattern else None
    result = []
    for vhost in vhosts:
        for queue in client.queues(vhost):
            name = queue["name"]
            queue_type = queue.get("type") or "classic"
            if not queue_pattern.fullmatch(name) or queue_type not in selector.queue_types:
                continue
            if policy_pattern and not policy_pattern.fullmatch(queue.get("policy") or ""):
                continue
            if queue.get("exclusive"):
                continue  # owned by another connection: we could not consume it anyway
            destination = route.destination
            transfer = QueueTransfer(
                route=route.name,
                source_cluster=selector.cluster,
                source_vhost=vhost,
                source_queue=name,
                source_type=queue_type,
                source_node=queue.get("node") or "",
                destination_cluster=destination.cluster,
                destination_vhost=destination.vhost.format(vhost=vhost, queue=name),
                destination_queue=destination.queue.format(vhost=vhost, queue=name),
                messages=int(queue.get("messages_ready") or 0),
                message_bytes=int(queue.get("message_bytes_ready") or 0),
                destination_messages=0,
            )
            result.append((transfer, queue))
    return result


def _reject_loops_and_overlaps(transfers: list[QueueTransfer]) -> None:
    problems = []
    sources: dict[tuple[str, str, str], str] = {}
    for t in transfers:
        source = (t.source_cluster, t.source_vhost, t.source_queue)
        if source == (t.destination_cluster, t.destination_vhost, t.destination_queue):
            problems.append(f"route {t.route}: {t.describe()} moves a queue onto itself")
        if source in sources:
            problems.append(
                f"routes {sources[source]} and {t.route} both select "
                f"{t.source_cluster}/{t.source_vhost}/{t.source_queue}"
            )
        sources[source] = t.route
    if problems:
        raise DiscoveryError("the plan is inconsistent:\n  " + "\n  ".join(problems))


def _prepare_destinations(
    config: JobConfig,
    clients: Mapping[str, ManagementClient],
    candidates: list[tuple[QueueTransfer, dict[str, Any]]],
) -> None:
    """Every destination queue must exist, or be created when the route allows it."""
    problems: list[str] = []
    for transfer, source_queue in candidates:
        client = clients[transfer.destination_cluster]
        where = (
            f"cluster {transfer.destination_cluster} vhost {transfer.destination_vhost!r} "
            f"queue {transfer.destination_queue!r}"
        )
        try:
            if not client.vhost_exists(transfer.destination_vhost):
                problems.append(f"{where}: the destination vhost does not exist")
                continue
            existing = client.queue(transfer.destination_vhost, transfer.destination_queue)
            if existing is None:
                if not _route(config, transfer.route).destination.create_missing:
                    problems.append(
                        f"{where}: missing, and create_missing is false for route {transfer.route}"
                    )
                    continue
                arguments = {
                    k: v
                    for k, v in (source_queue.get("arguments") or {}).items()
                    if k in _INHERITED_ARGUMENTS
                }
                arguments.setdefault("x-queue-type", transfer.source_type)
                client.declare_queue(
                    transfer.destination_vhost,
                    transfer.destination_queue,
                    durable=bool(source_queue.get("durable", True)),
                    arguments=arguments,
                )
                log.info("%s: created (%s)", where, arguments)
            elif existing.get("exclusive"):
                problems.append(
                    f"{where}: exclusive to another connection, cannot publish reliably"
                )
        except RmqSparkError as exc:
            problems.append(str(exc))
    if problems:
        raise DestinationIncompatibleError(
            "destination pre-flight failed; nothing was moved:\n  " + "\n  ".join(problems)
        )


def _with_exact_depths(config: JobConfig, transfers: list[QueueTransfer]) -> list[QueueTransfer]:
    depths = measure_depths(config, transfers)
    return [replace(t, messages=depths[t][0], destination_messages=depths[t][1]) for t in transfers]


def measure_depths(
    config: JobConfig, transfers: list[QueueTransfer]
) -> dict[QueueTransfer, tuple[int, int]]:
    """Exact (source, destination) ready counts per transfer, one connection per vhost."""
    by_vhost: dict[tuple[str, str], set[str]] = defaultdict(set)
    for t in transfers:
        by_vhost[(t.source_cluster, t.source_vhost)].add(t.source_queue)
        by_vhost[(t.destination_cluster, t.destination_vhost)].add(t.destination_queue)
    depths: dict[tuple[str, str, str], int] = {}
    for (cluster, vhost), names in by_vhost.items():
        counted = queue_depths(cluster, config.clusters[cluster], vhost, sorted(names))
        depths.update({(cluster, vhost, name): depth for name, depth in counted.items()})
    return {
        t: (
            depths[(t.source_cluster, t.source_vhost, t.source_queue)],
            depths[(t.destination_cluster, t.destination_vhost, t.destination_queue)],
        )
        for t in transfers
    }
