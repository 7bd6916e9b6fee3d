"""Property bytes pass through pika unchanged (the hook in rmq_spark.transfer.amqp091.wire).

Every block here is built by hand with `tests.amqp_encoding` (pure, no
broker) and goes through pika's real frame decoder and encoder:
`pika.frame.decode_frame` on the way in, `pika.frame.Header.marshal` on the way out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import struct
from decimal import Decimal
from typing import TypedDict

import pytest
from pika import data, exceptions, frame, spec

from rmq_spark.model import Delivery
from rmq_spark.transfer.amqp091 import wire
from rmq_spark.transfer.decisions import KEPT, MOVED, Decision
from tests.support import amqp_encoding as amqp

CHANNEL = 1
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def header_frame(properties: bytes, body_size: int = 3) -> bytes:
    return amqp.header_frame(CHANNEL, body_size, properties)


def decode(properties: bytes) -> wire.WireBasicProperties:
    consumed, decoded = frame.decode_frame(header_frame(properties))
    assert consumed == len(header_frame(properties))
    assert isinstance(decoded, frame.Header)
    assert isinstance(decoded.properties, wire.WireBasicProperties)
    return decoded.properties


def forwarded_frame(properties: wire.WireBasicProperties, body_size: int = 3) -> bytes:
    marshalled: bytes = frame.Header(CHANNEL, body_size, wire.forward(properties)).marshal()
    return marshalled


def with_headers(*items: tuple[str | bytes, amqp.Value]) -> bytes:
    return amqp.BasicProperties(headers=amqp.table_bytes(*items), delivery_mode=2).encode()


def java_client_properties() -> bytes:
    """headers {'n': short-int 7, 'f': float 1.5}, delivery-mode 2, as a Java client sends them."""
    return with_headers(("n", amqp.short(7)), ("f", amqp.float32(1.5)))


# Properties other than headers, every one set; user_id is checked by brokers, not here.
class OtherProperties(TypedDict):
    """Every basic property but headers, as keyword arguments of a BasicProperties."""

    content_type: str
    content_encoding: str
    delivery_mode: int
    priority: int
    correlation_id: str
    reply_to: str
    expiration: str
    message_id: str
    timestamp: int
    type: str
    user_id: str
    app_id: str
    cluster_id: str


ALL_OTHER_PROPERTIES: OtherProperties = {
    "content_type": "application/octet-stream",
    "content_encoding": "gzip",
    "delivery_mode": 2,
    "priority": 9,
    "correlation_id": "corr-1",
    "reply_to": "replies",
    "expiration": "3600000",
    "message_id": "msg-42",
    "timestamp": 1_700_000_000,
    "type": "order.created",
    "user_id": "rmqspark",
    "app_id": "billing",
    "cluster_id": "legacy",
}


@pytest.fixture(autouse=True)
def installed() -> None:
    wire.install()


# -- every field type RabbitMQ 3.10 accepts ---------------------------------------------

# (value, what pika decodes it to, the type tag pika's encoder writes back)
EVERY_TYPE: dict[str, tuple[amqp.Value, object, bytes]] = {
    "t": (amqp.boolean(True), True, b"t"),
    "b": (amqp.short_short(-5), -5, b"I"),
    "B": (amqp.short_short_unsigned(250), 250, b"I"),
    "s": (amqp.short(-300), -300, b"I"),
    "u": (amqp.short_unsigned(65_000), 65_000, b"I"),
    "I": (amqp.long_int(-70_000), -70_000, b"I"),
    "i": (amqp.long_unsigned(4_000_000_000), 4_000_000_000, b"l"),
    "l": (amqp.long_long(-(2**40)), -(2**40), b"l"),
    "L": (amqp.long_long_upper(2**40), 2**40, b"l"),
    "f": (amqp.float32(1.5), 1, b"l"),  # truncated to an integer
    "d": (amqp.float64(-2.75), -2, b"l"),  # truncated to an integer
    "D": (amqp.decimal(2, 12_300), Decimal("123.00"), b"D"),
    "T": (
        amqp.timestamp(1_700_000_000),
        dt.datetime.fromtimestamp(1_700_000_000, dt.UTC),
        b"T",
    ),
    "S": (amqp.long_string("héllo"), "héllo", b"S"),
    "x": (amqp.byte_array(bytes(range(256))), bytes(range(256)), b"x"),
    "A": (amqp.array(amqp.short(1), amqp.long_string("a")), [1, "a"], b"A"),
    "F": (amqp.table(("n", amqp.short_short(1))), {"n": 1}, b"F"),
    "V": (amqp.void(), None, b"V"),
}

# Blocks whose bytes pika's own encoder writes back unchanged.
PIKA_KEEPS = {"t", "I", "l", "T", "S", "x", "V"}


@pytest.mark.parametrize("tag", sorted(EVERY_TYPE))
def test_every_field_type_is_forwarded_byte_for_byte(tag: str) -> None:
    value, _, _ = EVERY_TYPE[tag]
    raw = with_headers((tag, value))

    properties = decode(raw)

    assert properties.decode_error is None
    assert wire.wire_bytes(properties) == raw
    assert forwarded_frame(properties) == header_frame(raw)


@pytest.mark.parametrize("tag", sorted(EVERY_TYPE))
def test_what_pika_makes_of_each_field_type(tag: str) -> None:
    """Why the bytes are kept: pika's decoded value and the tag it would write back."""
    value, decoded_value, reencoded_tag = EVERY_TYPE[tag]
    raw = with_headers((tag, value))

    properties = decode(raw)
    reencoded = b"".join(spec.BasicProperties.encode(properties))

    assert properties.headers == {tag: decoded_value}
    table = reencoded[2:]  # after the flag word; headers come first here
    assert table[4 + 2 : 4 + 3] == reencoded_tag  # length, key "x" (2 bytes), then the tag
    assert (reencoded == raw) is (tag in PIKA_KEEPS)


