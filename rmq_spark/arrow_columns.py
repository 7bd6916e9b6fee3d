"""Arrow arrays built from Python values by their buffers, without pa.array.

pa.array() asks whether its input is a pandas object, and that question imports pandas:
a third of a second of CPU and 55 MiB of RSS in a Spark Python worker that has no other
use for it (bench.memory --park: a park's peak). The executors' columns are of a few
kinds, so they are built here from their buffers: the ledger's rows and intents
(`ledger/writer.py`), the selection columns (`selection/columns.py`) and the parked rows
(`transfer/parked_rows.py`). tests/unit/test_arrow_columns.py checks each kind against
what pa.array makes of the same values.

Scalars: string, binary, bool, int32, int64, float64 and timestamp[us] (naive datetimes
are UTC). Nested: maps, lists and structs from their children (`map_column`,
`list_column`, `struct_column`). One string many times (`repeated_text`: a ledger row's
transfer key) is built without a pass over its copies.
"""

from __future__ import annotations

import array
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import Any

import pyarrow as pa

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Arrow's binary and string columns address their data with 32-bit offsets.
_MAX_DATA_BYTES = (1 << 31) - 1
# array.array typecodes of the fixed-width kinds (null is 0).
_FIXED = {pa.int32(): "i", pa.int64(): "q", pa.float64(): "d"}


def column(kind: pa.DataType, values: Sequence[Any]) -> pa.Array:
    """The Arrow array of `values` (None is null) of a scalar `kind`: what
    pa.array(values, kind) returns."""
    count = len(values)
    validity, nulls = _validity(values)
    if nulls == count and count:  # a property no message of the batch sets
        return pa.nulls(count, kind)
    if kind == pa.string() or kind == pa.binary():
        data_buffers = _data_buffers(values, nulls, text=kind == pa.string())
        if data_buffers is None:  # over 2 GiB: pa.array splits it into chunks
            return pa.array(values, kind)
        buffers = [validity, *data_buffers]
    elif kind in _FIXED:
        numbers = array.array(_FIXED[kind], values if not nulls else (v or 0 for v in values))
        buffers = [validity, pa.py_buffer(numbers)]
    elif kind == pa.bool_():
        buffers = [validity, pa.py_buffer(_bitmap(values))]
    elif pa.types.is_timestamp(kind) and kind.unit == "us":
        buffers = [validity, pa.py_buffer(_microseconds(values))]
    else:
        raise TypeError(f"no column builder for {kind}")
    return pa.Array.from_buffers(kind, count, buffers, null_count=nulls)


def repeated_text(value: str, count: int) -> pa.Array:
    """`value` `count` times, a string column: what pa.array([value] * count, pa.string())
    returns, built by two C-level repeats (its bytes, evenly spaced offsets) where
    `column` would join, measure and count `count` Python strings."""
    data = value.encode("utf-8")
    size = len(data)
    if size * count > _MAX_DATA_BYTES:
        return column(pa.string(), (value,) * count)
    if size:
        offsets = array.array("i", range(0, size * count + 1, size))
    else:
        offsets = array.array("i", bytes(4 * (count + 1)))
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data * count)]
    )


def _offsets(lengths: Sequence[int]) -> pa.Array:
    data = array.array("i", accumulate(lengths, initial=0))
    return pa.Array.from_buffers(pa.int32(), len(data), [None, pa.py_buffer(data)])


def map_column(
    kind: pa.MapType, lengths: Sequence[int], keys: Sequence[str], items: Sequence[Any]
) -> pa.Array:
    """A map column (never null): entry i holds `lengths[i]` of the flat keys and items."""
    return pa.MapArray.from_arrays(
        _offsets(lengths), column(kind.key_type, keys), column(kind.item_type, items), type=kind
    )


def list_column(kind: pa.ListType, lengths: Sequence[int], flat: pa.Array) -> pa.Array:
    """A list column (never null): entry i holds `lengths[i]` of the flat values."""
    return pa.ListArray.from_arrays(_offsets(lengths), flat, type=kind)


def struct_column(
    kind: pa.StructType, children: Sequence[pa.Array], nulls: Sequence[bool] | None = None
) -> pa.Array:
    """A struct column of its children's arrays; `nulls[i]` makes entry i null."""
    if nulls is not None and nulls and all(nulls):  # no death in the batch
        return pa.nulls(len(nulls), kind)
    mask = None if nulls is None or not any(nulls) else column(pa.bool_(), nulls)
    return pa.StructArray.from_arrays(list(children), fields=list(kind), mask=mask)


def _validity(values: Sequence[Any]) -> tuple[pa.Buffer | None, int]:
    """Arrow's validity bitmap (None when nothing is null) and the null count."""
    nulls = values.count(None)
    if not nulls:
        return None, 0
    return pa.py_buffer(_bitmap([value is not None for value in values])), nulls


def _data_buffers(values: Sequence[Any], nulls: int, *, text: bool) -> list[pa.Buffer] | None:
    """Offsets and data of a string (UTF-8) or binary column (nulls are empty); None
    when the data would not fit 32-bit offsets."""
    empty = "" if text else b""
    pieces: Sequence[Any] = [value or empty for value in values] if nulls else values
    if text:
        data = "".join(pieces).encode("utf-8")
        lengths: Iterable[int] = map(len, pieces)
        if len(data) != sum(map(len, pieces)):  # not all ASCII: lengths in bytes, one by one
            lengths = [len(piece.encode("utf-8")) for piece in pieces]
    else:
        if sum(map(len, pieces)) > _MAX_DATA_BYTES:
            return None
        data = b"".join(pieces)
        lengths = map(len, pieces)
    if len(data) > _MAX_DATA_BYTES:
        return None
    return [pa.py_buffer(array.array("i", accumulate(lengths, initial=0))), pa.py_buffer(data)]


def _bitmap(flags: Sequence[Any]) -> bytes:
    """Arrow's bit-packed booleans (truthiness of each flag): LSB first, whole bytes."""
    packed = int("".join("1" if flag else "0" for flag in reversed(flags)) or "0", 2)
    return packed.to_bytes((len(flags) + 7) // 8, "little")


def _microseconds(moments: Sequence[datetime | None]) -> array.array[int]:
    """Microseconds since the epoch, as Arrow stores timestamp[us] (naive means UTC;
    null is 0). Rows of a batch share their timestamps, so a repeat is not recomputed."""
    result = array.array("q")
    last: datetime | None = None
    last_value = 0
    for moment in moments:
        if moment is not last:
            last = moment
            if moment is None:
                last_value = 0
            else:
                aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
                last_value = (aware - _EPOCH) // _MICROSECOND
        result.append(last_value)
    return result
