"""The mover's ack/confirm bookkeeping, without a broker."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest

from rmq_spark.model import DeliveryState
from rmq_spark.transfer.decisions import MOVED, Decision
from rmq_spark.transfer.window import (
    FLUSH_FRACTION,
    MAX_FLUSH_DELAY_SECONDS,
    Ack,
    TransferWindow,
    prefetch_for,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def publish(window: TransferWindow, tag: int, body: str = "b", props: str = "p") -> None:
    window.on_publish(
        tag,
        redelivered=False,
        body_size=10,
        body_sha256=body,
        properties_sha256=props,
        message_id=f"m{tag}",
    )


def write_all(window: TransferWindow) -> list[int]:
    rows = window.rows_to_write()
    window.mark_durable(rows)
    return [row.tag for row in rows]


def test_seq_and_position_follow_publish_order(clock: FakeClock) -> None:
    window = TransferWindow(10, first_position=100, clock=clock)
    for tag in (1, 2, 3):
        publish(window, tag)
    rows = window.on_confirm(3, multiple=True)
    assert [(d.tag, d.seq, d.position) for d in rows] == [(1, 1, 100), (2, 2, 101), (3, 3, 102)]
    assert window.next_position == 103


def test_confirmed_but_not_durable_is_never_acked(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    publish(window, 1)
    window.on_confirm(1, multiple=False)
    assert window.take_acks() == []
    assert window.in_flight == 1


def test_durable_but_unconfirmed_is_impossible(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    publish(window, 1)
    delivery = window._by_tag[1]
    with pytest.raises(ValueError, match="published"):
        window.mark_durable([delivery])


def test_multiple_confirm_then_durable_acks_prefix_once(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    for tag in range(1, 6):
        publish(window, tag)
    window.on_confirm(5, multiple=True)
    assert write_all(window) == [1, 2, 3, 4, 5]
    assert window.take_acks() == [Ack(5, multiple=True)]
    assert window.in_flight == 0
    assert window.in_flight_bytes == 0
    assert window.settled


def test_out_of_order_confirms_ack_only_the_contiguous_prefix(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    for tag in range(1, 5):
        publish(window, tag)
    window.on_confirm(3, multiple=False)
    window.on_confirm(1, multiple=False)
    write_all(window)
    assert window.take_acks() == [Ack(1, multiple=True)]
    window.on_confirm(2, multiple=False)
    write_all(window)
    assert window.take_acks() == [Ack(3, multiple=True)]
    assert window.in_flight == 1  # tag 4 still waits for its confirm


def test_multiple_confirm_only_covers_lower_or_equal_seqs(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    for tag in range(1, 5):
        publish(window, tag)
    confirmed = window.on_confirm(2, multiple=True)
    assert [d.seq for d in confirmed] == [1, 2]
    assert window.unconfirmed == 2


def test_nacked_message_is_never_acked_and_blocks_multiple_ack(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    for tag in range(1, 5):
        publish(window, tag)
    nacked = window.on_nack(2, multiple=False)
    assert [d.tag for d in nacked] == [2]
    window.refuse(nacked[0], "nacked by the destination")
    window.on_confirm(4, multiple=True)
    write_all(window)
    acks = window.take_acks()
    # 1 by prefix; 3 and 4 singly; 2 never.
    assert acks == [Ack(1, multiple=True), Ack(3, multiple=False), Ack(4, multiple=False)]
    assert [d.tag for d in window.refused()] == [2]
    assert window.in_flight == 1
    assert window.settled  # only the refused one remains


def test_multiple_nack_covers_every_lower_unconfirmed(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    for tag in range(1, 4):
        publish(window, tag)
    window.on_confirm(1, multiple=False)
    nacked = window.on_nack(3, multiple=True)
    assert [d.tag for d in nacked] == [2, 3]
    assert window.nacked == 2


def test_nacked_then_republished_keeps_its_position_and_counts_attempts(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    window.on_publish(
        1,
        redelivered=False,
        body_size=3,
        body_sha256="b",
        properties_sha256="p",
        message_id=None,
        body=b"abc",
        properties=b"\x00\x00",
    )
    publish(window, 2)
    (nacked,) = window.on_nack(1, multiple=False)
    assert nacked.body == b"abc"  # kept for the retry
    window.on_confirm(2, multiple=False)
    write_all(window)
    assert window.take_acks() == [Ack(2, multiple=False)]  # not held back by the nack
    window.republish(nacked)
    assert (nacked.seq, nacked.attempts, nacked.position) == (3, 2, 0)
    (confirmed,) = window.on_confirm(3, multiple=False)
    assert confirmed is nacked
    assert confirmed.body is None  # freed once confirmed
    write_all(window)
    assert window.take_acks() == [Ack(1, multiple=True)]
    assert window.in_flight == 0


def test_only_nacked_deliveries_can_be_republished(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    publish(window, 1)
    with pytest.raises(ValueError, match="not nacked"):
        window.republish(window._by_tag[1])


def test_lost_destination_marks_unconfirmed_uncertain(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    for tag in range(1, 4):
        publish(window, tag)
    window.on_confirm(1, multiple=False)
    uncertain = window.mark_uncertain()
    assert [(d.tag, d.state) for d in uncertain] == [
        (2, DeliveryState.UNCERTAIN),
        (3, DeliveryState.UNCERTAIN),
    ]
    assert window.unconfirmed == 0
    assert [d.tag for d in window.rows_to_write()] == [1]  # uncertain rows are the mover's


def test_returned_message_is_not_confirmed_by_its_later_ack(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    publish(window, 1, body="a")
    publish(window, 2, body="x")
    publish(window, 3, body="x")
    returned = window.on_return("x", "p", "312 NO_ROUTE")
    assert returned is not None
    assert returned.tag == 2  # the earliest unconfirmed delivery with that content
    assert returned.refusal == "312 NO_ROUTE"
    confirmed = window.on_confirm(3, multiple=True)
    assert [d.tag for d in confirmed] == [1, 3]
    assert returned.state is DeliveryState.REFUSED


def test_a_return_of_a_message_published_with_rewritten_properties_is_refused(
    clock: FakeClock,
) -> None:
    """A redrive publishes the header policy's rewrite: the broker returns those bytes
    (origin queue deleted meanwhile), not the received ones the ledger digests. The
    return must still refuse it, or its later confirm would ack a message that went
    nowhere."""
    window = TransferWindow(10, clock=clock)
    publish(window, 1, body="x", props="received")
    rewritten = b"\x80\x00\x04text"
    window.on_publish(
        2,
        redelivered=False,
        body_size=10,
        body_sha256="x",
        properties_sha256="received",
        message_id="m2",
    ).detail = Decision(MOVED, routing_key="orders", properties=rewritten)
    returned = window.on_return("x", hashlib.sha256(rewritten).hexdigest(), "312 NO_ROUTE")
    assert returned is not None
    assert returned.tag == 2
    assert [d.tag for d in window.on_confirm(2, multiple=True)] == [1]
    assert returned.state is DeliveryState.REFUSED


def test_return_for_unknown_content_matches_nothing(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    publish(window, 1, body="a")
    assert window.on_return("zzz", "p", "312 NO_ROUTE") is None
    assert window.refused() == []


def test_flush_waits_for_a_share_of_the_window_while_confirms_are_pending(
    clock: FakeClock,
) -> None:
    window = TransferWindow(2 * FLUSH_FRACTION, clock=clock)  # flushes at 2 confirmed
    for tag in range(1, 2 * FLUSH_FRACTION + 1):
        publish(window, tag)
    window.on_confirm(1, multiple=False)
    assert not window.should_flush()
    window.on_confirm(2, multiple=False)
    assert window.should_flush()


def test_flush_when_nothing_is_pending_or_after_a_delay(clock: FakeClock) -> None:
    window = TransferWindow(100, clock=clock)
    publish(window, 1)
    publish(window, 2)
    window.on_confirm(1, multiple=False)
    assert not window.should_flush()
    clock.advance(MAX_FLUSH_DELAY_SECONDS)
    assert window.should_flush()
    window.on_confirm(2, multiple=False)
    assert window.should_flush()  # nothing left unconfirmed


def test_nothing_to_flush_when_nothing_is_confirmed(clock: FakeClock) -> None:
    window = TransferWindow(1, clock=clock)
    assert not window.should_flush(draining=True)


def test_tags_must_increase(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    publish(window, 5)
    with pytest.raises(ValueError, match="not above"):
        publish(window, 5)


def test_confirm_timestamp_comes_from_the_clock(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    publish(window, 1)
    clock.advance(2)
    (delivery,) = window.on_confirm(1, multiple=False)
    assert delivery.consumed_at == T0
    assert delivery.confirmed_at == T0 + timedelta(seconds=2)


@pytest.mark.parametrize(
    ("messages", "window_bytes", "average", "expected"),
    [
        (1000, 64 << 20, 1024, 1000),  # small messages: the message window binds
        (1000, 64 << 20, 1 << 20, 64),  # 1 MiB messages: 64 fit in 64 MiB
        (1000, 64 << 20, 100 << 20, 1),  # larger than the byte window: still moves, alone
        (1000, 64 << 20, 0, 1000),  # empty queue / unknown size
    ],
)
def test_prefetch_follows_average_message_size(
    messages: int, window_bytes: int, average: float, expected: int
) -> None:
    assert prefetch_for(messages, window_bytes, average) == expected


def test_withdrawn_publishes_are_neither_uncertain_nor_acked(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    for tag in range(1, 4):
        publish(window, tag)
    unsent = window.on_publish(
        4, redelivered=False, body_size=1, body_sha256="b", properties_sha256="p", message_id=None
    )
    window.on_confirm(2, multiple=True)
    assert write_all(window) == [1, 2]
    window.withdraw([unsent])

    assert [d.tag for d in window.mark_uncertain()] == [3]  # sent, unconfirmed
    assert window.take_acks() == [Ack(2, multiple=True)]
    assert window.take_acks() == []  # 3 uncertain, 4 never sent: neither is acked
    assert window.in_flight == 2


def test_withdrawn_first_publishes_give_their_positions_to_the_next_session(
    clock: FakeClock,
) -> None:
    window = TransferWindow(10, first_position=40, clock=clock)
    for tag in (1, 2):
        publish(window, tag)
    unsent = [
        window.on_publish(
            tag,
            redelivered=False,
            body_size=1,
            body_sha256="b",
            properties_sha256="p",
            message_id=None,
        )
        for tag in (3, 4, 5)
    ]
    window.on_confirm(1, multiple=False)
    window.withdraw(unsent)  # the session ended before their intents were durable

    assert [d.position for d in window.mark_uncertain()] == [41]
    assert [d.position for d in window.rows_to_write()] == [40]
    assert window.next_position == 42  # 42..44 were never sent: numbered again


def test_a_withdrawn_position_below_a_sent_one_is_not_given_again(clock: FakeClock) -> None:
    window = TransferWindow(10, clock=clock)
    withdrawn = window.on_publish(
        1, redelivered=False, body_size=1, body_sha256="b", properties_sha256="p", message_id=None
    )
    publish(window, 2)
    window.withdraw([withdrawn])
    # Only the newest positions are given again: numbering never goes below a sent one.
    assert window.next_position == 2


def test_nacked_deliveries_at_the_end_of_a_session_become_uncertain_rows(
    clock: FakeClock,
) -> None:
    window = TransferWindow(10, clock=clock)
    for tag in (1, 2, 3):
        publish(window, tag)
    (waiting,) = window.on_nack(1, multiple=False)  # waits for its republish's backoff
    (resent,) = window.on_nack(2, multiple=False)
    window.republish(resent)
    window.withdraw([resent])  # the republish waited for the intents lane: never sent
    assert (waiting.state, resent.state) == (DeliveryState.NACKED, DeliveryState.NACKED)

    uncertain = window.mark_uncertain()  # sent at least once, never confirmed
    assert [(d.position, d.state) for d in uncertain] == [
        (0, DeliveryState.UNCERTAIN),
        (1, DeliveryState.UNCERTAIN),
        (2, DeliveryState.UNCERTAIN),
    ]
    assert window.take_acks() == []
    assert window.next_position == 3