def test_pika_alone_would_change_the_wire_types() -> None:
    raw = java_client_properties()
    properties = decode(raw)
    reencoded = b"".join(spec.BasicProperties.encode(properties))
    assert properties.headers == {"n": 7, "f": 1}  # and the float lost its fraction
    assert reencoded != raw


def test_every_type_at_once_with_every_property() -> None:
    items = [(tag, value) for tag, (value, _, _) in EVERY_TYPE.items()]
    nested = amqp.table(*items, ("inner", amqp.array(*(value for _, value in items))))
    raw = amqp.BasicProperties(
        headers=amqp.table_bytes(*items, ("nested", nested)), **ALL_OTHER_PROPERTIES
    ).encode()

    properties = decode(raw)

    assert properties.decode_error is None
    assert wire.wire_bytes(properties) == raw
    assert forwarded_frame(properties) == header_frame(raw)
    assert {name: getattr(properties, name) for name in ALL_OTHER_PROPERTIES} == (
        ALL_OTHER_PROPERTIES
    )


def test_what_a_dict_cannot_hold_is_forwarded_too() -> None:
    """A repeated name, a non-UTF-8 name and long string, a boolean octet of 2."""
    raw = with_headers(
        ("k", amqp.short(1)),
        ("k", amqp.long_string("again")),
        (b"\xffkey", amqp.long_string(b"\xff\x00not utf-8")),
        ("flag", amqp.boolean_octet(2)),
    )

    properties = decode(raw)

    assert properties.headers == {"k": "again", b"\xffkey": b"\xff\x00not utf-8", "flag": True}
    assert forwarded_frame(properties) == header_frame(raw)
    assert b"".join(spec.BasicProperties.encode(properties)) != raw


def test_forwarded_properties_marshal_to_the_original_bytes() -> None:
    raw = java_client_properties()
    outgoing = frame.Header(CHANNEL, 3, wire.forward(decode(raw))).marshal()
    assert outgoing == header_frame(raw)


def test_empty_properties_round_trip() -> None:
    raw = struct.pack(">H", 0)
    _, decoded = frame.decode_frame(header_frame(raw, body_size=0))
    assert wire.wire_bytes(decoded.properties) == raw
    assert frame.Header(CHANNEL, 0, wire.forward(decoded.properties)).marshal() == header_frame(
        raw, 0
    )


def test_properties_not_from_the_wire_are_refused() -> None:
    with pytest.raises(RuntimeError, match="install"):
        wire.wire_bytes(spec.BasicProperties())


# -- blocks pika cannot decode --------------------------------------------------------


UNDECODABLE_HEADERS: dict[str, tuple[amqp.Value, type[Exception]]] = {
    # RabbitMQ 3.10 accepts these; pika raises on them.
    "timestamp after 9999": (amqp.timestamp(253_402_300_800), ValueError),
    "largest timestamp": (amqp.timestamp(2**64 - 1), OverflowError),
    "tables 1200 deep": (amqp.nested_tables(1200), RecursionError),
    "arrays 1200 deep": (amqp.nested_arrays(1200), RecursionError),
    # RabbitMQ refuses this one (connection error 541); it never delivers it.
    "unknown type tag": (amqp.raw_value(b"Z", b""), exceptions.InvalidFieldTypeException),
}


