"""A park's or a replay's report figures: messages per source, destination and death.

A park's rows are in the ledger's `parked` table (`park/table.py`): per source queue,
the origin queue and reason of each message's newest death (`last_death`, NULL when it
never died), with the body bytes kept. A replay's confirmed ledger rows (decision
`replayed`, `reason` the parked run) name the source and position of the parked row
they published and the queue it went to; the death comes from the parked row itself.
A plain move's or a redrive's run has neither, and no such figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rmq_spark.errors import LedgerError
from rmq_spark.ledger import tables
from rmq_spark.ledger.schema import TRANSFER_KEY
from rmq_spark.transfer.decisions import REPLAYED
from rmq_spark.transfer.parked_table import read_parked

PARKED = "parked table"
_PARKED_COLUMNS = [
    "source_cluster",
    "source_vhost",
    "source_queue",
    "position",
    "last_death",
    "body_size",
]


@dataclass(frozen=True)
class ParkedCount:
    """Messages (and their body bytes) that went from `source` to `destination`, whose
    newest death was `reason` in `origin` (both None: the message never died)."""

    source: str
    destination: str
    origin: str | None
    reason: str | None
    messages: int
    bytes: int


def parked_counts(ledger_path: str, run_id: str, messages: pa.Table) -> list[ParkedCount]:
    """The run's figures: a park's from its parked rows, a replay's from its confirmed
    `replayed` ledger rows; empty for any other run. `messages`: the report's rows of
    the run (the positions are read only for a replay)."""
    if _replayed(messages).num_rows:
        columns = [*TRANSFER_KEY, "position", "decision", "reason", "confirmed_at"]
        rows = tables.read_arrow(ledger_path, "messages", run_id=run_id, columns=columns)
        return replayed_counts(ledger_path, _replayed(rows).to_pylist())
    try:
        parked = read_parked(ledger_path, run_id, _PARKED_COLUMNS).to_pylist()
    except LedgerError:
        return []  # no parked table: nothing was ever parked in this ledger
    return count_deaths((row, PARKED) for row in parked)


def replayed_counts(ledger_path: str, replayed: list[dict[str, Any]]) -> list[ParkedCount]:
    """Each confirmed replayed row with the parked row it published (its parked run is
    the ledger row's `reason`; source and position name it within the run)."""
    parked: dict[tuple[str, str, str, str, int], dict[str, Any]] = {}
    for parked_run in sorted({row["reason"] for row in replayed}):
        for row in read_parked(ledger_path, parked_run, _PARKED_COLUMNS).to_pylist():
            parked[(parked_run, *_source(row), row["position"])] = row
    pairs = []
    for row in replayed:
        found = parked.get((row["reason"], *_source(row), row["position"]))
        if found is not None:  # a parked run since dropped from the table has no deaths
            pairs.append((found, _label(row, "destination")))
    return count_deaths(pairs)


def count_deaths(rows: Iterable[tuple[Mapping[str, Any], str]]) -> list[ParkedCount]:
    """(parked row, destination) pairs counted by source, destination, origin and
    reason; sorted by those, a message that never died before one that did.

    >>> death = {"queue": "orders", "reason": "rejected"}
    >>> row = {"source_cluster": "dr", "source_vhost": "/", "source_queue": "dlq",
    ...     "last_death": death, "body_size": 10}
    >>> count_deaths([(row, "parked table"), (row, "parked table")])
    [ParkedCount(source='dr///dlq', destination='parked table', origin='orders', \
reason='rejected', messages=2, bytes=20)]
    """
    messages: Counter[tuple[str, str, str | None, str | None]] = Counter()
    sizes: Counter[tuple[str, str, str | None, str | None]] = Counter()
    for row, destination in rows:
        death = row.get("last_death") or {}
        key = (_label(row, "source"), destination, death.get("queue"), death.get("reason"))
        messages[key] += 1
        sizes[key] += row.get("body_size") or 0
    return [
        ParkedCount(*key, messages=messages[key], bytes=sizes[key])
        for key in sorted(messages, key=lambda k: (k[0], k[1], k[2] or "", k[3] or ""))
    ]


def _replayed(messages: pa.Table) -> pa.Table:
    """The confirmed replayed rows (none in a ledger without the decision column)."""
    wanted = {"decision", "reason", "confirmed_at"}
    if not wanted <= set(messages.column_names):
        return messages.slice(0, 0)
    replayed = pc.and_(
        pc.equal(messages["decision"], REPLAYED), pc.is_valid(messages["confirmed_at"])
    )
    return messages.filter(replayed)


def _source(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return (row["source_cluster"], row["source_vhost"], row["source_queue"])


def _label(row: Mapping[str, Any], side: str) -> str:
    """cluster/vhost/queue as the report's queue table writes it."""
    return f"{row[f'{side}_cluster']}/{row[f'{side}_vhost']}/{row[f'{side}_queue']}"
