"""The message columns a selection expression can name: one definition, two engines.

Each column has one Arrow type; the Spark schema is derived from it (`spark_ddl`), and the
rows the mover evaluates are built from it (`message_table`). docs/selection.md documents
them; tests/spark/test_selection_engines.py runs the same expressions over the same
messages in Spark SQL and in the executor's engine and compares the answers.

Times are UTC wall-clock times without a zone (Arrow timestamp without tz, Spark
TIMESTAMP_NTZ), so a literal like '2026-01-31 12:00:00' means the same in both engines
whatever the session's time zone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

import pyarrow as pa

from rmq_spark.arrow_columns import column, list_column, map_column, struct_column
from rmq_spark.selection.fields import (
    FLOAT_TYPES,
    INTEGER_TYPES,
    TEXT_PROPERTIES,
    Properties,
    Shared,
    Typed,
    plain,
    read_properties,
    text,
)
from rmq_spark.selection.gc_pause import collection_paused

_TIME = pa.timestamp("us")
DEATH = pa.struct(
    [
        ("queue", pa.string()),
        ("reason", pa.string()),
        ("count", pa.int64()),
        ("time", _TIME),
        ("exchange", pa.string()),
        ("routing_keys", pa.list_(pa.string())),
        ("original_expiration", pa.string()),
    ]
)
DEATH_FIELDS = tuple(DEATH.field(i).name for i in range(DEATH.num_fields))


# Columns a route's select cannot read: the mover's source reader keeps a delivery's
# tag, redelivered flag, property bytes and body (transfer/amqp091/inbound.py), not the
# exchange and routing key it was delivered with.
ROUTE_UNREAD = frozenset({"exchange", "routing_key"})


class Message(NamedTuple):
    """What the selection sees of one delivery: its routing, its property block, its body.

    A named tuple: a park builds one per message it parks (transfer/parked_rows.py)."""

    exchange: str
    routing_key: str
    redelivered: bool
    properties: bytes
    body: bytes


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


COLUMNS: tuple[Column, ...] = (
    Column("exchange", pa.string(), "the exchange the message was last published to"),
    Column("routing_key", pa.string(), "the routing key it was delivered with"),
    Column("redelivered", pa.bool_(), "the delivery's redelivered flag"),
    *(
        Column(name, pa.string(), f"the {name} property (NULL when absent)")
        for name in TEXT_PROPERTIES
    ),
    Column("delivery_mode", pa.int32(), "1 transient, 2 persistent (NULL when absent)"),
    Column("priority", pa.int32(), "the priority property (NULL when absent)"),
    Column("timestamp", _TIME, "the timestamp property, UTC (NULL when absent)"),
    Column("headers", pa.map_(pa.string(), pa.string()), "every header as text"),
    Column("header_types", pa.map_(pa.string(), pa.string()), "each header's AMQP type"),
    Column("header_ints", pa.map_(pa.string(), pa.int64()), "integer headers, any width"),
    Column("header_floats", pa.map_(pa.string(), pa.float64()), "float, double, decimal"),
    Column("header_times", pa.map_(pa.string(), _TIME), "timestamp headers, UTC"),
    Column("x_death", pa.list_(DEATH), "the parsed x-death entries, newest first ([] if none)"),
    Column("last_death", DEATH, "x_death's first entry: the newest death (NULL if none)"),
    Column("first_death", DEATH, "x_death's last entry: the oldest death (NULL if none)"),
    Column("body_size", pa.int64(), "the body's size in bytes"),
    Column("body", pa.binary(), "the body's bytes"),
    Column("body_text", pa.string(), "the body as UTF-8 text (NULL when it is not UTF-8)"),
)
BY_NAME = {column.name: column for column in COLUMNS}
SCHEMA = pa.schema([(column.name, column.type) for column in COLUMNS])


# json.dumps with these options builds an encoder per call; one serves every header.
_JSON = json.JSONEncoder(default=str, ensure_ascii=False)
_BYTES_KINDS = frozenset({"long-string", "byte-array"})
_NESTED_KINDS = frozenset({"array", "table"})


def _header_text(value: Typed) -> str | None:
    kind, raw = value
    if kind in _BYTES_KINDS:
        return text(raw)
    if kind == "void":
        return None
    if kind == "boolean":
        return "true" if raw else "false"
    if kind == "timestamp":
        return str(raw.isoformat(sep=" "))
    if kind in _NESTED_KINDS:
        return _JSON.encode(plain(value))
    return str(raw)


def _death(entry: Typed) -> dict[str, Any] | None:
    if entry.type != "table":
        return None
    fields = entry.value

    def string(key: str) -> str | None:
        found = fields.get(key)
        return None if found is None else _header_text(found)

    count = fields.get("count")
    time = fields.get("time")
    keys = fields.get("routing-keys")
    return {
        "queue": string("queue"),
        "reason": string("reason"),
        "count": count.value if count and count.type in INTEGER_TYPES else None,
        "time": time.value if time and isinstance(time.value, datetime) else None,
        "exchange": string("exchange"),
        "routing_keys": (
            [_header_text(k) for k in keys.value] if keys and keys.type == "array" else []
        ),
        "original_expiration": string("original-expiration"),
    }


def deaths(properties: Properties) -> list[dict[str, Any]]:
    """The x-death header as rows, newest first as the broker keeps them ([] if none)."""
    found = properties.headers.get("x-death")
    if found is None or found.type != "array":
        return []
    return [row for row in (_death(entry) for entry in found.value) if row is not None]


_HEADER_COLUMNS = ("headers", "header_types", "header_ints", "header_floats", "header_times")
_DEATH_COLUMNS = ("x_death", "last_death", "first_death")
_PROPERTY_COLUMNS = frozenset({*TEXT_PROPERTIES, "delivery_mode", "priority", "timestamp"})
_MESSAGE_ONLY = frozenset(
    {"exchange", "routing_key", "redelivered", "body", "body_size", "body_text"}
)
# Which typed map a header value also goes to (`_header_columns`): none, ints, floats, times.
_UNTYPED, _INTS, _FLOATS, _TIMES = range(4)
# What each header value gives the map columns (its text, its typed map and value), by
# the value's identity: fields.py hands out one `Shared` value for every repeat of an
# entry, so a queue's repeated headers are turned into text (a JSON encoding for nested
# ones) once.
# The memo holds each value it describes, so no other object can take its id meanwhile.
_ENTRY_COLUMNS: dict[int, tuple[Typed, str | None, int, Any]] = {}
_ENTRY_COLUMNS_MAX = 4096


def _entry_columns(value: Typed) -> tuple[Typed, str | None, int, Any]:
    kind, raw = value
    if kind in INTEGER_TYPES:
        return value, _header_text(value), _INTS, raw
    if kind in FLOAT_TYPES:
        return value, _header_text(value), _FLOATS, float(raw) if isinstance(raw, Decimal) else raw
    if kind == "timestamp":
        return value, _header_text(value), _TIMES, raw
    return value, _header_text(value), _UNTYPED, None


class _HeaderColumns:
    """The five header map columns of a batch, gathered flat in one pass over each
    message's headers: every header as text, each one's AMQP type, and the integer,
    float (decimal as float) and timestamp ones. Names are shared by the first two."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self.names: list[str] = []
        self.texts: list[str | None] = []
        self.types: list[str] = []
        # Per typed map: entries per message, names, values.
        self.typed: dict[int, tuple[list[int], list[str], list[Any]]] = {
            slot: ([], [], []) for slot in (_INTS, _FLOATS, _TIMES)
        }

    def add(self, headers: dict[str, Typed]) -> None:
        memo = _ENTRY_COLUMNS
        typed = self.typed
        counted = dict.fromkeys(typed, 0)
        for name, value in headers.items():
            if type(value) is not Shared:  # seen once (so far): nothing to keep
                found = _entry_columns(value)
            else:
                kept = memo.get(id(value))
                if kept is None or kept[0] is not value:
                    kept = _entry_columns(value)
                    if len(memo) >= _ENTRY_COLUMNS_MAX:
                        memo.clear()
                    memo[id(value)] = kept
                found = kept
            _, text_value, slot, converted = found
            self.names.append(name)
            self.texts.append(text_value)
            self.types.append(value.type)
            if slot != _UNTYPED:
                _, names, values = typed[slot]
                names.append(name)
                values.append(converted)
                counted[slot] += 1
        self.counts.append(len(headers))
        for slot, count in counted.items():
            typed[slot][0].append(count)

    def array(self, name: str) -> pa.Array:
        kind = BY_NAME[name].type
        if name == "headers":
            return map_column(kind, self.counts, self.names, self.texts)
        if name == "header_types":
            return map_column(kind, self.counts, self.names, self.types)
        slot = {"header_ints": _INTS, "header_floats": _FLOATS, "header_times": _TIMES}[name]
        return map_column(kind, *self.typed[slot])


