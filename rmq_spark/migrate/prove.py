"""The ledger's proof of a migration: every message moved out was moved back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rmq_spark.errors import RmqSparkError
from rmq_spark.ledger import tables
from rmq_spark.migrate.hops import HOP_BACK, HOP_HELD, HOP_OUT
from rmq_spark.migrate.selection import QueueMigration


@dataclass(frozen=True)
class QueueOutcome:
    """One migrated queue, as the ledger proves it."""

    vhost: str
    queue: str
    migration_id: str
    moved_out: int  # distinct messages moved Q -> T
    moved_back: int  # distinct messages moved T -> Q
    held: int  # distinct messages published during the swap, moved H -> Q
    missing: int  # moved out but not moved back (must be 0)
    duplicates: int  # extra copies named by the ledger across the hops
    bindings: int

    @property
    def verified(self) -> bool:
        return self.missing == 0 and self.moved_back >= self.moved_out


def prove(ledger_path: str, plans: Sequence[QueueMigration]) -> list[QueueOutcome]:
    """Per queue, from the ledger: every message moved out was moved back.

    Compares the multisets of (body, property bytes) checksums of the distinct confirmed
    rows of the out hop with the confirmed rows of the back hop.
    """
    outcomes = []
    by_run: dict[str, list[dict[str, Any]]] = {}

    def rows(run_id: str) -> list[dict[str, Any]]:
        if run_id not in by_run:
            try:
                table = tables.read_arrow(
                    ledger_path,
                    "messages",
                    run_id=run_id,
                    columns=[
                        "source_vhost",
                        "source_queue",
                        "position",
                        "redelivered",
                        "confirmed_at",
                        "body_sha256",
                        "properties_sha256",
                    ],
                )
                by_run[run_id] = table.to_pylist()
            except RmqSparkError:
                by_run[run_id] = []
        return by_run[run_id]

    for plan in plans:
        mid = plan.migration_id
        out, out_dups = _distinct(rows(f"{mid}-{HOP_OUT}"), plan.vhost, plan.queue)
        back, back_dups = _distinct(rows(f"{mid}-{HOP_BACK}"), plan.vhost, plan.temp)
        held, held_dups = _distinct(rows(f"{mid}-{HOP_HELD}"), plan.vhost, plan.holding)
        outcomes.append(
            QueueOutcome(
                vhost=plan.vhost,
                queue=plan.queue,
                migration_id=mid,
                moved_out=sum(out.values()),
                moved_back=sum(back.values()),
                held=sum(held.values()),
                missing=sum((out - back).values()),
                duplicates=out_dups + back_dups + held_dups,
                bindings=len(plan.bindings),
            )
        )
    return outcomes


def _distinct(
    rows: list[dict[str, Any]], vhost: str, source_queue: str
) -> tuple[Counter[tuple[str, str]], int]:
    """Confirmed rows of one source queue, without the redelivered repeats (counted)."""
    distinct: Counter[tuple[str, str]] = Counter()
    duplicates = 0
    mine = [r for r in rows if r["source_vhost"] == vhost and r["source_queue"] == source_queue]
    for row in sorted(mine, key=lambda r: r["position"]):
        if row["confirmed_at"] is None:
            continue
        fingerprint = (row["body_sha256"], row["properties_sha256"])
        if row["redelivered"] and distinct[fingerprint]:
            duplicates += 1
            continue
        distinct[fingerprint] += 1
    return distinct, duplicates
