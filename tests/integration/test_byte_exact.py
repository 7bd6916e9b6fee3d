"""Messages arrive byte for byte: every AMQP field type, every basic property, any body.

The property blocks are built by hand (`amqp_encoding`), so they carry the wire types
a Java or .NET client writes (short ints, unsigned types, 32-bit floats...), not the
ones pika's encoder would pick, and are published with `wire.ForwardedProperties`,
which makes pika send them unchanged. After the transfer the destination is read by
a consumer that keeps the raw content-header bytes, and compared byte for byte.

What proves *rmq-spark* changes nothing is the comparison with what the SOURCE broker
delivers: every message is also published to a reference queue on the same node and
read back raw first. What RabbitMQ 3.10.8 itself does to property bytes (measured
with these blocks; the first test asserts the classic-queue part):

* Classic queues deliver the exact bytes that were published: every type tag
  (including 'L', which RabbitMQ would write back as 'l'), repeated table names,
  non-UTF-8 names and strings, a boolean octet of 2.
* Quorum queues re-encode the properties of a redelivery (and of every basic.get,
  first ones included): they add an `x-delivery-count` header (type 'l'), sort the
  table by name and write 'L' as 'l'. A first delivery to a consumer, which is what
  the mover is, keeps the published bytes. rmq-spark forwards whatever the source
  delivered; the second test checks that with redelivered messages. (The readers
  here consume, never basic.get, for that reason.)
* 4.0.5 and 4.3.6 (from 3.13 on RabbitMQ keeps messages in its own container format
  and writes 0-9-1 properties anew on delivery, headers sorted by name) deliver
  other bytes than these blocks were published with, from classic queues too. So
  byte-exact means, on every version (each runs here against itself): what the source
  delivered (read from the reference queue) is what the destination delivers, and
  what the ledger's checksums are over. Bodies are never changed; the tests check
  that the destination's re-encoding of the re-encoded bytes changes nothing. 4.3
  marks a redelivery after a nack with `x-acquired-count` instead of
  `x-delivery-count` (which it adds after a reject).
* A `BCC` header is removed at publish (the table is then re-encoded); none is used here.
* Refused at publish, with connection error 541 INTERNAL_ERROR: any other type tag
  ('U', which pika reads as a short int, or unknown ones), NaN or infinite
  floats and doubles, a property-flags continuation bit. A `user_id` other than the
  publishing user is refused with channel error 406, so the mover's user on the
  destination must be the one named in user_id.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from rmq_spark.config import load_config
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION
from rmq_spark.ledger import tables
from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.amqp091 import wire
from rmq_spark.transfer.executor import ExecutorSettings, move_queue
from tests.support import amqp_encoding as amqp
from tests.support.brokers import Brokers, depth, fresh_vhost, write_config

KIB, MIB = 1 << 10, 1 << 20
# An hour: nothing may expire while the test runs.
EXPIRATION_MS = "3600000"
# Longest wait for the next message when reading a queue back.
READ_TIMEOUT = 30.0


@dataclass(frozen=True)
class Message:
    label: str
    properties: bytes
    body: bytes
    ledger_message_id: str | None  # what the ledger's message_id column must say


def full_properties(node: LocalNode, message_id: str, headers: bytes) -> bytes:
    """Every basic property set (user_id must be the publishing user)."""
    return amqp.BasicProperties(
        content_type="application/octet-stream",
        content_encoding="identity",
        headers=headers,
        delivery_mode=2,
        priority=7,
        correlation_id=f"corr-{message_id}",
        reply_to="replies",
        expiration=EXPIRATION_MS,
        message_id=message_id,
        timestamp=1_700_000_000,
        type="order.created",
        user_id=node.username,
        app_id="a-java-app",
        cluster_id="legacy-cluster",
    ).encode()


def every_type_headers() -> bytes:
    return amqp.table_bytes(*amqp.one_of_every_type())


def messages(node: LocalNode) -> list[Message]:
    """Bodies from empty to 16 MiB, each with every type; plus blocks pika cannot decode."""
    bodies = random.Random(20240601)
    sized = [
        ("empty body", b""),
        ("1 byte", b"\x00"),
        ("every byte value", bytes(range(256))),
        ("1 KiB", bodies.randbytes(KIB)),
        ("1 MiB", bodies.randbytes(MIB)),
        ("16 MiB", bodies.randbytes(16 * MIB)),
    ]
    result = [
        Message(label, full_properties(node, f"m-{i}", every_type_headers()), body, f"m-{i}")
        for i, (label, body) in enumerate(sized)
    ]
    undecodable = amqp.table_bytes(
        ("after year 9999", amqp.timestamp(2**64 - 1)),
        ("1200 deep", amqp.nested_tables(1200)),
    )
    odd = amqp.table_bytes(
        ("k", amqp.short(1)),
        ("k", amqp.long_string("the same name again")),
        (b"\xffname", amqp.long_string(b"\xff\x00not utf-8")),
        ("flag", amqp.boolean_octet(2)),
    )
    return [
        *result,
        Message(
            "headers pika cannot decode",
            full_properties(node, "m-undecodable", undecodable),
            b"{}",
            "m-undecodable",
        ),
        Message(
            "what a dict cannot hold, non-UTF-8 message id",
            amqp.BasicProperties(headers=odd, message_id=b"\xfe\xffid").encode(),
            b"\xfe\xff",
            "\\xfe\\xffid",
        ),
        Message("no properties at all", amqp.BasicProperties().encode(), b"bare", None),
    ]


def declare(node: LocalNode, brokers: Brokers, vhost: str, *queues: str, kind: str) -> None:
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
    finally:
        connection.close()


def publish_raw(
    brokers: Brokers, vhost: str, queues: tuple[str, ...], batch: list[Message]
) -> None:
    """Publish each message's exact bytes to each queue (confirmed), on dr."""
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for message in batch:
            for queue in queues:
                channel.basic_publish(
                    "",
                    queue,
                    message.body,
                    properties=wire.ForwardedProperties(message.properties),
                    mandatory=True,
                )
    finally:
        connection.close()


