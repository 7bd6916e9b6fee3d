"""park/verdicts.py: what a park's ledger rows, parked rows and source depths prove; and
what the console prints of it (park/command.py)."""

from __future__ import annotations

import json
from typing import Any

from rmq_spark.model import MoveOutcome, QueueTransfer, TransferKey
from rmq_spark.park.command import format_result
from rmq_spark.park.run import ParkedQueue, ParkResult
from rmq_spark.park.verdicts import WITNESS_DEPTH, WITNESS_LEDGER, Reading, park_verdict


def row(position: int, *, decision: str = "moved", confirmed: bool = True) -> dict[str, Any]:
    return {
        "position": position,
        "body_sha256": f"b{position}",
        "properties_sha256": f"p{position}",
        "decision": decision,
        "confirmed_at": 1 if confirmed else None,
    }


def test_every_confirmed_row_in_the_table_and_the_drop_matching_verifies() -> None:
    rows = [row(i) for i in range(3)]
    verdict = park_verdict(rows, rows, Reading(3, 0), Reading(0, 0))
    assert verdict.verified
    assert (verdict.parked, verdict.table_rows, verdict.lost, verdict.duplicates) == (3, 3, 0, 0)
    assert verdict.witness == WITNESS_DEPTH


def test_a_confirmed_row_missing_from_the_table_is_unmatched() -> None:
    rows = [row(i) for i in range(3)]
    verdict = park_verdict(rows, rows[:2], Reading(3, 0), Reading(0, 0))
    assert verdict.unmatched == 1
    assert not verdict.verified


def test_a_table_row_with_other_checksums_is_unmatched_and_unexpected() -> None:
    changed = {**row(1), "body_sha256": "other"}
    verdict = park_verdict([row(0), row(1)], [row(0), changed], Reading(2, 0), Reading(0, 0))
    assert (verdict.unmatched, verdict.unexpected) == (1, 1)
    assert not verdict.verified


def test_a_source_drop_above_the_parked_rows_is_lost() -> None:
    verdict = park_verdict([row(0)], [row(0)], Reading(5, 0), Reading(3, 0))
    assert verdict.lost == 1
    assert not verdict.verified


def test_an_uncertain_row_whose_copy_is_in_the_table_is_no_surprise() -> None:
    # Its task died after the durable file, before the confirm; the source redelivered
    # the message, parked again at position 1.
    uncertain, again = row(0, confirmed=False), {**row(1), "body_sha256": "b0"}
    parked = [uncertain, again]
    verdict = park_verdict([uncertain, again], parked, Reading(1, 0), Reading(0, 0))
    assert verdict.verified
    assert (verdict.uncertain, verdict.table_rows, verdict.unexpected) == (1, 2, 0)


def test_kept_rows_are_counted_apart_and_stay_in_the_source() -> None:
    rows = [row(0), row(1, decision="kept"), row(2)]
    verdict = park_verdict(rows, [rows[0], rows[2]], Reading(3, 0), Reading(1, 0))
    assert verdict.verified
    assert (verdict.parked, verdict.kept, verdict.drop) == (2, 1, 2)


def test_stale_fences_removed_from_the_source_are_not_counted_as_lost() -> None:
    rows = [row(0)]
    verdict = park_verdict(rows, rows, Reading(2, 0), Reading(0, 0), stale_fences=1)
    assert (verdict.drop, verdict.lost) == (1, 0)


def test_a_consumer_on_the_source_leaves_the_park_unproven() -> None:
    rows = [row(0)]
    verdict = park_verdict(rows, rows, Reading(1, 1), Reading(0, 0))
    assert verdict.witness == WITNESS_LEDGER
    assert not verdict.verified


def test_the_console_names_each_source_and_ends_with_the_result_line() -> None:
    rows = [row(i) for i in range(2)]
    transfer = QueueTransfer(
        "r", "dr", "/", "orders.dlq", "classic", "", "parked", "/", "orders.dlq", 2, 0, 0
    )
    outcome = MoveOutcome(TransferKey.of(vars(transfer)), "moved", None, 2, 20, 0, 2, 1.0, 1)
    queue = ParkedQueue(
        transfer,
        outcome,
        Reading(2, 0),
        Reading(0, 0),
        park_verdict(rows, rows, Reading(2, 0), Reading(0, 0)),
    )
    text = format_result(ParkResult("park-1", (queue,), 2.0, exclude_body=False))
    assert "dr:/:orders.dlq" in text
    summary = json.loads(text.splitlines()[-1].removeprefix("RESULT "))
    assert (summary["verified"], summary["parked"], summary["lost"]) == (True, 2, 0)
    assert format_result(ParkResult("park-2", (), 0.1, exclude_body=False)).endswith(
        "nothing parked"
    )
