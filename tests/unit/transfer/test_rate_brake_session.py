"""The rate brake in a session (fake links): held deliveries, a source read on, timers."""

from __future__ import annotations

from rmq_spark.config import Limits
from tests.support.fakes import MoverRig, mover_rig


def deliver(rig: MoverRig, first_tag: int, count: int) -> list[bool]:
    """Deliveries arrive; what the source link was told after each (go on or pause)."""
    return [rig.source.deliver(tag, b"x" * 10) for tag in range(first_tag, first_tag + count)]


def publish_for(rig: MoverRig, seconds: float, step: float = 0.005) -> None:
    """Let the loop run: timers fire, intents become durable at once."""
    elapsed = 0.0
    while elapsed < seconds:
        rig.timers.advance(step)
        rig.lanes.finish("intents")
        elapsed += step


def test_a_braked_session_holds_deliveries_until_the_timer_without_pausing_the_source() -> None:
    rig = mover_rig(window_messages=1000, rate_limits=Limits(messages_per_second=100.0))
    rig.open_session()

    assert all(deliver(rig, 1, 40))  # one loop iteration's worth: not yet braked
    rig.timers.run_due()
    rig.lanes.finish("intents")
    assert len(rig.destination.published) == 6  # the burst (50 ms of the rate) and one
    # Held back, yet the source is read on: the prefetch bounds what is held, and a
    # pause would stop every queue sharing the connection.
    assert deliver(rig, 41, 1) == [True]
    assert not rig.source.paused

    publish_for(rig, 0.3)
    assert 34 <= len(rig.destination.published) <= 37  # 100 per second
    assert len(rig.destination.published) < 41  # still holding some

    rig.confirm(len(rig.destination.published))
    rig.lanes.finish("ledger")
    assert not rig.source.paused

    publish_for(rig, 0.2)
    assert len(rig.destination.published) == 41  # all that was held went out


def test_an_unlimited_transfer_is_never_braked() -> None:
    rig = mover_rig(window_messages=1000, rate_limits=Limits())
    rig.open_session()

    assert all(deliver(rig, 1, 200))
    rig.timers.run_due()
    rig.lanes.finish("intents")

    assert len(rig.destination.published) == 200
