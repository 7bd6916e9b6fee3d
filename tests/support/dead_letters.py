"""A real dead-letter queue, filled by the broker itself: rejections and expirations.

Three origin queues dead-letter into one DLQ through a fanout dead-letter exchange:

- `orders` and `payments`: a consumer takes each message and rejects it (requeue=false);
- `invoices`: each message is published with a per-message TTL and expires unread.

Messages go in through a direct exchange `shop` (routing key = the queue's name), with
property blocks built by the independent encoder (`amqp_encoding`), headers of several
AMQP types and a `tenant` header alternating `acme` / `globex`. They are dead-lettered one
origin queue after the other, so the DLQ holds orders', then invoices', then payments'.
One more message is published straight to the DLQ, with no `x-death`.

`Published` keeps what each message was published with, for the independent consumer's
comparison after the redrive. The DLQ's order is `dead_letter_order`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.transfer.amqp091 import wire
from tests.support import amqp_encoding as amqp

EXCHANGE = "shop"
DEAD_LETTER_EXCHANGE = "shop.dlx"
REJECTING = ("orders", "payments")
EXPIRING = "invoices"
ORIGINS = (*REJECTING, EXPIRING)
TENANTS = ("acme", "globex")
EXPIRATION_MS = "20"
STRAY_ID = "stray"
# Longest wait for the broker to dead-letter what the harness asked it to.
SETTLE_SECONDS = 30.0


@dataclass(frozen=True)
class Published:
    """One message as the harness published it, and why the broker dead-lettered it."""

    message_id: str
    origin: str | None  # None: published straight to the DLQ, no x-death
    reason: str | None
    tenant: str
    properties: bytes
    body: bytes


def _properties(message_id: str, tenant: str, index: int, expiration: str | None) -> bytes:
    headers = amqp.table_bytes(
        ("tenant", amqp.long_string(tenant)),
        ("attempt", amqp.short(index)),
        ("ratio", amqp.float32(0.5)),
        ("amount", amqp.decimal(2, 1999 + index)),
        ("created", amqp.timestamp(1_700_000_000 + index)),
        ("urgent", amqp.boolean(index % 3 == 0)),
        ("trace", amqp.array(amqp.long_string(f"t-{index}"), amqp.long_int(index))),
    )
    return amqp.BasicProperties(
        content_type="application/json",
        headers=headers,
        delivery_mode=2,
        priority=3,
        correlation_id=f"corr-{message_id}",
        expiration=expiration,
        message_id=message_id,
        timestamp=1_700_000_000,
        type="shop.event",
        app_id="harness",
    ).encode()


def _publish(channel: Any, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
    channel.basic_publish(
        exchange, routing_key, body, properties=wire.ForwardedProperties(properties)
    )


def _depth(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def _wait_depth(channel: Any, queue: str, expected: int, connection: Any) -> None:
    deadline = time.monotonic() + SETTLE_SECONDS
    while (found := _depth(channel, queue)) != expected:
        if found > expected or time.monotonic() > deadline:
            raise AssertionError(f"{queue}: expected {expected} messages, found {found}")
        connection.process_data_events(time_limit=0.05)


def make_dead_letters(
    node: LocalNode,
    vhost: str,
    dlq: str,
    *,
    per_queue: int,
    dlq_arguments: dict[str, Any] | None = None,
) -> list[Published]:
    """Declare the topology, publish `per_queue` messages to each origin queue, let the
    broker dead-letter all of them, add one stray; the DLQ's messages in its order."""
    wire.install()
    connection = node.connect(vhost)
    published: list[Published] = []
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare(EXCHANGE, "direct", durable=True)
        channel.exchange_declare(DEAD_LETTER_EXCHANGE, "fanout", durable=True)
        channel.queue_declare(dlq, durable=True, arguments=dlq_arguments)
        channel.queue_bind(dlq, DEAD_LETTER_EXCHANGE)
        for origin in ORIGINS:
            channel.queue_declare(
                origin, durable=True, arguments={"x-dead-letter-exchange": DEAD_LETTER_EXCHANGE}
            )
            channel.queue_bind(origin, EXCHANGE, routing_key=origin)
        for origin in ORIGINS:
            expiring = origin == EXPIRING
            reason = "expired" if expiring else "rejected"
            before = _depth(channel, dlq)
            batch = []
            for i in range(per_queue):
                message_id = f"{origin}-{i}"
                tenant = TENANTS[i % len(TENANTS)]
                properties = _properties(message_id, tenant, i, EXPIRATION_MS if expiring else None)
                body = f'{{"id": "{message_id}", "n": {i}}}'.encode()
                batch.append(Published(message_id, origin, reason, tenant, properties, body))
                _publish(channel, EXCHANGE, origin, properties, body)
            if not expiring:
                _reject_all(channel, origin, per_queue)
            _wait_depth(channel, dlq, before + per_queue, connection)
            published.extend(batch)
        stray = _properties(STRAY_ID, TENANTS[0], 0, None)
        _publish(channel, "", dlq, stray, b"{}")
        published.append(Published(STRAY_ID, None, None, TENANTS[0], stray, b"{}"))
        _wait_depth(channel, dlq, len(published), connection)
    finally:
        connection.close()
    return published


def _reject_all(channel: Any, queue: str, count: int) -> None:
    """A consumer that rejects each message without requeueing it, in queue order."""
    rejected = 0

    def on_message(ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
        nonlocal rejected
        ch.basic_reject(method.delivery_tag, requeue=False)
        rejected += 1
        if rejected == count:
            ch.stop_consuming()

    channel.basic_qos(prefetch_count=1)  # one at a time: they die in queue order
    channel.basic_consume(queue, on_message)
    channel.start_consuming()  # until the last reject; stop_consuming cancels the consumer


def read_queue(node: LocalNode, vhost: str, queue: str) -> list[tuple[bytes, bytes]]:
    """Independent consumer: every message of `queue` as (exact property bytes, body), in
    order, acked. It consumes (never basic.get, which a quorum queue answers re-encoded)."""
    wire.install()
    connection = node.connect(vhost)
    found: list[tuple[bytes, bytes]] = []
    try:
        channel = connection.channel()
        expected = _depth(channel, queue)
        if not expected:
            return found
        channel.basic_qos(prefetch_count=100)
        for method, properties, body in channel.consume(queue, inactivity_timeout=SETTLE_SECONDS):
            if method is None:
                raise AssertionError(f"{queue}: {len(found)} of {expected} messages arrived")
            found.append((wire.wire_bytes(properties), body))
            channel.basic_ack(method.delivery_tag)
            if len(found) == expected:
                break
        channel.cancel()
    finally:
        connection.close()
    return found


def queue_arguments(kind: str) -> dict[str, Any]:
    """The DLQ's declare arguments for a classic or a quorum DLQ."""
    return {"x-queue-type": kind}
