"""The routes' `select` expressions, checked before anything is discovered or moved.

Each route with a `select` gets its expression compiled once here (sqlglot's parse and
the language's allow-list, then a DuckDB type check: `selection.Selection.compile`), so
a bad one is one `SelectionError` (a ConfigError: exit 2) naming the route and the
position in the expression. The executors compile the same text again for their batches
(`transfer/executor.py`); what travels is the text.
"""

from __future__ import annotations

from rmq_spark.config import JobConfig
from rmq_spark.selection import Selection, SelectionError
from rmq_spark.selection.columns import ROUTE_UNREAD


def route_selections(config: JobConfig) -> dict[str, str]:
    """route name -> its checked `select` expression; routes without one are left out.

    Raises SelectionError for the first route whose expression cannot be used.
    """
    checked: dict[str, str] = {}
    for index, route in enumerate(config.routes):
        if route.select is None:
            continue
        where = route_where(index, route.name)
        selection = Selection.compile(route.select, where=where)
        unread = sorted(ROUTE_UNREAD.intersection(selection.columns))
        selection.close()
        if unread:
            raise SelectionError(
                where,
                route.select,
                f"a route's select cannot read {', '.join(unread)} (the mover does not "
                "keep the exchange and routing key a message was delivered with)",
            )
        checked[route.name] = route.select
    return checked


def route_where(index: int, name: str) -> str:
    """How an error names a route: its place in the config and its name."""
    return f"routes[{index}] ({name})"
