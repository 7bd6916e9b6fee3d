"""Pure pre-flight rules: what the brokers' facts mean for the plan, no I/O.

Each function takes rows the management API returned (or values from them) and the
config, and answers with values or with the problems it found; `preflight` gathers
the facts and collects the problems, `discovery` selects the queues.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rmq_spark.config import RouteConfig
from rmq_spark.model import QueueTransfer
from rmq_spark.planning.topology_rules import translate_queue_arguments

_REFUSING_OVERFLOW = ("reject-publish", "reject-publish-dlx")


def _transfer(route: RouteConfig, vhost: str, queue: dict[str, Any]) -> QueueTransfer:
    name = queue["name"]
    destination = route.destination
    return QueueTransfer(
        route=route.name,
        source_cluster=route.source.cluster,
        source_vhost=vhost,
        source_queue=name,
        source_type=_queue_type(queue),
        source_node=hosting_node(queue),
        destination_cluster=destination.cluster,
        destination_vhost=destination.vhost.format(vhost=vhost, queue=name),
        destination_queue=destination.queue.format(vhost=vhost, queue=name),
        messages=int(queue.get("messages_ready") or 0),
        message_bytes=int(queue.get("message_bytes_ready") or 0),
        destination_messages=0,
    )


def _matching_queues(route: RouteConfig, queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The route's queue_pattern, policy_pattern and queue_types filters."""
    selector = route.source
    queue_pattern = re.compile(selector.queue_pattern)
    policy_pattern = re.compile(selector.policy_pattern) if selector.policy_pattern else None
    chosen = []
    for queue in queues:
        if not queue_pattern.fullmatch(queue["name"]):
            continue
        if _queue_type(queue) not in selector.queue_types:
            continue
        if policy_pattern and not policy_pattern.fullmatch(queue.get("policy") or ""):
            continue
        if queue.get("exclusive"):
            continue  # owned by another connection: we could not consume it anyway
        chosen.append(queue)
    return chosen


def _incompatibilities(
    transfer: QueueTransfer,
    source: dict[str, Any],
    existing: dict[str, Any],
    *,
    destination_depth: int | None,
    expected_type: str,
    type_origin: str,
    keep_priorities: bool = True,
) -> list[str]:
    """Why an existing destination queue cannot take its source's messages as they are."""
    reasons = []
    if existing.get("exclusive"):
        reasons.append("exclusive to another connection, cannot publish reliably")
    found_type = _queue_type(existing)
    if found_type != expected_type:
        reasons.append(f"is a {found_type} queue, expected {expected_type} ({type_origin})")
    source_priority = _int_argument(source, "x-max-priority")
    if source_priority is not None and keep_priorities:
        found_priority = _int_argument(existing, "x-max-priority")
        if found_priority is None or found_priority < source_priority:
            reasons.append(
                f"expected x-max-priority >= {source_priority} like the source, found "
                f"{'none' if found_priority is None else found_priority}; messages would "
                "lose their priorities"
            )
    if source.get("durable", True) and not existing.get("durable", True):
        reasons.append("is not durable but the source is; its messages would not survive a restart")
    overflow = _overflow(existing)
    consequence = (
        "the rest would be refused and stay in the source"
        if overflow in _REFUSING_OVERFLOW
        else "the oldest would be dropped and lost"
    )
    depth = (
        destination_depth
        if destination_depth is not None
        else int(existing.get("messages_ready") or 0)
    )
    max_length = _limit(existing, "x-max-length", "max-length")
    if max_length is not None and max_length - depth < transfer.messages:
        reasons.append(
            f"holds at most {max_length} messages (max-length, overflow {overflow}) and has "
            f"{depth}; expected room for the source's {transfer.messages} ({consequence})"
        )
    max_bytes = _limit(existing, "x-max-length-bytes", "max-length-bytes")
    held = int(existing.get("message_bytes_ready") or 0)
    if max_bytes is not None and max_bytes - held < transfer.message_bytes:
        reasons.append(
            f"holds at most {max_bytes} bytes (max-length-bytes, overflow {overflow}) and has "
            f"about {held}; expected room for the source's about {transfer.message_bytes} "
            f"({consequence})"
        )
    return reasons


def queue_mode_applies(rabbitmq_version: str) -> bool:
    """Whether a classic queue on this RabbitMQ version takes x-queue-mode to mean something.

    3.12 and later ignore it; an unknown version keeps the source's argument.

    >>> queue_mode_applies("3.10.8"), queue_mode_applies("4.3.6")
    (True, False)
    """
    arguments, _ = translate_queue_arguments(
        {"x-queue-mode": "lazy"}, destination_type="classic", destination_version=rabbitmq_version
    )
    return "x-queue-mode" in arguments


def _queue_type(queue: Mapping[str, Any]) -> str:
    return str(queue.get("type") or "classic")


def _int_argument(queue: Mapping[str, Any], key: str) -> int | None:
    value = (queue.get("arguments") or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _limit(queue: Mapping[str, Any], argument: str, policy_key: str) -> int | None:
    """A length limit from the queue's argument or its policies: the lower one applies."""
    policy = queue.get("effective_policy_definition") or {}
    values = [
        v
        for v in ((queue.get("arguments") or {}).get(argument), policy.get(policy_key))
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    return min(values) if values else None


def _overflow(queue: Mapping[str, Any]) -> str:
    policy = queue.get("effective_policy_definition") or {}
    return str(
        (queue.get("arguments") or {}).get("x-overflow") or policy.get("overflow") or "drop-head"
    )


def _allows(pattern: str, name: str) -> bool:
    """RabbitMQ's permission match: an unanchored regex; '' permits nothing."""
    if not pattern:
        return False
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True  # Erlang-only syntax: leave the decision to the broker


def hosting_node(queue: Mapping[str, Any]) -> str:
    """The node to connect to for a queue: a quorum queue's leader, else its home node."""
    return str(queue.get("leader") or queue.get("node") or "")
