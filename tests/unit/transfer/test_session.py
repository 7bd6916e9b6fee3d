"""A session driven through fake links (tests/support/fakes.py): every guarantee the
mover keeps, checked without a broker."""

from __future__ import annotations

from rmq_spark.config import MoverConfig
from rmq_spark.model import DeliveryState, MoveOutcome
from rmq_spark.transfer.drain import IDLE_DEPTH_CHECK_SECONDS
from rmq_spark.transfer.session import FINISHING, TICK_SECONDS, Ending, Stage
from tests.support.fakes import NO_PROPERTIES, MoverRig, mover_rig


def finish_drain(rig: MoverRig) -> MoveOutcome:
    """Drive an idle, consuming session through the drain proof to its outcome."""
    rig.timers.advance(IDLE_DEPTH_CHECK_SECONDS)
    rig.source.events.on_depth(0, 1)
    rig.source.events.on_cancel_ok()
    rig.source.events.on_get_empty()
    rig.timers.advance(TICK_SECONDS)
    rig.timers.run_due()  # both connections report closed
    rig.lanes.finish("ledger")  # the ledger closes on its lane
    rig.lanes.finish("intents")  # the spent intent log goes on its lane
    (outcome,) = rig.results
    assert isinstance(outcome, MoveOutcome)
    return outcome


def test_source_is_acked_only_after_confirm_and_durable_row() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.receive(b"a", b"b")
    assert rig.destination.published == [b"a", b"b"]
    assert [d.position for d in rig.intents.logged] == [0, 1]  # logged before the publish

    rig.timers.advance(1.0)
    assert rig.source.acks == []  # published, not confirmed

    rig.confirm(2)
    assert rig.lanes.waiting("ledger") == 1
    assert rig.source.acks == []  # confirmed, the row not yet durable
    rig.timers.advance(1.0)
    assert rig.source.acks == []

    rig.lanes.finish("ledger")
    assert [row.position for row in rig.ledger.rows] == [0, 1]
    assert rig.source.acked_tags == [1, 2]

    outcome = finish_drain(rig)
    assert (outcome.status, outcome.messages, outcome.bytes) == ("moved", 2, 2)


def test_nacked_publish_is_sent_again_after_backoff_then_refused() -> None:
    rig = mover_rig(limits=MoverConfig(nack_retries=1, backoff_seconds=0.5))
    rig.open_session()
    rig.receive(b"x")
    rig.confirm(1, ack=False)
    rig.timers.advance(0.45)
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"x"]  # not before the backoff

    rig.timers.advance(0.1)
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"x", b"x"]

    rig.confirm(2, ack=False)  # out of retries: refused
    rig.timers.advance(60.0)
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"x", b"x"]
    assert rig.source.cancels == 1  # the transfer stops taking messages

    rig.source.events.on_cancel_ok()  # failed: no drain proof
    assert rig.source.gets == 0
    rig.timers.advance(TICK_SECONDS)
    rig.timers.run_due()
    rig.lanes.finish("ledger")
    rig.lanes.finish("intents")  # the spent intent log goes on its lane
    (outcome,) = rig.results
    assert isinstance(outcome, MoveOutcome)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "nacked" in outcome.error
    assert rig.source.acks == []  # it stays in the source
    assert rig.ledger.rows == []


def test_publishes_waiting_for_intents_are_withdrawn_when_the_session_ends() -> None:
    rig = mover_rig()
    rig.open_session()
    for tag, body in enumerate((b"a", b"b"), start=1):
        rig.source.deliver(tag, body)
    rig.timers.run_due()
    assert rig.lanes.waiting("intents") == 1  # the batch's intents are being logged

    rig.source.lose()  # the session ends while the intents are not yet durable
    assert len(rig.intents.logged) == 2  # the session waited for the log...
    assert rig.destination.batches == []  # ...but never sent the batch
    assert rig.ledger.rows == []  # never sent, so not uncertain either
    assert rig.source.acks == []


