"""origin: the queue a dead-lettered message goes back to is its newest x-death entry's."""

from __future__ import annotations

from rmq_spark.redrive.origin import death_entries, origin
from rmq_spark.selection.fields import read_properties
from tests.support import amqp_encoding as amqp


def _properties(*entries: amqp.Value, summary: str | None = None) -> bytes:
    headers: list[tuple[str, amqp.Value]] = [("x-death", amqp.array(*entries))]
    if summary:
        # A wrong summary (rabbitmq-server #15385): it must not be read.
        headers.append(("x-first-death-queue", amqp.long_string(summary)))
    return amqp.BasicProperties(headers=amqp.table_bytes(*headers)).encode()


def test_the_newest_entry_is_the_origin_whatever_the_summaries_say() -> None:
    raw = _properties(
        amqp.death_entry("payments", "rejected", "pay.new", "cc.audit"),
        amqp.death_entry("orders", "expired", "orders.new", expiration="60000"),
        summary="invoices",
    )
    found = origin(read_properties(raw), "shop.dlq")
    assert found is not None
    assert (found.queue, found.reason, found.count) == ("payments", "rejected", 2)
    assert (found.exchange, found.routing_key) == ("shop", "pay.new")
    assert found.routing_keys == ("pay.new", "cc.audit")


def test_an_entry_naming_the_dlq_itself_is_skipped() -> None:
    raw = _properties(
        amqp.death_entry("shop.dlq", "expired"), amqp.death_entry("orders", "rejected", "o")
    )
    found = origin(read_properties(raw), "shop.dlq")
    assert found is not None
    assert found.queue == "orders"


def test_no_x_death_means_no_origin() -> None:
    plain = amqp.BasicProperties(headers=amqp.table_bytes(("tenant", amqp.short(1)))).encode()
    assert origin(read_properties(plain), "shop.dlq") is None
    assert origin(read_properties(_properties()), "shop.dlq") is None


def test_original_expiration_and_order_are_read_for_every_entry() -> None:
    raw = _properties(
        amqp.death_entry("a", "expired", "a", expiration="500"),
        amqp.death_entry("b", "maxlen", "b"),
    )
    entries = death_entries(read_properties(raw))
    assert [(e.queue, e.reason, e.original_expiration) for e in entries] == [
        ("a", "expired", "500"),
        ("b", "maxlen", None),
    ]


def test_an_entry_without_routing_keys_routes_by_its_queue_name() -> None:
    found = origin(read_properties(_properties(amqp.death_entry("orders", "rejected"))), "dlq")
    assert found is not None
    assert found.routing_key == "orders"
