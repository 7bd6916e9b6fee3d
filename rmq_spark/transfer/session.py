"""One session of a transfer: one pair of links and one `TransferWindow`.

No pika: the session drives `ports.SourceLink` and `ports.DestinationLink` and is
their `ports.SessionEvents`. Every decision about what may be acked lives in
`window.TransferWindow`; this module turns link events into calls on it:

    source delivery ──► batch ──► intent log (durable) ──► publish the batch ──► window
    destination ack/nack/return ──► window ──► ledger write (durable) ──► source ack

A source message is acked only after the destination confirmed it AND its ledger
row is durable. A nacked publish is sent again after a backoff, a few times; then,
like a returned one, it is refused: never acked, back to the source when the
channel closes, and the transfer fails with an error naming the queue.

A session is built fresh for each pair of links (a channel each, on connections the
task shares), so nothing of an ended session can act on the next one. It ends
(`SessionEnd`) when both links are closed: finished (drained, or the transfer
failed), lost (a connection went; a new session follows after a backoff) or fatal
(access refused, a durable write failed). On the way out, confirmed deliveries are
written (and acked if the source is still there), unsent publishes are withdrawn,
and unconfirmed ones are written as "uncertain" rows because they may have arrived.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from hashlib import sha256
from typing import Literal

from rmq_spark.config import MoverConfig
from rmq_spark.errors import RmqSparkError
from rmq_spark.model import Delivery, TransferKey
from rmq_spark.transfer import refusals
from rmq_spark.transfer.byte_window import ByteWindow
from rmq_spark.transfer.consumer import Consumer
from rmq_spark.transfer.decisions import BatchDecider
from rmq_spark.transfer.depth_bound import DepthBound
from rmq_spark.transfer.drain import STOP_CONFIRM_TIMEOUT_SECONDS, DrainStep
from rmq_spark.transfer.outbound import Outbound
from rmq_spark.transfer.ports import (
    DESTINATION,
    SOURCE,
    Connector,
    DestinationLink,
    EngineLoop,
    IntentSink,
    LedgerSink,
    Side,
    SourceLink,
)
from rmq_spark.transfer.rate_limit import RateBrake
from rmq_spark.transfer.return_guard import ReturnGuard
from rmq_spark.transfer.selective import FenceState
from rmq_spark.transfer.settlement import Settlement
from rmq_spark.transfer.window import TransferWindow

log = logging.getLogger(__name__)

# How often the loop flushes a slow trickle of confirms and re-checks an idle queue.
TICK_SECONDS = 0.05


@dataclass(frozen=True)
class SessionEnd:
    """How a session ended, once both its links are closed."""

    how: Literal["finished", "lost", "fatal"]
    next_position: int  # where the next session numbers its deliveries
    error: str | None  # the transfer failed (outcome "failed"): why
    lost: str | None = None  # why the session was lost
    fatal: BaseException | None = None


class Stage(enum.Enum):
    """Where a session is in its life; the closing stages in order of gravity."""

    RUNNING = 0
    FINISHING = 1  # closing: drained, or the transfer failed
    LOST = 2  # closing: a connection went (a new session follows)
    FATAL = 3  # closing: access refused, or a durable write failed
    ENDED = 4  # both links are closed and `on_end` was told


@dataclass(frozen=True)
class Ending:
    """The session's end, its one field: the stage, and why when lost or fatal."""

    stage: Stage
    lost: str | None = None
    fatal: BaseException | None = None

    def graver(self, other: Ending) -> Ending:
        """A later cause replaces an earlier one only when graver (fatal > lost >
        finished): a session lost while it finished is lost, and fatal stays fatal."""
        return other if other.stage.value > self.stage.value else self


RUNNING = Ending(Stage.RUNNING)
FINISHING = Ending(Stage.FINISHING)
_HOW: dict[Stage, Literal["finished", "lost", "fatal"]] = {
    Stage.RUNNING: "finished",  # both links closed by themselves, nothing said why
    Stage.FINISHING: "finished",
    Stage.LOST: "lost",
    Stage.FATAL: "fatal",
}


