"""A selection expression: checked once, then evaluated per batch of messages.

The expression is Spark SQL (a WHERE clause without the keyword). sqlglot parses it
in Spark's dialect, which gives positions for every error and a tree to check: only the
documented columns, and only the constructs listed in `_ALLOWED`, each of which
tests/spark/test_selection_engines.py evaluates in both engines on the same messages. The
executors evaluate the tree translated to DuckDB's dialect, over an Arrow table of the
batch (DuckDB reads Arrow without copying and is vectorised; a per-message Python
evaluator would cost more than the move). The Spark side (`spark_sql`) is the same tree
written back in Spark's dialect, so both engines run one checked expression.

Rules the two dialects would otherwise disagree on, settled in the tree:
- CAST is TRY_CAST in both: a value that does not convert is NULL, never an error.
- A message is selected when the expression is TRUE; FALSE and NULL leave it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from rmq_spark.errors import ConfigError
from rmq_spark.selection.columns import BY_NAME, DEATH_FIELDS, SCHEMA, Message, message_table

# Every construct the language allows; each has a case in the two-engine test.
_ALLOWED: tuple[type[exp.Expression], ...] = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.Paren,
    exp.Star,
    exp.And,
    exp.Or,
    exp.Not,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.Is,
    exp.In,
    exp.Between,
    exp.Like,
    exp.ILike,
    exp.RegexpLike,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Mod,
    exp.Neg,
    exp.Bracket,
    exp.Dot,
    exp.Cast,
    exp.TryCast,
    exp.DataType,
    exp.Coalesce,
    exp.Lower,
    exp.Upper,
    exp.Length,
    exp.Substring,
    exp.StartsWith,
    exp.Contains,
    exp.ArraySize,
    exp.ArrayContains,
    exp.ArrayFilter,
    exp.Lambda,
    exp.Hex,
    exp.Concat,
)
_STRUCTS = frozenset({"last_death", "first_death"})


class SelectionError(ConfigError):
    """A selection expression that cannot be used, and where the problem is."""

    def __init__(
        self, where: str, expression: str, problem: str, position: int | None = None
    ) -> None:
        self.where = where
        self.expression = expression
        self.problem = problem
        self.position = position  # 1-based character position in the expression
        at = f" at position {position}" if position is not None else ""
        super().__init__(f"{where}: select expression {expression!r}{at}: {problem}")


def _position(node: exp.Expr) -> int | None:
    for candidate in (node, *node.find_all(exp.Identifier)):
        meta = candidate.meta
        if "start" in meta:
            return int(meta["start"]) + 1
    return None


def _lambda_names(tree: exp.Expr) -> set[str]:
    return {
        ident.name
        for lam in tree.find_all(exp.Lambda)
        for ident in lam.expressions
        if isinstance(ident, exp.Identifier)
    }


def _check_column(column: exp.Column, lambdas: set[str]) -> str | None:
    """The problem with one column reference, or None; `a.b` parses as table a, column b."""
    root = column.table or column.name
    if root in lambdas:
        return None
    if root not in BY_NAME:
        return f"unknown column {root!r} (the columns are listed in docs/selection.md)"
    if column.table and (column.table not in _STRUCTS or column.name not in DEATH_FIELDS):
        return f"{column.sql(dialect='spark')!r} names no field ({root} has {DEATH_FIELDS})"
    return None


@dataclass
class Selection:
    """One checked expression, ready to evaluate batches.

    >>> Selection.compile("headers['tenant'] = 'acme'", where="route 0").columns
    ('headers',)
    """

    expression: str
    where: str
    spark_sql: str
    duckdb_sql: str
    columns: tuple[str, ...]
    _connection: Any = field(default=None, repr=False)

    @classmethod
    def compile(cls, expression: str, *, where: str) -> Selection:
        """Parse and check `expression`; SelectionError names `where` and the position."""
        if not expression.strip():
            raise SelectionError(where, expression, "the expression is empty")
        try:
            tree = sqlglot.parse_one(expression, read="spark")
        except ParseError as exc:
            first = exc.errors[0] if exc.errors else {}
            raise SelectionError(
                where,
                expression,
                str(first.get("description", exc)),
                _offset(expression, first.get("line"), first.get("col")),
            ) from exc
        except TokenError as exc:
            raise SelectionError(where, expression, f"cannot be read: {exc}") from exc
        lambdas = _lambda_names(tree)
        for node in tree.walk():
            if not isinstance(node, _ALLOWED):
                what = node.sql(dialect="spark") or node.key
                raise SelectionError(
                    where,
                    expression,
                    f"{what!r} is not part of the selection language "
                    "(docs/selection.md lists what is)",
                    _position(node),
                )
            if isinstance(node, exp.Column) and not isinstance(node.parent, exp.Lambda):
                problem = _check_column(node, lambdas)
                if problem:
                    raise SelectionError(where, expression, problem, _position(node))
            if isinstance(node, exp.Star):
                raise SelectionError(where, expression, "'*' selects no message", None)
        tree = tree.transform(
            lambda node: (
                exp.TryCast(this=node.this, to=node.to, safe=True)
                if isinstance(node, exp.Cast)
                else node
            )
        )
        columns = tuple(
            sorted(
                {
                    c.table or c.name
                    for c in tree.find_all(exp.Column)
                    if (c.table or c.name) in BY_NAME and (c.table or c.name) not in lambdas
                }
            )
        )
        for bracket in tree.find_all(exp.Bracket):
            if _is_array(bracket.this) and not _literal_index(bracket):
                raise SelectionError(
                    where,
                    expression,
                    "an x_death index must be a whole number, from 0",
                    _position(bracket),
                )
        selection = cls(
            expression=expression,
            where=where,
            spark_sql=tree.copy().transform(_safe_index).sql(dialect="spark"),
            duckdb_sql=tree.sql(dialect="duckdb"),
            columns=columns,
        )
        selection._bind()
        return selection

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its DuckDB connection (Spark ships it to the executors)."""
        return {**self.__dict__, "_connection": None}

    def _query(self) -> str:
        return f"SELECT ({self.duckdb_sql}) AS selected FROM batch"

    def _cursor(self) -> Any:
        if self._connection is None:
            self._connection = duckdb.connect(config={"threads": 1})
            self._connection.execute("SET TimeZone = 'UTC'")
        return self._connection

    def _bind(self) -> None:
        """Type-check the expression on one row of NULLs (constants are converted too)."""
        names = list(self.columns) or ["body_size"]
        nulls = pa.table(
            {name: pa.nulls(1, SCHEMA.field(name).type) for name in names},
            schema=pa.schema([SCHEMA.field(name) for name in names]),
        )
        try:
            kind = self._run(nulls).schema.field("selected").type
        except duckdb.Error as exc:
            raise SelectionError(self.where, self.expression, _first_line(exc)) from exc
        if not (pa.types.is_boolean(kind) or pa.types.is_null(kind)):
            raise SelectionError(
                self.where, self.expression, f"gives {kind}, not a boolean (true selects)"
            )

    def _run(self, batch: pa.Table) -> pa.Table:
        cursor = self._cursor()
        cursor.register("batch", batch)
        try:
            return cursor.sql(self._query()).to_arrow_table()
        finally:
            cursor.unregister("batch")

    def evaluate(self, messages: Sequence[Message]) -> list[bool]:
        """True for each message the expression selects (NULL is not selected)."""
        if not messages:
            return []
        batch = message_table(messages, self.columns or ["body_size"])
        try:
            result = self._run(batch).column("selected").to_pylist()
        except duckdb.Error as exc:
            raise SelectionError(
                self.where, self.expression, f"failed on a message: {_first_line(exc)}"
            ) from exc
        return [value is True for value in result]

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _is_array(node: exp.Expression) -> bool:
    return isinstance(node, exp.Column) and node.name in {"x_death", "routing_keys"}


def _literal_index(bracket: exp.Bracket) -> bool:
    (index, *rest) = bracket.expressions or [None]
    return (
        not rest
        and isinstance(index, exp.Literal)
        and not index.is_string
        and str(index.this).isdigit()
    )


def _safe_index(node: exp.Expression) -> exp.Expression:
    """arr[i] (0-based) as Spark's try_element_at(arr, i + 1): NULL past the end, as in
    DuckDB, instead of ANSI mode's error."""
    if isinstance(node, exp.Bracket) and _is_array(node.this):
        index = int(node.expressions[0].this) + 1
        return exp.Anonymous(
            this="try_element_at", expressions=[node.this.copy(), exp.Literal.number(index)]
        )
    return node


def _offset(expression: str, line: Any, col: Any) -> int | None:
    """1-based character position of (line, col), both 1-based, in `expression`."""
    if not isinstance(line, int) or not isinstance(col, int):
        return None
    lines = expression.split("\n")
    return sum(len(text) + 1 for text in lines[: line - 1]) + col


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
