"""Pure pre-flight rules: what the brokers' facts mean for the plan, no I/O.

Each function takes rows the management API returned (or values read from them), the
config and the planned transfers, and answers with a value or with the problems it
found, one RmqSparkError per line of the eventual message. `preflight` gathers the
facts and collects the problems; `one_error` turns them into the one error pre-flight
raises. Tested without a broker in tests/unit/planning/test_rules.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.broker.federation_plan import listed_policy
from rmq_spark.broker.management import Permissions
from rmq_spark.config import PARKED, RouteConfig
from rmq_spark.errors import (
    AccessRefusedError,
    DestinationIncompatibleError,
    DiscoveryError,
    PreflightError,
    RmqSparkError,
)
from rmq_spark.model import QueueTransfer
from rmq_spark.planning import queue_room
from rmq_spark.planning.topology_rules import Decision, translate_queue_arguments

# Queue arguments a destination created by rmq-spark inherits from its source
# (all of them with destination.topology: copy), translated for the destination's
# type and RabbitMQ version by topology_rules.translate_queue_arguments.
INHERITED_ARGUMENTS = ("x-queue-type", "x-max-priority", "x-queue-mode", "x-message-ttl")
# Publishing to a queue goes through the default exchange, which permissions call this.
DEFAULT_EXCHANGE = "amq.default"


def one_error(problems: Sequence[RmqSparkError]) -> RmqSparkError | None:
    """Every problem as one error: their kind, or PreflightError if mixed; None if none.

    One line per problem, in the order found; the problems stay in `.problems`.
    """
    if not problems:
        return None
    found = tuple(problems)
    kinds = {type(p) for p in found}
    kind = kinds.pop() if len(kinds) == 1 else PreflightError
    count = f"{len(found)} problem{'s' if len(found) > 1 else ''}"
    lines = "\n  ".join(str(p) for p in found)
    error = kind(f"pre-flight found {count}; nothing was moved:\n  {lines}")
    error.problems = found
    return error


# -- sources ------------------------------------------------------------------------------


def missing_source_vhost(route: RouteConfig, vhost: str, username: str) -> RmqSparkError:
    return DiscoveryError(
        f"cluster {route.source.cluster} vhost {vhost!r}: source vhost not found (it does "
        f"not exist or user {username!r} cannot see it); route {route.name!r} source.vhosts "
        "names it"
    )


def named_queues(
    route: RouteConfig, vhost: str, queues: Iterable[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], list[RmqSparkError]]:
    """source.queues: each named queue must exist and be one the mover can consume.

    Returns the rows of the queues that may move, and a problem for each that may not.
    """
    selector = route.source
    by_name = {q["name"]: dict(q) for q in queues}
    chosen: list[dict[str, Any]] = []
    problems: list[RmqSparkError] = []
    for name in selector.queues or []:
        where = f"cluster {selector.cluster} vhost {vhost!r} queue {name!r}"
        queue = by_name.get(name)
        if queue is None:
            problems.append(
                DiscoveryError(
                    f"{where}: source queue not found; route {route.name!r} source.queues names it"
                )
            )
        elif queue_type(queue) not in selector.queue_types:
            problems.append(
                DiscoveryError(
                    f"{where}: is a {queue_type(queue)} queue; route {route.name!r} "
                    f"source.queue_types allows {list(selector.queue_types)}"
                )
            )
        elif queue.get("exclusive"):
            problems.append(
                DiscoveryError(
                    f"{where}: exclusive to another connection, so it cannot be consumed"
                )
            )
        else:
            chosen.append(queue)
    return chosen, problems


def refused_passive_declares(
    cluster: str, vhost: str, refused: Mapping[str, str], *, role: str
) -> list[RmqSparkError]:
    """A queue the broker would not passive-declare (gone, or access refused)."""
    return [
        DiscoveryError(
            f"cluster {cluster} vhost {vhost!r} queue {queue!r}: the {role} queue did not "
            f"answer a passive declare ({reason})"
        )
        for queue, reason in sorted(refused.items())
    ]


# -- the plan as a whole ------------------------------------------------------------------


def check_plan(transfers: Iterable[QueueTransfer]) -> list[RmqSparkError]:
    """No loops, no queue selected twice, one source per destination, no chains."""
    problems: list[RmqSparkError] = []
    sources: dict[tuple[str, str, str], str] = {}
    destinations: dict[tuple[str, str, str], QueueTransfer] = {}
    for t in transfers:
        source = (t.source_cluster, t.source_vhost, t.source_queue)
        destination = (t.destination_cluster, t.destination_vhost, t.destination_queue)
        if source == destination:
            problems.append(
                DiscoveryError(
                    f"cluster {t.source_cluster} vhost {t.source_vhost!r} queue "
                    f"{t.source_queue!r}: route {t.route!r} moves it onto itself; expected a "
                    "destination other than the source"
                )
            )
        if source in sources:
            problems.append(
                DiscoveryError(
                    f"cluster {t.source_cluster} vhost {t.source_vhost!r} queue "
                    f"{t.source_queue!r}: selected by both route {sources[source]!r} and "
                    f"route {t.route!r}; expected one route per source queue"
                )
            )
        sources[source] = t.route
        if destination in destinations:
            other = destinations[destination]
            problems.append(
                DiscoveryError(
                    f"cluster {t.destination_cluster} vhost {t.destination_vhost!r} queue "
                    f"{t.destination_queue!r}: destination of both {other.describe()} and "
                    f"{t.describe()}; expected one source per destination (verification "
                    "counts each destination's rise against one source)"
                )
            )
        destinations[destination] = t
    for destination, t in destinations.items():
        if destination in sources and destination != (
            t.source_cluster,
            t.source_vhost,
            t.source_queue,
        ):
            problems.append(
                DiscoveryError(
                    f"cluster {t.destination_cluster} vhost {t.destination_vhost!r} queue "
                    f"{t.destination_queue!r}: destination of {t.describe()} is also a "
                    f"source (route {sources[destination]!r}); its messages would move twice"
                )
            )
    return problems


# -- destinations -------------------------------------------------------------------------


def missing_destination_vhost(
    cluster: str, vhost: str, username: str, routes: Sequence[str]
) -> RmqSparkError:
    route_names = ", ".join(repr(r) for r in sorted(set(routes)))
    return DestinationIncompatibleError(
        f"cluster {cluster} vhost {vhost!r}: the destination vhost does not exist "
        f"(or user {username!r} cannot see it); "
        f"{len(routes)} queue(s) of route(s) {route_names} go there"
    )


@dataclass(frozen=True)
class DestinationCheck:
    """What pre-flight concluded about one destination queue.

    `create` with the `arguments` to declare it with, or `problems` (then nothing is
    created); `decisions` are the translations of its source's arguments, to log.
    """

    create: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    decisions: tuple[Decision, ...] = ()
    problems: tuple[RmqSparkError, ...] = ()


def check_destination(
    transfer: QueueTransfer,
    route: RouteConfig,
    source: Mapping[str, Any],
    existing: Mapping[str, Any] | None,
    *,
    destination_depth: int | None,
    destination_version: str,
) -> DestinationCheck:
    """The destination exists and fits its source, or may be created like it.

    `source` and `existing` are the management API's rows of the source and the
    destination queue (None: missing); `destination_depth` its exact depth where known.
    """
    t = transfer
    where = (
        f"cluster {t.destination_cluster} vhost {t.destination_vhost!r} "
        f"queue {t.destination_queue!r}"
    )
    expected_type = route.queue_destination.queue_type or t.source_type
    type_origin = (
        "destination.queue_type"
        if route.queue_destination.queue_type
        else "the source's type; set destination.queue_type to move into another type"
    )
    if existing is not None:
        reasons = _incompatibilities(
            t,
            source,
            existing,
            destination_depth=destination_depth,
            expected_type=expected_type,
            type_origin=type_origin,
            keep_priorities=route.queue_destination.priorities == "keep",
        )
        return DestinationCheck(
            problems=tuple(DestinationIncompatibleError(f"{where}: {r}") for r in reasons)
        )
    if not route.queue_destination.create_missing:
        return DestinationCheck(
            problems=(
                DestinationIncompatibleError(
                    f"{where}: missing, and create_missing is false for route {t.route!r}"
                ),
            )
        )
    source_arguments = source.get("arguments") or {}
    # topology: copy declares the destination like its source, every argument
    # translated; otherwise only the ones a transfer needs to keep its meaning.
    inherited = (
        dict(source_arguments)
        if route.queue_destination.topology == "copy"
        else {k: v for k, v in source_arguments.items() if k in INHERITED_ARGUMENTS}
    )
    arguments, decisions = translate_queue_arguments(
        inherited,
        destination_type=expected_type,
        destination_version=destination_version,
        priorities=route.queue_destination.priorities,
    )
    refused = tuple(
        DestinationIncompatibleError(
            f"{where}: cannot be created as a {expected_type} queue ({type_origin}) "
            f"like its source {t.source_label} (route {t.route!r}): argument "
            f"{decision.key}={decision.value!r}: {decision.reason}"
        )
        for decision in decisions
        if decision.action == "refused"
    )
    if refused:
        return DestinationCheck(decisions=tuple(decisions), problems=refused)
    return DestinationCheck(create=True, arguments=arguments, decisions=tuple(decisions))


def destination_durable(arguments: Mapping[str, Any], source: Mapping[str, Any]) -> bool:
    """A created destination is durable like its source; a quorum one always is."""
    return arguments.get("x-queue-type") == "quorum" or bool(source.get("durable", True))


# -- permissions --------------------------------------------------------------------------


def read_problems(
    cluster: str, vhost: str, user: str, permissions: Permissions, queues: Iterable[str]
) -> list[RmqSparkError]:
    """The user may consume every source queue: a read permission matching it."""
    return [
        AccessRefusedError(
            f"cluster {cluster} vhost {vhost!r} queue {queue!r}: user {user!r} "
            f"may not consume it; expected a read permission matching it, "
            f"found {permissions.read!r}"
        )
        for queue in sorted(set(queues))
        if not allows(permissions.read, queue)
    ]


def write_problems(
    cluster: str,
    vhost: str,
    user: str,
    permissions: Permissions,
    destinations: Sequence[tuple[str, bool]],
) -> list[RmqSparkError]:
    """The user may publish to every destination and declare each one to be created.

    `destinations` are (queue, to be created) pairs of one vhost.
    """
    problems: list[RmqSparkError] = []
    if not allows(permissions.write, DEFAULT_EXCHANGE):
        names = sorted(queue for queue, _ in destinations)
        problems.append(
            AccessRefusedError(
                f"cluster {cluster} vhost {vhost!r}: user {user!r} may not publish to "
                f"queue(s) {', '.join(repr(n) for n in names[:5])}"
                f"{' ...' if len(names) > 5 else ''}; expected a write permission "
                f"matching {DEFAULT_EXCHANGE!r}, found {permissions.write!r}"
            )
        )
    problems.extend(
        AccessRefusedError(
            f"cluster {cluster} vhost {vhost!r} queue {queue!r}: missing, and "
            f"user {user!r} may not declare it; expected a configure "
            f"permission matching it, found {permissions.configure!r}"
        )
        for queue, create in destinations
        if create and not allows(permissions.configure, queue)
    )
    return problems


# -- rows of the management API -----------------------------------------------------------


def queue_transfer(route: RouteConfig, vhost: str, queue: Mapping[str, Any]) -> QueueTransfer:
    """The transfer of one selected source queue (its management API row)."""
    name = queue["name"]
    if route.parks:
        # The parked table, named in the ledger by the source's vhost and queue.
        cluster, to_vhost, to_queue = PARKED, vhost, name
    else:
        destination = route.queue_destination
        cluster = destination.cluster
        to_vhost = destination.vhost.format(vhost=vhost, queue=name)
        to_queue = destination.queue.format(vhost=vhost, queue=name)
    return QueueTransfer(
        route=route.name,
        source_cluster=route.source.cluster,
        source_vhost=vhost,
        source_queue=name,
        source_type=queue_type(queue),
        source_node=hosting_node(queue),
        destination_cluster=cluster,
        destination_vhost=to_vhost,
        destination_queue=to_queue,
        messages=int(queue.get("messages_ready") or 0),
        message_bytes=int(queue.get("message_bytes_ready") or 0),
        destination_messages=0,
    )


def matching_queues(route: RouteConfig, queues: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The route's queue_pattern, policy_pattern and queue_types filters."""
    selector = route.source
    queue_pattern = re.compile(selector.queue_pattern)
    policy_pattern = re.compile(selector.policy_pattern) if selector.policy_pattern else None
    chosen = []
    for queue in queues:
        if not queue_pattern.fullmatch(queue["name"]):
            continue
        if queue_type(queue) not in selector.queue_types:
            continue
        # A queue a crashed run left paused lists the override, not its own policy.
        if policy_pattern and not policy_pattern.fullmatch(
            listed_policy(queue.get("policy")) or ""
        ):
            continue
        if queue.get("exclusive"):
            continue  # owned by another connection: we could not consume it anyway
        chosen.append(queue)
    return chosen