def _body_text(body: bytes) -> str | None:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _deaths(rows: Sequence[dict[str, Any] | None]) -> pa.Array:
    """A DEATH struct column of death rows (None is a null entry)."""
    if not any(rows):  # most queues' messages never died
        return pa.nulls(len(rows), DEATH)
    present = [row or _NO_DEATH for row in rows]
    children = []
    for name in DEATH_FIELDS:
        kind = DEATH.field(name).type
        values = [row[name] for row in present]
        if name == "routing_keys":
            flat = column(kind.value_type, [key for keys in values for key in keys])
            children.append(list_column(kind, [len(keys) for keys in values], flat))
        else:
            children.append(column(kind, values))
    return struct_column(DEATH, children, [row is None for row in rows])


_NO_DEATH: dict[str, Any] = {name: None for name in DEATH_FIELDS} | {"routing_keys": []}


_MESSAGE_VALUES: dict[str, Callable[[Message], Any]] = {
    "exchange": lambda m: m.exchange,
    "routing_key": lambda m: m.routing_key,
    "redelivered": lambda m: m.redelivered,
    "body_size": lambda m: len(m.body),
    "body": lambda m: m.body,
    "body_text": lambda m: _body_text(m.body),
}


def _column_array(
    name: str,
    messages: Sequence[Message],
    properties: Sequence[Properties],
    header_columns: _HeaderColumns,
    death_rows: Sequence[list[dict[str, Any]]],
) -> pa.Array:
    """One column's array for every message, from what was decoded once per message;
    built from buffers (`arrow_columns`), never by pa.array, which imports pandas."""
    kind = BY_NAME[name].type
    if name in _PROPERTY_COLUMNS:
        return column(kind, [p.values.get(name) for p in properties])
    if name in _HEADER_COLUMNS:
        return header_columns.array(name)
    if name == "x_death":
        flat = [row for rows in death_rows for row in rows]
        return list_column(kind, [len(rows) for rows in death_rows], _deaths(flat))
    if name in _DEATH_COLUMNS:
        newest = name == "last_death"
        return _deaths([(rows[0] if newest else rows[-1]) if rows else None for rows in death_rows])
    value_of = _MESSAGE_VALUES[name]
    return column(kind, [value_of(m) for m in messages])


