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

A queue with another consumer is waited for until it has none: the count a declare gives
is of ready messages only, so what another consumer holds unacked would be left out of
the read, and a redrive would plan (or skip) without it. The usual such consumer is an
interrupted redrive's own, whose messages come back when the broker closes its
connection: at once for a killed process, within two heartbeats for a vanished host.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from pika.adapters.blocking_connection import BlockingChannel

from rmq_spark.broker.connection import HEARTBEAT_SECONDS, blocking_connection
from rmq_spark.config import ClusterConfig
from rmq_spark.errors import DiscoveryError
from rmq_spark.transfer.amqp091 import wire

log = logging.getLogger(__name__)

# Longest wait for the next of the messages the depth promised (a queue emptied by another
# consumer meanwhile ends the read early, with what was read).
_QUIET_SECONDS = 10.0
# Longest wait for another consumer of the queue to go: the broker closes a vanished
# host's connection after two missed heartbeats.
OTHER_READER_SECONDS = 2.0 * HEARTBEAT_SECONDS
# How often the queue is asked whether its other consumers have gone.
_POLL_SECONDS = 0.2


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
        depth = _depth_with_no_other_reader(channel, cluster_name, vhost, queue)
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


def _depth_with_no_other_reader(
    channel: BlockingChannel, cluster_name: str, vhost: str, queue: str
) -> int:
    """The queue's depth once no consumer holds any of its messages (module doc).

    Raises DiscoveryError naming the queue when it still has consumers after
    OTHER_READER_SECONDS."""
    deadline = time.monotonic() + OTHER_READER_SECONDS
    ok = channel.queue_declare(queue, passive=True).method
    if ok.consumer_count:
        log.info(
            "%s vhost %r queue %r: %d other consumer(s); waiting up to %.0f s for them to go",
            cluster_name,
            vhost,
            queue,
            ok.consumer_count,
            OTHER_READER_SECONDS,
        )
    while ok.consumer_count:
        if time.monotonic() > deadline:
            raise DiscoveryError(
                f"cluster {cluster_name} vhost {vhost!r} queue {queue!r}: "
                f"{ok.consumer_count} other consumer(s) still read it after "
                f"{OTHER_READER_SECONDS:.0f} s; the messages they hold cannot be read or "
                "moved. Stop them (an interrupted redrive's go when its connection closes) "
                "and run again; nothing was moved"
            )
        time.sleep(_POLL_SECONDS)
        ok = channel.queue_declare(queue, passive=True).method
    return int(ok.message_count)
