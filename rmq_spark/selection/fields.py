"""A content-header property block read into typed values, keeping each header's AMQP type.

Pure Python and pika-free: the selection language runs on executors beside the mover and
on the driver, and needs what pika's decoder throws away (a short-int and a long-long-int
both come back from pika as `int`). The grammar is AMQP 0-9-1 section 4.2 with RabbitMQ's
field-table tags (`rabbit_binary_parser`):

    t boolean  b short-short-int  B short-short-uint  s short-int  u short-uint
    I long-int  i long-uint  l long-long-int  L long-long-int  f float  d double
    D decimal  T timestamp  S long-string  x byte-array  A array  F table  V void

A block that cannot be read raises `FieldDecodeError`; the caller decides what that means.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

# The basic class's properties in wire order, with their flag bit and kind.
PROPERTY_LAYOUT: tuple[tuple[str, int, str], ...] = (
    ("content_type", 1 << 15, "shortstr"),
    ("content_encoding", 1 << 14, "shortstr"),
    ("headers", 1 << 13, "table"),
    ("delivery_mode", 1 << 12, "octet"),
    ("priority", 1 << 11, "octet"),
    ("correlation_id", 1 << 10, "shortstr"),
    ("reply_to", 1 << 9, "shortstr"),
    ("expiration", 1 << 8, "shortstr"),
    ("message_id", 1 << 7, "shortstr"),
    ("timestamp", 1 << 6, "timestamp"),
    ("type", 1 << 5, "shortstr"),
    ("user_id", 1 << 4, "shortstr"),
    ("app_id", 1 << 3, "shortstr"),
    ("cluster_id", 1 << 2, "shortstr"),
)
TEXT_PROPERTIES = tuple(name for name, _, kind in PROPERTY_LAYOUT if kind == "shortstr")

# Fixed-width numeric tags: (AMQP type name, struct format).
_FIXED: dict[bytes, tuple[str, str]] = {
    b"b": ("short-short-int", ">b"),
    b"B": ("short-short-uint", ">B"),
    b"s": ("short-int", ">h"),
    b"u": ("short-uint", ">H"),
    b"I": ("long-int", ">i"),
    b"i": ("long-uint", ">I"),
    b"l": ("long-long-int", ">q"),
    b"L": ("long-long-int", ">q"),
    b"f": ("float", ">f"),
    b"d": ("double", ">d"),
}
INTEGER_TYPES = frozenset(name for name, fmt in _FIXED.values() if fmt[-1] not in "fd")
FLOAT_TYPES = frozenset({"float", "double", "decimal"})
_MAX_DEPTH = 64


class FieldDecodeError(ValueError):
    """A property block or field table that does not follow the grammar."""


@dataclass(frozen=True)
class Typed:
    """One field value and its AMQP type name (`long-string`, `short-int`, ...)."""

    type: str
    value: Any


@dataclass
class Properties:
    """The basic properties of one message; headers as {name: Typed}."""

    values: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Typed] = field(default_factory=dict)


class _Reader:
    def __init__(self, raw: bytes, offset: int = 0) -> None:
        self.raw = raw
        self.at = offset

    def take(self, size: int) -> bytes:
        end = self.at + size
        if size < 0 or end > len(self.raw):
            raise FieldDecodeError(
                f"the block ends at byte {len(self.raw)}; a field needs bytes up to {end}"
            )
        chunk = self.raw[self.at : end]
        self.at = end
        return chunk

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack(fmt, self.take(struct.calcsize(fmt)))
        return value

    def short_string(self) -> bytes:
        return self.take(self.unpack(">B"))

    def long_bytes(self) -> bytes:
        return self.take(self.unpack(">I"))


def text(raw: bytes) -> str:
    """Bytes as text: UTF-8, anything else backslash-escaped (never an error)."""
    return raw.decode("utf-8", "backslashreplace")


def timestamp(seconds: int) -> datetime:
    """An AMQP timestamp (seconds since the epoch) as a UTC wall-clock time without zone."""
    try:
        return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError) as exc:
        raise FieldDecodeError(f"timestamp {seconds} is out of range") from exc


def _array(reader: _Reader, depth: int) -> list[Typed]:
    inner = _Reader(reader.long_bytes())
    items = []
    while inner.at < len(inner.raw):
        items.append(_value(inner, depth + 1))
    return items


def _decimal(reader: _Reader) -> Decimal:
    scale = reader.unpack(">B")
    return Decimal(reader.unpack(">I")).scaleb(-scale)


# The variable-width tags: (AMQP type name, reader of what follows the tag).
_VARIABLE: dict[bytes, tuple[str, Callable[[_Reader, int], Any]]] = {
    b"t": ("boolean", lambda r, d: r.unpack(">B") != 0),
    b"D": ("decimal", lambda r, d: _decimal(r)),
    b"T": ("timestamp", lambda r, d: timestamp(r.unpack(">Q"))),
    b"S": ("long-string", lambda r, d: r.long_bytes()),
    b"x": ("byte-array", lambda r, d: r.long_bytes()),
    b"V": ("void", lambda r, d: None),
    b"A": ("array", _array),
    b"F": ("table", lambda r, d: _table(_Reader(r.long_bytes()), d + 1)),
}


def _value(reader: _Reader, depth: int) -> Typed:
    if depth > _MAX_DEPTH:
        raise FieldDecodeError(f"field tables nested deeper than {_MAX_DEPTH}")
    tag = reader.take(1)
    if tag in _FIXED:
        name, fmt = _FIXED[tag]
        return Typed(name, reader.unpack(fmt))
    if tag in _VARIABLE:
        name, read = _VARIABLE[tag]
        return Typed(name, read(reader, depth))
    raise FieldDecodeError(f"unknown field type tag {tag!r} at byte {reader.at - 1}")


def _table(reader: _Reader, depth: int) -> dict[str, Typed]:
    table: dict[str, Typed] = {}
    while reader.at < len(reader.raw):
        name = text(reader.short_string())
        table[name] = _value(reader, depth)
    return table


def read_properties(raw: bytes) -> Properties:
    """Every property of a content-header property block (flags first), typed.

    >>> read_properties(b"\\x80\\x00\\x04text").values
    {'content_type': 'text'}
    """
    reader = _Reader(raw)
    flags = 0
    shift = 0
    while True:  # property flags: 16-bit words, the lowest bit says another follows
        word = reader.unpack(">H")
        flags |= (word & 0xFFFE) << shift
        if not word & 1:
            break
        shift += 16
    found = Properties()
    for name, flag, kind in PROPERTY_LAYOUT:
        if not flags & flag:
            continue
        if kind == "shortstr":
            found.values[name] = text(reader.short_string())
        elif kind == "octet":
            found.values[name] = reader.unpack(">B")
        elif kind == "timestamp":
            found.values[name] = timestamp(reader.unpack(">Q"))
        else:
            found.headers = _table(_Reader(reader.long_bytes()), 0)
    return found


def plain(value: Typed) -> Any:
    """A typed value as plain Python (strings for long-strings, lists, dicts)."""
    if value.type == "long-string":
        return text(value.value)
    if value.type == "array":
        return [plain(item) for item in value.value]
    if value.type == "table":
        return {name: plain(item) for name, item in value.value.items()}
    return value.value


def table_entries(raw: bytes) -> list[tuple[str, bytes, Typed]]:
    """A field table's entries in wire order: (name, the entry's exact bytes, its value).

    The bytes run from the name's length octet to the value's last byte, so a table
    rebuilt from some of them keeps every other entry exactly as it came (names repeated
    on the wire stay repeated). Used by the redrive's header policy.
    """
    reader = _Reader(raw)
    entries = []
    while reader.at < len(raw):
        start = reader.at
        name = text(reader.short_string())
        value = _value(reader, 0)
        entries.append((name, raw[start : reader.at], value))
    return entries