def message_table(messages: Iterable[Message], names: Sequence[str] | None = None) -> pa.Table:
    """The messages as an Arrow table of the named columns (all of them by default).

    Only what is asked for is computed: a batch for `headers['tenant'] = 'a'` decodes the
    property blocks but never copies a body. Each property block is decoded once, and
    each column then built in one pass over the batch.
    """
    wanted = list(names) if names is not None else [column.name for column in COLUMNS]
    unknown = [name for name in wanted if name not in BY_NAME]
    if unknown:
        raise KeyError(f"no message column {unknown[0]!r}")
    batch = list(messages)
    with collection_paused():  # gc_pause.py says why
        properties = (
            [read_properties(m.properties) for m in batch] if set(wanted) - _MESSAGE_ONLY else []
        )
        header_columns = _HeaderColumns()
        if set(wanted) & set(_HEADER_COLUMNS):
            for found in properties:
                header_columns.add(found.headers)
        death_rows = [deaths(p) for p in properties] if set(wanted) & set(_DEATH_COLUMNS) else []
        return pa.Table.from_arrays(
            [_column_array(name, batch, properties, header_columns, death_rows) for name in wanted],
            schema=pa.schema([(name, BY_NAME[name].type) for name in wanted]),
        )


_SCALAR_DDL: tuple[tuple[Callable[[pa.DataType], bool], str], ...] = (
    (pa.types.is_string, "STRING"),
    (pa.types.is_boolean, "BOOLEAN"),
    (pa.types.is_int32, "INT"),
    (pa.types.is_int64, "BIGINT"),
    (pa.types.is_float64, "DOUBLE"),
    (pa.types.is_timestamp, "TIMESTAMP_NTZ"),
    (pa.types.is_binary, "BINARY"),
)


def _ddl(kind: pa.DataType) -> str:
    for matches, name in _SCALAR_DDL:
        if matches(kind):
            return name
    if pa.types.is_map(kind):
        return f"MAP<{_ddl(kind.key_type)}, {_ddl(kind.item_type)}>"
    if pa.types.is_list(kind):
        return f"ARRAY<{_ddl(kind.value_type)}>"
    if pa.types.is_struct(kind):
        inner = ", ".join(f"{f.name}: {_ddl(f.type)}" for f in kind)
        return f"STRUCT<{inner}>"
    raise TypeError(f"no Spark type for {kind}")


def spark_ddl() -> str:
    """The columns as a Spark DDL schema string (`exchange STRING, ...`)."""
    return ", ".join(f"`{column.name}` {_ddl(column.type)}" for column in COLUMNS)
