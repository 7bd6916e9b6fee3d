"""The transfer engine's worker: drain one source queue into one destination queue.

A transfer is a series of sessions (`session.Session`), one pair of links each,
built fresh every time. `QueueMover` runs them in sequence and decides what follows
a session's end (`SessionEnd`): the outcome when it finished, a new session after a
backoff when it was lost, the error when it was fatal or when sessions stay lost
through `mover.reconnect_attempts`. It is the counterpart of the Shovel's
`rabbit_shovel_worker`; the protocol is `amqp091/links.py`, the bookkeeping
`window.py`.

A lost session leaves its confirmed deliveries written (and acked if the source was
still there), its unconfirmed ones written as "uncertain" rows (no confirm time),
because they may have arrived, and the rest back in the source. Redeliveries of
messages whose first copy has a row become named duplicates; duplicates per lost
session are bounded by the window.

Drain ends exactly when the source queue reports zero ready messages while nothing
is in flight, and a basic.get after the consumer's cancel finds nothing (`drain.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial

from rmq_spark.config import Limits, MoverConfig
from rmq_spark.errors import TransferError
from rmq_spark.model import Delivery, MoveOutcome, TransferKey
from rmq_spark.transfer import stages
from rmq_spark.transfer.byte_window import LARGEST_MESSAGE_BYTES, ByteWindow
from rmq_spark.transfer.decisions import BatchDecider
from rmq_spark.transfer.depth_bound import DepthBound
from rmq_spark.transfer.lanes import INTENTS, LEDGER, run_movers
from rmq_spark.transfer.outbound import backoff_seconds
from rmq_spark.transfer.ports import Connector, EngineLoop, IntentSink, LedgerSink
from rmq_spark.transfer.rate_limit import RateBrake
from rmq_spark.transfer.recognition import Recognition
from rmq_spark.transfer.return_guard import ReturnGuard
from rmq_spark.transfer.selective import FenceState
from rmq_spark.transfer.selective_session import SelectiveSession
from rmq_spark.transfer.session import Session, SessionEnd, Shared
from rmq_spark.transfer.stages import NOTHING_YET, WindowStages

__all__ = ["IntentSink", "LedgerSink", "NoIntents", "QueueMover", "utc_now"]

log = logging.getLogger(__name__)


class NoIntents:
    """An intent log that logs nothing, for benchmarks that measure without one.

    Without intents, a process killed after a publish and before its ledger row
    leaves a copy in the destination that no row names: a silent duplicate. Only a
    benchmark that asks for it by name uses this; every transfer logs its intents.
    """

    def append(self, deliveries: Sequence[Delivery]) -> None:
        return None

    def append_later(self, deliveries: Sequence[Delivery]) -> Callable[[], None]:
        return partial(self.append, deliveries)

    def close(self, *, finished: bool) -> None:
        return None


def utc_now() -> datetime:
    return datetime.now(UTC)


class QueueMover:
    """Moves every message of one source queue to one destination queue.

    Usage::

        connector = Amqp091Connector(source_endpoint, destination_endpoint)
        outcome = QueueMover(
            key, connector, ledger, intents, window_messages=1000, window_bytes=64 << 20
        ).run()
    """

    def __init__(
        self,
        key: TransferKey,
        connector: Connector,
        ledger: LedgerSink,
        intents: IntentSink,
        *,
        window_messages: int,
        window_bytes: int,
        largest_message: int = LARGEST_MESSAGE_BYTES,
        start_messages: int | None = None,
        first_position: int = 0,
        limits: MoverConfig | None = None,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        delivery_guard: ReturnGuard | None = None,
        rate_limits: Limits | None = None,
        decider: BatchDecider | None = None,
        fence_id: str | None = None,
        examine_limit: int | None = None,
        fence_recorded: bool = False,
        record_fence: Callable[[], None] | None = None,
        recognise: Callable[[bool], Recognition | None] | None = None,
    ) -> None:
        self._key = key
        self._connector = connector
        self._ledger = ledger
        self._intents = intents
        # Learned sizes outlive a session: a reconnect starts at the learned prefetch.
        # From start_messages the message limit grows with the rate (window_growth.py).
        self._flow = ByteWindow(
            window_messages,
            window_bytes,
            largest_message=largest_message,
            start_messages=start_messages,
        )
        self._window_bytes = window_bytes
        self._first_position = first_position
        self._next_position = first_position
        self._limits = limits or MoverConfig()
        self._clock = clock
        self._monotonic = monotonic
        # A quorum source's delivery limit (delivery_limit.py); inactive when unlimited.
        self._guard = delivery_guard or ReturnGuard(None)
        self._rate_limits = rate_limits if rate_limits and not rate_limits.unlimited else None
        self._brake: RateBrake | None = None
        bound = None if rate_limits is None else rate_limits.destination_max_depth
        self._depth = None if bound is None else DepthBound(bound)
        self._sessions = 0
        self._session: Session | None = None  # the current one, or the last
        self._moved_before_session = 0
        self._error: str | None = None
        self._moved_messages = 0
        self._moved_bytes = 0
        self._moved_with_priority = 0
        self._peak_held_bytes = 0
        # A selective move (a route's select): a decider per batch, a fence in the source.
        self._decider = decider
        self._fence = (
            None
            if decider is None
            else FenceState(
                fence_id or key.file_prefix,
                examine_limit=examine_limit,
                # An earlier task attempt's fence is in the source: publish none.
                published=fence_recorded,
            )
        )
        self._record_fence = record_fence or (lambda: None)
        self._kept_messages = 0
        # A plain move's: what earlier sessions moved, read when a session resumes the
        # transfer (True: list the ledger again, it changed since the task began).
        self._recognise = recognise if decider is None else None
        self._recognised_messages = 0

    @property
    def prefetch(self) -> int:
        """The consumer prefetch now: how many deliveries may be unacked at once."""
        return self._flow.granted

    def run(self) -> MoveOutcome:
        """Run sessions until the queue is drained or the transfer stops.

        Returns a "failed" outcome for refusals a user must act on (the source keeps
        the messages). Raises AccessRefusedError at once, and TransferError when
        connections stay lost through every reconnect attempt (Spark then retries).
        """
        return run_movers(
            [lambda: self],
            ioloop=self._connector.event_loop(),
            connections=self._connector.connections,
        )[0]

    def start(
        self, loop: EngineLoop, on_finished: Callable[[MoveOutcome | BaseException], None]
    ) -> None:
        """Begin on `loop`; `on_finished` gets the outcome or the error, on the loop."""
        self._loop = loop
        self._on_finished = on_finished
        self._started = self._monotonic()
        self._failures = 0
        limits = self._rate_limits
        if limits is not None and not (
            limits.messages_per_second is None and limits.bytes_per_second is None
        ):
            # Tokens and time held outlive a session: a reconnect does not start a burst.
            self._brake = RateBrake(limits, now=self._started)
        self._shared = Shared(
            key=self._key,
            loop=loop,
            connector=self._connector,
            ledger=self._ledger,
            intents=self._intents,
            flow=self._flow,
            guard=self._guard,
            limits=self._limits,
            window_bytes=self._window_bytes,
            clock=self._clock,
            monotonic=self._monotonic,
            brake=self._brake,
            depth=self._depth,
            decider=self._decider,
            fence=self._fence,
            record_fence=self._record_fence,
        )
        log.info(
            "moving %s (window %d messages, up to %d, %d bytes)",
            self._key.label(),
            self._flow.growth.limit,
            self._flow.window_messages,
            self._window_bytes,
        )
        self._start_session()

    def window_stages(self) -> WindowStages:
        """A sample of where this mover's deliveries are (`bench.stages`).

        Safe to call from another thread while the loop runs: it only reads lengths
        and counters, each consistent on its own, so a sample may be off by a batch.
        All zeros before the first session has begun.
        """
        session = self._session
        if session is None:
            return NOTHING_YET
        moved = self._moved_before_session + session.settlement.moved_messages
        return stages.sample(session.window, session.outbound, moved)

    def _start_session(self) -> None:
        """A fresh session; positions continue where the last one stopped."""
        kind = Session if self._decider is None else SelectiveSession
        session = kind(
            self._sessions,
            self._shared,
            first_position=self._next_position,
            error=self._error,
            on_end=self._after_session,
        )
        if self._recognise is not None and self._next_position > 0:
            recognition = self._recognise(self._sessions > 0)
            if recognition is not None:
                session.outbound.recognition = recognition
                session.settlement.counts_recognised = True
        self._sessions += 1
        self._moved_before_session = self._moved_messages
        self._session = session
        session.start()

    def _after_session(self, end: SessionEnd) -> None:
        """Both connections of a session are closed: finish, or reconnect after a backoff."""
        session = self._session
        assert session is not None
        self._next_position = end.next_position
        self._error = end.error
        self._moved_messages += session.settlement.moved_messages
        self._kept_messages += session.settlement.kept_messages
        self._recognised_messages += session.settlement.recognised_messages
        self._moved_bytes += session.settlement.moved_bytes
        self._moved_with_priority += session.settlement.moved_with_priority
        self._peak_held_bytes = max(self._peak_held_bytes, session.outbound.peak_held_bytes)
        if end.how == "fatal":
            assert end.fatal is not None
            self._finish(end.fatal)
        elif end.how == "finished" or self._guard.tripped:
            # A tripped delivery-limit guard never consumes again in this attempt: the
            # held messages had their one return, the rest stay in the source.
            self._finish(self._outcome())
        else:
            self._failures += 1
            if self._failures > self._limits.reconnect_attempts:
                self._finish(
                    TransferError(
                        f"{self._key.label()}: gave up after {self._failures} lost "
                        f"session(s): {end.lost}; unacked messages stay in the source"
                    )
                )
                return
            delay = backoff_seconds(self._failures, self._limits)
            log.warning("%s: %s; reconnecting in %.1fs", self._key.label(), end.lost, delay)
            self._loop.ioloop.call_later(delay, self._start_session)

    def _outcome(self) -> MoveOutcome:
        seconds = self._monotonic() - self._started
        status = "failed" if self._error else "moved"
        log.info(
            "%s: %s, %d messages, %d bytes in %.2fs (%d session(s), %d recognised as moved "
            "by an earlier one, window %d messages)",
            self._key.label(),
            status,
            self._moved_messages,
            self._moved_bytes,
            seconds,
            self._sessions,
            self._recognised_messages,
            self._flow.growth.limit,
        )
        return MoveOutcome(
            key=self._key,
            status=status,
            error=self._error,
            messages=self._moved_messages,
            bytes=self._moved_bytes,
            first_position=self._first_position,
            next_position=self._next_position,
            seconds=seconds,
            sessions=self._sessions,
            kept=self._kept_messages,
            recognised=self._recognised_messages,
            fences=(
                0
                if self._fence is None or not self._fence.reached
                else 1 + self._fence.stale_dropped
            ),
            peak_held_bytes=self._peak_held_bytes,
            window_messages=self._flow.growth.limit,
            priority_messages=self._moved_with_priority,
            rate_limits=self._rate_limits,
            rate_held_seconds=(
                0.0 if self._brake is None else self._brake.held_seconds(self._monotonic())
            ),
            depth_held_seconds=(
                0.0 if self._depth is None else self._depth.held_seconds(self._monotonic())
            ),
        )

    def _finish(self, result: MoveOutcome | BaseException) -> None:
        """Close the ledger (on its lane: it may write a data file), then report, and
        remove the spent intent log behind the report (`EngineLoop.clean_up`).

        A mover that returns an outcome has a row for every publish that may have
        arrived, so its intents are spent; one that dies keeps them for the retry.
        """
        if self._decider is not None:
            self._decider.close()
        if isinstance(result, BaseException):
            self._intents.close(finished=False)
            self._on_finished(result)
            return

        def closed(error: BaseException | None) -> None:
            if error is not None:
                self._intents.close(finished=False)
                self._on_finished(error)
                return
            # Every row is durable: the transfer is over, and the task's next queue may
            # start while the spent log is removed. On the intents lane, after the
            # transfer's appends, not on the loop: on an object store that is three
            # requests per batch (HEAD, DELETE, the prefix's marker PUT), which the next
            # queue waited for (bench.many_queues --ledger s3). A removal that fails
            # fails the task once its transfers are done, as it did before.
            self._loop.clean_up(INTENTS, partial(self._intents.close, finished=True))
            self._on_finished(result)

        self._loop.submit(LEDGER, self._ledger.close, closed)