@pytest.mark.parametrize("case", sorted(UNDECODABLE_HEADERS))
def test_pika_alone_cannot_decode(case: str) -> None:
    """Without the fallback these raise inside decode_frame, which kills the connection."""
    value, error = UNDECODABLE_HEADERS[case]
    with pytest.raises(error):
        spec.BasicProperties().decode(with_headers(("bad", value)))


@pytest.mark.parametrize("case", sorted(UNDECODABLE_HEADERS))
def test_undecodable_headers_are_forwarded_and_the_rest_is_read(case: str) -> None:
    raw = amqp.BasicProperties(
        headers=amqp.table_bytes(("ok", amqp.short(1)), ("bad", UNDECODABLE_HEADERS[case][0])),
        **ALL_OTHER_PROPERTIES,
    ).encode()

    properties = decode(raw)

    assert properties.decode_error is not None
    assert "pika could not decode" in properties.decode_error
    assert properties.headers is None
    assert {name: getattr(properties, name) for name in ALL_OTHER_PROPERTIES} == (
        ALL_OTHER_PROPERTIES
    )
    assert forwarded_frame(properties) == header_frame(raw)


def test_the_fallback_reads_what_pika_reads() -> None:
    """Same block, once with decodable headers and once not: same other properties."""
    good = amqp.BasicProperties(
        headers=amqp.table_bytes(("t", amqp.timestamp(1))), **ALL_OTHER_PROPERTIES
    ).encode()
    bad = amqp.BasicProperties(
        headers=amqp.table_bytes(("t", amqp.timestamp(2**64 - 1))), **ALL_OTHER_PROPERTIES
    ).encode()
    by_pika, by_fallback = decode(good), decode(bad)
    for name in ALL_OTHER_PROPERTIES:
        assert getattr(by_fallback, name) == getattr(by_pika, name), name
    assert by_pika.decode_error is None
    assert by_fallback.decode_error is not None


def test_a_truncated_block_keeps_what_was_read_and_says_so() -> None:
    full = amqp.BasicProperties(
        headers=amqp.table_bytes(("bad", amqp.raw_value(b"Z", b""))),
        message_id="m-1",
        app_id="an app id that is cut off",
    ).encode()
    raw = full[:-5]

    properties = decode(raw)

    assert properties.message_id == "m-1"
    assert properties.app_id is None
    assert "truncated" in (properties.decode_error or "")
    assert forwarded_frame(properties) == header_frame(raw)


def test_undecodable_properties_without_headers_still_decode() -> None:
    """Only tables can fail; the flags and short strings around them always decode."""
    raw = amqp.BasicProperties(message_id="m-2", timestamp=2**64 - 1).encode()
    properties = decode(raw)
    assert (properties.message_id, properties.timestamp, properties.decode_error) == (
        "m-2",
        2**64 - 1,
        None,
    )


# -- message_id for the ledger ----------------------------------------------------------


def test_non_utf8_message_id_is_text_with_escapes() -> None:
    raw = amqp.BasicProperties(message_id=b"\xff\xfeid-1").encode()
    properties = decode(raw)
    assert properties.message_id == "\\xff\\xfeid-1"
    assert forwarded_frame(properties) == header_frame(raw)


def test_utf8_message_id_is_unchanged() -> None:
    properties = decode(amqp.BasicProperties(message_id="ünïcode-1").encode())
    assert properties.message_id == "ünïcode-1"


def test_the_encoder_matches_pika_where_pika_has_no_choice() -> None:
    """A sanity check of the test encoder itself: pika writes the same bytes for these."""
    pieces: list[bytes] = []
    data.encode_table(pieces, {"s": "text", "x": b"\x00", "t": False, "V": None})
    ours = amqp.table_bytes(
        ("s", amqp.long_string("text")),
        ("x", amqp.byte_array(b"\x00")),
        ("t", amqp.boolean(False)),
        ("V", amqp.void()),
    )
    assert b"".join(pieces) == ours
    props = spec.BasicProperties(**ALL_OTHER_PROPERTIES)
    assert b"".join(props.encode()) == amqp.BasicProperties(**ALL_OTHER_PROPERTIES).encode()


# -- publishing from bytes --------------------------------------------------------------

FRAME_MAX_BODY = 131_072 - 8  # RabbitMQ's default frame_max less the frame's own bytes


