"""expression: what the selection language accepts, what it refuses and where, and what
the executors' engine selects (tests/spark/test_selection_engines.py checks Spark agrees)."""

from __future__ import annotations

import pickle

import pytest

from rmq_spark.errors import ConfigError
from rmq_spark.selection import Message, Selection, SelectionError, message_table
from rmq_spark.selection.columns import COLUMNS, SCHEMA, spark_ddl
from tests.support.selection_messages import CASES, sample_messages


@pytest.mark.parametrize(("expression", "selected"), CASES, ids=[c[0] for c in CASES])
def test_the_executor_engine_selects_the_messages_worked_out_by_hand(
    expression: str, selected: list[int]
) -> None:
    selection = Selection.compile(expression, where="routes[0]")
    found = selection.evaluate(sample_messages())
    assert [i for i, chosen in enumerate(found) if chosen] == selected


@pytest.mark.parametrize(
    ("expression", "position", "problem"),
    [
        ("exchange = 'a' AND tenant = 'x'", 20, "unknown column 'tenant'"),
        ("last_death.queen = 'q'", 12, "names no field"),
        ("headers['a'] = = 'b'", 16, "missing"),
        ("upper(nope(exchange)) = 'A'", 7, "not part of the selection language"),
        ("exchange IN (SELECT 1)", None, "not part of the selection language"),
        ("x_death[body_size].queue = 'q'", 1, "whole number"),
    ],
)
def test_a_bad_expression_names_the_route_and_the_position(
    expression: str, position: int | None, problem: str
) -> None:
    with pytest.raises(SelectionError, match=problem) as raised:
        Selection.compile(expression, where="routes[2]")
    error = raised.value
    assert isinstance(error, ConfigError)  # exit 2 at pre-flight, like any bad config
    assert str(error).startswith("routes[2]: select expression ")
    if position is not None:
        assert error.position == position
        assert f"at position {position}:" in str(error)


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("routing_key", "not a boolean"),
        ("body LIKE 'a%'", "Binder Error"),
        ("body_size = 'many'", "Conversion Error"),
        ("   ", "empty"),
        ("routing_key = 'a", "cannot be read"),
    ],
)
def test_a_type_error_is_found_before_any_message(expression: str, problem: str) -> None:
    with pytest.raises(SelectionError, match=problem):
        Selection.compile(expression, where="routes[0]")


def test_only_the_referenced_columns_are_built() -> None:
    selection = Selection.compile("headers['tenant'] = 'acme' AND body_size > 1", where="r")
    assert selection.columns == ("body_size", "headers")
    table = message_table(sample_messages(), selection.columns)
    assert table.column_names == ["body_size", "headers"]


def test_casts_never_fail_in_either_dialect() -> None:
    selection = Selection.compile("CAST(headers['n'] AS INT) > 1", where="r")
    assert selection.spark_sql.startswith("TRY_CAST(")
    assert selection.duckdb_sql.startswith("TRY_CAST(")


def test_a_compiled_selection_travels_to_an_executor_by_pickle() -> None:
    selection = Selection.compile("last_death.queue = 'orders.eu'", where="routes[0]")
    assert selection.evaluate(sample_messages())[0] is True  # the driver's connection is open
    shipped = pickle.loads(pickle.dumps(selection))
    assert shipped.evaluate(sample_messages()) == [True, False, False, False, True, False]


def test_an_empty_batch_selects_nothing() -> None:
    assert Selection.compile("TRUE", where="r").evaluate([]) == []


def test_a_message_with_an_unreadable_property_block_is_an_error_not_a_guess() -> None:
    broken = Message("", "q", False, b"\x80", b"body")
    selection = Selection.compile("content_type IS NULL", where="routes[1]")
    with pytest.raises(ValueError, match="ends at byte"):
        selection.evaluate([broken])


def test_the_columns_have_one_definition() -> None:
    assert SCHEMA.names == [column.name for column in COLUMNS]
    assert message_table(sample_messages()).schema == SCHEMA
    ddl = spark_ddl()
    assert ddl.startswith("`exchange` STRING, `routing_key` STRING, `redelivered` BOOLEAN")
    assert "`timestamp` TIMESTAMP_NTZ" in ddl
    assert "`x_death` ARRAY<STRUCT<queue: STRING, reason: STRING, count: BIGINT" in ddl
