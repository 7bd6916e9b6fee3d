"""What a classic queue's arguments become on the quorum queue (pure), and the options
for the cases that have no single right answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# Kept unchanged on the quorum queue (RabbitMQ 3.10 quorum queues support them; message
# TTL since 3.10.0, checked on this project's 3.10.8 brokers).
_KEPT = (
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-single-active-consumer",
    # RabbitMQ 4.x classic queues take the leader locator too (it replaces the master
    # locator, whose declare 4.3 refuses); quorum queues take the same values.
    "x-queue-leader-locator",
)
# Quorum queues refuse these on declare (406 PRECONDITION_FAILED, 3.10 to 4.3).
_DROPPED = {
    "x-queue-mode": "quorum queues refuse it; they keep every message on disk, so lazy mode "
    "does not apply",
    "x-queue-version": "quorum queues refuse it; it is a classic queue storage version and "
    "quorum queues have their own log",
}
_QUORUM_OVERFLOW = ("drop-head", "reject-publish")
# Classic master locators and the quorum leader locator that does the same job.
_LEADER_LOCATOR = {"client-local": "client-local", "min-masters": "balanced", "random": "balanced"}

Action = Literal["kept", "translated", "dropped", "refused", "added"]


@dataclass(frozen=True)
class MigrationOptions:
    """What to do with the cases that have no single right answer."""

    # refuse: a queue with consumers is not migrated; wait: wait for them to go.
    consumers: Literal["refuse", "wait"] = "refuse"
    consumer_wait_seconds: float = 300.0
    # refuse: x-max-priority stops the migration; drop: migrate, priorities are ignored.
    priorities: Literal["refuse", "drop"] = "refuse"
    # x-quorum-initial-group-size of the new queues (default: RabbitMQ's, all nodes).
    replicas: int | None = None


@dataclass(frozen=True)
class ArgumentDecision:
    """What happens to one queue argument in the quorum queue."""

    argument: str
    value: Any
    action: Action
    becomes: str | None  # "x-queue-leader-locator=balanced" for translations
    reason: str

    def describe(self) -> str:
        target = f" -> {self.becomes}" if self.becomes else ""
        return f"{self.argument}={self.value!r}: {self.action}{target} ({self.reason})"


def translate_arguments(
    arguments: Mapping[str, Any], options: MigrationOptions
) -> tuple[dict[str, Any], list[ArgumentDecision]]:
    """The quorum queue's arguments for a classic queue's, and a decision per argument.

    >>> translate_arguments({"x-queue-mode": "lazy"}, MigrationOptions())[0]
    {'x-queue-type': 'quorum'}
    """
    quorum: dict[str, Any] = {"x-queue-type": "quorum"}
    decisions: list[ArgumentDecision] = []

    def decide(
        key: str, value: Any, action: Action, reason: str, becomes: str | None = None
    ) -> None:
        decisions.append(ArgumentDecision(key, value, action, becomes, reason))

    for key, value in sorted(arguments.items()):
        if key == "x-queue-type":
            continue
        if key in _KEPT:
            quorum[key] = value
            decide(key, value, "kept", "quorum queues support it")
        elif key in _DROPPED:
            decide(key, value, "dropped", _DROPPED[key])
        elif key == "x-max-priority":
            if options.priorities == "drop":
                decide(
                    key,
                    value,
                    "dropped",
                    "quorum queues have no priorities; messages keep their priority "
                    "property, the queue delivers in arrival order",
                )
            else:
                decide(
                    key,
                    value,
                    "refused",
                    "quorum queues have no priorities; migrate anyway with --drop-priorities",
                )
        elif key == "x-queue-master-locator":
            locator = _LEADER_LOCATOR.get(str(value), "balanced")
            quorum["x-queue-leader-locator"] = locator
            decide(
                key,
                value,
                "translated",
                "quorum queues place leaders instead of masters",
                becomes=f"x-queue-leader-locator={locator}",
            )
        elif key == "x-overflow":
            if value in _QUORUM_OVERFLOW:
                quorum[key] = value
                decide(key, value, "kept", "quorum queues support it")
            else:
                # RabbitMQ 4.x accepts reject-publish-dlx on a quorum declare and then
                # ignores it (drop-head, with a warning in its log): refused here.
                decide(
                    key,
                    value,
                    "refused",
                    f"quorum queues support x-overflow {' and '.join(_QUORUM_OVERFLOW)} only",
                )
        elif key.startswith("x-"):
            decide(key, value, "refused", "unknown to rmq-spark, so its quorum meaning is unknown")
        else:
            quorum[key] = value
            decide(key, value, "kept", "not a RabbitMQ argument; passed on unchanged")
    if options.replicas is not None:
        quorum["x-quorum-initial-group-size"] = options.replicas
        decide(
            "x-quorum-initial-group-size",
            options.replicas,
            "added",
            "--replicas: the number of quorum members",
        )
    return quorum, decisions
