"""Declaring destination queues over AMQP (driver side, after pre-flight passed).

The management API names a queue in its URL path, and a path segment `.` or `..` is
removed before the broker sees it (RFC 3986 dot segments: `PUT /api/queues/%2F/.`
arrives as `PUT /api/queues/%2F/`, HTTP 405), so queues of those names could not be
created through it. `queue.declare` carries the name as a field: any legal name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pika.exceptions

from rmq_spark.broker.connection import blocking_connection
from rmq_spark.config import ClusterConfig
from rmq_spark.errors import AccessRefusedError, DestinationIncompatibleError, RmqSparkError

log = logging.getLogger(__name__)

# AMQP reply codes (AMQP 0-9-1 spec, "Constants").
ACCESS_REFUSED = 403


@dataclass(frozen=True)
class QueueDeclaration:
    """A queue to create: the same name, durability and arguments on every node."""

    name: str
    durable: bool
    arguments: Mapping[str, Any] = field(default_factory=dict)


def declare_queues(
    cluster_name: str, cluster: ClusterConfig, vhost: str, queues: Sequence[QueueDeclaration]
) -> dict[str, RmqSparkError]:
    """Declare each queue on one connection to the vhost; what the broker refused, by name.

    Declaring a queue that exists with the same definition is a no-op. A refusal
    (406 PRECONDITION_FAILED, 403 ACCESS_REFUSED, a connection closed with 541 ...) is
    returned as the error naming the queue and the broker's reason, and the other
    queues are still declared (a fresh channel, or connection, replaces a closed one).
    Raises AccessRefusedError or BrokerUnreachableError when the vhost does not open.
    """
    refused: dict[str, RmqSparkError] = {}
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="declare")
    try:
        channel = connection.channel()
        for queue in queues:
            try:
                channel.queue_declare(
                    queue.name,
                    durable=queue.durable,
                    auto_delete=False,
                    arguments=dict(queue.arguments),
                )
            except pika.exceptions.ChannelClosedByBroker as exc:
                refused[queue.name] = _refusal(
                    cluster_name, vhost, queue, exc.reply_code, exc.reply_text
                )
                channel = connection.channel()
            except pika.exceptions.ConnectionClosedByBroker as exc:
                # Some refusals close the whole connection (4.3: a denied deprecated
                # feature such as x-queue-master-locator, 541 INTERNAL_ERROR).
                refused[queue.name] = _refusal(
                    cluster_name, vhost, queue, exc.reply_code, exc.reply_text
                )
                connection = blocking_connection(cluster_name, cluster, vhost, purpose="declare")
                channel = connection.channel()
            else:
                log.debug("cluster %s vhost %r queue %r: declared", cluster_name, vhost, queue.name)
    finally:
        if connection.is_open:
            connection.close()
    return refused


def _refusal(
    cluster_name: str, vhost: str, queue: QueueDeclaration, code: int, text: str
) -> RmqSparkError:
    where = f"cluster {cluster_name} vhost {vhost!r} queue {queue.name!r}"
    wanted = (
        f"expected to create it {'durable' if queue.durable else 'transient'} with arguments "
        f"{dict(queue.arguments)}"
    )
    kind = AccessRefusedError if code == ACCESS_REFUSED else DestinationIncompatibleError
    return kind(f"{where}: missing, and the broker refused to declare it ({code} {text}); {wanted}")


@dataclass(frozen=True)
class QueueBinding:
    """A binding from an exchange to a queue, as queue.bind takes it."""

    exchange: str
    queue: str
    routing_key: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


def bind_queues(
    cluster_name: str, cluster: ClusterConfig, vhost: str, bindings: Sequence[QueueBinding]
) -> None:
    """Bind each queue on one connection to the vhost (binding twice is a no-op).

    Over AMQP for the same reason as the declares: any legal queue name. Raises the
    first refusal, naming the queue, the exchange and the broker's reason.
    """
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="bind")
    try:
        channel = connection.channel()
        for binding in bindings:
            try:
                channel.queue_bind(
                    binding.queue,
                    binding.exchange,
                    routing_key=binding.routing_key,
                    arguments=dict(binding.arguments),
                )
            except (
                pika.exceptions.ChannelClosedByBroker,
                pika.exceptions.ConnectionClosedByBroker,
            ) as exc:
                kind = (
                    AccessRefusedError
                    if exc.reply_code == ACCESS_REFUSED
                    else DestinationIncompatibleError
                )
                raise kind(
                    f"cluster {cluster_name} vhost {vhost!r} queue {binding.queue!r}: the broker "
                    f"refused to bind it to exchange {binding.exchange!r} with routing key "
                    f"{binding.routing_key!r} ({exc.reply_code} {exc.reply_text}); expected "
                    "the binding its source has"
                ) from exc
    finally:
        if connection.is_open:
            connection.close()