def read_raw(
    brokers: Brokers, node: LocalNode, vhost: str, queue: str, count: int
) -> list[tuple[bytes, bytes]]:
    """Consume `count` messages in order (as the mover does, not basic.get), acking them;
    (exact property bytes, body) per message."""
    wire.install()
    found: list[tuple[bytes, bytes]] = []
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for method, properties, body in channel.consume(queue, inactivity_timeout=READ_TIMEOUT):
            if method is None:
                break  # fewer than expected; the caller's comparison says which
            found.append((wire.wire_bytes(properties), body))
            channel.basic_ack(method.delivery_tag)
            if len(found) == count:
                break
        channel.cancel()
    finally:
        if connection.is_open:
            connection.close()
    return found


def requeue_once(brokers: Brokers, vhost: str, queue: str, count: int) -> None:
    """Take `count` messages and give them back (nack, requeue) exactly once each.

    basic.get, not a consumer: a consumer would get the requeued messages again at once,
    and whether that second delivery is then returned by a cancel or by the channel's
    close (which 4.3 counts in x-delivery-count, unlike a nack) would be a race.
    """
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        last_tag = None
        for taken in range(count):
            method, _, _ = channel.basic_get(queue, auto_ack=False)
            assert method is not None, f"only {taken} of {count} messages were there"
            last_tag = method.delivery_tag
        channel.basic_nack(last_tag, multiple=True, requeue=True)
    finally:
        connection.close()