@dataclass(frozen=True)
class Shared:
    """What every session of one transfer uses (`mover.QueueMover` makes one)."""

    key: TransferKey
    loop: EngineLoop
    connector: Connector
    ledger: LedgerSink
    intents: IntentSink
    flow: ByteWindow  # learned sizes outlive a session: a reconnect starts there
    guard: ReturnGuard  # a quorum source's delivery limit (delivery_limit.py)
    limits: MoverConfig
    window_bytes: int
    clock: Callable[[], datetime]
    monotonic: Callable[[], float]
    brake: RateBrake | None = None  # the rate limits (rate_limit.py); outlives a session
    depth: DepthBound | None = None  # the destination depth bound (depth_bound.py); likewise
    # A selective move's decider and fence (selective.py); None: a plain move.
    decider: BatchDecider | None = None
    fence: FenceState | None = None
    # Makes the confirmed fence durable in the ledger (`ledger/fences.py`), on the
    # ledger lane; a transfer without a ledger (benchmarks, unit tests) records nothing.
    record_fence: Callable[[], None] = lambda: None


class Session:
    """One pair of links moving deliveries through one `TransferWindow`.

    `mover.QueueMover` makes one per pair of connections: `Session(...).start()`.
    Everything it uses is built with it; `start` only begins its tick.
    """

    def __init__(
        self,
        number: int,
        shared: Shared,
        *,
        first_position: int,
        error: str | None,
        on_end: Callable[[SessionEnd], None],
    ) -> None:
        self._shared = shared
        self._key = shared.key
        self._label = shared.key.label()
        self._on_end = on_end
        self._window = window = TransferWindow(
            shared.flow.granted, first_position=first_position, session=number, clock=shared.clock
        )
        self._error = error  # the transfer's failure; it outlives the session
        self._end = RUNNING
        # The links open on the loop: no event reaches this session before it is built.
        self._source: SourceLink
        self._destination: DestinationLink
        self._source, self._destination = shared.connector.connect(
            self, shared.loop.ioloop, self._label
        )
        self._consumer = Consumer(
            self,
            self._source,
            flow=shared.flow,
            window=window,
            label=self._label,
            monotonic=shared.monotonic,
        )
        self.outbound = Outbound(
            self,
            key=shared.key,
            window=window,
            destination=self._destination,
            consumer=self._consumer,
            loop=shared.loop,
            connector=shared.connector,
            intents=shared.intents,
            flow=shared.flow,
            guard=shared.guard,
            limits=shared.limits,
            window_bytes=shared.window_bytes,
            clock=shared.clock,
            brake=shared.brake,
            depth=shared.depth,
            monotonic=shared.monotonic,
        )
        # The source link calls this per delivery: `Outbound.on_delivery` itself, so
        # the hot path makes no extra call.
        self.on_delivery: Callable[[int, bool, bytes, bytes], bool] = self.outbound.on_delivery
        self.settlement = Settlement(
            self,
            window=window,
            source=self._source,
            consumer=self._consumer,
            loop=shared.loop,
            ledger=shared.ledger,
        )

    def start(self) -> None:
        """Begin the tick; the consumer starts once both links are ready."""
        self.call_later(TICK_SECONDS, self._on_tick)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """A timer that fires only while this session lasts: sessions share the loop,
        and an ended one must not act (publish on its closed channel, tick on)."""

        def fire() -> None:
            if self._end.stage is not Stage.ENDED:
                callback()

        self._shared.loop.ioloop.call_later(delay, fire)

    @property
    def closing(self) -> bool:
        return self._end.stage is not Stage.RUNNING

    @property
    def failing(self) -> bool:
        return self._error is not None

    def may_read(self) -> bool:
        """A paused source may be read again (`Outbound.may_read`, holds.py)."""
        return self.outbound.may_read()

    def settle(self) -> None:
        self.settlement.settle()

    def write_failed(self, error: BaseException) -> None:
        fatal = Ending(Stage.FATAL, fatal=error)
        if self.closing:
            self._mark(fatal)  # the close under way reports it
        else:
            self._close(fatal)

    def idle(self) -> bool:
        """Nothing received that is not yet acked (published or waiting to be)."""
        return self._window.in_flight == 0 and self.outbound.empty

    @property
    def window(self) -> TransferWindow:
        return self._window

    # -- the links' events ----------------------------------------------------------

    def on_ready(self, side: Side) -> None:
        if side == SOURCE:
            self._consumer.source_ready()
        else:
            self._consumer.destination_ready()

    def on_prefetch_set(self) -> None:
        self._consumer.on_prefetch_set()

    def on_depth(self, ready: int, consumers: int) -> None:
        self._consumer.on_depth(ready, consumers)

    def on_destination_depth(self, ready: int) -> None:
        self.outbound.on_destination_depth(ready)

    def on_cancel_ok(self) -> None:
        self._consumer.on_cancel_ok()
        self.drain_step()

    def on_got(
        self, tag: int, redelivered: bool, body: bytes, properties: bytes, remaining: int
    ) -> None:
        self._consumer.on_got(tag, redelivered, body, properties, remaining)

    def on_get_empty(self) -> None:
        self._consumer.on_get_empty()
        self.drain_step()

    def on_confirm(self, seq: int, *, multiple: bool, ack: bool) -> None:
        """The destination's basic.ack or basic.nack for one or more publishes."""
        if ack:
            self._window.on_confirm(seq, multiple=multiple)
        else:
            for delivery in self._window.on_nack(seq, multiple=multiple):
                self.outbound.retry_or_refuse(delivery)
        self.settlement.settle()

    def on_return(self, body: bytes, properties: bytes, reason: str) -> None:
        """A mandatory publish was routed nowhere (destination queue missing)."""
        returned = self._window.on_return(
            sha256(body).hexdigest(), sha256(properties).hexdigest(), reason
        )
        position = returned.position if returned else "?"
        self.fail(f"a message was {reason} (source position {position}); is the queue there?")

    def on_consumer_cancelled(self) -> None:
        """The broker cancelled our consumer (source queue deleted, the quorum queue's
        leader moved, a 4.3 quorum queue's consumer timeout). A new session consumes
        again; a deleted queue then fails its passive declare."""
        self._consumer.on_cancelled_by_broker()
        self._connection_lost("the broker cancelled the source consumer")

    def on_channel_closed(self, side: Side, code: int, text: str) -> None:
        """The broker closed a channel: for a missing queue or no access. Not retryable
        by a new session or task attempt, so the transfer fails with the reason."""
        if self.closing:
            return
        if side == SOURCE and refusals.consumer_timed_out(code, text):
            # 3.10, 4.0 and 4.3.6: the source held a delivery past consumer_timeout (e.g.
            # the destination was blocked); what it held goes back, a new session goes on.
            self._connection_lost(f"the source consumer timed out ({code} {text})")
            return
        too_large = refusals.oversize(code, text) if side == DESTINATION else None
        if self._error is None:
            if too_large is not None:
                refused = self._window.refuse_oversized(
                    too_large.message_bytes, "larger than the destination's max_message_size"
                )
                self._error = oversize_error(self._key, too_large, refused)
            else:
                self._error = channel_closed_error(self._key, side, code, text)
            log.error("%s", self._error)
        self._close(FINISHING)

    def on_lost(self, side: Side, reason: str) -> None:
        self._connection_lost(reason)

    def on_refused(self, side: Side, error: RmqSparkError) -> None:
        self._close(Ending(Stage.FATAL, fatal=error))

    def on_closed(self, side: Side) -> None:
        self._end_if_closed()

    # -- stopping and ending --------------------------------------------------------

    def _on_tick(self) -> None:
        """Timer: flush slow confirms, check whether an idle queue is drained, or finish."""
        if self.closing:
            return
        self.settlement.settle()
        self.drain_step()
        if not self.closing:
            self.call_later(TICK_SECONDS, self._on_tick)

    def drain_step(self) -> None:
        """Ask whether an idle queue is drained, or finish a stopping one, now.

        Called on every tick, and as soon as the events it waits on arrive (acks sent
        after a durable write, cancel-ok, get-empty): a queue of a few messages would
        otherwise wait for a tick twice (to ask its depth, then to close), ~50 ms of a
        small queue's life. What it may do is unchanged (`drain.DrainCheck`).
        """
        if self.closing:
            return
        now = self._shared.monotonic()
        if self._consumer.stopping:
            self._finish_if_settled(now)
        else:
            self._consumer.tick(now)

    def _finish_if_settled(self, now: float) -> None:
        window = self._window
        settled = self.outbound.empty and window.unconfirmed == 0 and window.settled
        step = self._consumer.drain.finish(now, settled=settled)
        if step is DrainStep.NOTHING:
            return
        if step is DrainStep.TIMED_OUT and self._error is None:
            self._error = (
                f"{self._label}: {window.unconfirmed} publish(es) were not "
                f"confirmed within {STOP_CONFIRM_TIMEOUT_SECONDS:.0f}s; they stay in the source"
            )
        self._close(FINISHING)

    def fail(self, reason: str) -> None:
        """Stop this transfer: no new deliveries; confirmed ones are still written and acked."""
        if self._error is None:
            self._error = f"{self._label}: {reason}"
            log.error("%s", self._error)
        self._consumer.stop()

    def _connection_lost(self, reason: str) -> None:
        """A connection is gone: settle what can be settled, then end the session."""
        self._close(Ending(Stage.LOST, lost=reason))

    def _mark(self, why: Ending) -> None:
        """Record why the session ends, unless an earlier cause is as grave."""
        if self._end.stage is not Stage.ENDED:
            self._end = self._end.graver(why)

    def _close(self, why: Ending) -> None:
        """Close both links; what the source has not acked goes back to its queue.

        Confirmed deliveries are in the destination whether or not they can still be
        acked, so their rows are written (and acked, if the source is still open)
        first. Unconfirmed publishes may have arrived too: their rows are written
        without a confirm time, so a copy that did arrive is named.
        """
        running = self._end.stage is Stage.RUNNING
        self._mark(why)
        if running:
            if self.outbound.last_intents is not None:
                self.outbound.last_intents.wait()
            self.settlement.write_confirmed_now()
            if self._source.is_open:
                self.settlement.send_acks()
            self.outbound.withdraw_unsent()  # never sent: they cannot have arrived
            # Normally nothing is unconfirmed here; after a lost connection, a channel
            # closed by the broker or a confirm timeout, these may have arrived.
            uncertain = self._window.mark_uncertain()
            if uncertain:
                self._shared.ledger.write(uncertain)
            self._source.resume()  # a paused source could not read its close-ok
        self._source.close()
        self._destination.close()
        self._end_if_closed()

    def _end_if_closed(self) -> None:
        ending = self._end
        if ending.stage is Stage.ENDED or not (
            self._source.is_closed and self._destination.is_closed
        ):
            return
        self._end = Ending(Stage.ENDED)
        self._on_end(
            SessionEnd(
                _HOW[ending.stage],
                self._window.next_position,
                self._error,
                lost=ending.lost,
                fatal=ending.fatal,
            )
        )


