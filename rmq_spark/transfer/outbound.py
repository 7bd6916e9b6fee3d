"""Deliveries on their way out of one session: batching, intents first, publishing.

No pika. Deliveries are taken in batches (one I/O loop iteration's worth, or
INTENT_BATCH): a batch gets its positions and sequence numbers from the window, is
logged as intents on the loop's intents lane, and only then published, in one write
(`ports.DestinationLink.publish`). A nacked publish is sent again after a backoff,
through the same lane, so frames leave in the order sequence numbers were given out.
When the session ends, what still waits for its intents is withdrawn: never sent,
so it cannot have arrived, and it goes back to the source.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from hashlib import sha256
from itertools import repeat
from typing import Protocol

from rmq_spark.config import MoverConfig
from rmq_spark.model import Delivery, TransferKey
from rmq_spark.transfer.byte_window import ByteWindow
from rmq_spark.transfer.consumer import Consumer
from rmq_spark.transfer.decisions import Decision, apply_decisions
from rmq_spark.transfer.depth_bound import DepthBound
from rmq_spark.transfer.gate import PublishGate
from rmq_spark.transfer.holds import Hold, Holds
from rmq_spark.transfer.lanes import INTENTS
from rmq_spark.transfer.ports import (
    Connector,
    DestinationLink,
    DurableJob,
    EngineLoop,
    IntentSink,
)
from rmq_spark.transfer.rate_limit import RateBrake
from rmq_spark.transfer.recognition import Recognition
from rmq_spark.transfer.return_guard import ReturnGuard
from rmq_spark.transfer.window import TransferWindow

log = logging.getLogger(__name__)

# A batch of deliveries is handed to the intents lane once this many are waiting, or
# at the end of the I/O loop iteration that received them. While a batch is being
# logged, what arrives waits for the next one, which may then be larger (group commit).
INTENT_BATCH = 256


def backoff_seconds(attempt: int, limits: MoverConfig) -> float:
    """Exponential backoff: first, double, double... capped."""
    return float(min(limits.backoff_seconds * 2 ** (attempt - 1), limits.max_backoff_seconds))


class OutboundHost(Protocol):
    """What the outbound side needs of its session."""

    @property
    def closing(self) -> bool: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """A timer that fires only while the session lasts."""

    def fail(self, reason: str) -> None:
        """The transfer fails: no new deliveries; what is confirmed still settles."""

    def write_failed(self, error: BaseException) -> None:
        """A durable write failed: the session ends, and the transfer with it."""

    def settle(self) -> None:
        """Confirmed deliveries wait for their rows: write them, ack what is durable."""


class _Outgoing:
    """Deliveries to publish once their intents are durable."""

    def __init__(self, deliveries: list[Delivery], *, logs_intents: bool) -> None:
        self.deliveries = deliveries
        self.logs_intents = logs_intents  # a new batch (False: a republish)
        self.withdrawn = False


def _nothing_to_log() -> None:
    return None


class Outbound:
    """Received deliveries until their publish, for one session's window."""

    def __init__(
        self,
        host: OutboundHost,
        *,
        key: TransferKey,
        window: TransferWindow,
        destination: DestinationLink,
        consumer: Consumer,
        loop: EngineLoop,
        connector: Connector,
        intents: IntentSink,
        flow: ByteWindow,
        guard: ReturnGuard,
        limits: MoverConfig,
        window_bytes: int,
        clock: Callable[[], datetime],
        monotonic: Callable[[], float],
        brake: RateBrake | None = None,
        depth: DepthBound | None = None,
    ) -> None:
        self._host = host
        self._key = key
        self._label = key.label()
        self._window = window
        self._destination = destination
        self._consumer = consumer
        self._loop = loop
        self._intents = intents
        self._flow = flow
        self._guard = guard
        self._limits = limits
        self._window_bytes = window_bytes
        self._clock = clock
        self._monotonic = monotonic  # the window's growth measures the rate by it
        self._connector = connector
        self._message_id_of = connector.message_id_of
        self._delivery_count_of = connector.delivery_count_of
        self._carries_priority = connector.carries_priority
        self._digest_properties = connector.digest_properties
        # Deliveries received but not yet logged and published (one loop iteration's worth).
        self._pending: list[tuple[int, bool, bytes, bytes]] = []
        # A selective move's (selective_session.py): decide a batch, publish on two links.
        self.decide: Callable[[Sequence[tuple[int, bool, bytes, bytes]]], list[Decision]] | None
        self.decide = None
        self.publish_batch: Callable[[Sequence[Delivery]], None] = destination.publish
        # A resumed plain move's: its first redeliveries an earlier session moved.
        self.recognition: Recognition | None = None
        self._pending_bytes = 0
        self._pending_largest = 0
        self._flush_scheduled = False
        self.last_intents: DurableJob | None = None  # the lane's jobs complete in order
        self._batches_logging = 0  # batches whose intents are being logged
        # Batches whose intents are being logged; published in this order when durable.
        self._outgoing: list[_Outgoing] = []
        self.holds = Holds()  # why publishing (or reading the source) waits now
        self.peak_held_bytes = 0
        # The rate brake and the depth bound, when the transfer has either (gate.py).
        self._gate = (
            PublishGate(
                brake=brake,
                depth=depth,
                destination=destination,
                timers=host,
                monotonic=monotonic,
                unconfirmed=lambda: window.unconfirmed,
                holds=self.holds,
                on_open=self.release,
            )
            if brake is not None or depth is not None
            else None
        )

    def on_destination_depth(self, ready: int) -> None:
        if self._gate is not None:
            self._gate.on_depth(ready)

    @property
    def empty(self) -> bool:
        """Nothing received waits to be logged and published."""
        return not self._pending

    def held_bytes(self) -> int:
        """Body bytes received and not yet acked at the source (the byte window's measure)."""
        return self._pending_bytes + self._window.in_flight_bytes

    def waiting(self) -> tuple[int, int]:
        """Deliveries not yet logged, and those being logged (a `WindowStages` sample)."""
        return len(self._pending), sum(len(o.deliveries) for o in list(self._outgoing))

    def on_delivery(self, tag: int, redelivered: bool, body: bytes, properties: bytes) -> bool:
        """A source delivery (`inbound.DeliveryReader`, per message). It is published
        with its batch (`publish_pending`).

        Returns whether the reader may go on: False once the bytes held pass the byte
        window, and the reader pauses until `Settlement.send_acks` resumes it.
        """
        size = len(body)
        self._pending.append((tag, redelivered, body, properties))
        self._pending_bytes += size
        self._pending_largest = max(self._pending_largest, size)
        if self._guard.active and self._guard.observe(self._delivery_count_of(properties)):
            self._host.fail(delivery_limit_reason(self._key, self._guard))
        held = self._pending_bytes + self._window.in_flight_bytes
        self.peak_held_bytes = max(self.peak_held_bytes, held)
        if len(self._pending) >= INTENT_BATCH:
            self.publish_pending()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._host.call_later(0, self.publish_pending)
        # Closing: the connection must read its close-ok; what arrives goes back anyway.
        # A hold on publishing does not pause reading (holds.py).
        if held <= self._window_bytes or self._host.closing:
            return True
        self.holds.hold(Hold.BYTES)
        return False

    def may_read(self) -> bool:
        """A paused source may be read again: the bytes held fit the byte window."""
        if self.held_bytes() > self._window_bytes:
            return False
        return self.holds.release(Hold.BYTES)

    def publish_pending(self) -> None:
        """Log the batch as intents (durable, on the intents lane), then publish
        each delivery unchanged.

        Logging first means a process killed after a publish still leaves a row for it.
        Up to `EngineLoop.overlap` batches are logged at a time (one on a local disk,
        several on an object store, where each waits a PUT's round trip): what arrives
        meanwhile waits and goes out as the next batch, so a slow write means larger
        batches, not a queue of small ones (group commit). Dropped or withdrawn
        batches (the session is ending) are never acked: they go back to the source,
        and since they are the newest deliveries no multiple ack can cover them.
        """
        self._flush_scheduled = False
        if self.holds.publishing_held:
            return  # `release` calls again when nothing holds
        if self._gate is None:
            pending, self._pending = self._pending, []
            self._flow.observe(len(pending), self._pending_largest, now=self._monotonic())
            self._pending_bytes = self._pending_largest = 0
        else:
            pending = self._admitted()
        if not pending:
            return
        self._consumer.drain.received()
        if self._host.closing or not self._destination.is_open:
            return
        consumed_at = self._clock()  # one reading per batch: they arrived together
        if self.recognition is not None:  # what an earlier session moved: ack, never publish
            recognised = self.recognition.take(pending, self._connector, consumed_at)
            for delivery in recognised:
                self._window.on_recognised(delivery)
            if not self.recognition.active:
                self.recognition = None  # the rest of the session publishes as usual
            if recognised:
                self._host.settle()
                pending = pending[len(recognised) :]
            if not pending:
                self._consumer.follow_sizes()
                return
        on_publish = self._window.on_publish
        digest_properties = self._digest_properties
        message_id_of = self._message_id_of
        carries_priority = self._carries_priority
        decisions = None if self.decide is None else self.decide(pending)
        kept_flags = repeat(False) if decisions is None else [d.kept for d in decisions]
        batch = [
            on_publish(
                tag,
                redelivered=redelivered,
                body_size=len(body),
                body_sha256=sha256(body).hexdigest(),
                properties_sha256=digest_properties(property_bytes),
                message_id=message_id_of(property_bytes),
                body=body,
                properties=property_bytes,
                consumed_at=consumed_at,
                priority=carries_priority(property_bytes),
                kept=kept,
            )
            for (tag, redelivered, body, property_bytes), kept in zip(
                pending, kept_flags, strict=False
            )
        ]
        if decisions is not None:
            apply_decisions(batch, decisions)
        self._batches_logging += 1
        if self._batches_logging >= self._loop.overlap:
            self.holds.hold(Hold.INTENTS)
        self._send_when_durable(batch, self._intents.append_later(batch))
        self._consumer.follow_sizes()

    def _admitted(self) -> list[tuple[int, bool, bytes, bytes]]:
        """What the gate lets go now, taken from the pending deliveries; the rest wait
        for it to reopen (the source's prefetch bounds how many: they are not acked)."""
        assert self._gate is not None
        waiting = self._pending
        allowed = self._gate.admit([len(body) for _tag, _red, body, _props in waiting])
        taken, self._pending = waiting[:allowed], waiting[allowed:]
        if taken:
            largest = max(len(body) for _t, _r, body, _p in taken)
            self._flow.observe(len(taken), largest, now=self._monotonic())
        self._pending_bytes = sum(len(body) for _t, _r, body, _p in self._pending)
        self._pending_largest = max((len(body) for _t, _r, body, _p in self._pending), default=0)
        return taken

    def release(self, reason: Hold) -> None:
        """A hold on publishing let go (a batch's intents are out, tokens came in, the
        destination's depth fell): publish what waits, if nothing else holds."""
        if self.holds.release(reason) and self._pending and not self._host.closing:
            self.publish_pending()

    def _send_when_durable(
        self, deliveries: list[Delivery], log_intents: Callable[[], None]
    ) -> None:
        """Publish `deliveries` once `log_intents` has run on the intents lane.

        Every publish goes through the intents lane (a republish with nothing to log
        too), so frames leave in the order sequence numbers were given out, which is
        the order the destination numbers its confirms.
        """
        outgoing = _Outgoing(deliveries, logs_intents=log_intents is not _nothing_to_log)
        self._outgoing.append(outgoing)
        # Overlapping: batches may be logged at once (each its own object, numbered
        # when handed out); they are still published in this order, as completions
        # run in submission order.
        self.last_intents = self._loop.submit(
            INTENTS, log_intents, partial(self._send_logged, outgoing), overlap=True
        )

    def _send_logged(self, outgoing: _Outgoing, error: BaseException | None) -> None:
        """Loop: the intents of `outgoing` are durable (or failed): publish, in order."""
        if outgoing.logs_intents:
            self._batches_logging -= 1
        if outgoing.withdrawn:
            return  # the session ended and withdrew it
        self._outgoing.remove(outgoing)
        if error is not None or self._host.closing or not self._destination.is_open:
            self._window.withdraw(outgoing.deliveries)
            outgoing.withdrawn = True
            if error is not None:
                self._host.write_failed(error)
            return
        self.publish_batch(outgoing.deliveries)
        if outgoing.logs_intents:
            self.release(Hold.INTENTS)

    def retry_or_refuse(self, delivery: Delivery) -> None:
        """A nacked publish: send it again after a backoff, or give up on it."""
        limits = self._limits
        if delivery.attempts > limits.nack_retries:
            self._window.refuse(delivery, "nacked by the destination")
            self._host.fail(
                f"the destination refused (nacked) the message at source position "
                f"{delivery.position} {delivery.attempts} time(s); it stays in the source"
            )
            return
        delay = backoff_seconds(delivery.attempts, limits)
        log.warning(
            "%s: destination nacked position %d; publishing it again in %.2fs",
            self._label,
            delivery.position,
            delay,
        )
        self._host.call_later(delay, partial(self._republish, delivery))

    def _republish(self, delivery: Delivery) -> None:
        """Timer: publish a nacked delivery again (same bytes, same position)."""
        if self._host.closing or not self._destination.is_open:
            return  # the session ended; the source redelivers it
        self._window.republish(delivery)
        self._send_when_durable([delivery], _nothing_to_log)  # its intent is logged already

    def withdraw_unsent(self) -> None:
        """Session end: publishes still waiting for their intents will never be sent."""
        for outgoing in self._outgoing:
            self._window.withdraw(outgoing.deliveries)
            outgoing.withdrawn = True
        self._outgoing.clear()


def delivery_limit_reason(key: TransferKey, guard: ReturnGuard) -> str:
    """A delivery's return count leaves no room for another lost session: take no
    more messages. What is held is still moved (and acked); the rest stays in the
    source, returned no more than the limit allows."""
    return (
        f"stopped before the delivery limit of cluster {key.source_cluster} vhost "
        f"{key.source_vhost!r} queue {key.source_queue!r}: a message arrived with "
        f"x-delivery-count {guard.highest_count} (returns it has had) and the limit is "
        f"{guard.limit} (past it a message is {guard.past_limit}); another lost session could "
        f"pass it, so the rest stays in the source. Find what returned them (lost "
        f"connections, consumers that requeue) or raise the limit, then run again"
    )
