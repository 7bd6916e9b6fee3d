"""QueueMover: sessions in sequence, the reconnect policy, the outcome (fake links)."""

from __future__ import annotations

import inspect

from rmq_spark.config import MoverConfig
from rmq_spark.errors import AccessRefusedError, TransferError
from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.mover import QueueMover
from tests.support.fakes import mover_rig

# A property block with only `priority` set (5): the flags word's bit 11, then the octet.
PRIORITY_5 = b"\x08\x00\x05"


def test_reconnect_gives_up_after_the_configured_attempts() -> None:
    rig = mover_rig(limits=MoverConfig(reconnect_attempts=2, backoff_seconds=0.5))
    for session in range(1, 4):
        assert len(rig.connector.links) == session
        rig.source.lose()
        rig.timers.run_due()
        rig.timers.advance(5.0)  # past every backoff
    assert len(rig.connector.links) == 3  # the first session and two reconnects
    (error,) = rig.results
    assert isinstance(error, TransferError)
    assert "gave up after 3 lost session(s)" in str(error)
    assert rig.intents.closed is False  # kept for the retry: it names what may have arrived


def test_a_lost_session_reconnects_after_a_backoff_that_doubles() -> None:
    rig = mover_rig(limits=MoverConfig(reconnect_attempts=5, backoff_seconds=0.5))
    rig.source.lose()
    rig.timers.run_due()
    rig.timers.advance(0.49)
    assert len(rig.connector.links) == 1
    rig.timers.advance(0.02)
    assert len(rig.connector.links) == 2
    rig.source.lose()
    rig.timers.run_due()
    rig.timers.advance(0.99)
    assert len(rig.connector.links) == 2
    rig.timers.advance(0.02)
    assert len(rig.connector.links) == 3


def test_refused_access_ends_the_transfer_without_reconnecting() -> None:
    rig = mover_rig()
    refused = AccessRefusedError("cluster blue vhost '/': access refused")
    rig.source.events.on_refused("source", refused)
    rig.source.connection_closed = rig.destination.connection_closed = True
    rig.timers.advance(60.0)
    assert rig.results == [refused]
    assert len(rig.connector.links) == 1


def test_the_outcome_counts_the_moved_messages_whose_properties_set_priority() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.receive(b"a", b"b", properties=PRIORITY_5)
    rig.receive(b"c", first_tag=3)
    rig.confirm(3)
    rig.lanes.finish("ledger")
    rig.drain_to_the_end()
    (outcome,) = rig.results
    assert isinstance(outcome, MoveOutcome)
    assert (outcome.messages, outcome.priority_messages) == (3, 2)


def test_the_outcome_counts_every_session() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.receive(b"ab")
    rig.confirm(1)
    rig.lanes.finish("ledger")
    rig.source.lose()
    rig.timers.run_due()
    rig.timers.advance(5.0)
    rig.open_session()
    rig.receive(b"cde")
    rig.confirm(1)
    rig.lanes.finish("ledger")
    rig.drain_to_the_end()
    (outcome,) = rig.results
    assert isinstance(outcome, MoveOutcome)
    assert (outcome.messages, outcome.bytes, outcome.sessions) == (2, 5, 2)
    assert (outcome.first_position, outcome.next_position) == (0, 2)
    assert rig.ledger.closed
    assert rig.intents.closed is True


def test_window_stages_say_where_the_deliveries_are() -> None:
    rig = mover_rig()
    assert rig.mover.window_stages().moved == 0
    rig.open_session()
    for tag in (1, 2, 3):
        rig.source.deliver(tag, b"m")
    rig.timers.run_due()
    stages = rig.mover.window_stages()
    assert (stages.logging, stages.destination, stages.ledger) == (3, 0, 0)
    rig.lanes.finish("intents")
    rig.confirm(2)
    stages = rig.mover.window_stages()
    assert (stages.logging, stages.destination, stages.ledger) == (0, 1, 2)
    rig.lanes.finish("ledger")
    assert rig.mover.window_stages().moved == 2


def test_intents_are_required() -> None:
    """An engine without an intent log gives up crash safety: only by name (NoIntents)."""
    intents = inspect.signature(QueueMover).parameters["intents"]
    assert intents.default is inspect.Parameter.empty
