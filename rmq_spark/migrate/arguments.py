"""What a classic queue's arguments become on the quorum queue (pure), and the options
for the cases that have no single right answer.

The translation is the one table `rmq_spark.planning.queue_arguments` (which
`destination.topology: copy` reads too): a queue migrated in place gets the arguments
a copy-topology move into a quorum queue would give it. Here it is only worded for
migrate's plan and log, and given the `--replicas` argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rmq_spark.planning.queue_arguments import translate_queue_arguments

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
    arguments: Mapping[str, Any],
    options: MigrationOptions,
    *,
    rabbitmq_version: str = "unknown",
) -> tuple[dict[str, Any], list[ArgumentDecision]]:
    """The quorum queue's arguments for a classic queue's, and a decision per argument.

    >>> translate_arguments({"x-queue-mode": "lazy"}, MigrationOptions())[0]
    {'x-queue-type': 'quorum'}
    """
    quorum, table = translate_queue_arguments(
        arguments,
        destination_type="quorum",
        destination_version=rabbitmq_version,
        priorities="drop" if options.priorities == "drop" else "keep",
    )
    decisions = [ArgumentDecision(d.key, d.value, d.action, d.becomes, d.reason) for d in table]
    if options.replicas is not None:
        quorum["x-quorum-initial-group-size"] = options.replicas
        decisions.append(
            ArgumentDecision(
                "x-quorum-initial-group-size",
                options.replicas,
                "added",
                None,
                "--replicas: the number of quorum members",
            )
        )
    return quorum, decisions
