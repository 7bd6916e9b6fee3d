"""When a source queue is drained: a pure state machine, no pika, time passed in.

"Zero ready" from a queue is not proof of a drain. A quorum queue answers a
passive declare with "0 messages, 0 consumers" when its leader does not reply
within 250 ms (RabbitMQ 3.10's `rabbit_quorum_queue:stat/1`), and a ready count
leaves out deliveries already on their way to the consumer. So the session stops
only on this sequence:

    idle tick ──ASK_DEPTH──► depth: 0 ready, our consumer counted, still idle
        ──CANCEL──► cancel-ok (every delivery sent before it has arrived)
        ──GET──► get-empty ──► DRAINED
                 get-ok ──► RESUME (move that one, consume again)

A reply that did not count our consumer is asked again on a later tick. A failed
transfer also stops consuming (`stop`), but skips the proof: the cancel-ok is the
end of it. Once stopping, the session closes when everything received is settled
(`finish`), or after STOP_CONFIRM_TIMEOUT_SECONDS if the destination never confirms.
"""

from __future__ import annotations

import enum

# An idle consumer re-asks the queue depth this often (other consumers may hold messages).
IDLE_DEPTH_CHECK_SECONDS = 0.5
# How long to wait for outstanding confirms once the transfer is stopping.
STOP_CONFIRM_TIMEOUT_SECONDS = 60.0


class DrainStep(enum.Enum):
    """What the session does next."""

    NOTHING = "nothing"
    ASK_DEPTH = "ask depth"  # passive declare
    CANCEL = "cancel"  # stop consuming
    GET = "get"  # basic.get, the proof
    DRAINED = "drained"  # the consumer is gone and nothing more is coming
    RESUME = "resume"  # the proof found a message: move it, consume again
    CLOSE = "close"  # stopping, and everything is settled
    TIMED_OUT = "timed out"  # stopping, and confirms did not come in time


class DrainCheck:
    """One session's drain decision.

    `stopping_since` is set while the session stops consuming (a drain or a failure);
    `cancelled` once the consumer is gone and no more deliveries can come.
    """

    def __init__(self) -> None:
        self._asking = False  # a passive declare is on its way
        self._asked_at = 0.0
        self._received_since_asked = True
        self._getting = False  # the basic.get that proves a drain is on its way
        self.stopping_since: float | None = None
        self.cancelled = False

    def received(self) -> None:
        """Deliveries arrived: ask at once when the window next empties."""
        self._received_since_asked = True

    def tick(self, now: float, *, idle: bool) -> DrainStep:
        """A tick while consuming (not stopping, no prefetch change): ask the depth?"""
        if not idle or self._asking:
            return DrainStep.NOTHING
        # Ask at once when the window just emptied; an idle queue only now and then.
        if self._received_since_asked or now - self._asked_at >= IDLE_DEPTH_CHECK_SECONDS:
            self._asking = True
            self._received_since_asked = False
            self._asked_at = now
            return DrainStep.ASK_DEPTH
        return DrainStep.NOTHING

    def depth(self, ready: int, consumers: int, *, idle: bool) -> DrainStep:
        """The passive declare's answer. Zero ready and nothing in flight means drained,
        but only from a reply that counted our own consumer."""
        self._asking = False
        if ready == 0 and consumers > 0 and idle:
            return DrainStep.CANCEL
        return DrainStep.NOTHING

    def stop(self, now: float) -> None:
        """The session stops consuming (drained, or failed); the stop's clock starts."""
        if self.stopping_since is None:
            self.stopping_since = now

    def nothing_to_cancel(self) -> None:
        """Stopping with no consumer (never consumed, or the broker cancelled it)."""
        self.cancelled = True

    def cancel_ok(self, *, failing: bool) -> DrainStep:
        """The consumer is gone. A drain is proved by a basic.get, not a count: a get
        goes through the queue itself (a quorum queue's log) and waits for a busy
        leader where a declare would answer 0. A failed transfer needs no proof."""
        if failing:
            self.cancelled = True
            return DrainStep.DRAINED
        self._getting = True
        return DrainStep.GET

    def got(self, *, empty: bool, failing: bool) -> DrainStep:
        """The proof's answer: get-empty (drained) or get-ok (not drained)."""
        if empty and not self._getting:
            return DrainStep.NOTHING  # not our get
        self._getting = False
        if empty or failing:
            # After a failure the message is never acked: it goes back with the channel.
            self.cancelled = True
            return DrainStep.DRAINED
        self.stopping_since = None
        return DrainStep.RESUME

    def finish(self, now: float, *, settled: bool) -> DrainStep:
        """Stopping: close once nothing waits, or once the wait has lasted too long."""
        assert self.stopping_since is not None
        waiting = not self.cancelled or not settled
        if not waiting:
            return DrainStep.CLOSE
        if now - self.stopping_since < STOP_CONFIRM_TIMEOUT_SECONDS:
            return DrainStep.NOTHING
        return DrainStep.TIMED_OUT
