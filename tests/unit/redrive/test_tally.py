"""tally: per destination what arrived and what proves it; the DLQ's side: nothing lost."""

from __future__ import annotations

from typing import Any

import pytest

from rmq_spark.redrive.tally import (
    WITNESS_CONFIRMS,
    WITNESS_DEPTH,
    QueueReading,
    decision_counts,
    destination_verdict,
    destination_verdicts,
    source_verdict,
)

DLQ = "shop.dlq"


def row(
    position: int,
    decision: str = "moved",
    key: str | None = "orders",
    *,
    exchange: str = "",
    reason: str = "rejected",
    confirmed: bool = True,
    redelivered: bool = False,
    body: str | None = None,
) -> dict[str, Any]:
    routed = decision == "moved" and key is not None
    return {
        "position": position,
        "decision": decision,
        "publish_exchange": exchange if routed else None,
        "publish_routing_key": key if routed else None,
        "reason": reason,
        "confirmed_at": 1 if confirmed else None,
        "redelivered": redelivered,
        "body_sha256": body or f"b{position}",
        "properties_sha256": "p",
        "message_id": None,
    }


def test_counts_by_decision_destination_and_reason_leave_out_unconfirmed_rows() -> None:
    rows = [
        row(0),
        row(1, key="payments", reason="expired"),
        row(2, "kept", reason="not selected"),
        row(3, key="eu.orders", exchange="shop"),
        row(4, confirmed=False),
        row(5, "kept", reason="no x-death"),
    ]
    assert decision_counts(rows, DLQ) == {
        ("moved", "orders", "rejected"): 1,
        ("moved", "payments", "expired"): 1,
        ("moved", "shop/eu.orders", "rejected"): 1,
        ("kept", DLQ, "not selected"): 1,
        ("kept", DLQ, "no x-death"): 1,
    }


@pytest.mark.parametrize(
    ("before", "after", "uncertain", "witness", "missing"),
    [
        # nobody else there: the rise proves each confirmed message arrived
        (QueueReading(5, 0), QueueReading(8, 0), 0, WITNESS_DEPTH, 0),
        # an uncertain publish that did arrive is within the rise
        (QueueReading(5, 0), QueueReading(9, 0), 1, WITNESS_DEPTH, 0),
        # confirmed, yet not there, and nobody consumed: missing, a failure
        (QueueReading(5, 0), QueueReading(6, 0), 0, WITNESS_DEPTH, 2),
        # a consumer at a reading: the depth proves nothing, the confirms say arrived
        (QueueReading(5, 1), QueueReading(5, 1), 0, WITNESS_CONFIRMS, 0),
        (QueueReading(5, 0), QueueReading(5, 2), 0, WITNESS_CONFIRMS, 0),
        # more than every row: another publisher; unproven, not unexpected
        (QueueReading(5, 0), QueueReading(20, 0), 0, WITNESS_CONFIRMS, 0),
        # no queue to read (an exchange was the destination)
        (None, None, 0, WITNESS_CONFIRMS, 0),
    ],
)
def test_a_destination_is_proven_by_its_depth_only_when_nothing_else_changes_it(
    before: QueueReading | None,
    after: QueueReading | None,
    uncertain: int,
    witness: str,
    missing: int,
) -> None:
    verdict = destination_verdict("orders", 3, uncertain, before, after)
    assert (verdict.witness, verdict.missing) == (witness, missing)
    assert verdict.proven == (witness == WITNESS_DEPTH and missing == 0)


@pytest.mark.parametrize(
    ("before", "after", "expiring", "because"),
    [
        # a queue that drops by itself: its TTL or length limit may have taken them
        (QueueReading(5, 0, ("message-ttl",)), QueueReading(6, 0), False, ("message-ttl",)),
        (
            QueueReading(5, 0, ("max-length",)),
            QueueReading(6, 0, ("max-length", "max-length-bytes")),
            False,
            ("max-length", "max-length-bytes"),
        ),
        # the redriven messages carry their per-message TTL again
        (QueueReading(5, 0), QueueReading(6, 0), True, ("restored per-message TTL",)),
        # the delivery counter rose: a consumer came and went between the readings
        (
            QueueReading(5, 0, delivered=10),
            QueueReading(6, 0, delivered=12),
            False,
            ("a consumer came and went",),
        ),
    ],
)
def test_a_shortfall_something_else_may_explain_is_unproven_with_its_cause_never_missing(
    before: QueueReading, after: QueueReading, expiring: bool, because: tuple[str, ...]
) -> None:
    verdict = destination_verdict("orders", 3, 0, before, after, expiring=expiring)
    assert (verdict.witness, verdict.missing, verdict.unproven_because) == (
        WITNESS_CONFIRMS,
        0,
        because,
    )
    assert not verdict.proven


def test_a_shortfall_is_missing_when_the_delivery_counter_stood_still() -> None:
    before, after = QueueReading(5, 0, delivered=10), QueueReading(6, 0, delivered=10)
    verdict = destination_verdict("orders", 3, 0, before, after)
    assert (verdict.witness, verdict.missing, verdict.unproven_because) == (WITNESS_DEPTH, 2, ())


def test_a_limit_does_not_weaken_a_rise_that_proves_every_arrival() -> None:
    before, after = QueueReading(5, 0, ("message-ttl",)), QueueReading(8, 0, ("message-ttl",))
    assert destination_verdict("orders", 3, 0, before, after, expiring=True).proven


def test_destination_verdicts_name_each_destination_with_its_own_rows_and_readings() -> None:
    rows = [row(0), row(1), row(2, key="payments"), row(3, "kept"), row(4, confirmed=False)]
    before = {"orders": QueueReading(0, 0), "payments": QueueReading(0, 0)}
    after = {"orders": QueueReading(2, 0), "payments": QueueReading(0, 0)}
    orders, payments = destination_verdicts(rows, DLQ, before, after)
    assert (orders.destination, orders.confirmed, orders.uncertain) == ("orders", 2, 1)
    assert (orders.rise, orders.proven) == (2, True)
    assert (payments.destination, payments.missing, payments.proven) == ("payments", 1, False)


def test_the_dlq_falls_by_the_moved_ones_kept_ones_went_back_and_repeats_count_once() -> None:
    rows = [
        row(0),
        row(1, "kept"),
        row(2, body="same"),
        row(3, body="same", redelivered=True),  # a duplicate of position 2
        row(4, confirmed=False),
        row(5, "kept"),
    ]
    verdict = source_verdict(rows, QueueReading(6, 0), QueueReading(3, 0), stale_fences=1)
    assert (verdict.examined, verdict.moved, verdict.kept, verdict.uncertain) == (6, 2, 2, 1)
    assert verdict.duplicates == 1
    assert (verdict.drop, verdict.lost, verdict.passed) == (3, 0, True)


def test_a_dlq_that_fell_by_more_than_was_moved_lost_messages() -> None:
    verdict = source_verdict([row(0), row(1, "kept")], QueueReading(10, 0), QueueReading(6, 0))
    assert (verdict.lost, verdict.passed) == (3, False)


def test_a_gap_in_positions_fails_the_dlq_even_when_its_depth_adds_up() -> None:
    verdict = source_verdict([row(0), row(2)], QueueReading(2, 0), QueueReading(0, 0))
    assert (verdict.positions_contiguous, verdict.lost, verdict.passed) == (False, 0, False)
