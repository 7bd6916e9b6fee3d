"""The transfer engine: drain one source queue into one destination queue.

One pika I/O loop drives two asynchronous connections (source and destination), so
publishes pipeline under publisher confirms instead of waiting for each one. The
consumer prefetch is the window. Every decision about what may be acked lives in
`window.TransferWindow`; this module only turns broker events into calls on it:

    source delivery ──► publish (mandatory, exact property bytes) ──► window.on_publish
    destination ack/nack/return ──► window ──► ledger write (durable) ──► source ack

A source message is acked only after the destination confirmed it AND its ledger
row is durable. Refused (nacked or returned) messages are never acked: when the
source channel closes they go back to the queue.

Drain ends exactly when the source queue reports zero ready messages while
nothing is in flight.
"""

from __future__ import annotations

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
from rmq_spark.errors import TransferError
from rmq_spark.ledger.writer import TransferKey
from rmq_spark.window import Delivery, TransferWindow

log = logging.getLogger(__name__)

# How often the loop flushes a slow trickle of confirms and re-checks an idle queue.
TICK_SECONDS = 0.05
# An idle consumer re-asks the queue depth this often (other consumers may hold messages).
IDLE_DEPTH_CHECK_SECONDS = 0.5
# How long to wait for outstanding confirms once the transfer is stopping.
STOP_CONFIRM_TIMEOUT_SECONDS = 60.0


class LedgerSink(Protocol):
    """Where the mover makes rows durable; `write` must be durable when it returns."""

    def write(self, deliveries: Sequence[Delivery]) -> None: ...


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


