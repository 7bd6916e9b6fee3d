"""The destination depth bound (depth_bound.py) on its own, and in a session (fake links)."""

from __future__ import annotations

import pytest

from rmq_spark.config import Limits
from rmq_spark.transfer.depth_bound import POLL_SECONDS, DepthBound
from tests.support.fakes import MoverRig, mover_rig


def answered_bound(bound: int, ready: int) -> DepthBound:
    depth = DepthBound(bound)
    depth.session_started()
    depth.asked(0)
    depth.answered(ready, now=0.0)
    return depth


def test_nothing_goes_before_the_depth_is_known() -> None:
    depth = DepthBound(100)
    depth.session_started()

    assert depth.admit(10, now=0.0) == 0
    assert depth.wants_depth
    assert not depth.holding  # unknown is not held: one question away


def test_it_publishes_up_to_the_bound_then_holds_until_a_tenth_below() -> None:
    depth = answered_bound(100, ready=0)

    assert depth.admit(150, now=1.0) == 100
    depth.published(100)
    assert depth.holding
    assert depth.wants_depth
    depth.asked(0)
    assert not depth.wants_depth  # one question at a time
    depth.answered(95, now=2.0)  # a consumer took 5: not yet a tenth below
    assert depth.holding
    assert depth.admit(10, now=2.0) == 0
    depth.asked(0)
    depth.answered(90, now=3.0)
    assert not depth.holding
    assert depth.admit(10, now=3.0) == 10
    assert not depth.holding
    assert depth.held_seconds(now=10.0) == pytest.approx(2.0)


def test_publishes_sent_after_the_question_count_on_top_of_its_answer() -> None:
    depth = answered_bound(100, ready=0)
    assert depth.admit(50, now=0.0) == 50
    depth.published(50)
    depth.asked(0)  # all 50 confirmed: the answer counts them
    assert depth.admit(20, now=0.0) == 20  # estimate 0 + 50: room for 50
    depth.published(20)

    depth.answered(60, now=0.1)  # a consumer took 40 of the 50, and the 20 follow it

    assert depth.admit(100, now=0.1) == 20  # 60 + 20 in flight: room for 20


def test_publishes_unconfirmed_when_asked_count_on_top_of_the_answer() -> None:
    # A classic queue answers its count ahead of the publishes in its mailbox: only
    # confirmed ones are surely counted.
    depth = answered_bound(100, ready=0)
    assert depth.admit(50, now=0.0) == 50
    depth.published(50)
    depth.asked(30)  # 30 of them not yet confirmed

    depth.answered(20, now=0.1)

    assert depth.admit(100, now=0.1) == 50  # 20 + 30 that may come: room for 50


def test_a_destination_already_above_the_bound_is_waited_for() -> None:
    depth = answered_bound(100, ready=500)

    assert depth.holding
    assert depth.admit(1, now=0.0) == 0


def test_a_new_session_asks_again_and_keeps_a_hold() -> None:
    depth = answered_bound(100, ready=100)
    depth.session_started()

    assert depth.holding
    assert depth.wants_depth


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="bound must be >= 1"):
        DepthBound(0)


def deliver(rig: MoverRig, first_tag: int, count: int) -> None:
    for tag in range(first_tag, first_tag + count):
        rig.source.deliver(tag, b"x")
    rig.timers.run_due()
    rig.lanes.finish("intents")


def test_a_session_publishes_to_the_bound_holds_the_source_and_polls_until_it_falls() -> None:
    rig = mover_rig(window_messages=1000, rate_limits=Limits(destination_max_depth=10))
    rig.open_session()
    depth_answer = rig.destination.events.on_destination_depth

    deliver(rig, 1, 30)
    assert rig.destination.published == []  # the depth is asked first
    assert rig.destination.depth_asks == 1
    depth_answer(0)
    rig.timers.run_due()  # the loop iteration ends: the next question leaves
    rig.lanes.finish("intents")
    assert len(rig.destination.published) == 10
    rig.confirm(10)  # after the second question: it may leave these 10 out
    rig.lanes.finish("ledger")
    assert rig.source.deliver(31, b"x") is True  # held, but the source is read on
    assert rig.destination.depth_asks == 2  # at the bound: asked again at once

    depth_answer(0)  # the 10 not yet counted: 0 + 10 unconfirmed, at the bound
    rig.timers.advance(POLL_SECONDS - 0.01)
    assert rig.destination.depth_asks == 2
    rig.timers.advance(0.02)
    assert rig.destination.depth_asks == 3  # polled while held

    depth_answer(9)  # above 9 (a tenth below 10) it would stay held
    rig.lanes.finish("intents")
    assert len(rig.destination.published) == 11
    assert not rig.source.paused  # the prefetch, not a pause, bounds what waits

    rig.timers.advance(POLL_SECONDS)
    depth_answer(0)  # a consumer drained it; the 11th, unconfirmed when asked, may come
    rig.lanes.finish("intents")
    assert len(rig.destination.published) == 20  # room for 9
