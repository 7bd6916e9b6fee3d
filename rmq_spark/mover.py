"""The transfer engine: drain one source queue into one destination queue.

One pika I/O loop drives two asynchronous connections (source and destination), so
publishes pipeline under publisher confirms instead of waiting for each one. The
consumer prefetch is the window. Every decision about what may be acked lives in
`window.TransferWindow`; this module turns broker events into calls on it:

    source delivery ──► publish (mandatory, exact property bytes) ──► window.on_publish
    destination ack/nack/return ──► window ──► ledger write (durable) ──► source ack

A source message is acked only after the destination confirmed it AND its ledger
row is durable. A nacked publish is sent again after a backoff, a few times; then,
like a returned one, it is refused: never acked, back to the source when the
channel closes, and the transfer fails with an error naming the queue.

A run is a series of sessions, one pair of connections each. A lost connection ends
the session: confirmed deliveries are written (and acked if the source is still
there), unconfirmed ones are written as "uncertain" rows (no confirm time) because
they may have arrived, then both connections close, the source requeues what was
not acked, and a new session starts after a backoff. Redeliveries of messages whose
first copy has a row become named duplicates; duplicates per lost session are
bounded by the window.

Drain ends exactly when the source queue reports zero ready messages while nothing
is in flight.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import pika
import pika.channel
import pika.connection
import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.select_connection import IOLoop, SelectConnection

from rmq_spark import wire
from rmq_spark.amqp import open_error
from rmq_spark.config import MoverConfig
from rmq_spark.errors import AccessRefusedError, TransferError
from rmq_spark.ledger.writer import TransferKey
from rmq_spark.window import Delivery, TransferWindow

log = logging.getLogger(__name__)

# How often the loop flushes a slow trickle of confirms and re-checks an idle queue.
TICK_SECONDS = 0.05
# An idle consumer re-asks the queue depth this often (other consumers may hold messages).
IDLE_DEPTH_CHECK_SECONDS = 0.5
# How long to wait for outstanding confirms once the transfer is stopping.
STOP_CONFIRM_TIMEOUT_SECONDS = 60.0
# Deliveries are logged as intents and published in batches of at most this many;
# a smaller batch goes out at the end of the I/O loop iteration that received it.
INTENT_BATCH = 256


class LedgerSink(Protocol):
    """Where the mover makes rows durable; `write` must be durable when it returns."""

    def write(self, deliveries: Sequence[Delivery]) -> None: ...


class IntentSink(Protocol):
    """Where the mover logs deliveries before publishing them; durable on return."""

    def append(self, deliveries: Sequence[Delivery]) -> None: ...


class _NoIntents:
    """For callers that accept silent duplicates after a hard crash (benchmarks)."""

    def append(self, deliveries: Sequence[Delivery]) -> None:
        return None


@dataclass(frozen=True)
class Endpoint:
    """One side of the transfer: where to connect and which queue."""

    cluster: str
    vhost: str
    queue: str
    parameters: tuple[pika.ConnectionParameters, ...]


@dataclass(frozen=True)
class MoveOutcome:
    """What happened to one queue transfer (the ledger holds the per-message truth)."""

    key: TransferKey
    status: str  # "moved" | "failed"
    error: str | None
    messages: int
    bytes: int
    first_position: int
    next_position: int
    seconds: float
    sessions: int


class _SessionEnd(enum.Enum):
    DONE = "done"  # drained, or stopped with an error recorded in the outcome
    LOST = "lost"  # a connection was lost or could not open: try a new session


def utc_now() -> datetime:
    return datetime.now(UTC)


def backoff_seconds(attempt: int, limits: MoverConfig) -> float:
    """Exponential backoff: first, double, double... capped."""
    return float(min(limits.backoff_seconds * 2 ** (attempt - 1), limits.max_backoff_seconds))


class QueueMover:
    """Moves every message of one source queue to one destination queue.

    Usage::

        outcome = QueueMover(key, source, destination, ledger, prefetch=1000).run()
    """

    def __init__(
        self,
        key: TransferKey,
        source: Endpoint,
        destination: Endpoint,
        ledger: LedgerSink,
        *,
        prefetch: int,
        first_position: int = 0,
        limits: MoverConfig | None = None,
        intents: IntentSink | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        wire.install()
        self._key = key
        self._source = source
        self._destination = destination
        self._ledger = ledger
        self._intents = intents or _NoIntents()
        self._prefetch = prefetch
        self._first_position = first_position
        self._limits = limits or MoverConfig()
        self._clock = clock
        self._next_position = first_position
        self._session = -1
        self._error: str | None = None
        self._moved_messages = 0
        self._moved_bytes = 0

    # -- running --------------------------------------------------------------------

    def run(self) -> MoveOutcome:
        """Run sessions until the queue is drained or the transfer stops.

        Returns a "failed" outcome for refusals a user must act on (the source keeps
        the messages). Raises AccessRefusedError at once, and TransferError when
        connections stay lost through every reconnect attempt (Spark then retries).
        """
        started = time.monotonic()
        log.info("moving %s (prefetch %d)", self._key.describe(), self._prefetch)
        failures = 0
        while self._run_session() is _SessionEnd.LOST:
            failures += 1
            if failures > self._limits.reconnect_attempts:
                raise TransferError(
                    f"{self._key.describe()}: gave up after {failures} lost session(s): "
                    f"{self._lost}; unacked messages stay in the source"
                )
            delay = backoff_seconds(failures, self._limits)
            log.warning("%s: %s; reconnecting in %.1fs", self._key.describe(), self._lost, delay)
            time.sleep(delay)  # between sessions: the loop is stopped, nothing to serve
        seconds = time.monotonic() - started
        status = "failed" if self._error else "moved"
        log.info(
            "%s: %s, %d messages, %d bytes in %.2fs (%d session(s))",
            self._key.describe(),
            status,
            self._moved_messages,
            self._moved_bytes,
            seconds,
            self._session + 1,
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
            sessions=self._session + 1,
        )

    def _reset_session(self) -> None:
        """Fresh per-session state; positions continue where the last session stopped."""
        self._session += 1
        self._window = TransferWindow(
            self._prefetch,
            first_position=self._next_position,
            session=self._session,
            clock=self._clock,
        )
        self._ioloop = IOLoop()
        self._source_connection: SelectConnection | None = None
        self._destination_connection: SelectConnection | None = None
        self._source_channel: pika.channel.Channel | None = None
        self._destination_channel: pika.channel.Channel | None = None
        # Deliveries received but not yet logged and published (one loop iteration's worth).
        self._pending: list[tuple[pika.spec.Basic.Deliver, bytes, bytes, str | None]] = []
        self._flush_scheduled = False
        self._qos_ok = False
        self._confirms_on = False
        self._consumer_tag: str | None = None
        self._consuming = False
        self._cancel_ok = False
        self._depth_check_pending = False
        self._last_depth_check = 0.0
        self._published_since_depth_check = True
        self._stopping_since: float | None = None
        self._closing = False
        self._lost: str | None = None
        self._fatal: BaseException | None = None

    def _run_session(self) -> _SessionEnd:
        self._reset_session()
        self._connect(self._source, 0)
        self._connect(self._destination, 0)
        self._ioloop.call_later(TICK_SECONDS, self._on_tick)
        self._ioloop.start()
        self._ioloop.close()
        self._next_position = self._window.next_position
        if self._fatal is not None:
            raise self._fatal
        return _SessionEnd.LOST if self._lost else _SessionEnd.DONE

    # -- connections ----------------------------------------------------------------

    def _connect(self, endpoint: Endpoint, index: int) -> None:
        is_source = endpoint is self._source
        connection = SelectConnection(
            endpoint.parameters[index],
            on_open_callback=self._on_source_open if is_source else self._on_destination_open,
            on_open_error_callback=lambda _c, exc: self._on_open_error(endpoint, index, exc),
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._ioloop,
        )
        connection.add_on_connection_blocked_callback(self._on_blocked)
        connection.add_on_connection_unblocked_callback(self._on_unblocked)
        if is_source:
            self._source_connection = connection
        else:
            self._destination_connection = connection

    def _on_open_error(self, endpoint: Endpoint, index: int, exc: BaseException) -> None:
        """pika: a connection could not open. Try the next URI; refused access is final."""
        if self._closing:
            self._stop_loop_if_closed()
            return
        if index + 1 < len(endpoint.parameters):
            self._connect(endpoint, index + 1)
            return
        error = open_error(endpoint.cluster, endpoint.vhost, endpoint.parameters[index], exc)
        if isinstance(error, AccessRefusedError):
            self._fatal = error
            self._close()
        else:
            self._connection_lost(str(error))

    def _on_source_open(self, connection: pika.connection.Connection) -> None:
        """pika: source connection is open; open its channel next (unless ending)."""
        if self._closing:
            connection.close()
            return
        connection.channel(on_open_callback=self._on_source_channel_open)

    def _on_destination_open(self, connection: pika.connection.Connection) -> None:
        """pika: destination connection is open; open its channel next (unless ending)."""
        if self._closing:
            connection.close()
            return
        connection.channel(on_open_callback=self._on_destination_channel_open)

    def _on_source_channel_open(self, channel: pika.channel.Channel) -> None:
        """pika: source channel is open; set the window as consumer prefetch."""
        self._source_channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_cancel_callback(self._on_consumer_cancelled_by_broker)
        channel.basic_qos(prefetch_count=self._prefetch, callback=self._on_qos_ok)

    def _on_destination_channel_open(self, channel: pika.channel.Channel) -> None:
        """pika: destination channel is open; turn on publisher confirms."""
        self._destination_channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=self._on_confirm_select_ok)

    def _on_qos_ok(self, _frame: pika.frame.Method) -> None:
        self._qos_ok = True
        self._start_consuming()

    def _on_confirm_select_ok(self, _frame: pika.frame.Method) -> None:
        self._confirms_on = True
        self._start_consuming()

    def _start_consuming(self) -> None:
        """Consume only once both sides are ready, so every delivery can be published."""
        if not (self._qos_ok and self._confirms_on) or self._closing:
            return
        assert self._source_channel is not None
        self._consuming = True
        self._consumer_tag = self._source_channel.basic_consume(
            self._source.queue, self._on_message, auto_ack=False
        )

    def _on_blocked(self, connection: pika.connection.Connection, _frame: Any) -> None:
        """pika: the broker blocked publishing (memory or disk alarm).

        Nothing to do but wait: publishes stay buffered, confirms stop, so acks stop and
        the prefetch window stops new deliveries. pika closes the connection if the
        block outlasts blocked_timeout_seconds, which ends the session as lost.
        """
        side = "destination" if connection is self._destination_connection else "source"
        log.warning("%s: %s connection blocked by a broker alarm", self._key.describe(), side)

    def _on_unblocked(self, connection: pika.connection.Connection, _frame: Any) -> None:
        """pika: the alarm cleared; publishing resumes by itself."""
        side = "destination" if connection is self._destination_connection else "source"
        log.info("%s: %s connection unblocked", self._key.describe(), side)

    # -- the transfer ---------------------------------------------------------------

    def _on_message(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Deliver,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: a source delivery. It is published with its batch (`_publish_pending`)."""
        self._pending.append((method, body, wire.wire_bytes(properties), properties.message_id))
        self._published_since_depth_check = True
        if len(self._pending) >= INTENT_BATCH:
            self._publish_pending()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._ioloop.call_later(0, self._publish_pending)

    def _publish_pending(self) -> None:
        """Log the batch as intents (durable), then publish each delivery unchanged.

        Logging first means a process killed after a publish still leaves a row for it.
        Dropped batches (the session is ending) are not acked: they go back to the source,
        and since they are the newest deliveries no multiple ack can cover them.
        """
        self._flush_scheduled = False
        pending, self._pending = self._pending, []
        if not pending or self._closing:
            return
        if self._destination_channel is None or not self._destination_channel.is_open:
            return
        batch = [
            self._window.on_publish(
                method.delivery_tag,
                redelivered=bool(method.redelivered),
                body_size=len(body),
                body_sha256=hashlib.sha256(body).hexdigest(),
                properties_sha256=hashlib.sha256(property_bytes).hexdigest(),
                message_id=message_id,
                body=body,
                properties=property_bytes,
            )
            for method, body, property_bytes, message_id in pending
        ]
        self._intents.append(batch)
        for delivery in batch:
            assert delivery.body is not None
            assert delivery.properties is not None
            self._publish(delivery.body, delivery.properties)

    def _publish(self, body: bytes, property_bytes: bytes) -> None:
        assert self._destination_channel is not None
        self._destination_channel.basic_publish(
            exchange="",
            routing_key=self._destination.queue,
            body=body,
            properties=wire.ForwardedProperties(property_bytes),
            mandatory=True,
        )

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        """pika: the destination's basic.ack or basic.nack for one or more publishes."""
        method = frame.method
        if isinstance(method, pika.spec.Basic.Ack):
            self._window.on_confirm(method.delivery_tag, multiple=method.multiple)
        else:
            for delivery in self._window.on_nack(method.delivery_tag, multiple=method.multiple):
                self._retry_or_refuse(delivery)
        self._settle()

    def _retry_or_refuse(self, delivery: Delivery) -> None:
        """A nacked publish: send it again after a backoff, or give up on it."""
        if delivery.attempts > self._limits.nack_retries:
            self._window.refuse(delivery, "nacked by the destination")
            self._fail(
                f"the destination refused (nacked) the message at source position "
                f"{delivery.position} {delivery.attempts} time(s); it stays in the source"
            )
            return
        delay = backoff_seconds(delivery.attempts, self._limits)
        log.warning(
            "%s: destination nacked position %d; publishing it again in %.2fs",
            self._key.describe(),
            delivery.position,
            delay,
        )
        self._ioloop.call_later(delay, lambda: self._republish(delivery))

    def _republish(self, delivery: Delivery) -> None:
        """Timer: publish a nacked delivery again (same bytes, same position)."""
        channel = self._destination_channel
        if self._closing or channel is None or not channel.is_open:
            return  # the session ended; the source redelivers it
        assert delivery.body is not None
        assert delivery.properties is not None
        self._publish(delivery.body, delivery.properties)
        self._window.republish(delivery)

    def _on_return(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: a mandatory publish was routed nowhere (destination queue missing)."""
        reason = f"returned by the destination: {method.reply_code} {method.reply_text}"
        returned = self._window.on_return(
            hashlib.sha256(body).hexdigest(),
            hashlib.sha256(wire.wire_bytes(properties)).hexdigest(),
            reason,
        )
        position = returned.position if returned else "?"
        self._fail(f"a message was {reason} (source position {position}); is the queue there?")

    def _settle(self) -> None:
        """Write durable ledger rows for confirmed deliveries, then ack what is safe."""
        if self._source_channel is None or not self._source_channel.is_open:
            return
        if self._window.should_flush(draining=self._stopping_since is not None):
            self._write_confirmed()
        for ack in self._window.take_acks():
            self._source_channel.basic_ack(ack.tag, multiple=ack.multiple)

    def _write_confirmed(self) -> None:
        """Make the rows of every confirmed delivery durable (one ledger file)."""
        rows = self._window.rows_to_write()
        if not rows:
            return
        self._ledger.write(rows)
        self._window.mark_durable(rows)
        self._moved_messages += len(rows)
        self._moved_bytes += sum(row.body_size for row in rows)

    def _on_tick(self) -> None:
        """Timer: flush slow confirms, check whether an idle queue is drained, or finish."""
        if self._closing:
            return
        self._settle()
        now = time.monotonic()
        if self._stopping_since is not None:
            self._finish_if_settled(now)
        elif self._consuming and self._idle() and not self._depth_check_pending:
            # Ask at once when the window just emptied; an idle queue only now and then.
            idle_for = now - self._last_depth_check
            if self._published_since_depth_check or idle_for >= IDLE_DEPTH_CHECK_SECONDS:
                self._check_drained()
        if not self._closing:
            self._ioloop.call_later(TICK_SECONDS, self._on_tick)

    def _check_drained(self) -> None:
        assert self._source_channel is not None
        self._depth_check_pending = True
        self._published_since_depth_check = False
        self._last_depth_check = time.monotonic()
        self._source_channel.queue_declare(
            self._source.queue, passive=True, callback=self._on_depth
        )

    def _on_depth(self, frame: pika.frame.Method) -> None:
        """pika: passive declare-ok. Zero ready and nothing in flight means drained."""
        self._depth_check_pending = False
        if frame.method.message_count == 0 and self._idle():
            self._stop_consuming()

    def _idle(self) -> bool:
        """Nothing received that is not yet acked (published or waiting to be)."""
        return self._window.in_flight == 0 and not self._pending

    def _stop_consuming(self) -> None:
        """Cancel the consumer; deliveries already on the wire are still handled."""
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()
        if self._consuming and self._source_channel is not None and self._source_channel.is_open:
            self._consuming = False
            self._source_channel.basic_cancel(self._consumer_tag, callback=self._on_cancel_ok)
        elif not self._consuming:
            self._cancel_ok = True  # never consumed (or the broker cancelled): nothing to wait for

    def _on_cancel_ok(self, _frame: pika.frame.Method) -> None:
        """pika: cancel-ok. Every delivery sent before it has reached _on_message.

        A drain is confirmed only now: RabbitMQ's ready count leaves out deliveries
        already on their way to us, and pika rejects (requeues) any that arrive after
        the cancel was sent. Ask again; what is there is consumed by a new consumer.
        """
        if self._error is None and self._source_channel is not None:
            self._source_channel.queue_declare(
                self._source.queue, passive=True, callback=self._on_depth_after_cancel
            )
            return
        self._cancel_ok = True

    def _on_depth_after_cancel(self, frame: pika.frame.Method) -> None:
        """pika: declare-ok after cancel-ok. Zero: drained. Otherwise consume again."""
        remaining = frame.method.message_count
        if remaining == 0 or self._error is not None:
            self._cancel_ok = True
            return
        log.info(
            "%s: %d message(s) still ready after the drain check; consuming again",
            self._key.describe(),
            remaining,
        )
        self._stopping_since = None
        self._published_since_depth_check = True
        self._start_consuming()

    def _finish_if_settled(self, now: float) -> None:
        assert self._stopping_since is not None
        waiting = (
            not self._cancel_ok
            or bool(self._pending)
            or self._window.unconfirmed > 0
            or not self._window.settled
        )
        if waiting and now - self._stopping_since < STOP_CONFIRM_TIMEOUT_SECONDS:
            return
        if waiting and self._error is None:
            self._error = (
                f"{self._key.describe()}: {self._window.unconfirmed} publish(es) were not "
                f"confirmed within {STOP_CONFIRM_TIMEOUT_SECONDS:.0f}s; they stay in the source"
            )
        self._close()

    def _fail(self, reason: str) -> None:
        """Stop this transfer: no new deliveries; confirmed ones are still written and acked."""
        if self._error is None:
            self._error = f"{self._key.describe()}: {reason}"
            log.error("%s", self._error)
        self._stop_consuming()

    # -- ending a session -----------------------------------------------------------

    def _connection_lost(self, reason: str) -> None:
        """A connection is gone: settle what can be settled, then end the session."""
        if self._lost is None and self._fatal is None:
            self._lost = reason
        self._close()

    def _close(self) -> None:
        """Close both connections; what the source has not acked goes back to its queue.

        Confirmed deliveries are in the destination whether or not they can still be
        acked, so their rows are written (and acked, if the source is still open)
        first. Unconfirmed publishes may have arrived too: their rows are written
        without a confirm time, so a copy that did arrive is named.
        """
        if not self._closing:
            self._closing = True
            self._write_confirmed()
            if self._source_channel is not None and self._source_channel.is_open:
                for ack in self._window.take_acks():
                    self._source_channel.basic_ack(ack.tag, multiple=ack.multiple)
            # Normally nothing is unconfirmed here; after a lost connection, a channel
            # closed by the broker or a confirm timeout, these may have arrived.
            uncertain = self._window.mark_uncertain()
            if uncertain:
                self._ledger.write(uncertain)
        for connection in (self._source_connection, self._destination_connection):
            # A connection still opening is left to finish: pika's connect workflow
            # cannot be closed mid-way. Its open (or open-error) callback closes it.
            if connection is not None and connection.is_open:
                connection.close()
        self._stop_loop_if_closed()

    def _stop_loop_if_closed(self) -> None:
        connections = (self._source_connection, self._destination_connection)
        if all(c is None or c.is_closed for c in connections):
            self._ioloop.stop()

    def _on_connection_closed(self, connection: pika.connection.Connection, reason: Any) -> None:
        """pika: a connection closed. Expected when closing; otherwise the session is lost."""
        if not self._closing:
            side = self._source if connection is self._source_connection else self._destination
            self._connection_lost(
                f"connection to cluster {side.cluster} vhost {side.vhost!r} was lost ({reason})"
            )
        self._stop_loop_if_closed()

    def _on_channel_closed(self, channel: pika.channel.Channel, reason: Any) -> None:
        """pika: a channel closed. The broker does that for a missing queue or no access.

        Not retryable by a new session or task attempt, so the transfer fails with the
        reason. A channel closed because its connection went is handled as a lost session.
        """
        if self._closing:
            return
        side = self._source if channel is self._source_channel else self._destination
        if not isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            return  # the connection is closing; _on_connection_closed follows
        if self._error is None:
            self._error = (
                f"{self._key.describe()}: the broker closed the channel on cluster "
                f"{side.cluster} vhost {side.vhost!r} queue {side.queue!r} "
                f"({reason.reply_code} {reason.reply_text})"
            )
            log.error("%s", self._error)
        self._close()

    def _on_consumer_cancelled_by_broker(self, _frame: pika.frame.Method) -> None:
        """pika: the broker cancelled our consumer (source queue deleted, or the quorum
        queue's leader moved). A new session consumes again; a deleted queue then fails
        its passive declare."""
        self._consuming = False
        self._connection_lost("the broker cancelled the source consumer")
