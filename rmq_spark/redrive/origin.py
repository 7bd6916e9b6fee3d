"""Where a dead-lettered message came from: read from its `x-death` header, never guessed.

RabbitMQ keeps one `x-death` entry per (queue, reason), each with `count`, `time`,
`exchange`, `routing-keys` and, for a per-message TTL, `original-expiration`. The newest
entry comes first on every version this project runs:

- 3.10 (`rabbit_dead_letter:update_x_death_header`): a new entry is put at the head; an
  existing (queue, reason) entry has its count raised and is moved to the head.
- 3.13 and 4.x (`mc_amqpl:deaths_to_headers`): the deaths are kept in the message container
  and written out sorted by each entry's last time, newest first. The entry's `time` is the
  FIRST time of that (queue, reason), so `time` cannot order entries: the order does.

The newest entry names the queue the message died in last, which is the queue that
dead-lettered it into the DLQ: that is the origin. `x-first-death-*` and `x-last-death-*` are
summaries the broker may get wrong (4.1 after a second death, rabbitmq-server #15385), so
they are never read. An entry naming the DLQ itself (a message that died in the DLQ and came
back through a cycle) is skipped: the origin is the newest other queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmq_spark.selection.columns import deaths
from rmq_spark.selection.fields import Properties


@dataclass(frozen=True)
class Death:
    """One `x-death` entry: a queue the message died in, why, and how it got there."""

    queue: str
    reason: str
    count: int | None
    exchange: str | None
    routing_keys: tuple[str, ...]
    original_expiration: str | None

    @property
    def routing_key(self) -> str:
        """The routing key the message was published with (the first recorded; CC follow)."""
        return self.routing_keys[0] if self.routing_keys else self.queue


def death_entries(properties: Properties) -> list[Death]:
    """The `x-death` entries, newest first, leaving out any without a queue name."""
    return [
        Death(
            queue=row["queue"],
            reason=row["reason"] or "unknown",
            count=row["count"],
            exchange=row["exchange"],
            routing_keys=tuple(key for key in row["routing_keys"] if key is not None),
            original_expiration=row["original_expiration"],
        )
        for row in deaths(properties)
        if row["queue"]
    ]


def origin(properties: Properties, dead_letter_queue: str) -> Death | None:
    """The entry naming the queue the message goes back to, or None when it has none.

    >>> origin(Properties(), "orders.dlq") is None
    True
    """
    for entry in death_entries(properties):
        if entry.queue != dead_letter_queue:
            return entry
    return None
