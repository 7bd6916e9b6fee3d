"""Which positions a transfer's ledger lacks: named in the failure line of the
contiguity check, so an operator sees the hole, not only that there is one.

Pure; each engine finds the gaps its own way (`summary_arrow.gaps_arrow`,
`summary_spark.gaps_spark`) only for the transfers whose positions are not contiguous.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from rmq_spark.model import TransferKey

# The key a summary row carries the text under (not a summary column: it is only
# filled in for the transfers that fail the contiguity check).
MISSING_POSITIONS = "missing_positions"
# Ranges named per transfer before "and N more range(s)".
MAX_RANGES_NAMED = 10


def missing_ranges(positions: Iterable[int | None]) -> list[tuple[int, int]]:
    """The ranges (first, last) of positions below the highest that are absent, from 0
    (a null position, which only a malformed row has, is no position)."""
    ranges = []
    expected = 0
    for position in sorted({p for p in positions if p is not None}):
        if position > expected:
            ranges.append((expected, position - 1))
        expected = position + 1
    return ranges


def describe_ranges(ranges: Sequence[tuple[int, int]]) -> str:
    """ "4106-4999, 6001 (895 positions)" for up to MAX_RANGES_NAMED ranges."""
    named = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:MAX_RANGES_NAMED]]
    rest = len(ranges) - MAX_RANGES_NAMED
    count = sum(b - a + 1 for a, b in ranges)
    more = f", and {rest} more range(s)" if rest > 0 else ""
    return f"{', '.join(named)}{more} ({count} position(s))"


def not_contiguous(summary_rows: Sequence[Mapping[str, Any]]) -> list[TransferKey]:
    """The transfers whose ledger rows do not number 0..max without a gap."""
    return [
        TransferKey.of(row)
        for row in summary_rows
        if row["ledger_rows"] and not row["positions_contiguous"]
    ]


def add_missing_positions(
    summary_rows: Sequence[MutableMapping[str, Any]],
    gaps: Mapping[TransferKey, Sequence[tuple[int, int]]],
) -> None:
    """Put the described gaps into the rows they are about (MISSING_POSITIONS)."""
    for row in summary_rows:
        ranges = gaps.get(TransferKey.of(row))
        if ranges:
            row[MISSING_POSITIONS] = describe_ranges(ranges)
