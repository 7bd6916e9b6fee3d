"""The source consumer's state machine (prefetch.py): the prefetch change and its
interleavings with the stop, the session's end and the drain's proof; then the same
sequences through a session on fake links (tests/support/fakes.py)."""

from __future__ import annotations

from rmq_spark.model import MoveOutcome
from rmq_spark.transfer.prefetch import ConsumerState, ConsumerStep, Phase
from rmq_spark.transfer.session import TICK_SECONDS
from tests.support.fakes import NO_PROPERTIES, MoverRig, mover_rig

STEP = ConsumerStep


def consuming() -> ConsumerState:
    state = ConsumerState()
    assert state.confirms_on(ending=False) is STEP.NOTHING  # the prefetch is not set yet
    assert state.prefetch_set(idle=True, ending=False) is STEP.CONSUME
    assert state.consuming
    return state


def test_the_consumer_starts_only_once_the_prefetch_is_set_and_confirms_are_on() -> None:
    state = ConsumerState()
    assert state.prefetch_set(idle=True, ending=False) is STEP.NOTHING
    assert not state.consuming
    assert state.confirms_on(ending=False) is STEP.CONSUME
    assert state.phase is Phase.CONSUMING


def test_a_prefetch_change_cancels_sets_the_prefetch_and_consumes_once_the_old_is_acked() -> None:
    state = consuming()
    assert state.change(ending=False) is STEP.CANCEL
    assert not state.consuming  # no depth questions, no second change meanwhile
    assert state.change(ending=False) is STEP.NOTHING
    assert state.cancel_ok(ending=False) is STEP.SET_PREFETCH
    assert state.prefetch_set(idle=False, ending=False) is STEP.NOTHING  # old ones unacked
    assert state.phase is Phase.WAITING
    assert state.acked(idle=False, ending=False) is STEP.NOTHING
    assert state.acked(idle=True, ending=False) is STEP.CONSUME
    assert state.consuming


def test_a_new_prefetch_set_with_nothing_unacked_consumes_at_once() -> None:
    state = consuming()
    state.change(ending=False)
    state.cancel_ok(ending=False)
    assert state.prefetch_set(idle=True, ending=False) is STEP.CONSUME


def test_a_stop_during_the_changes_cancel_takes_it_over_and_proves_at_its_cancel_ok() -> None:
    state = consuming()
    state.change(ending=False)
    assert state.stop(ending=False) is STEP.NOTHING  # the change's cancel is the stop's
    assert state.cancel_ok(ending=False) is STEP.PROVE  # no basic.qos: the drain's proof
    assert state.phase is Phase.STOPPED


def test_a_stop_during_the_changes_qos_proves_at_its_qos_ok() -> None:
    state = consuming()
    state.change(ending=False)
    state.cancel_ok(ending=False)
    assert state.stop(ending=False) is STEP.NOTHING
    assert state.phase is Phase.STOPPING_AFTER_QOS
    assert state.prefetch_set(idle=True, ending=False) is STEP.PROVE  # never consumes


def test_a_stop_while_the_change_waits_for_acks_proves_at_once() -> None:
    state = consuming()
    state.change(ending=False)
    state.cancel_ok(ending=False)
    state.prefetch_set(idle=False, ending=False)
    assert state.stop(ending=False) is STEP.PROVE
    assert state.acked(idle=True, ending=False) is STEP.NOTHING  # stopped: no consume


def test_a_plain_stop_cancels_and_proves_at_the_cancel_ok_once() -> None:
    state = consuming()
    assert state.stop(ending=False) is STEP.CANCEL
    assert state.stop(ending=False) is STEP.NOTHING  # a failure after the drain's stop
    assert state.cancel_ok(ending=False) is STEP.PROVE
    assert state.cancel_ok(ending=False) is STEP.NOTHING


def test_a_stop_without_a_consumer_of_ours_has_nothing_to_cancel() -> None:
    assert ConsumerState().stop(ending=False) is STEP.NOTHING_TO_CANCEL  # never consumed
    state = consuming()
    state.cancelled_by_broker()
    assert not state.consuming
    assert state.stop(ending=False) is STEP.NOTHING_TO_CANCEL


def test_the_proof_finding_a_message_consumes_again_with_the_prefetch_the_broker_has() -> None:
    state = consuming()
    state.stop(ending=False)
    state.cancel_ok(ending=False)
    assert state.resume(ending=False) is STEP.CONSUME
    assert state.consuming


def test_a_get_ok_after_a_stop_that_took_over_a_cancel_sets_the_new_prefetch_first() -> None:
    state = consuming()
    state.change(ending=False)
    state.stop(ending=False)
    state.cancel_ok(ending=False)  # PROVE: the get is sent; the qos never was
    assert state.resume(ending=False) is STEP.SET_PREFETCH
    assert state.prefetch_set(idle=False, ending=False) is STEP.NOTHING  # the got one waits
    assert state.acked(idle=True, ending=False) is STEP.CONSUME
    # The broker has the byte window's prefetch now: a later resume consumes at once.
    state.stop(ending=False)
    state.cancel_ok(ending=False)
    assert state.resume(ending=False) is STEP.CONSUME


