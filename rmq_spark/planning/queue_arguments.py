"""The one argument-compatibility table: a source queue's arguments, translated for the
destination queue's type and RabbitMQ version (pure).

Both ways of creating a queue from another read it: `destination.topology: copy` (and
pre-flight's destination check, `planning/rules.py`) and `rmq-spark migrate`
(`migrate/arguments.py`, classic → quorum in place), so the same queue is translated the
same way by both. Measured on RabbitMQ 3.10.8, 4.0.5 and 4.3.6
(`tests/integration/test_argument_table.py`, `test_blue_green.py`, `test_migrate.py`)
and read in the 4.3 source (`rabbit_amqqueue:declare_args/0`, the queue types'
`capabilities/0`):

* quorum queues refuse `x-queue-mode`, `x-queue-version`, `x-queue-master-locator` and
  `x-max-priority` (406); classic queues refuse the quorum-only arguments;
* quorum queues accept `x-overflow: reject-publish-dlx` on declare and then behave as
  `drop-head` (the oldest messages are dropped instead of new publishes being refused):
  a different queue, so it is refused, not copied;
* an `x-` argument RabbitMQ does not know is accepted as it is by classic and quorum
  queues (it means something only to a plugin that reads it): kept, like any argument
  that is not a RabbitMQ one;
* 4.3 refuses `x-queue-version: 1` and `x-queue-master-locator` on a classic queue;
  3.12 and later ignore `x-queue-mode`.

A quorum queue has no `x-max-priority`, yet on 4.x it delivers by the messages'
`priority` property (`QUORUM_PRIORITY_ORDER`): dropping the argument does not give
arrival order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Action = Literal["kept", "translated", "dropped", "refused"]

# Arguments only quorum queues take; a classic queue refuses them (or, for the
# delivery limit, has no such thing).
_QUORUM_ONLY_ARGUMENTS = {
    "x-dead-letter-strategy": "classic queues refuse it (at-least-once dead lettering is "
    "a quorum queue feature)",
    "x-max-in-memory-length": "classic queues refuse it (a quorum queue argument)",
    "x-max-in-memory-bytes": "classic queues refuse it (a quorum queue argument)",
    "x-quorum-initial-group-size": "classic queues refuse it (a quorum queue argument)",
    "x-delivery-limit": "classic queues have no delivery limit",
    "x-consumer-disconnected-timeout": "classic queues refuse it (a quorum queue argument)",
}
_STREAM_ONLY_ARGUMENTS = (
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-stream-filter-size-bytes",
    "x-initial-cluster-size",
)
# Every argument RabbitMQ itself reads on a classic or quorum queue declare; an `x-`
# argument outside this set (and the sets above) is a plugin's or an application's.
_RABBITMQ_ARGUMENTS = frozenset(
    {
        "x-message-ttl",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-overflow",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-single-active-consumer",
        "x-queue-leader-locator",
        "x-queue-master-locator",
        "x-queue-mode",
        "x-queue-version",
        "x-max-priority",
        "x-consumer-timeout",
        "x-queue-type",
        *_QUORUM_ONLY_ARGUMENTS,
        *_STREAM_ONLY_ARGUMENTS,
    }
)
# The overflow modes a quorum queue honours (it takes reject-publish-dlx and drops heads).
QUORUM_OVERFLOW = ("drop-head", "reject-publish")
# x-queue-master-locator's values, as leader locators.
LEADER_LOCATOR = {"client-local": "client-local", "min-masters": "balanced", "random": "balanced"}
# What a 4.x quorum queue does with the `priority` property, with no queue argument.
QUORUM_PRIORITY_ORDER = (
    "a RabbitMQ 4.x quorum queue delivers by it: 4.0 delivers messages of priority 5 and "
    "above ahead of the others (not strictly), 4.3 in priority order (no priority counts "
    "as 4), so consumers see a new order wherever publishers set priorities"
)

# From this release a quorum queue delivers by the `priority` property (QUORUM_PRIORITY_ORDER).
QUORUM_PRIORITY_ORDER_FROM = (4, 0)


def delivers_by_priority(queue_type: str, rabbitmq_version: str) -> bool | None:
    """Whether a queue of this type on this RabbitMQ delivers by the `priority` property
    rather than in arrival order, without any queue argument; None when unknown.

    >>> delivers_by_priority("quorum", "4.3.6"), delivers_by_priority("quorum", "3.10.8")
    (True, False)
    >>> delivers_by_priority("classic", "4.3.6"), delivers_by_priority("", "4.3.6")
    (False, None)
    """
    version = parse_version(rabbitmq_version)
    if not queue_type or version is None:
        return None
    return queue_type == "quorum" and version >= QUORUM_PRIORITY_ORDER_FROM


# The RabbitMQ versions that changed these (queue arguments here, the same settings as
# policy keys in topology_rules.py).
QUEUE_MODE_IGNORED_FROM = (3, 12)
MASTER_LOCATOR_DEPRECATED_IN = (4, 0)
_CLASSIC_LEADER_LOCATOR_FROM = (4, 0)
CQV1_REMOVED_IN = (4, 3)
_CONSUMER_TIMEOUT_QUORUM_ONLY_FROM = (4, 3)


@dataclass(frozen=True)
class Decision:
    """What happens to one queue argument or policy key, and why."""

    key: str
    value: Any
    action: Action
    reason: str
    becomes: str | None = None

    def describe(self) -> str:
        change = f" -> {self.becomes}" if self.becomes else ""
        return f"{self.key}={self.value!r} {self.action}{change}: {self.reason}"


def parse_version(rabbitmq_version: str) -> tuple[int, int] | None:
    """(major, minor) of a RabbitMQ version string; None when it is not one.

    >>> parse_version("4.3.6"), parse_version("unknown")
    ((4, 3), None)
    """
    try:
        major, minor = (int(part) for part in rabbitmq_version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def at_least(version: tuple[int, int] | None, release: tuple[int, int]) -> bool:
    """Whether a known version is `release` or later (unknown: no, keep what the source had)."""
    return version is not None and version >= release


def translate_queue_arguments(
    arguments: Mapping[str, Any],
    *,
    destination_type: str,
    destination_version: str,
    priorities: Literal["keep", "drop"] = "keep",
) -> tuple[dict[str, Any], list[Decision]]:
    """The arguments to declare a destination with, from its source's, and why.

    `x-queue-type` is the destination type. A "refused" decision means the queue
    cannot be created like its source: the caller reports it and declares nothing.

    >>> args, decisions = translate_queue_arguments(
    ...     {"x-queue-version": 1, "x-message-ttl": 60000},
    ...     destination_type="classic", destination_version="4.3.6")
    >>> args
    {'x-message-ttl': 60000, 'x-queue-type': 'classic'}
    """
    version = parse_version(destination_version)
    quorum = destination_type == "quorum"
    result: dict[str, Any] = {}
    decisions: list[Decision] = []

    def drop(key: str, value: Any, reason: str) -> None:
        decisions.append(Decision(key, value, "dropped", reason))

    def refuse(key: str, value: Any, reason: str) -> None:
        decisions.append(Decision(key, value, "refused", reason))

    for key, value in sorted(arguments.items()):
        if key == "x-queue-type":
            continue
        if key == "x-queue-mode" and quorum:
            drop(
                key,
                value,
                "quorum queues refuse it; they keep every message on disk, so lazy mode "
                "does not apply",
            )
        elif key == "x-queue-mode" and at_least(version, QUEUE_MODE_IGNORED_FROM):
            drop(
                key,
                value,
                f"RabbitMQ {destination_version} ignores it (from 3.12 every classic queue "
                "stores messages like a lazy one)",
            )
        elif key == "x-queue-version" and quorum:
            drop(
                key,
                value,
                "quorum queues refuse it; it is a classic queue storage version and quorum "
                "queues have their own log",
            )
        elif key == "x-queue-version" and value != 2 and at_least(version, CQV1_REMOVED_IN):
            drop(
                key,
                value,
                f"RabbitMQ {destination_version} refuses it (4.3 removed classic queue "
                "version 1; every classic queue is version 2)",
            )
        elif key == "x-queue-master-locator" and (
            quorum or at_least(version, MASTER_LOCATOR_DEPRECATED_IN)
        ):
            reason = (
                "quorum queues refuse it; they place leaders instead of masters"
                if quorum
                else "deprecated from 4.0, and RabbitMQ 4.3 refuses it on declare"
            )
            if "x-queue-leader-locator" in arguments:
                drop(key, value, f"{reason}; the source's x-queue-leader-locator is kept")
                continue
            locator = LEADER_LOCATOR.get(str(value), "balanced")
            result["x-queue-leader-locator"] = locator
            decisions.append(
                Decision(key, value, "translated", reason, f"x-queue-leader-locator={locator}")
            )
        elif (
            key == "x-queue-leader-locator"
            and not quorum
            and version is not None
            and not at_least(version, _CLASSIC_LEADER_LOCATOR_FROM)
        ):
            drop(key, value, f"classic queues on RabbitMQ {destination_version} refuse it")
        elif key == "x-max-priority" and quorum:
            if priorities == "drop":
                drop(
                    key,
                    value,
                    "quorum queues refuse it; messages keep their priority property "
                    f"({QUORUM_PRIORITY_ORDER})",
                )
            else:
                refuse(
                    key,
                    value,
                    "quorum queues refuse it; move it into a queue that keeps priorities, "
                    "or drop it (destination.priorities: drop; migrate --drop-priorities)",
                )
        elif key == "x-overflow" and quorum and value not in QUORUM_OVERFLOW:
            refuse(
                key,
                value,
                f"quorum queues honour x-overflow {' and '.join(QUORUM_OVERFLOW)} only "
                "(RabbitMQ 4.x takes this one on declare, then drops heads)",
            )
        elif key in _QUORUM_ONLY_ARGUMENTS and not quorum:
            drop(key, value, _QUORUM_ONLY_ARGUMENTS[key])
        elif (
            key == "x-consumer-timeout"
            and not quorum
            and at_least(version, _CONSUMER_TIMEOUT_QUORUM_ONLY_FROM)
        ):
            drop(key, value, f"classic queues on RabbitMQ {destination_version} refuse it")
        elif key in _STREAM_ONLY_ARGUMENTS:
            drop(key, value, f"a stream argument; {destination_type} queues refuse it")
        elif key.startswith("x-") and key not in _RABBITMQ_ARGUMENTS:
            result[key] = value
            decisions.append(
                Decision(
                    key,
                    value,
                    "kept",
                    "not a RabbitMQ argument (RabbitMQ takes it as it is; a plugin may read it)",
                )
            )
        elif not key.startswith("x-"):
            result[key] = value
            decisions.append(Decision(key, value, "kept", "not a RabbitMQ argument"))
        else:
            result[key] = value
            decisions.append(Decision(key, value, "kept", "the destination takes it"))
    result["x-queue-type"] = destination_type
    return result, decisions
