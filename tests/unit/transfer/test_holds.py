"""The holds on publishing and reading (holds.py): one set of reasons, and one answer
to "may it resume now"; then the holds as a session keeps them (fake links)."""

from __future__ import annotations

from rmq_spark.config import Limits
from rmq_spark.transfer.holds import Hold, Holds
from rmq_spark.transfer.session import Session
from tests.support.fakes import MoverRig, mover_rig


def session_holds(rig: MoverRig) -> Holds:
    session = rig.source.events  # the links' events are the session's
    assert isinstance(session, Session)
    return session.outbound.holds


def test_publishing_resumes_only_when_its_last_hold_lets_go() -> None:
    holds = Holds()
    assert not holds.publishing_held
    holds.hold(Hold.INTENTS)
    holds.hold(Hold.RATE)
    assert holds.publishing_held
    assert holds.release(Hold.INTENTS) is False  # the rate brake still holds
    assert holds.reasons == {Hold.RATE}
    assert holds.release(Hold.RATE) is True
    assert not holds.publishing_held


def test_a_hold_on_reading_neither_holds_publishing_nor_is_held_by_it() -> None:
    holds = Holds()
    holds.hold(Hold.BYTES)
    assert not holds.publishing_held  # publishing is what brings the bytes back under
    holds.hold(Hold.DEPTH)
    assert holds.release(Hold.BYTES) is True  # reading resumes while publishing waits
    assert holds.publishing_held
    assert holds.release(Hold.DEPTH) is True


def test_releasing_a_reason_that_does_not_hold_changes_nothing() -> None:
    holds = Holds()
    holds.hold(Hold.DEPTH)
    assert holds.release(Hold.RATE) is False
    assert Hold.DEPTH in holds


def test_a_session_holds_a_batch_until_the_one_being_logged_is_out() -> None:
    rig = mover_rig(window_messages=100)
    rig.open_session()
    rig.source.deliver(1, b"a")
    rig.timers.run_due()  # the first batch goes to the intents lane
    holds = session_holds(rig)
    assert holds.reasons == {Hold.INTENTS}
    rig.source.deliver(2, b"b")
    rig.timers.run_due()
    assert rig.lanes.waiting("intents") == 1  # the second batch waits (group commit)
    rig.lanes.finish("intents")  # the first is durable and published: the hold lets go
    assert rig.destination.published == [b"a"]
    assert holds.reasons == {Hold.INTENTS}  # ...and the second is being logged
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"a", b"b"]
    assert not holds.reasons


def test_a_braked_session_holds_publishing_by_the_rate_until_its_timer() -> None:
    rig = mover_rig(window_messages=1000, rate_limits=Limits(messages_per_second=100.0))
    rig.open_session()
    for tag in range(1, 21):
        rig.source.deliver(tag, b"x")
    rig.timers.run_due()
    rig.lanes.finish("intents")
    holds = session_holds(rig)
    assert holds.reasons == {Hold.RATE}
    published = len(rig.destination.published)
    assert published < 20
    rig.timers.advance(0.05)
    rig.lanes.finish("intents")
    assert len(rig.destination.published) > published