def test_lost_destination_writes_unconfirmed_as_uncertain_rows() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.receive(b"a", b"b", b"c")
    rig.confirm(1, multiple=False)

    rig.destination.lose()
    by_position = {row.position: row for row in rig.ledger.rows}
    assert sorted(by_position) == [0, 1, 2]
    assert by_position[0].state is DeliveryState.DURABLE
    assert by_position[0].confirmed_at is not None
    for position in (1, 2):
        assert by_position[position].state is DeliveryState.UNCERTAIN
        assert by_position[position].confirmed_at is None
    assert rig.source.acked_tags == [1]  # the confirmed one is acked; the others go back

    rig.timers.run_due()
    rig.timers.advance(MoverConfig().backoff_seconds)
    assert len(rig.connector.links) == 2  # a new session, numbering on
    rig.open_session()
    rig.receive(b"b", b"c", first_tag=1)
    assert [d.position for d in rig.intents.logged][-2:] == [3, 4]


def test_zero_count_without_our_consumer_does_not_end_the_drain() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.timers.advance(TICK_SECONDS)
    assert rig.source.depth_asks == 1
    rig.source.events.on_depth(0, 0)  # a busy quorum leader: "0 messages, 0 consumers"
    rig.timers.advance(IDLE_DEPTH_CHECK_SECONDS / 2)
    assert rig.source.cancels == 0
    assert rig.results == []

    rig.timers.advance(IDLE_DEPTH_CHECK_SECONDS)
    assert rig.source.depth_asks == 2  # asked again later
    rig.source.events.on_depth(0, 1)
    assert rig.source.cancels == 1


def test_message_found_by_the_drain_proof_resumes_consuming() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.timers.advance(TICK_SECONDS)
    rig.source.events.on_depth(0, 1)
    rig.source.events.on_cancel_ok()
    assert rig.source.gets == 1

    rig.source.events.on_got(7, False, b"late", NO_PROPERTIES, 0)
    assert rig.source.consumes == 2  # consuming again
    rig.timers.run_due()
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"late"]
    rig.confirm(1)
    rig.lanes.finish("ledger")
    assert rig.source.acked_tags == list(range(1, 8))  # a multiple ack up to tag 7
    assert rig.results == []

    outcome = finish_drain(rig)
    assert (outcome.status, outcome.messages) == ("moved", 1)


def test_held_bytes_past_the_window_pause_the_source_until_acked() -> None:
    rig = mover_rig(window_messages=4, window_bytes=25)
    rig.open_session()
    assert rig.source.deliver(1, b"x" * 10)
    assert rig.source.deliver(2, b"x" * 10)
    assert not rig.source.deliver(3, b"x" * 10)  # 30 bytes held: past the window
    rig.timers.run_due()
    rig.lanes.finish("intents")
    rig.confirm(3)
    assert rig.source.paused  # confirmed is not yet acked
    rig.lanes.finish("ledger")
    assert rig.source.acked_tags == [1, 2, 3]
    assert not rig.source.paused


def test_a_source_consumer_timeout_is_a_lost_session_not_a_failure() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.source.events.on_channel_closed(
        "source", 406, "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out"
    )
    rig.timers.run_due()
    rig.timers.advance(MoverConfig().backoff_seconds)
    assert len(rig.connector.links) == 2  # a new session
    assert rig.results == []


def test_a_message_too_large_for_the_destination_is_refused_and_fails_the_queue() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.receive(b"small", b"x" * 64)
    rig.destination.events.on_channel_closed(
        "destination", 406, "PRECONDITION_FAILED - message size 64 is larger than max size 16"
    )
    rig.timers.run_due()
    rig.lanes.finish("ledger")
    rig.lanes.finish("intents")  # the spent intent log goes on its lane
    (outcome,) = rig.results
    assert isinstance(outcome, MoveOutcome)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "64 bytes" in outcome.error
    assert "source position 1" in outcome.error
    assert "max_message_size 16" in outcome.error
    assert [row.position for row in rig.ledger.rows] == [0]  # "small" is uncertain; 64 never
    assert rig.ledger.rows[0].state is DeliveryState.UNCERTAIN
    assert rig.source.acks == []
    assert len(rig.connector.links) == 1  # no new session: it would meet the same answer


def test_positions_withdrawn_by_a_lost_session_are_numbered_again_without_a_gap() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.receive(b"a", b"b")
    rig.confirm(1, multiple=False)
    rig.lanes.finish("ledger")
    for tag, body in enumerate((b"c", b"d", b"e"), start=3):
        rig.source.deliver(tag, body)
    rig.timers.run_due()
    assert rig.lanes.waiting("intents") == 1  # positions 2..4 given, not yet sent

    rig.destination.lose()  # the destination's node dies with the read-ahead unsent
    assert [d.position for d in rig.intents.logged] == [0, 1, 2, 3, 4]
    assert sorted(row.position for row in rig.ledger.rows) == [0, 1]  # 1 uncertain

    rig.timers.run_due()
    rig.timers.advance(MoverConfig().backoff_seconds)
    rig.open_session()
    rig.receive(b"b", b"c", b"d", b"e", first_tag=1)  # redelivered
    assert [d.position for d in rig.intents.logged][-4:] == [2, 3, 4, 5]
    rig.confirm(4)
    rig.lanes.finish("ledger")
    positions = sorted(row.position for row in rig.ledger.rows)
    assert positions == list(range(6))  # contiguous: every position has a row


