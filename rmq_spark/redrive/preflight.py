"""What a redrive checks before it moves anything, and what its dry run prints.

Every check here raises a `ConfigError` (exit 2) naming what is wrong and where, before a
message moves: an unknown cluster or a malformed `--queue`, a `--where` that does not parse
or names an unknown column (with its position), a DLQ that does not exist, a DLQ none of
whose messages has an `x-death` (nothing to say where they go: reported, never guessed).

The DLQ is read without taking anything from it (`transfer.amqp091.peek`) and each batch
decided as the run would (`RedriveDecider`), so the dry run's counts are the run's plan.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import JobConfig
from rmq_spark.errors import ConfigError
from rmq_spark.redrive.decider import NO_X_DEATH, RedriveDecider, plan_counts
from rmq_spark.redrive.headers import HeaderPolicy
from rmq_spark.selection import Message, Selection
from rmq_spark.selection.columns import ROUTE_UNREAD
from rmq_spark.transfer.amqp091.peek import peek
from rmq_spark.transfer.amqp091.wire import message_id_of
from rmq_spark.transfer.decisions import MOVED
from rmq_spark.transfer.selective import FENCE_PREFIX

WHERE = "--where"


@dataclass(frozen=True)
class DeadLetterQueue:
    """The queue a redrive empties: `--queue CLUSTER:VHOST:QUEUE`."""

    cluster: str
    vhost: str
    queue: str

    @property
    def label(self) -> str:
        return f"{self.cluster}:{self.vhost}:{self.queue}"


def parse_queue(text: str, config: JobConfig) -> DeadLetterQueue:
    """CLUSTER:VHOST:QUEUE (the vhost may hold ':'; the queue is after the last one)."""
    cluster, _, rest = text.partition(":")
    vhost, _, queue = rest.rpartition(":")
    if not cluster or not vhost or not queue:
        raise ConfigError(f"--queue {text!r}: expected CLUSTER:VHOST:QUEUE, e.g. main:/:orders.dlq")
    if cluster not in config.clusters:
        known = ", ".join(sorted(config.clusters))
        raise ConfigError(
            f"--queue {text!r}: no cluster {cluster!r} in the config (it has {known})"
        )
    return DeadLetterQueue(cluster, vhost, queue)


def compile_where(where: str | None) -> Selection | None:
    """The `--where` expression, checked (a bad one: ConfigError naming its position)."""
    if where is None:
        return None
    selection = Selection.compile(where, where=WHERE)
    unread = sorted(ROUTE_UNREAD.intersection(selection.columns))
    if unread:
        raise ConfigError(
            f"{WHERE} {where!r}: column {unread[0]!r} is the dead-letter exchange's, not the "
            "origin's; use last_death.exchange or last_death.routing_keys"
        )
    return selection


def existing_queues(config: JobConfig, dlq: DeadLetterQueue) -> frozenset[str]:
    """The names of the DLQ's vhost's queues; a missing vhost or DLQ is a ConfigError."""
    client = ManagementClient(
        dlq.cluster, config.clusters[dlq.cluster], timeout=config.management_timeout_seconds
    )
    try:
        if not client.vhost_exists(dlq.vhost):
            raise ConfigError(
                f"--queue {dlq.label}: cluster {dlq.cluster} has no vhost {dlq.vhost!r}"
            )
        names = frozenset(str(row["name"]) for row in client.queues(dlq.vhost, columns="name"))
    finally:
        client.close()
    if dlq.queue not in names:
        raise ConfigError(
            f"--queue {dlq.label}: cluster {dlq.cluster} vhost {dlq.vhost!r} has no queue "
            f"{dlq.queue!r}"
        )
    return names


def survey(
    config: JobConfig, dlq: DeadLetterQueue, decider: RedriveDecider
) -> Counter[tuple[str, str, str]]:
    """(decision, where, reason) -> count over the DLQ's messages, read and put back.

    Raises ConfigError when the DLQ holds messages and none has an `x-death`.
    """
    counts: Counter[tuple[str, str, str]] = Counter()
    for batch in peek(dlq.cluster, config.clusters[dlq.cluster], dlq.vhost, dlq.queue):
        # A selective move's fence (an interrupted redrive's, resumed next) is not a message.
        messages = [
            Message("", "", redelivered, props, body)
            for redelivered, props, body in batch
            if not (message_id_of(props) or "").startswith(FENCE_PREFIX)
        ]
        counts.update(plan_counts(decider, messages))
    total = sum(counts.values())
    without = sum(n for (_, _, reason), n in counts.items() if reason == NO_X_DEATH)
    if total and without == total:
        raise ConfigError(
            f"--queue {dlq.label}: none of its {total} messages has an x-death header, so "
            "none says which queue it came from; is it a dead-letter queue?"
        )
    return counts


def redrive_decider(
    dlq: DeadLetterQueue,
    existing: frozenset[str],
    selection: Selection | None,
    policy: HeaderPolicy,
    to_exchange: bool,
) -> RedriveDecider:
    return RedriveDecider(
        dlq.queue, existing, selection=selection, policy=policy, to_exchange=to_exchange
    )


def origin_queues(counts: Counter[tuple[str, str, str]], dlq: DeadLetterQueue) -> list[str]:
    """The queues the plan moves messages to (through the default exchange), sorted:
    the destinations whose depths a moving redrive reads as its witness."""
    return sorted({where for kind, where, _ in counts if kind == MOVED and where != dlq.queue})


def format_counts(dlq: DeadLetterQueue, counts: Counter[tuple[str, str, str]]) -> str:
    """The dry run's table: one line per (decision, destination, reason), moved first."""
    rows = sorted(counts.items(), key=lambda item: (item[0][0] != MOVED, item[0][1], item[0][2]))
    width = max([len(where) for (_, where, _), _ in rows] + [len("destination")])
    lines = [
        f"redrive of {dlq.label}: {sum(counts.values())} messages",
        f"  {'decision':<8}  {'destination':<{width}}  {'reason':<22}  {'messages':>8}",
    ]
    for (decision, where, reason), count in rows:
        lines.append(f"  {decision:<8}  {where:<{width}}  {reason:<22}  {count:>8}")
    return "\n".join(lines)
