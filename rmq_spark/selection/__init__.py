"""The selection language: which messages a move takes (docs/selection.md).

A Spark SQL boolean expression over documented message columns (`columns.py`), checked
once on the driver and evaluated per batch on the executors (`expression.py`), over
property blocks read with their AMQP types (`fields.py`).

`Selection` and `SelectionError` are imported on first use: their module loads DuckDB
and sqlglot (26 MiB of an executor's memory), which a park without `select` never
needs, though it decodes every message with `columns.py` (bench.memory --park).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rmq_spark.selection.columns import COLUMNS, Message, message_table

if TYPE_CHECKING:
    from rmq_spark.selection.expression import Selection, SelectionError

__all__ = ["COLUMNS", "Message", "Selection", "SelectionError", "message_table"]


def __getattr__(name: str) -> Any:
    if name in {"Selection", "SelectionError"}:
        from rmq_spark.selection import expression

        return getattr(expression, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
