"""report/decision_sections.parked_section: a park's and a replay's counts as a table."""

from __future__ import annotations

from rmq_spark.report.decision_sections import parked_section
from rmq_spark.report.parked import PARKED, ParkedCount

REJECTED = ParkedCount("dr///shop.dlq", PARKED, "orders", "rejected", 3, 3072)
NEVER_DIED = ParkedCount("dr///shop.dlq", PARKED, None, None, 1, 2)


def test_a_park_is_one_row_per_source_and_death_without_a_destination_column() -> None:
    [section] = parked_section([REJECTED, NEVER_DIED])
    assert "<h2>Parked by source and death reason</h2>" in section
    assert "<th>destination</th>" not in section
    assert (
        '<td>dr///shop.dlq</td><td>orders</td><td>rejected</td><td class="num">3</td>'
        '<td class="num">3.0 KiB</td>'
    ) in section
    assert '<td></td><td>never died</td><td class="num">1</td><td class="num">2 B</td>' in section


def test_a_replay_names_each_rows_destination() -> None:
    replayed = ParkedCount("dr///shop.dlq", "dr///orders", "orders", "rejected", 3, 3072)
    [section] = parked_section([replayed])
    assert "<h2>Replayed by source and death reason</h2>" in section
    assert "<th>destination</th>" in section
    assert "<td>dr///shop.dlq</td><td>dr///orders</td><td>orders</td>" in section


def test_any_other_run_has_no_section() -> None:
    assert parked_section([]) == []
