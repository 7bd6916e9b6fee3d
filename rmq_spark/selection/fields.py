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
from typing import Any, NamedTuple

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


class Typed(NamedTuple):
    """One field value and its AMQP type name (`long-string`, `short-int`, ...).

    A named tuple, not a dataclass: a park decodes every header of every message, and a
    tuple is the cheapest immutable value Python builds.
    """

    type: str
    value: Any


class Shared(Typed):
    """A header value the decoder kept for its entry's repeats (`_headers`): every message
    with the same entry gets this one object, so a reader may keep what it derives from
    it by identity (`columns.py`'s map columns do)."""

    __slots__ = ()


@dataclass
class Properties:
    """The basic properties of one message; headers as {name: Typed}."""

    values: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Typed] = field(default_factory=dict)


# The decoder reads one buffer by offset: each reader takes (raw, at, end) and returns
# (value, the offset after it), where `end` is the end of the enclosing table or array.
# No slice or reader object per field: a park decodes every message's block
# (transfer/parked_rows.py), so this is on the mover's path.
_OCTET = struct.Struct(">B").unpack_from
_SHORT = struct.Struct(">H").unpack_from
_LONG = struct.Struct(">I").unpack_from
_LONG_LONG = struct.Struct(">Q").unpack_from
# tag byte -> (AMQP type name, unpack_from, size)
_FIXED_AT: dict[int, tuple[str, Callable[[bytes, int], tuple[Any, ...]], int]] = {
    tag[0]: (name, struct.Struct(fmt).unpack_from, struct.calcsize(fmt))
    for tag, (name, fmt) in _FIXED.items()
}


def _short_of(end: int, needed: int) -> FieldDecodeError:
    return FieldDecodeError(f"the block ends at byte {end}; a field needs bytes up to {needed}")


def _need(at: int, size: int, end: int) -> int:
    """The offset after `size` bytes at `at`; an error past `end`."""
    after = at + size
    if after > end:
        raise _short_of(end, after)
    return after


def _long_bytes(raw: bytes, at: int, end: int) -> tuple[bytes, int]:
    start = _need(at, 4, end)
    after = _need(start, _LONG(raw, at)[0], end)
    return raw[start:after], after


def _short_string(raw: bytes, at: int, end: int) -> tuple[bytes, int]:
    start = _need(at, 1, end)
    after = _need(start, raw[at], end)
    return raw[start:after], after


def text(raw: bytes) -> str:
    """Bytes as text: UTF-8, anything else backslash-escaped (never an error)."""
    return raw.decode("utf-8", "backslashreplace")


def timestamp(seconds: int) -> datetime:
    """An AMQP timestamp (seconds since the epoch) as a UTC wall-clock time without zone."""
    try:
        return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError) as exc:
        raise FieldDecodeError(f"timestamp {seconds} is out of range") from exc


def _array(raw: bytes, at: int, end: int, depth: int) -> tuple[list[Typed], int]:
    start = _need(at, 4, end)
    inner_end = _need(start, _LONG(raw, at)[0], end)
    items = []
    at = start
    while at < inner_end:
        item, at = _value(raw, at, inner_end, depth + 1)
        items.append(item)
    return items, inner_end


def _nested_table(raw: bytes, at: int, end: int, depth: int) -> tuple[dict[str, Typed], int]:
    start = _need(at, 4, end)
    inner_end = _need(start, _LONG(raw, at)[0], end)
    return _table(raw, start, inner_end, depth + 1), inner_end


def _decimal(raw: bytes, at: int, end: int, depth: int) -> tuple[Decimal, int]:
    after = _need(at, 5, end)
    return Decimal(_LONG(raw, at + 1)[0]).scaleb(-raw[at]), after


def _boolean(raw: bytes, at: int, end: int, depth: int) -> tuple[bool, int]:
    after = _need(at, 1, end)
    return raw[at] != 0, after


def _timestamp(raw: bytes, at: int, end: int, depth: int) -> tuple[datetime, int]:
    after = _need(at, 8, end)
    return timestamp(_LONG_LONG(raw, at)[0]), after


# The variable-width tags: (AMQP type name, reader of what follows the tag).
_VARIABLE: dict[int, tuple[str, Callable[[bytes, int, int, int], tuple[Any, int]]]] = {
    ord("t"): ("boolean", _boolean),
    ord("D"): ("decimal", _decimal),
    ord("T"): ("timestamp", _timestamp),
    ord("S"): ("long-string", lambda raw, at, end, depth: _long_bytes(raw, at, end)),
    ord("x"): ("byte-array", lambda raw, at, end, depth: _long_bytes(raw, at, end)),
    ord("V"): ("void", lambda raw, at, end, depth: (None, at)),
    ord("A"): ("array", _array),
    ord("F"): ("table", _nested_table),
}


_LONG_STRING_TAG = ord("S")


def _value(raw: bytes, at: int, end: int, depth: int) -> tuple[Typed, int]:
    if depth > _MAX_DEPTH:
        raise FieldDecodeError(f"field tables nested deeper than {_MAX_DEPTH}")
    _need(at, 1, end)
    tag = raw[at]
    at += 1
    if tag == _LONG_STRING_TAG:  # most headers: read here, without a call per step
        start = _need(at, 4, end)
        after = _need(start, _LONG(raw, at)[0], end)
        return Typed("long-string", raw[start:after]), after
    fixed = _FIXED_AT.get(tag)
    if fixed is not None:
        name, unpack, size = fixed
        after = _need(at, size, end)
        return Typed(name, unpack(raw, at)[0]), after
    variable = _VARIABLE.get(tag)
    if variable is None:
        raise FieldDecodeError(f"unknown field type tag {bytes([tag])!r} at byte {at - 1}")
    name, read = variable
    value, after = read(raw, at, end, depth)
    return Typed(name, value), after