def test_a_graver_cause_replaces_an_earlier_one_while_the_session_closes() -> None:
    reset, refused = "connection reset", OSError("disk full")
    lost = FINISHING.graver(Ending(Stage.LOST, lost=reset))
    assert lost == Ending(Stage.LOST, lost=reset)  # finishing, then a connection went
    assert lost.graver(Ending(Stage.LOST, lost="later")) is lost  # the first reason stays
    fatal = lost.graver(Ending(Stage.FATAL, fatal=refused))
    assert fatal.stage is Stage.FATAL
    assert fatal.fatal is refused
    assert fatal.graver(Ending(Stage.LOST, lost=reset)) is fatal
    assert fatal.graver(FINISHING) is fatal


def test_overlapping_ledger_writes_ack_rows_only_once_they_and_earlier_rows_are_durable() -> None:
    rig = mover_rig(overlap=2)  # an object-store ledger's lanes let writes overlap
    rig.open_session()
    rig.receive(b"a", b"b")
    rig.confirm(2)
    rig.receive(b"c", b"d", first_tag=3)
    rig.confirm(4)
    assert rig.lanes.waiting("ledger") == 2  # the second write did not wait for the first
    assert rig.lanes.overlapping["ledger"] == 2
    assert rig.source.acks == []

    rig.lanes.finish("ledger", 1)
    assert [row.position for row in rig.ledger.rows] == [0, 1]
    assert rig.source.acked_tags == [1, 2]  # not 3 and 4: their row is not durable yet

    rig.lanes.finish("ledger", 1)
    assert rig.source.acked_tags == [1, 2, 3, 4]
    outcome = finish_drain(rig)
    assert (outcome.status, outcome.messages) == ("moved", 4)


def test_without_overlap_a_session_writes_its_rows_one_write_at_a_time() -> None:
    rig = mover_rig()  # a local ledger's lanes
    rig.open_session()
    rig.receive(b"a", b"b")
    rig.confirm(2)
    rig.receive(b"c", b"d", first_tag=3)
    rig.confirm(4)
    assert rig.lanes.waiting("ledger") == 1  # rows 2 and 3 wait for the next write
    rig.lanes.finish("ledger", 1)
    assert rig.source.acked_tags == [1, 2]
    assert rig.lanes.waiting("ledger") == 1
    rig.lanes.finish("ledger", 1)
    assert rig.source.acked_tags == [1, 2, 3, 4]


def test_overlapping_intent_batches_are_logged_at_once_and_published_in_order() -> None:
    rig = mover_rig(overlap=2)
    rig.open_session()
    rig.source.deliver(1, b"a")
    rig.timers.run_due()  # the end of a loop iteration: a batch goes to the lane
    rig.source.deliver(2, b"b")
    rig.timers.run_due()
    rig.source.deliver(3, b"c")
    rig.timers.run_due()
    assert rig.lanes.waiting("intents") == 2  # the third waits: two are being logged
    assert rig.destination.published == []  # nothing before its intent is durable

    rig.lanes.finish("intents", 1)
    assert rig.destination.published == [b"a"]
    assert [d.position for d in rig.intents.logged] == [0]
    rig.lanes.finish("intents", 1)
    assert rig.destination.published == [b"a", b"b"]
    assert rig.lanes.waiting("intents") == 1  # c went out as soon as a's slot freed
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"a", b"b", b"c"]


def test_without_overlap_one_intent_batch_is_logged_at_a_time() -> None:
    rig = mover_rig()
    rig.open_session()
    rig.source.deliver(1, b"a")
    rig.timers.run_due()
    rig.source.deliver(2, b"b")
    rig.timers.run_due()
    assert rig.lanes.waiting("intents") == 1
    rig.lanes.finish("intents", 1)
    assert rig.destination.published == [b"a"]
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"a", b"b"]
