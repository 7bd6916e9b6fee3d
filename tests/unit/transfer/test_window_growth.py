"""The window's growth (window_growth.py) and the byte window that applies it, without a broker."""

from __future__ import annotations

import doctest

import pytest

from rmq_spark.transfer import window_growth
from rmq_spark.transfer.byte_window import ByteWindow
from rmq_spark.transfer.window_growth import FACTOR, GAIN, MIN_SECONDS, TURNS, WindowGrowth

KiB = 1024
MiB = 1024 * KiB


def measure(growth: WindowGrowth, rate: float, *, at: float) -> tuple[bool, float]:
    """Feed one window's refill then TURNS windows at `rate` msg/s from `at`; (grew, end)."""
    limit = growth.limit
    assert not growth.observe(limit, now=at, bytes_bound=False)  # the refill, not counted
    end = at + TURNS * limit / rate
    return growth.observe(TURNS * limit, now=end, bytes_bound=False), end


def test_the_docstring_example_holds() -> None:
    result = doctest.testmod(window_growth)
    assert result.attempted > 0
    assert result.failed == 0


def test_a_window_grows_while_its_rate_grows_with_it_up_to_the_ceiling() -> None:
    growth = WindowGrowth(1000, 5000)
    at, limits = 0.0, []
    for rate in (1000.0, 2000.0, 4000.0):  # a far destination: rate follows the window
        grew, at = measure(growth, rate, at=at)
        assert grew
        limits.append(growth.limit)
    assert limits == [1000 * FACTOR, 1000 * FACTOR**2, 5000]
    assert growth.settled  # the ceiling: nothing more to measure
    assert not growth.observe(10**6, now=at + 1, bytes_bound=False)


def test_a_rate_that_does_not_gain_a_tenth_settles_the_window() -> None:
    growth = WindowGrowth(1000, 64000)
    grew, at = measure(growth, 5000.0, at=0.0)
    assert grew
    assert growth.limit == 2000
    grew, at = measure(growth, 5000.0 * (1 + GAIN) * 0.99, at=at)  # the brokers' limit
    assert not grew
    assert growth.settled
    assert growth.limit == 2000
    grew, _ = measure(growth, 50_000.0, at=at)
    assert not grew
    assert growth.limit == 2000


def test_nothing_is_counted_before_the_refill_nor_before_three_windows() -> None:
    growth = WindowGrowth(100, 1000)
    assert not growth.observe(99, now=0.0, bytes_bound=False)
    assert not growth.observe(1, now=5.0, bytes_bound=False)  # the refill ends here
    assert not growth.observe(TURNS * 100 - 1, now=6.0, bytes_bound=False)
    assert growth.observe(1, now=6.0, bytes_bound=False)  # 300 in 1 s: the first rate
    assert growth.limit == 200


def test_a_rate_is_measured_over_half_a_second_at_least() -> None:
    # A window of 100, 20 ms away: three turns take 0.12 s, and a 0.1 s stall in them
    # would halve the rate measured. The measurement goes on until MIN_SECONDS.
    growth = WindowGrowth(100, 1000)
    assert not growth.observe(100, now=0.0, bytes_bound=False)  # the refill
    assert not growth.observe(TURNS * 100, now=0.12, bytes_bound=False)
    assert not growth.observe(900, now=MIN_SECONDS - 0.01, bytes_bound=False)
    assert growth.observe(100, now=MIN_SECONDS, bytes_bound=False)
    assert growth.limit == 200


def test_a_window_the_bytes_bound_is_settled_at_once() -> None:
    growth = WindowGrowth(1000, 20000)
    assert not growth.observe(1, now=0.0, bytes_bound=True)
    assert growth.settled
    assert growth.limit == 1000


def test_a_fixed_window_never_grows() -> None:
    growth = WindowGrowth(5000, 5000)
    assert growth.settled
    assert not measure(growth, 1.0, at=0.0)[0]


@pytest.mark.parametrize("start", [0, 5001])
def test_a_start_outside_the_ceiling_is_refused(start: int) -> None:
    with pytest.raises(ValueError, match=r"start must be in 1\.\.5000"):
        WindowGrowth(start, 5000)


def prefetch_after(window: ByteWindow) -> int | None:
    wanted = window.wanted_prefetch()
    if wanted is not None:
        window.qos_sent(wanted)
        window.qos_ok()
    return wanted


def test_the_byte_window_asks_for_the_grown_prefetch() -> None:
    window = ByteWindow(8000, 64 * MiB, largest_message=KiB, start_messages=1000)
    assert window.granted == 1000
    window.observe(1000, KiB, now=0.0)  # the refill
    assert prefetch_after(window) is None
    window.observe(TURNS * 1000, KiB, now=1.0)
    assert window.growth.limit == 2000
    assert prefetch_after(window) == 2000  # a new consumer with the grown prefetch


def test_large_messages_keep_the_byte_bound_and_settle_the_growth() -> None:
    window = ByteWindow(20000, 64 * MiB, largest_message=MiB, start_messages=1000)
    assert window.granted == 64  # 64 MiB of 1 MiB messages
    window.observe(64, MiB, now=0.0)
    assert window.growth.settled
    assert window.growth.limit == 1000
    assert prefetch_after(window) is None


def test_without_a_clock_the_window_stays_where_it_started() -> None:
    window = ByteWindow(8000, 64 * MiB, largest_message=KiB, start_messages=1000)
    for _ in range(10):
        window.observe(1000, KiB)
    assert window.growth.limit == 1000
    assert prefetch_after(window) is None