def utc_now() -> datetime:
    return datetime.now(UTC)


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
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        wire.install()
        self._key = key
        self._source = source
        self._destination = destination
        self._ledger = ledger
        self._prefetch = prefetch
        self._first_position = first_position
        self._window = TransferWindow(prefetch, first_position=first_position, clock=clock)
        self._ioloop = IOLoop()
        self._source_connection: SelectConnection | None = None
        self._destination_connection: SelectConnection | None = None
        self._source_channel: pika.channel.Channel | None = None
        self._destination_channel: pika.channel.Channel | None = None
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
        self._error: str | None = None
        self._fatal: BaseException | None = None
        self._moved_messages = 0
        self._moved_bytes = 0

    # -- running --------------------------------------------------------------------

    def run(self) -> MoveOutcome:
        """Run the I/O loop until the queue is drained or the transfer stops.

        Returns a "failed" outcome for refusals a user must act on (the source keeps
        the messages); raises for lost connections, which a retried task resumes.
        """
        started = time.monotonic()
        log.info("moving %s (prefetch %d)", self._key.describe(), self._prefetch)
        self._connect_source(0)
        self._connect_destination(0)
        self._ioloop.call_later(TICK_SECONDS, self._on_tick)
        self._ioloop.start()
        self._ioloop.close()
        if self._fatal is not None:
            raise self._fatal
        seconds = time.monotonic() - started
        log.info(
            "%s: %s, %d messages, %d bytes in %.2fs",
            self._key.describe(),
            "failed" if self._error else "moved",
            self._moved_messages,
            self._moved_bytes,
            seconds,
        )
        return MoveOutcome(
            key=self._key,
            status="failed" if self._error else "moved",
            error=self._error,
            messages=self._moved_messages,
            bytes=self._moved_bytes,
            first_position=self._first_position,
            next_position=self._window.next_position,
            seconds=seconds,
        )

    # -- connections ----------------------------------------------------------------

    def _connect_source(self, index: int) -> None:
        self._source_connection = SelectConnection(
            self._source.parameters[index],
            on_open_callback=self._on_source_open,
            on_open_error_callback=lambda _c, exc: self._on_open_error(self._source, index, exc),
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._ioloop,
        )

    def _connect_destination(self, index: int) -> None:
        self._destination_connection = SelectConnection(
            self._destination.parameters[index],
            on_open_callback=self._on_destination_open,
            on_open_error_callback=lambda _c, exc: self._on_open_error(
                self._destination, index, exc
            ),
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._ioloop,
        )

    def _on_open_error(self, endpoint: Endpoint, index: int, exc: BaseException) -> None:
        """pika: a connection could not open. Try the cluster's next URI, or give up."""
        if index + 1 < len(endpoint.parameters):
            if endpoint is self._source:
                self._connect_source(index + 1)
            else:
                self._connect_destination(index + 1)
            return
        self._abort(open_error(endpoint.cluster, endpoint.vhost, endpoint.parameters[index], exc))

    def _on_source_open(self, connection: pika.connection.Connection) -> None:
        """pika: source connection is open; open its channel next."""
        connection.channel(on_open_callback=self._on_source_channel_open)

    def _on_destination_open(self, connection: pika.connection.Connection) -> None:
        """pika: destination connection is open; open its channel next."""
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

    # -- the transfer ---------------------------------------------------------------

    def _on_message(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Deliver,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: a source delivery. Publish it unchanged, then record it in the window."""
        assert self._destination_channel is not None
        property_bytes = wire.wire_bytes(properties)
        self._destination_channel.basic_publish(
            exchange="",
            routing_key=self._destination.queue,
            body=body,
            properties=wire.ForwardedProperties(property_bytes),
            mandatory=True,
        )
        self._published_since_depth_check = True
        self._window.on_publish(
            method.delivery_tag,
            redelivered=bool(method.redelivered),
            body_size=len(body),
            body_sha256=hashlib.sha256(body).hexdigest(),
            properties_sha256=hashlib.sha256(property_bytes).hexdigest(),
            message_id=properties.message_id,
        )

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        """pika: the destination's basic.ack or basic.nack for one or more publishes."""
        method = frame.method
        if isinstance(method, pika.spec.Basic.Ack):
            self._window.on_confirm(method.delivery_tag, multiple=method.multiple)
        else:
            refused = self._window.on_nack(method.delivery_tag, multiple=method.multiple)
            if refused:
                self._fail(
                    f"the destination refused (nacked) {len(refused)} message(s), first at "
                    f"source position {refused[0].position}"
                )
        self._settle()

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
        elif self._consuming and self._window.in_flight == 0 and not self._depth_check_pending:
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
        if frame.method.message_count == 0 and self._window.in_flight == 0:
            self._stop_consuming()

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
        """pika: cancel-ok. Every delivery sent before it has reached _on_message."""
        self._cancel_ok = True

    def _finish_if_settled(self, now: float) -> None:
        assert self._stopping_since is not None
        waiting = not self._cancel_ok or self._window.unconfirmed > 0 or not self._window.settled
        if waiting and now - self._stopping_since < STOP_CONFIRM_TIMEOUT_SECONDS:
            return
        if waiting and self._error is None:
            self._error = (
                f"{self._window.unconfirmed} publish(es) were not confirmed within "
                f"{STOP_CONFIRM_TIMEOUT_SECONDS:.0f}s; they stay in the source"
            )
        self._close()

    def _fail(self, reason: str) -> None:
        """Stop this transfer: no new deliveries; confirmed ones are still written and acked."""
        if self._error is None:
            self._error = f"{self._key.describe()}: {reason}"
            log.error("%s", self._error)
        self._stop_consuming()

    def _abort(self, exc: BaseException) -> None:
        """Stop the loop with an exception for the caller (the task) to raise."""
        if self._fatal is None:
            self._fatal = exc
        self._close()

    # -- closing --------------------------------------------------------------------

    def _close(self) -> None:
        """Close both connections; unacked deliveries return to the source.

        Confirmed deliveries are in the destination whether or not they can still be
        acked, so their rows are written first: a later redelivery is then a named
        duplicate instead of an unexplained one.
        """
        if not self._closing:
            self._write_confirmed()
        self._closing = True
        for connection in (self._source_connection, self._destination_connection):
            if connection is not None and not (connection.is_closed or connection.is_closing):
                connection.close()
        self._stop_loop_if_closed()

    def _stop_loop_if_closed(self) -> None:
        connections = (self._source_connection, self._destination_connection)
        if all(c is None or c.is_closed for c in connections):
            self._ioloop.stop()

    def _on_connection_closed(self, connection: pika.connection.Connection, reason: Any) -> None:
        """pika: a connection closed. Expected when closing; otherwise the task must retry."""
        if not self._closing:
            side = self._source if connection is self._source_connection else self._destination
            self._abort(
                TransferError(
                    f"{self._key.describe()}: connection to cluster {side.cluster} "
                    f"vhost {side.vhost!r} was lost ({reason}); unacked messages stay in the source"
                )
            )
        self._stop_loop_if_closed()

    def _on_channel_closed(self, channel: pika.channel.Channel, reason: Any) -> None:
        """pika: a channel closed. The broker does that for a missing queue or no access.

        Not retryable by a new task attempt, so the transfer fails with the reason.
        """
        if self._closing:
            return
        side = self._source if channel is self._source_channel else self._destination
        detail = reason
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            detail = f"{reason.reply_code} {reason.reply_text}"
        if self._error is None:
            self._error = (
                f"{self._key.describe()}: the broker closed the channel on cluster "
                f"{side.cluster} vhost {side.vhost!r} queue {side.queue!r} ({detail})"
            )
            log.error("%s", self._error)
        self._close()

    def _on_consumer_cancelled_by_broker(self, _frame: pika.frame.Method) -> None:
        """pika: the broker cancelled our consumer (source queue deleted or failed over)."""
        self._consuming = False
        self._cancel_ok = True
        self._fail("the broker cancelled the source consumer (queue deleted?)")
