"""Progress arithmetic: moved, rate and ETA from two depth samples."""

from __future__ import annotations

import pytest

from rmq_spark.progress import snapshot


def test_moved_is_the_drop_in_ready_messages() -> None:
    now = snapshot({"a": 100, "b": 50}, {"a": 40, "b": 50}, seconds=2.0)
    assert (now.moved, now.total) == (60, 150)
    assert now.per_queue == {"a": (60, 100), "b": (0, 50)}
    assert now.rate == 30.0
    assert now.eta_seconds == pytest.approx(3.0)


def test_moved_stays_within_zero_and_the_start_depth() -> None:
    # A producer added messages to "a"; "b" was already empty at plan time.
    now = snapshot({"a": 10, "b": 0}, {"a": 25, "b": 0}, seconds=1.0)
    assert now.per_queue == {"a": (0, 10), "b": (0, 0)}
    assert now.eta_seconds is None  # no progress, no estimate


def test_missing_sample_counts_as_not_moved() -> None:
    assert snapshot({"a": 10}, {}, seconds=1.0).moved == 0


def test_log_line_is_structured() -> None:
    line = snapshot({"a": 100, "b": 20}, {"a": 0, "b": 10}, seconds=10.0).log_line(1024)
    assert line == (
        "progress moved=110/120 queues_done=1/2 rate=11msg/s bytes_rate=11264B/s eta=1s"
    )