def _incompatibilities(
    transfer: QueueTransfer,
    source: Mapping[str, Any],
    existing: Mapping[str, Any],
    *,
    destination_depth: int | None,
    expected_type: str,
    type_origin: str,
    keep_priorities: bool = True,
) -> list[str]:
    """Why an existing destination queue cannot take its source's messages as they are."""
    reasons = []
    if existing.get("exclusive"):
        reasons.append(queue_room.EXCLUSIVE)
    found_type = queue_type(existing)
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
    depth = (
        destination_depth
        if destination_depth is not None
        else int(existing.get("messages_ready") or 0)
    )
    reasons += queue_room.room_problems(
        existing,
        depth=depth,
        messages=transfer.messages,
        message_bytes=transfer.message_bytes,
        wanted_messages=f"the source's {transfer.messages}",
        wanted_bytes=f"the source's about {transfer.message_bytes}",
        refused="the rest would be refused and stay in the source",
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


def queue_type(queue: Mapping[str, Any]) -> str:
    return str(queue.get("type") or "classic")


def _int_argument(queue: Mapping[str, Any], key: str) -> int | None:
    value = (queue.get("arguments") or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def allows(pattern: str, name: str) -> bool:
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


def destination_type(existing: Mapping[str, Any] | None, arguments: Mapping[str, Any]) -> str:
    """A destination queue's type: as the management API lists it, or as it will be
    declared (`x-queue-type`, classic when absent); "" when neither says.

    >>> destination_type({"type": "quorum"}, {}), destination_type(None, {})
    ('quorum', 'classic')
    """
    if existing is not None:
        return str(existing.get("type") or "")
    return str(arguments.get("x-queue-type") or "classic")
