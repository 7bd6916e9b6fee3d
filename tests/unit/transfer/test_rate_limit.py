"""The rate brake (rate_limit.py) over a simulated clock, and the share of the job's limit."""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Sequence

import pytest

from rmq_spark.config import JobConfig, Limits
from rmq_spark.planning.rate_limits import route_rate_limits, transfer_limits, transfers_at_once
from rmq_spark.transfer.rate_limit import (
    MIN_WAIT_SECONDS,
    RateBrake,
    TokenBucket,
)

WINDOW_SECONDS = 10.0


def run_backlog(
    brake: RateBrake, sizes: Sequence[int], *, seconds: float, seed: int = 7
) -> tuple[list[tuple[float, int]], int]:
    """Drive the brake as `Outbound` does with a source that always has a backlog:
    offer what waits, publish what is admitted, wait for the timer it asks for (which
    fires up to 5 ms late, as a busy loop's would). Returns (time, size) of every
    publish, and how many timers it took."""
    jitter = random.Random(seed)
    now, position, timers = 0.0, 0, 0
    published: list[tuple[float, int]] = []
    while now < seconds:
        waiting = [sizes[(position + i) % len(sizes)] for i in range(256)]
        allowed = brake.admit(now, waiting)
        published.extend((now, size) for size in waiting[:allowed])
        position += allowed
        if allowed == len(waiting):
            now += 0.001  # no hold: the loop's next iteration offers the next batch
            continue
        now += brake.wait_seconds(now) + jitter.uniform(0, 0.005)
        timers += 1
    return published, timers


def window_totals(
    published: list[tuple[float, int]], *, start: float, end: float, step: float, by_bytes: bool
) -> list[float]:
    """What was published in every WINDOW_SECONDS window starting from `start` to
    `end - WINDOW_SECONDS`, one per `step`."""
    times = [at for at, _size in published]
    cumulative = [0]
    for _at, size in published:
        cumulative.append(cumulative[-1] + (size if by_bytes else 1))
    totals = []
    begin = start
    while begin + WINDOW_SECONDS <= end:
        first = bisect_left(times, begin)
        last = bisect_left(times, begin + WINDOW_SECONDS)
        totals.append(float(cumulative[last] - cumulative[first]))
        begin += step
    return totals


@pytest.mark.parametrize("rate", [2.0, 37.0, 500.0, 20_000.0])
def test_the_message_rate_holds_within_one_percent_over_every_ten_seconds(rate: float) -> None:
    brake = RateBrake(Limits(messages_per_second=rate), now=0.0)

    published, _timers = run_backlog(brake, [1024], seconds=120.0)

    totals = window_totals(published, start=1.0, end=120.0, step=0.25, by_bytes=False)
    expected = rate * WINDOW_SECONDS
    assert len(totals) > 400
    # Messages are whole: at 2/s a window holds 20, and may catch one more or less.
    tolerance = max(0.01 * expected, 1.0)
    worst = max(abs(total - expected) for total in totals)
    assert worst <= tolerance, (rate, worst, min(totals), max(totals))


def test_the_byte_rate_holds_with_mixed_sizes_and_messages_larger_than_the_burst() -> None:
    # 1 MB/s; a burst is 50 kB, and one message in 50 is 400 kB: it goes when the
    # bucket is out of debt, and the debt it leaves is waited out.
    sizes = [1000] * 49 + [400_000]
    brake = RateBrake(Limits(bytes_per_second=1_000_000.0), now=0.0)

    published, _timers = run_backlog(brake, sizes, seconds=120.0)

    totals = window_totals(published, start=1.0, end=120.0, step=0.25, by_bytes=True)
    worst = max(abs(total - 10_000_000) / 10_000_000 for total in totals)
    # A 10 s window may catch one 400 kB message more or less than its share: 4%.
    assert worst <= 0.05, (worst, min(totals), max(totals))


def test_both_limits_together_hold_the_tighter_one() -> None:
    # 100 messages of 10 kB per second would be 1 MB/s; the byte limit allows 200 kB/s.
    brake = RateBrake(Limits(messages_per_second=100.0, bytes_per_second=200_000.0), now=0.0)

    published, _timers = run_backlog(brake, [10_000], seconds=60.0)

    totals = window_totals(published, start=1.0, end=60.0, step=0.5, by_bytes=False)
    assert all(abs(total - 200) <= 2 for total in totals), (min(totals), max(totals))