@pytest.mark.parametrize("size", [0, 1, 1024, FRAME_MAX_BODY, FRAME_MAX_BODY + 1, 300_000])
def test_publish_frames_are_the_bytes_pika_would_send(size: int) -> None:
    body = bytes(index % 251 for index in range(size))
    properties = with_headers(("x-count", amqp.short(7)), ("name", amqp.long_string("é")))
    expected = [
        frame.Method(
            5, spec.Basic.Publish(exchange="", routing_key="q.é", mandatory=True)
        ).marshal(),
        frame.Header(5, size, wire.ForwardedProperties(properties)).marshal(),
    ] + [
        frame.Body(5, body[start : start + FRAME_MAX_BODY]).marshal()
        for start in range(0, size, FRAME_MAX_BODY)
    ]

    frames = wire.PublishFrames(
        5, exchange="", routing_key="q.é", mandatory=True, max_body_frame=FRAME_MAX_BODY
    )

    assert frames.marshal(body, properties) == b"".join(expected)


def test_publish_frames_for_a_batch_are_each_publish_in_order() -> None:
    frames = wire.PublishFrames(
        5, exchange="", routing_key="q", mandatory=True, max_body_frame=FRAME_MAX_BODY
    )
    batch = [(b"a" * size, java_client_properties()) for size in (0, 10, 300_000)]
    deliveries = [
        Delivery(tag, tag, tag, False, len(body), "", "", None, NOW, body=body, properties=props)
        for tag, (body, props) in enumerate(batch, 1)
    ]
    assert frames.marshal_all(deliveries) == b"".join(frames.marshal(*pair) for pair in batch)


def test_a_routed_decision_publishes_through_its_exchange_and_key_a_kept_one_does_not() -> None:
    """A redrive's moved message goes to its origin queue (or the exchange x-death
    recorded); a plain delivery and a kept one go where the link publishes."""
    frames = wire.PublishFrames(
        5, exchange="", routing_key="shop.dlq", mandatory=True, max_body_frame=FRAME_MAX_BODY
    )
    props = java_client_properties()

    def publish(exchange: str, key: str, body: bytes) -> bytes:
        method = spec.Basic.Publish(exchange=exchange, routing_key=key, mandatory=True)
        return b"".join(
            [
                frame.Method(5, method).marshal(),
                frame.Header(5, len(body), wire.ForwardedProperties(props)).marshal(),
                frame.Body(5, body).marshal(),
            ]
        )

    plain, to_origin, to_exchange, kept = (
        Delivery(tag, tag, tag, False, 1, "", "", None, NOW, body=b"m", properties=props)
        for tag in (1, 2, 3, 4)
    )
    to_origin.detail = Decision(MOVED, routing_key="orders", reason="rejected")
    to_exchange.detail = Decision(MOVED, routing_key="eu.orders", exchange="shop")
    kept.decision = KEPT
    kept.detail = Decision(KEPT, reason="not selected")

    assert frames.marshal_all([plain, to_origin, to_exchange, kept, to_origin]) == b"".join(
        [
            publish("", "shop.dlq", b"m"),
            publish("", "orders", b"m"),
            publish("shop", "eu.orders", b"m"),
            publish("", "shop.dlq", b"m"),
            publish("", "orders", b"m"),
        ]
    )


# -- what the mover reads straight from the property bytes -------------------------------


@pytest.mark.parametrize(
    ("message_id", "expected"),
    [("ünïcode-1", "ünïcode-1"), (b"\xff\xfeid-1", "\\xff\\xfeid-1"), (None, None)],
)
def test_message_id_of_reads_what_the_decoder_reads(
    message_id: str | bytes | None, expected: str | None
) -> None:
    raw = amqp.BasicProperties(
        headers=amqp.table_bytes(("n", amqp.short(7))), message_id=message_id, timestamp=5
    ).encode()
    assert wire.message_id_of(raw) == expected == decode(raw).message_id


def test_message_id_of_a_truncated_block_is_none() -> None:
    raw = amqp.BasicProperties(message_id="abcdef").encode()
    assert wire.message_id_of(raw[:-3]) is None


def test_digest_cache_digests_each_block() -> None:
    cache = wire.DigestCache()
    blocks = [b"a", b"a", b"b", b"a", b""]
    assert [cache.digest(block) for block in blocks] == [
        hashlib.sha256(block).hexdigest() for block in blocks
    ]


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        ({"priority": 0}, True),  # set, even to 0: a 4.x quorum queue orders by it
        ({"priority": 9, "headers": {"a": 1}, "message_id": "m"}, True),
        ({"delivery_mode": 2, "headers": {"priority": 9}, "message_id": "m"}, False),
        ({}, False),
    ],
)
def test_the_priority_property_is_read_from_the_flags_word(
    properties: dict[str, object], expected: bool
) -> None:
    raw = b"".join(spec.BasicProperties(**properties).encode())
    assert wire.carries_priority(raw) is expected
