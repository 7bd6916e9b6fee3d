"""Phases: seconds per named step of a verification, on an injected clock."""

from __future__ import annotations

import pytest

from rmq_spark.verify.phases import Phases


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phases_are_timed_in_the_order_they_first_ran_and_repeats_add_up() -> None:
    clock = Clock()
    phases = Phases(clock)
    with phases.timed("summary"):
        clock.now += 1.5
    with phases.timed("expectations"):
        clock.now += 0.25
    with phases.timed("summary"):
        clock.now += 0.5
    assert phases.seconds() == (("summary", 2.0), ("expectations", 0.25))
    assert phases.describe() == "summary 2.0s, expectations 0.2s"


def test_a_phase_that_raises_is_still_timed() -> None:
    clock = Clock()
    phases = Phases(clock)

    def failing_summary() -> None:
        with phases.timed("summary"):
            clock.now += 3.0
            raise RuntimeError("the summary's Spark job failed")

    with pytest.raises(RuntimeError):
        failing_summary()
    assert phases.seconds() == (("summary", 3.0),)


def test_no_phase_timed_is_empty() -> None:
    assert Phases(Clock()).seconds() == ()
    assert Phases(Clock()).describe() == ""
