"""Reading a queue without taking anything from it: what `rmq-spark redrive --dry-run` sees.

A consumer with manual acks reads the messages present when it starts (the queue's depth
then, so messages published meanwhile are not waited for), never acks one, and closes its
channel: the broker puts every unacked message back where it was. Neither `basic.get` with
a reject nor the management API's "get messages" (which is the same on the broker side) is
used: each of those returns messages one by one through a reject with requeue.

What a read costs (docs/redrive.md, "Dry run"): a classic queue keeps its order and its
messages unchanged. A quorum queue keeps its order too
(tests/integration/test_redrive.py), but counts each return: `x-delivery-count` + 1
on 3.10, `x-acquired-count` + 1 (and a rising `x-delivery-count`) on 4.3.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from rmq_spark.broker.connection import blocking_connection
from rmq_spark.config import ClusterConfig
from rmq_spark.transfer.amqp091 import wire

log = logging.getLogger(__name__)

# Longest wait for the next of the messages the depth promised (a queue emptied by another
# consumer meanwhile ends the read early, with what was read).
_QUIET_SECONDS = 10.0


def peek(
    cluster_name: str,
    cluster: ClusterConfig,
    vhost: str,
    queue: str,
    *,
    batch: int = 1000,
) -> Iterator[list[tuple[bool, bytes, bytes]]]:
    """The queue's messages in batches of (redelivered, property bytes, body), in order;
    none is acked, and all are back in the queue when the iterator is closed or ends."""
    wire.install()
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="redrive dry run")
    try:
        channel = connection.channel()
        depth = int(channel.queue_declare(queue, passive=True).method.message_count)
        if not depth:
            return
        channel.basic_qos(prefetch_count=depth if depth <= 65535 else 0)  # 0: no limit
        pending: list[tuple[bool, bytes, bytes]] = []
        seen = 0
        deliveries = channel.consume(queue, auto_ack=False, inactivity_timeout=_QUIET_SECONDS)
        for seen, (method, properties, body) in enumerate(deliveries):
            if method is None:
                log.warning(
                    "%s vhost %r queue %r: %d of %d messages read; the rest went elsewhere",
                    cluster_name,
                    vhost,
                    queue,
                    seen,
                    depth,
                )
                break
            pending.append((bool(method.redelivered), wire.wire_bytes(properties), body))
            if len(pending) >= batch:
                yield pending
                pending = []
            if seen + 1 >= depth:
                break
        if pending:
            yield pending
    finally:
        connection.close()  # unacked messages go back to the queue, in their places
