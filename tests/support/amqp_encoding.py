"""A small AMQP 0-9-1 encoder for content-header property blocks, wire type by wire type.

Test-only. It builds the exact bytes a Java or .NET client would put in a content
header, choosing every field-table type tag explicitly; pika's own encoder cannot do
that (it picks 'I', 'l', 'S' or 'x' from the Python type). Publishing those bytes with
`rmq_spark.transfer.amqp091.wire.ForwardedProperties(block)` makes pika send them unchanged.

The grammar is AMQP 0-9-1 section 4.2 with RabbitMQ's errata for field tables (the
tags `rabbit_binary_parser:parse_table/1` in RabbitMQ 3.10 accepts):

    t bool  b int8  B uint8  s int16  u uint16  I int32  i uint32  l int64  L int64
    f float32  d float64  D decimal (scale octet + uint32)  T timestamp (uint64)
    S long string  x byte array  A array  F table  V void

Usage::

    block = BasicProperties(
        headers=table(("retries", short(3)), ("ratio", float32(0.5))),
        delivery_mode=2,
        message_id="m-1",
    ).encode()
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields

# Property flag bits, most significant first, in the order the fields follow the flags.
_PROPERTY_ORDER: tuple[tuple[str, int], ...] = (
    ("content_type", 1 << 15),
    ("content_encoding", 1 << 14),
    ("headers", 1 << 13),
    ("delivery_mode", 1 << 12),
    ("priority", 1 << 11),
    ("correlation_id", 1 << 10),
    ("reply_to", 1 << 9),
    ("expiration", 1 << 8),
    ("message_id", 1 << 7),
    ("timestamp", 1 << 6),
    ("type", 1 << 5),
    ("user_id", 1 << 4),
    ("app_id", 1 << 3),
    ("cluster_id", 1 << 2),
)
_OCTET_PROPERTIES = frozenset({"delivery_mode", "priority"})


@dataclass(frozen=True)
class Value:
    """One encoded field value: its type tag and the bytes that follow the tag."""

    tag: bytes
    data: bytes

    def encode(self) -> bytes:
        return self.tag + self.data


def _text(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def short_string(value: str | bytes) -> bytes:
    """shortstr: length octet, then up to 255 octets (field names and most properties)."""
    raw = _text(value)
    if len(raw) > 255:
        raise ValueError(f"short string of {len(raw)} bytes; at most 255 fit")
    return struct.pack(">B", len(raw)) + raw


def _long(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def boolean(value: bool) -> Value:
    return Value(b"t", struct.pack(">B", int(value)))


def boolean_octet(octet: int) -> Value:
    """A boolean with an arbitrary non-canonical octet (RabbitMQ reads any non-zero as true)."""
    return Value(b"t", struct.pack(">B", octet))


def short_short(value: int) -> Value:
    return Value(b"b", struct.pack(">b", value))


def short_short_unsigned(value: int) -> Value:
    return Value(b"B", struct.pack(">B", value))


def short(value: int) -> Value:
    return Value(b"s", struct.pack(">h", value))


def short_unsigned(value: int) -> Value:
    return Value(b"u", struct.pack(">H", value))


def long_int(value: int) -> Value:
    return Value(b"I", struct.pack(">i", value))


def long_unsigned(value: int) -> Value:
    return Value(b"i", struct.pack(">I", value))


def long_long(value: int) -> Value:
    return Value(b"l", struct.pack(">q", value))


def long_long_upper(value: int) -> Value:
    """'L': RabbitMQ reads it as a signed 64-bit int too, and would write it back as 'l'."""
    return Value(b"L", struct.pack(">q", value))


def float32(value: float) -> Value:
    return Value(b"f", struct.pack(">f", value))


def float64(value: float) -> Value:
    return Value(b"d", struct.pack(">d", value))


def decimal(scale: int, unscaled: int) -> Value:
    """'D': value = unscaled / 10**scale; RabbitMQ reads both parts as unsigned."""
    return Value(b"D", struct.pack(">BI", scale, unscaled))


def timestamp(seconds: int) -> Value:
    return Value(b"T", struct.pack(">Q", seconds))


def long_string(value: str | bytes) -> Value:
    return Value(b"S", _long(_text(value)))


def byte_array(value: bytes) -> Value:
    return Value(b"x", _long(value))


def void() -> Value:
    return Value(b"V", b"")


def array(*values: Value) -> Value:
    return Value(b"A", _long(b"".join(v.encode() for v in values)))


def nested_tables(depth: int) -> Value:
    """A short-int `depth` tables deep: {'n': {'n': ... 1}} (RabbitMQ sets no depth limit)."""
    value = short(1)
    for _ in range(depth):
        value = table(("n", value))
    return value


def nested_arrays(depth: int) -> Value:
    """A short-int `depth` arrays deep: [[... [1]]]."""
    value = short(1)
    for _ in range(depth):
        value = array(value)
    return value


def raw_value(tag: bytes, data: bytes) -> Value:
    """Any tag with any payload, for types a broker or client should refuse."""
    return Value(tag, data)


def table_bytes(*items: tuple[str | bytes, Value]) -> bytes:
    """A field table as it follows its tag (or fills the headers property).

    Items are kept in the order given and may repeat a name: both are legal on the wire
    and a decoder that builds a dict loses them.
    """
    return _long(b"".join(short_string(name) + value.encode() for name, value in items))


def table(*items: tuple[str | bytes, Value]) -> Value:
    """A nested field table ('F')."""
    return Value(b"F", table_bytes(*items))


def death_entry(queue: str, reason: str, *keys: str, expiration: str | None = None) -> Value:
    """One `x-death` entry as the broker writes it (count, reason, queue, time, exchange,
    routing-keys; original-expiration for a per-message TTL death)."""
    items: list[tuple[str, Value]] = [
        ("count", long_long(2)),
        ("reason", long_string(reason)),
        ("queue", long_string(queue)),
        ("time", timestamp(1_700_000_000)),
        ("exchange", long_string("shop")),
        ("routing-keys", array(*(long_string(k) for k in keys))),
    ]
    if expiration:
        items.append(("original-expiration", long_string(expiration)))
    return table(*items)


@dataclass(frozen=True)
class BasicProperties:
    """The basic class's content-header properties, each as it goes on the wire.

    `headers` is an encoded table (`table_bytes(...)`), short strings may be bytes (to
    send non-UTF-8), `timestamp` is seconds as an unsigned 64-bit int.
    """

    content_type: str | bytes | None = None
    content_encoding: str | bytes | None = None
    headers: bytes | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | bytes | None = None
    reply_to: str | bytes | None = None
    expiration: str | bytes | None = None
    message_id: str | bytes | None = None
    timestamp: int | None = None
    type: str | bytes | None = None
    user_id: str | bytes | None = None
    app_id: str | bytes | None = None
    cluster_id: str | bytes | None = None

    def encode(self) -> bytes:
        """Property flags (one 16-bit word), then each present field in spec order."""
        assert [f.name for f in fields(self)] == [name for name, _ in _PROPERTY_ORDER]
        flags = 0
        pieces: list[bytes] = []
        for name, flag in _PROPERTY_ORDER:
            value = getattr(self, name)
            if value is None:
                continue
            flags |= flag
            pieces.append(_encode_property(name, value))
        return struct.pack(">H", flags) + b"".join(pieces)


def _encode_property(name: str, value: object) -> bytes:
    if name == "headers":
        assert isinstance(value, bytes)
        return value
    if name in _OCTET_PROPERTIES:
        assert isinstance(value, int)
        return struct.pack(">B", value)
    if name == "timestamp":
        assert isinstance(value, int)
        return struct.pack(">Q", value)
    assert isinstance(value, str | bytes)
    return short_string(value)


def header_frame(channel: int, body_size: int, properties: bytes, class_id: int = 60) -> bytes:
    """A whole content-header frame (type 2) carrying `properties`."""
    payload = struct.pack(">HHQ", class_id, 0, body_size) + properties
    return struct.pack(">BHI", 2, channel, len(payload)) + payload + b"\xce"


def one_of_every_type() -> list[tuple[str, Value]]:
    """One header per field type RabbitMQ 3.10 accepts, named after its tag, with values
    that a re-encoder would change (small ints, fractions, an unnormalised decimal)."""
    scalars: list[tuple[str, Value]] = [
        ("t", boolean(True)),
        ("b", short_short(-128)),
        ("B", short_short_unsigned(255)),
        ("s", short(-32768)),
        ("u", short_unsigned(65535)),
        ("I", long_int(-(2**31))),
        ("i", long_unsigned(2**32 - 1)),
        ("l", long_long(-(2**63))),
        ("L", long_long_upper(2**63 - 1)),
        ("f", float32(1.5)),
        ("d", float64(-0.1)),
        ("D", decimal(3, 1_500)),
        ("T", timestamp(1_700_000_000)),
        ("S", long_string("héllo wörld")),
        ("x", byte_array(bytes(range(256)))),
        ("V", void()),
    ]
    return [
        *scalars,
        ("F", table(*scalars, ("deeper", table(("s", short(7)))))),
        ("A", array(*(value for _, value in scalars), array(short(1)), table(("k", void())))),
    ]
