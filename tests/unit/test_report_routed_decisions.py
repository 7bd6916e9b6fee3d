"""The report's decisions by destination and reason: a redrive's origins, kept ones' why."""

from __future__ import annotations

import pyarrow as pa

from rmq_spark.report.decision_sections import routed_section
from rmq_spark.report.figures import routed_decisions


def messages(*rows: tuple[str | None, str | None, str | None, str | None, bool]) -> pa.Table:
    decision, exchange, key, reason, confirmed = zip(*rows, strict=True)
    return pa.table(
        {
            "source_queue": ["shop.dlq"] * len(rows),
            "decision": list(decision),
            "publish_exchange": list(exchange),
            "publish_routing_key": list(key),
            "reason": list(reason),
            "confirmed_at": [1 if c else None for c in confirmed],
        }
    )


def test_rows_count_per_decision_destination_and_reason_confirmed_only() -> None:
    table = messages(
        ("kept", None, None, "not selected", True),
        ("moved", "", "orders", "rejected", True),
        ("moved", "", "orders", "rejected", True),
        ("moved", "shop", "eu.payments", "expired", True),
        ("moved", "", "orders", "rejected", False),  # uncertain: not counted
        ("moved", None, None, None, True),  # a plain move's row: nothing to say
    )
    assert routed_decisions(table) == [
        ("moved", "orders", "rejected", 2),
        ("moved", "shop/eu.payments", "expired", 1),
        ("kept", "shop.dlq", "not selected", 1),
    ]
    [section] = routed_section(table)
    assert (
        '<tr><td>moved</td><td>orders</td><td>rejected</td><td class="num">2</td></tr>' in section
    )


def test_a_plain_move_and_an_older_ledger_get_no_section() -> None:
    plain = messages(("moved", None, None, None, True))
    older = pa.table({"source_queue": ["q"], "confirmed_at": [1]})
    assert routed_section(plain) == []
    assert routed_section(older) == []