# -- what a failed transfer says ---------------------------------------------------------


def oversize_error(key: TransferKey, too_large: refusals.Oversize, refused: Delivery | None) -> str:
    """The destination refused a message for its size: name it, the size, the limit."""
    position = refused.position if refused is not None else "?"
    return (
        f"{key.label()}: the destination cluster {key.destination_cluster} vhost "
        f"{key.destination_vhost!r} queue {key.destination_queue!r} refused (closed its "
        f"channel, {refusals.PRECONDITION_FAILED} PRECONDITION_FAILED) a message of "
        f"{too_large.message_bytes} bytes from cluster {key.source_cluster} vhost "
        f"{key.source_vhost!r} queue {key.source_queue!r} (source position {position}): larger "
        f"than the destination's max_message_size {too_large.max_message_size}. It stays "
        f"in the source, never acked; raise max_message_size on the destination (4.0 "
        f"lowered the default to 16 MiB) or move it another way"
    )


def channel_closed_error(key: TransferKey, side: Side, code: int, text: str) -> str:
    """The broker closed a channel: name the side's cluster, vhost and queue, and why."""
    if side == SOURCE:
        cluster, vhost, queue = key.source_cluster, key.source_vhost, key.source_queue
    else:
        cluster, vhost = key.destination_cluster, key.destination_vhost
        queue = key.destination_queue
    return (
        f"{key.label()}: the broker closed the channel on cluster {cluster} vhost "
        f"{vhost!r} queue {queue!r} ({code} {text})"
    )
