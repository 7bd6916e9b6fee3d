"""Messages for the selection language's tests: every column type, with and without values.

Built byte by byte with tests/support/amqp_encoding.py, the way a Java or .NET client (or
the broker, for x-death) would put them on the wire.
"""

from __future__ import annotations

from rmq_spark.selection import Message
from tests.support import amqp_encoding as amqp


def death(  # noqa: PLR0917 (the fields of one x-death entry, in the broker's order)
    queue: str,
    reason: str,
    count: int,
    time: int,
    routing_keys: tuple[str, ...],
    expiration: str | None = None,
) -> amqp.Value:
    """One x-death entry as RabbitMQ writes it (count a long-long, time a timestamp)."""
    items: list[tuple[str, amqp.Value]] = [
        ("count", amqp.long_long(count)),
        ("reason", amqp.long_string(reason)),
        ("queue", amqp.long_string(queue)),
        ("time", amqp.timestamp(time)),
        ("exchange", amqp.long_string("orders")),
        ("routing-keys", amqp.array(*(amqp.long_string(k) for k in routing_keys))),
    ]
    if expiration is not None:
        items.append(("original-expiration", amqp.long_string(expiration)))
    return amqp.table(*items)


def sample_messages() -> list[Message]:
    """Six messages: typed headers, two x-death histories, none at all, odd bodies."""
    rejected_twice = amqp.array(
        death("orders.eu", "rejected", 2, 1_770_000_100, ("eu.created",)),
        death("orders.delay", "expired", 1, 1_770_000_000, ("eu.created",), "60000"),
    )
    return [
        Message(
            "orders",
            "eu.created",
            False,
            amqp.BasicProperties(
                content_type="application/json",
                headers=amqp.table_bytes(
                    ("tenant", amqp.long_string("acme")),
                    ("retries", amqp.short(3)),
                    ("ratio", amqp.float32(0.5)),
                    ("price", amqp.decimal(2, 1999)),
                    ("due", amqp.timestamp(1_770_000_500)),
                    ("vip", amqp.boolean(True)),
                    ("x-death", rejected_twice),
                ),
                delivery_mode=2,
                priority=5,
                message_id="m-1",
                timestamp=1_770_000_000,
                app_id="shop",
            ).encode(),
            b'{"id": 1, "name": "h\xc3\xa9llo"}',
        ),
        Message(
            "orders",
            "us.created",
            True,
            amqp.BasicProperties(
                headers=amqp.table_bytes(
                    ("tenant", amqp.long_string("globex")),
                    ("retries", amqp.long_long(40_000_000_000)),
                    ("ratio", amqp.float64(2.25)),
                    (
                        "x-death",
                        amqp.array(
                            death(
                                "orders.us",
                                "expired",
                                1,
                                1_770_000_200,
                                ("us.created", "audit"),
                                "5000",
                            )
                        ),
                    ),
                ),
                delivery_mode=1,
                correlation_id="c-9",
                timestamp=1_780_000_000,
            ).encode(),
            b"plain text body",
        ),
        Message("", "orders.eu", False, amqp.BasicProperties().encode(), b""),
        Message(
            "billing",
            "eu.paid",
            False,
            amqp.BasicProperties(
                headers=amqp.table_bytes(
                    ("tenant", amqp.byte_array(b"acme")),
                    ("retries", amqp.long_string("3")),
                    ("nothing", amqp.void()),
                    ("tags", amqp.array(amqp.long_string("a"), amqp.short(1))),
                ),
                type="invoice",
                expiration="1000",
            ).encode(),
            b"\xff\xfe binary",
        ),
        Message(
            "orders",
            "eu.created",
            True,
            amqp.BasicProperties(
                headers=amqp.table_bytes(
                    ("tenant", amqp.long_string("acme")),
                    (
                        "x-death",
                        amqp.array(death("orders.eu", "maxlen", 1, 1_770_000_300, ("eu.created",))),
                    ),
                ),
                priority=0,
                user_id="guest",
            ).encode(),
            b"x" * 300,
        ),
        Message(
            "orders",
            "EU.Created",
            False,
            amqp.BasicProperties(
                content_type="text/plain",
                headers=amqp.table_bytes(("tenant", amqp.long_string("Acme"))),
                reply_to="replies",
                cluster_id="c1",
                content_encoding="utf-8",
            ).encode(),
            "ünïcode".encode(),
        ),
    ]


