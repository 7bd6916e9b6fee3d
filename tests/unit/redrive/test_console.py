"""console: a moving redrive's decisions, each destination's witness, and its RESULT line."""

from __future__ import annotations

from collections import Counter

from rmq_spark.model import MoveOutcome, TransferKey
from rmq_spark.redrive.console import format_result
from rmq_spark.redrive.preflight import DeadLetterQueue
from rmq_spark.redrive.run import RedriveResult
from rmq_spark.redrive.tally import QueueReading, SourceVerdict, destination_verdict

DLQ = DeadLetterQueue("dr", "shop", "shop.dlq")
KEY = TransferKey("dr", "shop", "shop.dlq", "dr", "shop", "shop.dlq")


def result(
    *,
    consumers: int = 0,
    orders_after: int = 3,
    lost: int = 0,
    limits: tuple[str, ...] = (),
    duplicates: int = 0,
) -> RedriveResult:
    outcome = MoveOutcome(KEY, "moved", None, 5, 50, 0, 19, 1.0, 1, kept=14, fences=1)
    return RedriveResult(
        run_id="redrive-1",
        dlq=DLQ,
        outcome=outcome,
        counts=Counter(
            {
                ("moved", "orders", "rejected"): 3,
                ("moved", "shop/eu.payments", "rejected"): 2,
                ("kept", "shop.dlq", "not selected"): 14,
            }
        ),
        source=SourceVerdict(19 + duplicates, 5, 14, 0, True, 5 + lost, lost, duplicates),
        destinations=(
            destination_verdict(
                "orders",
                3,
                0,
                QueueReading(0, consumers, limits),
                QueueReading(orders_after, consumers, limits),
            ),
            destination_verdict("shop/eu.payments", 2, 0, None, None),
        ),
        seconds=2.5,
    )


def test_a_clean_run_prints_decisions_destinations_and_a_verified_result() -> None:
    lines = format_result(result()).splitlines()
    assert lines[0] == "run redrive-1, by its ledger rows (confirmed):"
    assert [line.split() for line in lines[2:5]] == [
        ["moved", "orders", "rejected", "3"],
        ["moved", "shop/eu.payments", "rejected", "2"],
        ["kept", "shop.dlq", "not", "selected", "14"],
    ]
    assert [line.split() for line in lines[6:8]] == [
        ["orders", "3", "depth", "0", "3", "0"],
        ["shop/eu.payments", "2", "confirms", "-", "-", "-"],
    ]
    assert lines[-1] == (
        "RESULT verified: run redrive-1, examined 19, moved 5, kept 14, lost 0, uncertain 0, "
        "2.5 s; destinations unproven (confirms only): shop/eu.payments"
    )


def test_an_origin_with_a_consumer_is_unproven_and_one_short_without_is_not_verified() -> None:
    consumed = format_result(result(consumers=1, orders_after=1)).splitlines()[-1]
    assert consumed.startswith("RESULT verified: ")
    assert consumed.endswith("unproven (confirms only): orders, shop/eu.payments")
    short = format_result(result(orders_after=1)).splitlines()
    assert short[6].split()[:4] == ["orders", "3", "missing", "2"]
    assert short[-1].startswith("RESULT NOT VERIFIED: ")
    assert short[-1].endswith("; missing at a destination 2")


def test_a_dlq_that_fell_by_more_than_was_moved_is_not_verified_and_says_lost() -> None:
    line = format_result(result(lost=2)).splitlines()[-1]
    assert line.startswith("RESULT NOT VERIFIED: ")
    assert ", lost 2, " in line


def test_a_short_origin_with_a_ttl_is_unproven_naming_it_never_missing() -> None:
    lines = format_result(result(orders_after=1, limits=("message-ttl",))).splitlines()
    assert lines[6].split()[:3] == ["orders", "3", "confirms"]
    assert lines[-1].startswith("RESULT verified: ")
    assert lines[-1].endswith("unproven (confirms only): orders (message-ttl), shop/eu.payments")


def test_a_message_published_twice_is_counted_once_and_its_repeat_named() -> None:
    line = format_result(result(duplicates=1)).splitlines()[-1]
    assert line.startswith(
        "RESULT verified: run redrive-1, examined 20, moved 5, kept 14, lost 0, uncertain 0, "
        "duplicates 1 (named in the ledger), 2.5 s"
    )
