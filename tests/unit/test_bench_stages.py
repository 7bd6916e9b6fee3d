"""bench.stages' arithmetic: Little's law over sampled stage counts (pure)."""

from __future__ import annotations

import pytest

from bench.stages import Sample, stage_times
from rmq_spark.transfer.stages import WindowStages


def steady(count: int, *, logging: int, destination: int, ledger: int, rate: float) -> list[Sample]:
    """`count` samples 10 ms apart of a mover moving `rate` deliveries a second."""
    return [
        (i * 0.01, WindowStages(logging, destination, ledger, moved=int(rate * i * 0.01)))
        for i in range(count)
    ]


def test_time_per_stage_is_deliveries_held_over_rate() -> None:
    # 1000 msg/s with a window of 500: a round trip of 500 ms, of which 100 deliveries
    # logging (100 ms), 250 at the destination (250 ms), 50 in the ledger (50 ms).
    result = stage_times(steady(200, logging=100, destination=250, ledger=50, rate=1000), 500)

    assert result["rate"] == 1000
    assert result["round_trip_ms"] == 500.0
    assert result["milliseconds"] == {
        "logging": 100.0,
        "destination": 250.0,
        "ledger": 50.0,
        "source": 100.0,
    }
    assert result["share"]["destination"] == 0.5
    assert result["destination_full_share"] == 0.0


def test_only_the_middle_of_the_run_counts() -> None:
    samples = steady(100, logging=0, destination=450, ledger=0, rate=1000)
    # The first and last tenth (filling and emptying the window) must not count.
    samples[:10] = [(t, WindowStages(0, 0, 0, s.moved)) for t, s in samples[:10]]
    samples[-10:] = [(t, WindowStages(0, 0, 0, s.moved)) for t, s in samples[-10:]]

    result = stage_times(samples, 500)

    assert result["milliseconds"]["destination"] == 450.0
    assert result["destination_full_share"] == 1.0  # 450 of 500 is the 90% mark


def test_too_few_samples_or_nothing_moved_is_an_error() -> None:
    with pytest.raises(ValueError, match="too few"):
        stage_times(steady(5, logging=1, destination=1, ledger=1, rate=10), 10)
    with pytest.raises(ValueError, match="nothing moved"):
        stage_times(steady(50, logging=1, destination=1, ledger=1, rate=0), 10)