# Expressions over every column and every construct the language allows, each with the
# messages (indexes into sample_messages()) it selects, worked out by hand.
CASES: list[tuple[str, list[int]]] = [
    ("exchange = 'orders'", [0, 1, 4, 5]),
    ("routing_key LIKE 'eu.%'", [0, 3, 4]),
    ("routing_key ILIKE 'eu.%'", [0, 3, 4, 5]),
    ("routing_key RLIKE '^[a-z]+\\\\.created$'", [0, 1, 4]),
    ("redelivered", [1, 4]),
    ("NOT redelivered AND exchange <> ''", [0, 3, 5]),
    ("content_type = 'application/json' OR content_type IS NULL", [0, 1, 2, 3, 4]),
    ("content_encoding = 'utf-8'", [5]),
    ("delivery_mode = 2", [0]),
    ("priority >= 0", [0, 4]),
    ("priority BETWEEN 1 AND 9", [0]),
    ("correlation_id IN ('c-9', 'c-10')", [1]),
    ("reply_to = 'replies' AND cluster_id = 'c1'", [5]),
    ("expiration = '1000' AND type = 'invoice'", [3]),
    ("message_id = 'm-1' AND app_id = 'shop'", [0]),
    ("user_id = 'guest'", [4]),
    ("timestamp < '2026-05-01 00:00:00'", [0]),
    ("timestamp IS NULL", [2, 3, 4, 5]),
    ("headers['tenant'] = 'acme'", [0, 3, 4]),
    ("lower(headers['tenant']) = 'acme'", [0, 3, 4, 5]),
    ("headers['missing'] IS NULL AND headers['nothing'] IS NULL", [0, 1, 2, 3, 4, 5]),
    ("headers['vip'] = 'true'", [0]),
    ("header_types['tenant'] = 'byte-array'", [3]),
    ("header_types['retries'] = 'short-int'", [0]),
    ("header_ints['retries'] > 1000", [1]),
    ("header_ints['retries'] = 3", [0]),
    ("CAST(headers['retries'] AS INT) = 3", [0, 3]),
    ("CAST(headers['tenant'] AS INT) IS NULL", [0, 1, 2, 3, 4, 5]),
    ("header_floats['ratio'] * 2 = 1.0", [0]),
    ("header_floats['price'] > 19.98 AND header_floats['price'] < 20", [0]),
    ("header_times['due'] > timestamp", [0]),
    ("headers['tags'] LIKE '%\"a\"%'", [3]),
    ("size(x_death) = 2", [0]),
    ("size(x_death) = 0", [2, 3, 5]),
    ("last_death.reason = 'rejected'", [0]),
    ("last_death.queue = 'orders.eu'", [0, 4]),
    ("first_death.reason = 'expired'", [0, 1]),
    ("first_death.original_expiration = '60000'", [0]),
    ("last_death.count + 1 = 3", [0]),
    ("last_death.time >= '2026-02-02 02:43:20'", [1, 4]),
    ("array_contains(last_death.routing_keys, 'audit')", [1]),
    ("last_death.exchange = 'orders' AND last_death.count % 2 = 1", [1, 4]),
    ("x_death[0].queue = 'orders.eu'", [0, 4]),
    ("x_death[1].reason = 'expired'", [0]),
    ("size(filter(x_death, d -> d.reason = 'expired')) > 0", [0, 1]),
    ("body_size > 100", [4]),
    ("body_size - 15 = 0 OR -body_size = 0", [1, 2]),
    ("length(body_text) = 0", [2]),
    ("hex(body) LIKE 'FFFE%'", [3]),
    ("body_text IS NULL", [3]),
    ("contains(body_text, 'héllo')", [0]),
    ("startswith(body_text, 'plain')", [1]),
    ("upper(substring(body_text, 1, 2)) = 'ÜN'", [5]),
    ("concat(exchange, '/', routing_key) = 'billing/eu.paid'", [3]),
    ("coalesce(headers['tenant'], 'none') = 'none'", [2]),
    ("(priority > 3) IS NOT TRUE", [1, 2, 3, 4, 5]),
    ("TRUE", [0, 1, 2, 3, 4, 5]),
    ("NULL", []),
]
