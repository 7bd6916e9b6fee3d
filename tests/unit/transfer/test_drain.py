"""DrainCheck: when an idle source queue counts as drained (pure, time passed in)."""

from __future__ import annotations

from rmq_spark.transfer.drain import (
    IDLE_DEPTH_CHECK_SECONDS,
    STOP_CONFIRM_TIMEOUT_SECONDS,
    DrainCheck,
    DrainStep,
)


def test_an_idle_consumer_asks_the_depth_at_once_after_deliveries() -> None:
    check = DrainCheck()
    assert check.tick(0.0, idle=False) is DrainStep.NOTHING
    assert check.tick(0.0, idle=True) is DrainStep.ASK_DEPTH
    assert check.tick(0.1, idle=True) is DrainStep.NOTHING  # the answer is on its way


def test_an_idle_queue_is_asked_again_only_now_and_then() -> None:
    check = DrainCheck()
    check.tick(0.0, idle=True)
    check.depth(5, 1, idle=True)
    assert check.tick(IDLE_DEPTH_CHECK_SECONDS / 2, idle=True) is DrainStep.NOTHING
    assert check.tick(IDLE_DEPTH_CHECK_SECONDS, idle=True) is DrainStep.ASK_DEPTH
    check.depth(5, 1, idle=True)
    check.received()
    assert check.tick(IDLE_DEPTH_CHECK_SECONDS + 0.01, idle=True) is DrainStep.ASK_DEPTH


def test_zero_ready_cancels_only_from_a_reply_that_counted_our_consumer() -> None:
    check = DrainCheck()
    check.tick(0.0, idle=True)
    assert check.depth(0, 0, idle=True) is DrainStep.NOTHING  # a busy quorum leader's reply
    check.tick(IDLE_DEPTH_CHECK_SECONDS, idle=True)
    assert check.depth(0, 1, idle=False) is DrainStep.NOTHING  # deliveries arrived meanwhile
    check.tick(2 * IDLE_DEPTH_CHECK_SECONDS, idle=True)
    assert check.depth(3, 1, idle=True) is DrainStep.NOTHING
    check.tick(3 * IDLE_DEPTH_CHECK_SECONDS, idle=True)
    assert check.depth(0, 1, idle=True) is DrainStep.CANCEL


def test_cancel_ok_asks_for_the_proof_and_an_empty_get_is_drained() -> None:
    check = DrainCheck()
    check.stop(1.0)
    assert check.got(empty=True, failing=False) is DrainStep.NOTHING  # not our get
    assert check.cancel_ok(failing=False) is DrainStep.GET
    assert not check.cancelled
    assert check.got(empty=True, failing=False) is DrainStep.DRAINED
    assert check.cancelled


def test_a_message_found_by_the_proof_resumes_and_clears_the_stop() -> None:
    check = DrainCheck()
    check.stop(1.0)
    check.cancel_ok(failing=False)
    assert check.got(empty=False, failing=False) is DrainStep.RESUME
    assert check.stopping_since is None
    assert not check.cancelled


def test_a_failed_transfer_needs_no_proof_and_keeps_what_a_get_found() -> None:
    check = DrainCheck()
    check.stop(1.0)
    assert check.cancel_ok(failing=True) is DrainStep.DRAINED
    assert check.cancelled
    other = DrainCheck()
    other.stop(1.0)
    other.cancel_ok(failing=False)
    assert other.got(empty=False, failing=True) is DrainStep.DRAINED
    assert other.stopping_since == 1.0


def test_the_stop_clock_starts_once() -> None:
    check = DrainCheck()
    check.stop(1.0)
    check.stop(5.0)
    assert check.stopping_since == 1.0


def test_stopping_closes_once_settled_or_after_the_timeout() -> None:
    check = DrainCheck()
    check.stop(10.0)
    assert check.finish(11.0, settled=True) is DrainStep.NOTHING  # the consumer is not gone
    check.nothing_to_cancel()
    assert check.finish(11.0, settled=False) is DrainStep.NOTHING
    assert check.finish(11.0, settled=True) is DrainStep.CLOSE
    late = 10.0 + STOP_CONFIRM_TIMEOUT_SECONDS
    assert check.finish(late, settled=False) is DrainStep.TIMED_OUT
