"""The positions a ledger lacks, as the contiguity failure names them."""

from __future__ import annotations

from typing import Any

from rmq_spark.model import TransferKey
from rmq_spark.verify.gaps import (
    MISSING_POSITIONS,
    add_missing_positions,
    describe_ranges,
    missing_ranges,
    not_contiguous,
)

KEY = TransferKey("old", "/", "q", "new", "/", "q")


def test_missing_ranges_from_zero_skip_repeated_positions() -> None:
    assert missing_ranges([]) == []
    assert missing_ranges([0, 1, 1, 2]) == []
    assert missing_ranges([2, 3, 7, 9, 9]) == [(0, 1), (4, 6), (8, 8)]


def test_ranges_are_described_with_their_count_and_capped() -> None:
    assert describe_ranges([(4106, 4999), (6001, 6001)]) == "4106-4999, 6001 (895 position(s))"
    many = [(2 * i, 2 * i) for i in range(12)]
    assert describe_ranges(many).endswith(", 16, 18, and 2 more range(s) (12 position(s))")


def test_only_transfers_with_rows_and_a_gap_are_looked_at() -> None:
    def row(queue: str, rows: int, contiguous: bool) -> dict[str, Any]:
        return {
            **{name: getattr(KEY, name) for name in KEY.__dataclass_fields__},
            "source_queue": queue,
            "ledger_rows": rows,
            "positions_contiguous": contiguous,
        }

    rows = [row("ok", 3, True), row("empty", 0, False), row("holed", 3, False)]
    (holed,) = not_contiguous(rows)
    assert holed.source_queue == "holed"
    add_missing_positions(rows, {holed: [(1, 1)]})
    assert rows[2][MISSING_POSITIONS] == "1 (1 position(s))"
    assert MISSING_POSITIONS not in rows[0]
