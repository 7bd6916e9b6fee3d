"""The driver's exact queue depths, over AMQP.

The management API's message counts are sampled (every few seconds), so anything
that proves a transfer uses AMQP passive queue.declare, whose count is exact, with
one exception: a quorum queue whose leader does not answer within 250 ms (busy, or
unavailable) is reported as "0 messages, 0 consumers" (RabbitMQ 3.10,
`rabbit_quorum_queue:stat/1`). `ready_count` asks again while a reply may be that;
`queue_is_empty` asks the queue itself, for deciding to delete one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from rmq_spark.broker.connection import blocking_connection
from rmq_spark.config import ClusterConfig
from rmq_spark.errors import DiscoveryError

log = logging.getLogger(__name__)

# A quorum queue's declare-ok is "0 messages, 0 consumers" when its leader has not
# answered within this long; a zero reply that came back sooner is a count.
QUORUM_STAT_TIMEOUT_SECONDS = 0.25
# How long `ready_count` keeps asking while the replies may be such timeouts.
COUNT_DEADLINE_SECONDS = 15.0


@dataclass(frozen=True)
class VhostProbe:
    """What pre-flight learned from one vhost over AMQP."""

    depths: dict[str, int]  # exact ready count of each queue that answered
    refused: dict[str, str]  # queue -> the broker's reason (e.g. 404 NOT_FOUND)


def probe_vhost(
    cluster_name: str, cluster: ClusterConfig, vhost: str, queues: Iterable[str]
) -> VhostProbe:
    """Pre-flight: log in to the vhost and passive-declare each queue (exact depths).

    Raises AccessRefusedError or BrokerUnreachableError when the connection does not
    open; a queue the broker refuses is reported in `refused`, and the others still
    answer (a fresh channel replaces each one the broker closes).
    """
    depths: dict[str, int] = {}
    refused: dict[str, str] = {}
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="pre-flight")
    try:
        channel = connection.channel()
        for queue in queues:
            try:
                depths[queue] = ready_count(
                    channel, queue, f"cluster {cluster_name} vhost {vhost!r} queue {queue!r}"
                )
            except pika.exceptions.ChannelClosedByBroker as exc:
                refused[queue] = f"{exc.reply_code} {exc.reply_text}"
                channel = connection.channel()
    finally:
        if connection.is_open:
            connection.close()
    return VhostProbe(depths, refused)


def queue_depths(
    cluster_name: str, cluster: ClusterConfig, vhost: str, queues: Iterable[str]
) -> dict[str, int]:
    """Exact ready-message counts, by passive queue.declare on one connection."""
    depths: dict[str, int] = {}
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="depth check")
    try:
        channel = connection.channel()
        for queue in queues:
            where = f"cluster {cluster_name} vhost {vhost!r} queue {queue!r}"
            try:
                depths[queue] = ready_count(channel, queue, where)
            except pika.exceptions.ChannelClosedByBroker as exc:
                raise DiscoveryError(
                    f"{where}: cannot read its depth ({exc.reply_code} {exc.reply_text})"
                ) from exc
    finally:
        if connection.is_open:
            connection.close()
    return depths


def queue_readings(
    cluster_name: str, cluster: ClusterConfig, vhost: str, queues: Iterable[str]
) -> dict[str, tuple[int, int]]:
    """Exact (ready messages, consumers) per queue, by passive queue.declare on one
    connection: a redrive's witness readings (`redrive/tally.py`). A queue that is not
    there is left out (the witness then has no depth to read)."""
    readings: dict[str, tuple[int, int]] = {}
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="depth check")
    try:
        for queue in queues:
            where = f"cluster {cluster_name} vhost {vhost!r} queue {queue!r}"
            channel = connection.channel()
            try:
                depth = ready_count(channel, queue, where)
                consumers = channel.queue_declare(queue, passive=True).method.consumer_count
            except pika.exceptions.ChannelClosedByBroker:
                continue  # NOT_FOUND: the channel is gone; the next queue gets its own
            readings[queue] = (depth, int(consumers))
            channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return readings


def ready_count(channel: BlockingChannel, queue: str, where: str) -> int:
    """The queue's ready messages by passive queue.declare on a blocking channel.

    "0 messages, 0 consumers" that took a quorum leader's stat timeout or longer may
    be that timeout, so it is asked again, up to COUNT_DEADLINE_SECONDS; a leader
    that never answers raises DiscoveryError rather than pass for an empty queue.
    """
    deadline = time.monotonic() + COUNT_DEADLINE_SECONDS
    while True:
        asked = time.monotonic()
        ok = channel.queue_declare(queue, passive=True).method
        answered_in = time.monotonic() - asked
        if ok.message_count or ok.consumer_count or answered_in < QUORUM_STAT_TIMEOUT_SECONDS:
            return int(ok.message_count)
        if time.monotonic() > deadline:
            raise DiscoveryError(
                f"{where}: the broker did not count its messages for "
                f"{COUNT_DEADLINE_SECONDS:.0f} s (a quorum queue whose leader is busy "
                "or unavailable?); try again when the cluster is healthy"
            )
        log.debug("%s: a slow zero count (%.2f s); asking again", where, answered_in)


def queue_is_empty(cluster_name: str, cluster: ClusterConfig, vhost: str, queue: str) -> bool:
    """Whether the queue holds no ready message, by basic.get (then requeued).

    A get goes through the queue itself (a quorum queue's log) and waits for a busy
    leader, so unlike a count it never says empty when the queue is not. The
    requeued message is marked redelivered (and a quorum queue counts a delivery):
    only for rmq-spark's own helper queues, just before deleting them.
    """
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="emptiness check")
    try:
        channel = connection.channel()
        method, _properties, _body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            return True
        channel.basic_nack(method.delivery_tag, requeue=True)
        return False
    finally:
        if connection.is_open:
            connection.close()