def test_the_brake_never_spins_it_asks_for_timers_no_more_often_than_its_minimum_wait() -> None:
    # The backlog offers 256 messages a millisecond, more than twice the limit.
    brake = RateBrake(Limits(messages_per_second=100_000.0), now=0.0)

    published, timers = run_backlog(brake, [10], seconds=10.0)

    assert 0 < timers <= 10.0 / MIN_WAIT_SECONDS + 1
    assert len(published) == pytest.approx(1_000_000, rel=0.01)


def test_a_fresh_brake_allows_only_a_small_burst() -> None:
    brake = RateBrake(Limits(messages_per_second=500.0), now=100.0)

    assert brake.admit(100.0, [1] * 1000) == 26  # 50 ms of the rate, and one into debt
    assert brake.admit(100.0, [1] * 974) == 0
    assert brake.wait_seconds(100.0) == pytest.approx(MIN_WAIT_SECONDS)
    assert brake.admit(100.02, [1] * 974) == 10  # the debt of one is paid first


def test_held_seconds_counts_the_time_publishes_waited() -> None:
    brake = RateBrake(Limits(messages_per_second=10.0), now=0.0)
    assert brake.admit(0.0, [1, 1]) == 2  # the one-message burst, and one into debt
    assert not brake.holding
    assert brake.admit(0.0, [1, 1]) == 0
    assert brake.holding
    assert brake.admit(0.1, [1, 1]) == 1
    assert brake.held_seconds(0.15) == pytest.approx(0.15)
    assert brake.admit(0.2, [1]) == 1
    assert not brake.holding
    assert brake.held_seconds(5.0) == pytest.approx(0.2)  # nothing held since


def test_a_bucket_refuses_nonsense_rates() -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        TokenBucket(0.0, 1.0, now=0.0)
    with pytest.raises(ValueError, match="burst must be > 0"):
        TokenBucket(1.0, 0.0, now=0.0)


def test_a_transfer_keeps_to_the_smaller_of_its_route_limit_and_its_share_of_the_job() -> None:
    job = Limits(messages_per_second=1000.0, bytes_per_second=8_000_000.0)
    route = Limits(messages_per_second=100.0)

    limits = transfer_limits(job, route, at_once=4)

    assert limits.messages_per_second == 100.0  # the route's is smaller than 250
    assert limits.bytes_per_second == 2_000_000.0  # a quarter of the job's
    depth = transfer_limits(
        Limits(destination_max_depth=500), Limits(destination_max_depth=800), at_once=4
    )
    assert depth.destination_max_depth == 500  # per queue: the smaller, never shared
    assert transfer_limits(Limits(), Limits(), at_once=3).unlimited
    with pytest.raises(ValueError, match="at_once must be >= 1"):
        transfer_limits(job, route, at_once=0)


def _config(**overrides: object) -> JobConfig:
    raw: dict[str, object] = {
        "clusters": {"dr": {"amqp": ["amqp://dr"], "management": "http://dr:15672"}},
        "routes": [
            {
                "name": "slow",
                "source": {"cluster": "dr"},
                "destination": {"cluster": "dr", "vhost": "copy"},
                "limits": {"messages_per_second": 50},
            },
            {"name": "free", "source": {"cluster": "dr"}, "destination": {"cluster": "dr"}},
        ],
        "ledger": {"path": "/tmp/ledger"},
        "max_active": 6,
        "mover": {"queues_per_task": 2},
    }
    raw.update(overrides)
    return JobConfig.model_validate(raw)


def test_the_job_limit_is_shared_among_the_transfers_that_can_move_at_once() -> None:
    config = _config(limits={"messages_per_second": 600})

    assert transfers_at_once(config, 100) == 6  # three tasks of two queues
    assert transfers_at_once(config, 2) == 2
    assert transfers_at_once(config, 0) == 1
    many = route_rate_limits(config, 100)
    assert many["slow"].messages_per_second == 50.0
    assert many["free"].messages_per_second == 100.0
    one = route_rate_limits(config, 1)
    assert one["free"].messages_per_second == 600.0  # a lone queue has the whole job's
    assert route_rate_limits(_config(), 100) == {
        "slow": Limits(messages_per_second=50.0)
    }  # an unlimited route is left out