def transfer(
    brokers: Brokers, vhost: str, tmp_path: Path, run_id: str, batch: list[Message]
) -> tuple[MoveOutcome, pa.Table]:
    """Move queue 'orders' with the executor's entry point (no Spark); outcome and ledger."""
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger")
    )
    tables.ensure_tables(config.ledger.path)
    settings = ExecutorSettings(
        run_id=run_id,
        ledger_path=config.ledger.path,
        clusters=dict(config.clusters),
        window_messages=100,
        window_bytes=64 * MIB,
    )
    row = {
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": "orders",
        "destination_cluster": "main",
        "destination_vhost": vhost,
        "destination_queue": "orders",
        "messages": len(batch),
        "message_bytes": sum(len(m.body) for m in batch),
    }
    outcome = move_queue(row, settings, "local")
    tables.commit_run(config.ledger.path, run_id)
    ledger = tables.read_arrow(config.ledger.path, "messages")
    return outcome, ledger.sort_by("position")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_classic_queue_messages_arrive_as_the_source_delivered_them(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "byte-exact")
    batch = messages(brokers.dr)
    declare(brokers.dr, brokers, vhost, "orders", "reference", kind="classic")
    declare(brokers.main, brokers, vhost, "orders", kind="classic")
    publish_raw(brokers, vhost, ("orders", "reference"), batch)
    published = [(m.properties, m.body) for m in batch]
    delivered_by_source = read_raw(brokers, brokers.dr, vhost, "reference", len(batch))

    outcome, ledger = transfer(brokers, vhost, tmp_path, "exact-1", batch)
    arrived = read_raw(brokers, brokers.main, vhost, "orders", len(batch))

    assert (outcome.status, outcome.error) == ("moved", None)
    assert outcome.messages == len(batch)
    assert depth(brokers.dr, vhost, "orders") == 0
    if brokers.dr.version == HOST_VERSION:
        assert delivered_by_source == published  # classic queues keep the bytes (see above)
    else:
        # The premise on 4.x: the source re-encodes on delivery, so "byte-exact" can
        # only mean "as the source delivered it" (see above).
        assert [p for p, _ in delivered_by_source] != [p for p, _ in published]
    assert [body for _, body in delivered_by_source] == [body for _, body in published]
    assert len(arrived) == len(batch)
    for message, (properties, body), (sent_properties, sent_body) in zip(
        batch, arrived, delivered_by_source, strict=True
    ):
        assert properties == sent_properties, message.label
        assert body == sent_body, message.label
    assert ledger.column("position").to_pylist() == list(range(len(batch)))
    assert ledger.column("properties_sha256").to_pylist() == [
        sha256(p) for p, _ in delivered_by_source
    ]
    assert ledger.column("body_sha256").to_pylist() == [sha256(b) for _, b in published]
    assert ledger.column("body_size").to_pylist() == [len(b) for _, b in published]
    assert ledger.column("message_id").to_pylist() == [m.ledger_message_id for m in batch]
    assert not any(ledger.column("redelivered").to_pylist())


def test_quorum_redeliveries_are_forwarded_as_the_source_delivered_them(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    """A quorum queue re-encodes a redelivery's properties; rmq-spark forwards those bytes."""
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "byte-exact-quorum")
    batch = [
        Message(
            "every type",
            full_properties(brokers.dr, "q-0", every_type_headers()),
            bytes(range(256)),
            "q-0",
        ),
        Message("no properties at all", amqp.BasicProperties().encode(), b"", None),
    ]
    declare(brokers.dr, brokers, vhost, "orders", "reference", kind="quorum")
    declare(brokers.main, brokers, vhost, "orders", kind="classic")
    publish_raw(brokers, vhost, ("orders", "reference"), batch)
    for queue in ("orders", "reference"):
        requeue_once(brokers, vhost, queue, len(batch))
    delivered_by_source = read_raw(brokers, brokers.dr, vhost, "reference", len(batch))

    outcome, ledger = transfer(brokers, vhost, tmp_path, "exact-q1", batch)
    arrived = read_raw(brokers, brokers.main, vhost, "orders", len(batch))

    # The premise: the source broker delivers bytes other than the published ones. A
    # nack with requeue counts as a delivery up to 4.0; 4.3 counts it as an acquisition
    # (x-delivery-count is then kept for rejects and lost sessions, which it limits).
    counted = b"x-acquired-count" if brokers.dr.version == "4.3" else b"x-delivery-count"
    assert all(counted in properties for properties, _ in delivered_by_source)
    assert (outcome.status, outcome.error) == ("moved", None)
    assert depth(brokers.dr, vhost, "orders") == 0
    assert arrived == delivered_by_source
    assert ledger.column("properties_sha256").to_pylist() == [
        sha256(properties) for properties, _ in delivered_by_source
    ]
    assert ledger.column("message_id").to_pylist() == ["q-0", None]
    assert all(ledger.column("redelivered").to_pylist())
