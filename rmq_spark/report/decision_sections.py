"""The report's sections on what decisions did with messages, one function each:
a selective move's moved and kept (`decisions_section`), a redrive's destinations and
death reasons (`routed_section`), the destinations that reorder by priority
(`priority_section`), and a park's or a replay's messages by source, destination and
death (`parked_section`). Each returns no section for a run it says nothing about.
"""

from __future__ import annotations

from typing import Any

from rmq_spark.report.figures import routed_decisions
from rmq_spark.report.markup import escape as _e
from rmq_spark.report.markup import size as _size
from rmq_spark.report.parked import PARKED, ParkedCount


def decisions_section(queues: list[dict[str, Any]]) -> list[str]:
    """What a selective move decided, per destination (moved) and per source (kept); no
    section when nothing was kept."""
    if not any(q["kept"] for q in queues):
        return []
    moved: dict[str, int] = {}
    kept: dict[str, int] = {}
    for q in queues:
        moved[q["destination"]] = moved.get(q["destination"], 0) + (q["moved"] or 0)
        kept[q["source"]] = kept.get(q["source"], 0) + (q["kept"] or 0)
    rows = "".join(
        f'<tr><td>moved</td><td>{_e(where)}</td><td class="num">{count:,}</td></tr>'
        for where, count in sorted(moved.items())
    ) + "".join(
        f'<tr><td>kept</td><td>{_e(where)}</td><td class="num">{count:,}</td></tr>'
        for where, count in sorted(kept.items())
        if count
    )
    return [
        "<section><h2>Decisions</h2>"
        "<p>Each examined message was moved to its destination or kept in its source, "
        "in its order (routes[].select).</p>"
        '<div class="wide"><table class="queues"><thead><tr><th>decision</th>'
        "<th>queue</th><th>messages</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div></section>"
    ]


def routed_section(messages: Any) -> list[str]:
    """Where each decision sent messages and why (a redrive: per origin queue and death
    reason, and the kept ones with why); no section for a plain move's run."""
    rows = "".join(
        f"<tr><td>{_e(decision)}</td><td>{_e(where)}</td><td>{_e(reason)}</td>"
        f'<td class="num">{count:,}</td></tr>'
        for decision, where, reason, count in routed_decisions(messages)
    )
    if not rows:
        return []
    return [
        "<section><h2>Decisions by destination and reason</h2>"
        "<p>Confirmed rows per decision: moved to the queue (or exchange/key) named, or kept "
        "in the source, with the death reason or why it was kept (ledger columns "
        "<code>publish_routing_key</code> and <code>reason</code>).</p>"
        '<div class="wide"><table class="queues"><thead><tr><th>decision</th>'
        "<th>destination</th><th>reason</th><th>messages</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div></section>"
    ]


def priority_section(queues: list[dict[str, Any]]) -> list[str]:
    """The transfers whose destination will deliver moved messages by their priority
    property (a quorum queue on RabbitMQ 4.x); no section when there are none."""
    reordered = [q for q in queues if q["reordered_by_priority"]]
    if not reordered:
        return []
    rows = "".join(
        f"<tr><td>{_e(q['source'])}</td><td>{_e(q['destination'])}</td>"
        f'<td class="num">{q["reordered_by_priority"]:,}</td></tr>'
        for q in reordered
    )
    return [
        "<section><h2>Priority order</h2>"
        "<p>These destinations are quorum queues on RabbitMQ 4.x, which deliver by the "
        "<code>priority</code> property without any queue argument (4.3 in strict priority "
        "order, 4.0 priorities of 5 and above first): the moved messages that set it reach "
        "consumers in priority order, not in source order.</p>"
        '<div class="wide"><table class="queues"><thead><tr><th>source</th>'
        "<th>destination</th><th>moved with a priority</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div></section>"
    ]


def parked_section(counts: list[ParkedCount]) -> list[str]:
    """A park's messages per source and death, or a replay's per source, destination
    and death (`report/parked.py`); no section for any other run."""
    if not counts:
        return []
    parking = all(c.destination == PARKED for c in counts)
    rows = "".join(
        f"<tr><td>{_e(c.source)}</td>"
        + ("" if parking else f"<td>{_e(c.destination)}</td>")
        + f"<td>{_e(c.origin or '')}</td><td>{_e(c.reason or 'never died')}</td>"
        f'<td class="num">{c.messages:,}</td><td class="num">{_e(_size(c.bytes))}</td></tr>'
        for c in counts
    )
    title, about = (
        ("Parked", "Rows of the parked table this run wrote, per source queue")
        if parking
        else ("Replayed", "Confirmed replayed rows, per source queue and destination")
    )
    return [
        f"<section><h2>{title} by source and death reason</h2>"
        f"<p>{about}, by the origin queue and reason of each message's newest death "
        "(<code>last_death</code> of the parked row; empty for a message that never "
        "died), with the body bytes.</p>"
        '<div class="wide"><table class="queues"><thead><tr><th>source</th>'
        + ("" if parking else "<th>destination</th>")
        + "<th>origin</th><th>death reason</th><th>messages</th><th>bodies</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div></section>"
    ]
