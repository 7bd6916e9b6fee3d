"""A benchmark's own view of its queues, independent of the mover it measures: a node as
the `ClusterConfig` a mover takes, a queue's exact depth, and every message of a queue
read back in order.

Depths are AMQP passive declares (exact, unlike the management API's sampled
counters). The reader takes what it reads (acked), as the checks after a timing do.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import SecretStr

from rmq_spark.config import ClusterConfig
from rmq_spark.devtools.local_brokers import LocalNode

# How long the reader waits for the next message before it stops short.
READ_TIMEOUT_SECONDS = 30
READ_PREFETCH = 2000


def cluster(node: LocalNode) -> ClusterConfig:
    """The node as a config's cluster (its admin user)."""
    return ClusterConfig(
        amqp=[node.amqp_uri],
        management=node.management_url,
        username=node.username,
        password=SecretStr(node.password),
    )


def depth(node: LocalNode, vhost: str, queue: str) -> int:
    connection = node.connect(vhost)
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def bodies(node: LocalNode, vhost: str, queue: str) -> Iterator[bytes]:
    """Every message's body in delivery order, taken: as many as a passive declare
    counts when the read starts (fewer when none comes for READ_TIMEOUT_SECONDS)."""
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        expected = int(channel.queue_declare(queue, passive=True).method.message_count)
        channel.basic_qos(prefetch_count=READ_PREFETCH)
        if expected:
            arriving = channel.consume(queue, inactivity_timeout=READ_TIMEOUT_SECONDS)
            for read, (method, _properties, body) in enumerate(arriving, start=1):
                if method is None:
                    break
                channel.basic_ack(method.delivery_tag, multiple=True)
                yield body
                if read == expected:
                    break
            channel.cancel()
    finally:
        connection.close()