def _table(raw: bytes, at: int, end: int, depth: int) -> dict[str, Typed]:
    table: dict[str, Typed] = {}
    while at < end:  # so raw[at], the name's length, is inside the table
        start = at + 1
        after = _need(start, raw[at], end)
        table[raw[start:after].decode("utf-8", "backslashreplace")], at = _value(
            raw, after, end, depth
        )
    return table


# The headers' entries seen lately, by their exact bytes (name and value): a queue's
# messages mostly repeat their headers (a tenant, a flag, an x-death's reason and queue),
# and a repeated entry is then one dictionary lookup instead of a decode. An entry is kept
# decoded from its second sighting on: the first only leaves its bytes in a set (bytes are
# not tracked by the cyclic collector, so unique entries such as a sequence number add
# nothing for it to scan; keeping every entry decoded set off twice the full collections,
# bench.park). The decoded values are shared between messages: every reader only reads
# them. Bounded: each is cleared when full, and entries longer than _MEMO_ENTRY_BYTES are
# never kept.
_MEMO_ENTRIES = 16384
_MEMO_ENTRY_BYTES = 256
_entry_memo: dict[bytes, tuple[str, Typed]] = {}
_seen_once: set[bytes] = set()
# Bytes after a tag whose value's size does not depend on its content.
_SIZE_AFTER_TAG: dict[int, int] = {
    **{tag: size for tag, (_, _, size) in _FIXED_AT.items()},
    ord("t"): 1,
    ord("D"): 5,
    ord("T"): 8,
    ord("V"): 0,
}
_LENGTH_PREFIXED = frozenset(b"SxAF")


def _headers(raw: bytes, at: int, end: int) -> dict[str, Typed]:
    """The top-level headers table, each entry decoded once per distinct bytes."""
    table: dict[str, Typed] = {}
    memo = _entry_memo
    while at < end:
        entry_start = at
        start = at + 1
        after = _need(start, raw[at], end)
        value_end = _value_end(raw, after, end)
        cached = memo.get(raw[entry_start:value_end]) if value_end else None
        if cached is not None:
            table[cached[0]] = cached[1]
            at = value_end
            continue
        name = raw[start:after].decode("utf-8", "backslashreplace")
        value, at = _value(raw, after, end, 0)
        if at - entry_start <= _MEMO_ENTRY_BYTES:
            value = _keep(raw[entry_start:at], name, value)
        table[name] = value
    return table


def _keep(entry: bytes, name: str, value: Typed) -> Typed:
    """`value` as the Shared one of its entry from the entry's second sighting on."""
    if entry not in _seen_once:
        if len(_seen_once) >= _MEMO_ENTRIES:
            _seen_once.clear()
        _seen_once.add(entry)
        return value
    if len(_entry_memo) >= _MEMO_ENTRIES:
        _entry_memo.clear()
    shared = Shared(*value)
    _entry_memo[entry] = (name, shared)
    return shared


def _value_end(raw: bytes, at: int, end: int) -> int:
    """The offset after the value at `at` (its tag first) without decoding it; 0 when
    that cannot be known from its head (let the decoder say why)."""
    if at >= end:
        return 0
    tag = raw[at]
    size = _SIZE_AFTER_TAG.get(tag)
    if size is not None:
        after = at + 1 + size
    elif tag in _LENGTH_PREFIXED and at + 5 <= end:
        after = at + 5 + _LONG(raw, at + 1)[0]
    else:
        return 0
    return after if after <= end else 0


def read_properties(raw: bytes) -> Properties:
    """Every property of a content-header property block (flags first), typed.

    >>> read_properties(b"\\x80\\x00\\x04text").values
    {'content_type': 'text'}
    """
    end = len(raw)
    at = 0
    flags = 0
    shift = 0
    while True:  # property flags: 16-bit words, the lowest bit says another follows
        after = _need(at, 2, end)
        word = _SHORT(raw, at)[0]
        at = after
        flags |= (word & 0xFFFE) << shift
        if not word & 1:
            break
        shift += 16
    found = Properties()
    values = found.values
    for name, flag, kind in PROPERTY_LAYOUT:
        if not flags & flag:
            continue
        if kind == "shortstr":
            chunk, at = _short_string(raw, at, end)
            values[name] = text(chunk)
        elif kind == "octet":
            after = _need(at, 1, end)
            values[name] = raw[at]
            at = after
        elif kind == "timestamp":
            after = _need(at, 8, end)
            values[name] = timestamp(_LONG_LONG(raw, at)[0])
            at = after
        else:
            start = _need(at, 4, end)
            at = _need(start, _LONG(raw, at)[0], end)
            found.headers = _headers(raw, start, at)
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
    end = len(raw)
    at = 0
    entries = []
    while at < end:
        start = at
        name, at = _short_string(raw, at, end)
        value, at = _value(raw, at, end, 0)
        entries.append((text(name), raw[start:at], value))
    return entries
