"""A parked queue's fixtures, shared by test_park and the replay tests: the queue, how it
is filled (pika, through a direct exchange, test messages every version delivers
unchanged), what was published, a config whose one route parks it, and an independent
consumer that reads a queue the rows were replayed into."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from rmq_spark.config import JobConfig, load_config
from rmq_spark.devtools.demo import wait_for_depth
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.transfer.amqp091 import wire
from tests.support.brokers import Brokers, Transactions, take_all, write_config
from tests.support.faults import key_ordered_messages

QUEUE = "orders.parked"
EXCHANGE = "orders-in"
ROUTING_KEY = "order.created"


def seed(node: LocalNode, vhost: str, count: int) -> None:
    """`count` key-ordered demo messages, published through a direct exchange."""
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        channel.exchange_declare(EXCHANGE, "direct", durable=True)
        channel.queue_declare(QUEUE, durable=True)
        channel.queue_bind(QUEUE, EXCHANGE, ROUTING_KEY)
        with Transactions(channel) as publish:
            for message in key_ordered_messages(vhost, QUEUE, count):
                publish(EXCHANGE, ROUTING_KEY, message.body, message.properties, mandatory=True)
        wait_for_depth(channel, QUEUE, count)
    finally:
        connection.close()


def published(vhost: str, count: int) -> list[dict[str, Any]]:
    """What was published, in order: checksums of the body and the property bytes."""
    return [
        {
            "body_sha256": hashlib.sha256(m.body).hexdigest(),
            "properties_sha256": hashlib.sha256(b"".join(m.properties.encode())).hexdigest(),
            "message_id": m.properties.message_id,
            "tenant": (m.properties.headers or {})["tenant"],
        }
        for m in key_ordered_messages(vhost, QUEUE, count)
    ]


def park_config(
    tmp_path: Path, brokers: Brokers, vhost: str, *, queue: str = QUEUE, **route: Any
) -> JobConfig:
    """The config (written to tmp_path/job.yaml) whose one route parks `queue` of `vhost`
    on the dr node; `park` and `ledger` set those sections, the rest update the route."""
    path = write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    park = route.pop("park", None)
    ledger = route.pop("ledger", None)
    raw["routes"][0]["destination"] = {"table": "parked"}
    raw["routes"][0]["source"]["queues"] = [queue]
    del raw["routes"][0]["source"]["queue_pattern"]
    raw["routes"][0].update(route)
    if park is not None:
        raw["park"] = park
    if ledger is not None:
        raw["ledger"] = ledger
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(path)


def read_queue(node: LocalNode, vhost: str, queue: str) -> list[dict[str, Any]]:
    """Independent consumer: the queue's messages in order (taken), with the sha256 of
    the exact property bytes and of the body."""
    wire.install()
    found: list[dict[str, Any]] = []
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for properties, body in take_all(channel, queue):
            found.append(
                {
                    "body_sha256": hashlib.sha256(body).hexdigest(),
                    "properties_sha256": hashlib.sha256(wire.wire_bytes(properties)).hexdigest(),
                    "message_id": properties.message_id,
                }
            )
    finally:
        connection.close()
    return found