def test_a_get_ok_answers_nothing_unless_the_proof_is_under_way() -> None:
    state = consuming()
    assert state.resume(ending=False) is STEP.NOTHING
    state.change(ending=False)
    assert state.resume(ending=False) is STEP.NOTHING  # a change is never resumed
    assert state.phase is Phase.CANCELLING


def test_a_session_lost_mid_change_sends_nothing_more() -> None:
    for replies in (
        lambda s: s.cancel_ok(ending=True),
        lambda s: (s.cancel_ok(ending=False), s.prefetch_set(idle=True, ending=True))[1],
        lambda s: (
            s.cancel_ok(ending=False),
            s.prefetch_set(idle=False, ending=False),
            s.acked(idle=True, ending=True),
        )[2],
    ):
        state = consuming()
        state.change(ending=False)
        assert replies(state) is STEP.NOTHING
        assert state.phase is Phase.ENDED
        for late in (
            state.cancel_ok(ending=False),
            state.prefetch_set(idle=True, ending=False),
            state.acked(idle=True, ending=False),
            state.stop(ending=False),
            state.resume(ending=False),
        ):
            assert late is STEP.NOTHING
        state.cancelled_by_broker()
        assert state.phase is Phase.ENDED


# -- through a session on fake links -------------------------------------------------------


def small_window_rig() -> MoverRig:
    """A byte window of 1,000 bytes: the prefetch starts at 1 (for the largest message
    the source may hold) and the first small delivery calls for 100."""
    rig = mover_rig(window_messages=100, window_bytes=1000)
    rig.open_session()
    assert rig.source.prefetches == [1]
    return rig


def settle(rig: MoverRig, seq: int) -> None:
    rig.confirm(seq)
    rig.lanes.finish("ledger")


def test_a_session_follows_the_sizes_with_a_new_consumer_after_the_old_ones_are_acked() -> None:
    rig = small_window_rig()
    rig.receive(b"x" * 10)
    assert rig.source.cancels == 1  # the prefetch change begins
    rig.source.events.on_cancel_ok()
    assert rig.source.prefetches == [1, 100]
    rig.source.events.on_prefetch_set()
    assert rig.source.consumes == 1  # the old consumer's delivery is not acked yet

    settle(rig, 1)
    assert rig.source.acked_tags == [1]
    assert rig.source.consumes == 2  # the new consumer, with the new prefetch


def test_a_failure_during_a_prefetch_change_ends_the_session_without_consuming_again() -> None:
    rig = small_window_rig()
    rig.receive(b"x" * 10)
    rig.destination.events.on_return(b"x" * 10, NO_PROPERTIES, "unroutable")  # fails
    rig.confirm(1)  # RabbitMQ confirms a returned publish after its basic.return
    assert rig.source.cancels == 1  # the change's cancel is the stop's
    rig.source.events.on_cancel_ok()
    assert rig.source.prefetches == [1]  # no basic.qos
    assert rig.source.gets == 0  # a failed transfer needs no proof

    rig.timers.advance(TICK_SECONDS)
    rig.timers.run_due()
    rig.lanes.finish("ledger")
    rig.lanes.finish("intents")  # the spent intent log goes on its lane
    (outcome,) = rig.results
    assert isinstance(outcome, MoveOutcome)
    assert outcome.status == "failed"
    assert rig.source.consumes == 1


def test_a_session_lost_mid_change_sends_no_prefetch_and_no_consume() -> None:
    rig = small_window_rig()
    rig.receive(b"x" * 10)
    rig.destination.lose()  # the session ends; the source link is still closing
    rig.source.events.on_cancel_ok()
    rig.source.events.on_prefetch_set()
    assert rig.source.prefetches == [1]
    assert rig.source.consumes == 1


def test_a_drain_proof_during_a_prefetch_change_resumes_with_the_new_prefetch() -> None:
    rig = small_window_rig()
    rig.timers.advance(TICK_SECONDS)
    assert rig.source.depth_asks == 1  # idle: is the queue drained?
    rig.receive(b"x" * 10)  # ...meanwhile a delivery, and the prefetch change's cancel
    assert rig.source.cancels == 1
    settle(rig, 1)
    rig.source.events.on_depth(0, 1)  # idle again: drained? the change's cancel is the stop's
    assert rig.source.cancels == 1
    rig.source.events.on_cancel_ok()
    assert rig.source.gets == 1  # the proof, no basic.qos
    assert rig.source.prefetches == [1]

    rig.source.events.on_got(2, False, b"y" * 10, NO_PROPERTIES, 0)  # not drained
    assert rig.source.prefetches == [1, 100]  # the change's qos goes out before consuming
    rig.source.events.on_prefetch_set()
    assert rig.source.consumes == 1
    rig.timers.run_due()
    rig.lanes.finish("intents")
    assert rig.destination.published == [b"x" * 10, b"y" * 10]
    settle(rig, 2)
    assert rig.source.acked_tags == [1, 2]
    assert rig.source.consumes == 2
