"""The publish gate: the rate brake and the depth bound between receiving and publishing.

No pika. `Outbound.publish_pending` asks `admit` how many of the waiting deliveries
may be published now; the rest wait, held by `holds.Hold.RATE` or `Hold.DEPTH`
(publishing only: the source is read on, `holds.py`). The gate reopens by itself,
never by spinning: a timer when the rate brake's tokens come in
(`rate_limit.RateBrake.wait_seconds`), the destination's answer to a depth question
when the depth bound held (`depth_bound.DepthBound`), asked again every
`depth_bound.POLL_SECONDS` while it stays above. Then it calls `on_open` with the
hold that let go (`Outbound.release`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from rmq_spark.transfer.depth_bound import POLL_SECONDS, DepthBound
from rmq_spark.transfer.holds import Hold, Holds
from rmq_spark.transfer.ports import DestinationLink
from rmq_spark.transfer.rate_limit import RateBrake


class GateTimers(Protocol):
    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """A timer that fires only while the session lasts."""


class PublishGate:
    """One session's gate; the brake and the bound outlive it (`mover.QueueMover`)."""

    def __init__(
        self,
        *,
        brake: RateBrake | None,
        depth: DepthBound | None,
        destination: DestinationLink,
        timers: GateTimers,
        monotonic: Callable[[], float],
        unconfirmed: Callable[[], int],
        holds: Holds,
        on_open: Callable[[Hold], None],
    ) -> None:
        self._brake = brake
        self._depth = depth
        self._destination = destination
        self._timers = timers
        self._monotonic = monotonic
        self._unconfirmed = unconfirmed
        self._holds = holds
        self._on_open = on_open
        self._rate_timer_set = False
        self._poll_set = False
        if depth is not None:
            depth.session_started()

    def admit(self, sizes: Sequence[int]) -> int:
        """How many of the waiting deliveries (body sizes, in order) may go now."""
        now = self._monotonic()
        count = len(sizes)
        if self._depth is not None:
            count = self._depth.admit(count, now)
            if count < len(sizes):
                self._holds.hold(Hold.DEPTH)
        if self._brake is not None:
            braked = self._brake.admit(now, sizes[:count])
            if braked < count:
                self._holds.hold(Hold.RATE)
            count = braked
        if self._depth is not None:
            self._depth.published(count)
        if count < len(sizes):
            self._follow_up(now)
        return count

    def on_depth(self, ready: int) -> None:
        """The destination's ready count, answering `ask_depth`."""
        depth = self._depth
        if depth is None:
            return
        depth.answered(ready, self._monotonic())
        if not depth.holding:
            self._on_open(Hold.DEPTH)
        elif not self._poll_set:
            self._poll_set = True
            self._timers.call_later(POLL_SECONDS, self._on_poll)

    def _follow_up(self, now: float) -> None:
        """Something waits: make sure a timer or a depth question will reopen the gate."""
        brake = self._brake
        if brake is not None and brake.holding and not self._rate_timer_set:
            self._rate_timer_set = True
            self._timers.call_later(brake.wait_seconds(now), self._on_rate_timer)
        if not self._poll_set and self._depth is not None and self._depth.wants_depth:
            # After this batch is handed to the window: the question then counts it as
            # unconfirmed (it leaves after its intents, so after the question).
            self._timers.call_later(0, self._ask_depth)

    def _ask_depth(self) -> None:
        depth = self._depth
        if depth is not None and depth.wants_depth and self._destination.is_open:
            depth.asked(self._unconfirmed())
            self._destination.ask_depth()

    def _on_rate_timer(self) -> None:
        self._rate_timer_set = False
        self._on_open(Hold.RATE)

    def _on_poll(self) -> None:
        self._poll_set = False
        self._ask_depth()
