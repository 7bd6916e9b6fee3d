"""What a park's ledger rows, parked rows and source depths prove, per source queue.

Pure: plain rows (dicts) and depth readings in, a verdict out; no Spark, no broker.

A park's destination is the parked table, so its witness is the table itself, read back
after the commit, checked against the ledger row by row:

- every confirmed parked ledger row (decision "moved": the batch's data file was durable
  before the row was written, `transfer/parked.py`) has a parked row at its position
  with the same body and property checksums, else it is `unmatched`;
- every parked row has a ledger row at its position with the same checksums (confirmed,
  or uncertain: its task died between the durable file and the confirm), else it is
  `unexpected`;
- the source's exact depth fell by what was parked: `drop` (before - after, stale fences
  of earlier runs removed) against the confirmed parked rows; a drop above them is
  `lost` (gone from the source without a durable parked row), confirmed rows above it
  are `duplicates` (a message parked again after a lost session, each copy named by the
  ledger). Honest only without consumers or publishers on the source: a consumer at
  either reading makes the drop no witness (`witness` "ledger", reported unproven).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MOVED, KEPT = "moved", "kept"
WITNESS_DEPTH, WITNESS_LEDGER = "depth", "ledger"


@dataclass(frozen=True)
class Reading:
    """One exact reading of a source queue (passive queue.declare)."""

    depth: int
    consumers: int


@dataclass(frozen=True)
class ParkVerdict:
    """One source queue's park, and what proves it (module doc)."""

    parked: int  # confirmed ledger rows parked (copies included)
    kept: int  # confirmed ledger rows kept in the source (a selective park)
    uncertain: int  # ledger rows never confirmed: their row may be in the table
    table_rows: int  # the run's parked rows of this queue in the table
    unmatched: int  # confirmed parked rows without their row in the table
    unexpected: int  # rows in the table without a ledger row
    drop: int  # the source's depth drop, stale fences removed
    lost: int
    duplicates: int
    witness: str

    @property
    def verified(self) -> bool:
        return (
            self.lost == 0
            and self.unmatched == 0
            and self.unexpected == 0
            and self.witness == WITNESS_DEPTH
        )


def _fingerprint(row: Mapping[str, Any]) -> tuple[int, str, str]:
    return (int(row["position"]), str(row["body_sha256"]), str(row["properties_sha256"]))


def park_verdict(
    ledger_rows: Iterable[Mapping[str, Any]],
    parked_rows: Iterable[Mapping[str, Any]],
    before: Reading,
    after: Reading,
    *,
    stale_fences: int = 0,
) -> ParkVerdict:
    """The verdict on one source queue's park.

    >>> row = {"position": 0, "body_sha256": "b", "properties_sha256": "p",
    ...        "decision": "moved", "confirmed_at": 1}
    >>> park_verdict([row], [row], Reading(1, 0), Reading(0, 0)).verified
    True
    >>> park_verdict([row], [], Reading(1, 0), Reading(0, 0)).unmatched
    1
    """
    confirmed: Counter[tuple[int, str, str]] = Counter()
    every_row: set[tuple[int, str, str]] = set()
    kept = uncertain = 0
    for row in ledger_rows:
        decision = str(row.get("decision") or MOVED)
        if row.get("confirmed_at") is None:
            if decision == MOVED:
                uncertain += 1
                every_row.add(_fingerprint(row))
            continue
        if decision == KEPT:
            kept += 1
            continue
        confirmed[_fingerprint(row)] += 1
        every_row.add(_fingerprint(row))
    in_table: Counter[tuple[int, str, str]] = Counter(_fingerprint(row) for row in parked_rows)
    parked = sum(confirmed.values())
    unmatched = sum(max(count - in_table[key], 0) for key, count in confirmed.items())
    unexpected = sum(count for key, count in in_table.items() if key not in every_row)
    drop = before.depth - after.depth - stale_fences
    witness = WITNESS_DEPTH if before.consumers == 0 and after.consumers == 0 else WITNESS_LEDGER
    return ParkVerdict(
        parked=parked,
        kept=kept,
        uncertain=uncertain,
        table_rows=sum(in_table.values()),
        unmatched=unmatched,
        unexpected=unexpected,
        drop=drop,
        lost=max(drop - parked, 0),
        duplicates=max(parked - drop, 0) if witness == WITNESS_DEPTH else 0,
        witness=witness,
    )
