"""The byte window's prefetch rules (byte_window.py), without a broker."""

from __future__ import annotations

import pytest

from rmq_spark.transfer.byte_window import (
    CHANGE_FACTOR,
    LARGEST_MESSAGE_BYTES,
    ByteWindow,
    first_estimate,
)

KiB = 1024
MiB = 1024 * KiB


def test_first_prefetch_cannot_overflow_the_byte_window_whatever_the_sizes() -> None:
    window = ByteWindow(5000, 64 * MiB)
    assert window.granted == max(1, 64 * MiB // LARGEST_MESSAGE_BYTES) == 1
    told = ByteWindow(5000, 64 * MiB, largest_message=16 * MiB)
    assert told.granted == 4


def test_prefetch_follows_the_sizes_received() -> None:
    window = ByteWindow(5000, 16 * MiB)
    window.qos_sent(window.granted)
    window.qos_ok()
    window.observe(1, MiB)
    assert window.wanted_prefetch() == 16
    window.qos_sent(16)
    window.qos_ok()
    window.observe(16, MiB)
    assert window.wanted_prefetch() is None  # steady sizes: no more basic.qos


def test_small_messages_are_capped_by_the_message_window() -> None:
    window = ByteWindow(5000, 64 * MiB)
    window.observe(1, KiB)
    assert window.wanted_prefetch() == 5000


def test_a_large_message_lowers_the_prefetch_at_once() -> None:
    window = ByteWindow(5000, 64 * MiB)
    window.observe(1, KiB)
    window.qos_sent(5000)
    window.qos_ok()
    window.observe(3, 32 * MiB)
    assert window.wanted_prefetch() == 2


def test_the_large_message_is_forgotten_after_two_generations() -> None:
    window = ByteWindow(5000, 64 * MiB)
    window.observe(1, 32 * MiB)
    window.qos_sent(window.wanted_prefetch() or 0)
    window.qos_ok()
    assert window.granted == 2
    # The generation after the large one and the one after that, of small messages.
    for _ in range(2):
        window.observe(2, KiB)
    assert window.estimate == KiB
    assert window.wanted_prefetch() == 5000


def test_no_second_qos_while_one_is_on_its_way() -> None:
    window = ByteWindow(5000, 64 * MiB)
    window.qos_sent(1)
    window.observe(1, KiB)
    assert window.wanted_prefetch() is None
    window.qos_ok()
    assert window.wanted_prefetch() == 5000


@pytest.mark.parametrize("factor", [CHANGE_FACTOR - 0.1, 1 / (CHANGE_FACTOR - 0.1)])
def test_sizes_that_wander_a_little_change_nothing(factor: float) -> None:
    window = ByteWindow(5000, 100 * MiB)
    window.observe(1, MiB)
    window.qos_sent(100)
    window.qos_ok()
    wandered = int(MiB / factor)
    for _ in range(3):
        window.observe(100, wandered)
    assert window.estimate == wandered
    assert window.wanted_prefetch() is None


@pytest.mark.parametrize(("messages", "window_bytes"), [(0, MiB), (10, 0)])
def test_empty_windows_are_refused(messages: int, window_bytes: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        ByteWindow(messages, window_bytes)


def test_a_queue_the_plan_saw_fit_in_the_window_is_prefetched_whole_at_once() -> None:
    twenty_small = ByteWindow(1000, 64 * MiB, largest_message=first_estimate(20, 20 * KiB))
    assert twenty_small.granted == 1000  # 64 MiB // 20 KiB = 3,276, within the message window
    larger_than_the_window = first_estimate(100_000, 100 * MiB)
    assert ByteWindow(1000, 64 * MiB, largest_message=larger_than_the_window).granted == 1


@pytest.mark.parametrize(
    ("messages", "message_bytes"),
    [
        (20, 0),  # no statistics yet, or the metrics collector is off
        (0, 0),  # an empty queue
        (None, None),  # a row without the plan's sample
        (3, LARGEST_MESSAGE_BYTES * 2),  # no tighter than what RabbitMQ accepts anyway
    ],
)
def test_without_a_usable_sample_the_first_prefetch_assumes_the_largest_message(
    messages: int | None, message_bytes: int | None
) -> None:
    assert first_estimate(messages, message_bytes) == LARGEST_MESSAGE_BYTES
