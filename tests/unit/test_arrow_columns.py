"""arrow_columns: each kind built from its buffers is what pa.array makes of the same
values (pa.array imports pandas; the executors build their columns without it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from rmq_spark import arrow_columns
from tests.support.imports import imported_after

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
NAIVE = datetime(2026, 3, 4, 5, 6, 7, 891011)


@pytest.mark.parametrize(
    ("kind", "values"),
    [
        (pa.int64(), (0, 1, -5, 2**62, None, 7)),
        (pa.int64(), ()),
        (pa.int32(), (0, -(2**31), 2**31 - 1, None)),
        (pa.float64(), (0.5, None, -1e300, float("inf"))),
        (pa.bool_(), tuple(index % 3 == 0 for index in range(19))),
        (pa.bool_(), (True, None, False)),
        (pa.string(), ("a", "", None, "ünïcode ✓", "x" * 300, None)),
        (pa.string(), ("only",)),
        (pa.binary(), (b"\x00\xff", b"", None, b"x" * 300)),
        (pa.timestamp("us", tz="UTC"), (T0, None, T1, NAIVE, datetime(1969, 12, 31, tzinfo=UTC))),
        (pa.timestamp("us"), (NAIVE, None, datetime(1969, 12, 31))),
    ],
)
def test_a_scalar_column_is_what_pa_array_makes(
    kind: pa.DataType, values: tuple[object, ...]
) -> None:
    built = arrow_columns.column(kind, values)
    built.validate(full=True)
    assert built.equals(pa.array(values, kind))


def test_a_column_of_an_unsupported_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="no column builder for decimal"):
        arrow_columns.column(pa.decimal128(5, 2), [1])


def test_a_map_column_is_what_pa_array_makes() -> None:
    kind = pa.map_(pa.string(), pa.int64())
    rows: list[list[tuple[str, int | None]]] = [[("a", 1), ("b", None)], [], [("c", 3)]]
    built = arrow_columns.map_column(
        kind,
        [len(row) for row in rows],
        [key for row in rows for key, _ in row],
        [item for row in rows for _, item in row],
    )
    built.validate(full=True)
    assert built.equals(pa.array(rows, kind))


def test_a_list_of_structs_with_null_entries_is_what_pa_array_makes() -> None:
    inner = pa.struct([("name", pa.string()), ("tags", pa.list_(pa.string()))])
    rows: list[list[dict[str, Any]]] = [
        [{"name": "x", "tags": ["a", "b"]}, {"name": None, "tags": []}],
        [],
    ]
    flat = [entry for row in rows for entry in row]
    tags = arrow_columns.list_column(
        pa.list_(pa.string()),
        [len(entry["tags"]) for entry in flat],
        arrow_columns.column(pa.string(), [tag for entry in flat for tag in entry["tags"]]),
    )
    names = arrow_columns.column(pa.string(), [entry["name"] for entry in flat])
    structs = arrow_columns.struct_column(inner, [names, tags])
    built = arrow_columns.list_column(pa.list_(inner), [len(row) for row in rows], structs)
    built.validate(full=True)
    assert built.equals(pa.array(rows, pa.list_(inner)))
    # A struct column with null entries: the mask, not the children, says which.
    nullable = arrow_columns.struct_column(inner, [names, tags], [False, True])
    assert nullable.equals(pa.array([flat[0], None], inner))


def test_building_columns_does_not_import_pandas() -> None:
    script = (
        "import pyarrow as pa\n"
        "from rmq_spark import arrow_columns as c\n"
        "kind = pa.map_(pa.string(), pa.string())\n"
        "assert c.map_column(kind, [1], ['k'], ['v']).to_pylist() == [[('k', 'v')]]\n"
        "assert c.column(pa.binary(), [b'x', None]).null_count == 1\n"
    )
    assert not imported_after(script, "pandas")


@pytest.mark.parametrize("kind", [pa.string(), pa.int32(), pa.timestamp("us"), pa.binary()])
def test_a_column_of_nulls_only_is_what_pa_array_makes(kind: pa.DataType) -> None:
    built = arrow_columns.column(kind, [None, None, None])
    built.validate(full=True)
    assert built.equals(pa.array([None, None, None], kind))


@pytest.mark.parametrize(
    ("value", "count"),
    [("dr", 5), ("q-ünïcode ✓", 3), ("", 4), ("x" * 300, 1000), ("v", 0), ("a/b:c", 1)],
)
def test_a_repeated_text_column_is_what_pa_array_makes(value: str, count: int) -> None:
    built = arrow_columns.repeated_text(value, count)
    built.validate(full=True)
    assert built.equals(pa.array([value] * count, pa.string()))
