"""AMQP 0-9-1 links over pika's SelectConnection: the engine's protocol adapter.

The counterpart of the Shovel's `rabbit_amqp091_shovel`: it opens one session's
two channels, each on a connection the task's transfers share (`pool.py`, which
tries each URI of an endpoint in turn), turns pika's callbacks into
`ports.SessionEvents` calls, and sends what the session asks for. It decides
nothing about the transfer; every decision is in `session.Session`.

The hot path is pika's private surface, as before the split: the source channel's
deliveries are read off the bytes by `inbound.DeliveryReader`, which calls the
session's bound `on_delivery` per delivery, and a batch of publishes is marshalled
by `wire.PublishFrames` and handed to the connection's output buffer as one chunk.
`wire.install()` runs once, when the first connector is built.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pika
import pika.channel
import pika.connection
import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.select_connection import IOLoop

from rmq_spark.errors import AccessRefusedError
from rmq_spark.model import Delivery
from rmq_spark.transfer.amqp091 import inbound, wire
from rmq_spark.transfer.amqp091.pool import ConnectionPool, SharedConnection
from rmq_spark.transfer.ports import DESTINATION, SOURCE, EventLoop, SessionEvents, Side
from rmq_spark.transfer.window import Ack

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoint:
    """One side of the transfer: where to connect and which queue."""

    cluster: str
    vhost: str
    queue: str
    parameters: tuple[pika.ConnectionParameters, ...]


def event_loop() -> EventLoop:
    """A pika I/O loop for `lanes.run_movers` (one per executor task)."""
    loop: EventLoop = IOLoop()
    return loop


class Amqp091Connector:
    """Opens each session's two links to `source` and `destination` (`ports.Connector`),
    each a channel on a connection of `connections` (the task's pool, `pool.py`)."""

    def __init__(
        self, source: Endpoint, destination: Endpoint, connections: ConnectionPool | None = None
    ) -> None:
        # The patches are process-wide and idempotent; applied here, explicitly, before
        # any connection of ours can receive a delivery.
        wire.install()
        self.source = source
        self.destination = destination
        # Without a task's pool (a mover run alone), the transfer's sessions share one.
        self.connections = connections if connections is not None else ConnectionPool()
        self.message_id_of: Callable[[bytes], str | None] = wire.message_id_of
        self.delivery_count_of: Callable[[bytes], int] = wire.delivery_count_of
        self.carries_priority: Callable[[bytes], bool] = wire.carries_priority
        # One per transfer, as the messages of a queue often share their property bytes.
        self.digest_properties: Callable[[bytes], str] = wire.DigestCache().digest

    def connect(
        self, events: SessionEvents, ioloop: EventLoop, label: str
    ) -> tuple[SourceLink, DestinationLink]:
        return (
            SourceLink(self.source, events, ioloop, label, self.connections),
            DestinationLink(self.destination, events, ioloop, label, self.connections),
        )

    def connect_kept(self, events: SessionEvents, ioloop: EventLoop, label: str) -> DestinationLink:
        """A publisher to the source queue's tail (default exchange, the queue's name),
        confirms on: where a selective move puts back what it keeps."""
        return DestinationLink(self.source, events, ioloop, label, self.connections)

    def event_loop(self) -> EventLoop:
        return event_loop()


class _Link:
    """One channel on a shared connection (`pool.SharedConnection`); what both sides share.

    The link is closed when its channel is (by us, by the broker, or with its
    connection), or when its connection could not open: `SessionEvents.on_closed`
    tells the session, as a connection's close did when each link had its own.
    """

    side: Side

    def __init__(
        self,
        endpoint: Endpoint,
        events: SessionEvents,
        ioloop: Any,
        label: str,
        connections: ConnectionPool,
    ) -> None:
        self._endpoint = endpoint
        self._events = events
        self._label = label
        self._channel: pika.channel.Channel | None = None
        self._closing = False
        self._closed = False
        self._shared: SharedConnection = connections.join(
            self.side,
            endpoint.cluster,
            endpoint.vhost,
            endpoint.parameters,
            ioloop=ioloop,
            user=self,
        )

    @property
    def is_open(self) -> bool:
        return not self._closed and self._channel is not None and self._channel.is_open

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the channel; what the source has not acked goes back to its queue.

        A channel (or connection) still opening is left to finish: its open
        callback closes it.
        """
        self._closing = True
        channel = self._channel
        if channel is not None and channel.is_open and not self._closed:
            channel.close()

    # -- the shared connection's news (pool.ChannelUser) ----------------------------

    def connection_open(self, connection: pika.connection.Connection) -> None:
        """The connection is open: open this link's channel (unless ending)."""
        if self._closed:
            return
        if self._closing:
            self._ended()
            return
        connection.channel(on_open_callback=self._channel_opened)

    def connection_failed(self, error: Exception) -> None:
        """No URI opened the connection; refused access is final."""
        if self._closed:
            return
        self._closed = True
        self._shared.leave(self)
        if self._closing:
            self._events.on_closed(self.side)
        elif isinstance(error, AccessRefusedError):
            self._events.on_refused(self.side, error)
        else:
            self._events.on_lost(self.side, str(error))

    def connection_lost(self, reason: str) -> None:
        """The connection closed: expected when closing; otherwise the session is lost."""
        if self._closed:
            return
        self._forget_channel()
        self._closed = True
        self._shared.leave(self)
        if not self._closing:
            self._events.on_lost(self.side, reason)
        self._events.on_closed(self.side)

    def connection_blocked(self, blocked: bool) -> None:
        """The broker blocked publishing (memory or disk alarm), or unblocked it.

        Nothing to do but wait: publishes stay buffered, confirms stop, so acks stop and
        the prefetch window stops new deliveries. pika closes the connection if the
        block outlasts blocked_timeout_seconds, which ends every session on it as lost.
        """
        if blocked:
            log.warning("%s: %s connection blocked by a broker alarm", self._label, self.side)
        else:
            log.info("%s: %s connection unblocked", self._label, self.side)

    # -- the channel ------------------------------------------------------------------

    def _channel_opened(self, channel: pika.channel.Channel) -> None:
        """pika: the channel is open; set it up (`_on_channel_open`) unless ending."""
        self._channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        if self._closing:
            channel.close()
            return
        self._on_channel_open(channel)

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        raise NotImplementedError

    def _forget_channel(self) -> None:
        """The channel is gone: the connection's reader stops reading for it."""

    def _ended(self) -> None:
        self._forget_channel()
        self._closed = True
        self._shared.leave(self)
        self._events.on_closed(self.side)

    def _on_channel_closed(self, _channel: pika.channel.Channel, reason: Any) -> None:
        """pika: the channel closed: we closed it, or the broker did (a missing queue,
        no access, a 406), or its connection went (`connection_lost` follows)."""
        if self._closed:
            return
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            self._forget_channel()
            self._closed = True
            self._shared.leave(self)
            if not self._closing:
                self._events.on_channel_closed(self.side, reason.reply_code, reason.reply_text)
            self._events.on_closed(self.side)
        elif isinstance(reason, pika.exceptions.ChannelClosedByClient):
            self._ended()


class SourceLink(_Link):
    """The source side (`ports.SourceLink`): qos, consume, cancel, ack, depth, get.

    With `on_route`, each delivery's exchange and routing key are told to it (by tag)
    just before the delivery itself (a park keeps them; a move does not read them).
    """

    side = SOURCE

    def __init__(
        self,
        endpoint: Endpoint,
        events: SessionEvents,
        ioloop: Any,
        label: str,
        connections: ConnectionPool,
        *,
        on_route: inbound.OnRoute | None = None,
    ) -> None:
        self._reader: inbound.ChannelReader | None = None
        self._on_route = on_route
        self._consumer_tag: str | None = None
        super().__init__(endpoint, events, ioloop, label, connections)

    @property
    def paused(self) -> bool:
        reader = self._reader
        return reader is not None and reader.paused

    def resume(self) -> None:
        if self._reader is not None:
            self._reader.resume()

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        """pika: source channel is open; the session asks for its prefetch next."""
        self._reader = inbound.install(
            channel.connection, channel, self._events.on_delivery, self._on_route
        )
        channel.add_on_cancel_callback(self._on_consumer_cancelled_by_broker)
        channel.add_callback(self._on_get_empty, [pika.spec.Basic.GetEmpty], one_shot=False)
        self._events.on_ready(SOURCE)

    def _forget_channel(self) -> None:
        if self._reader is not None:
            self._reader.remove()

    def set_prefetch(self, prefetch: int) -> None:
        assert self._channel is not None
        self._channel.basic_qos(prefetch_count=prefetch, callback=self._on_qos_ok)

    def _on_qos_ok(self, _frame: pika.frame.Method) -> None:
        self._events.on_prefetch_set()

    def consume(self) -> None:
        assert self._channel is not None
        self._consumer_tag = self._channel.basic_consume(
            self._endpoint.queue, self._on_message, auto_ack=False
        )

    def cancel(self) -> None:
        # What the consumer was sent before the cancel took effect is delivered, not
        # rejected: a requeue would count against a quorum source's delivery limit.
        assert self._channel is not None
        if self._reader is not None and self._consumer_tag is not None:
            self._reader.keep_after_cancel(self._consumer_tag)
        self._channel.basic_cancel(self._consumer_tag, callback=self._on_cancel_ok)

    def _on_cancel_ok(self, _frame: pika.frame.Method) -> None:
        """pika: cancel-ok. Every delivery sent before it has reached on_delivery."""
        self._events.on_cancel_ok()

    def ack(self, acks: Sequence[Ack]) -> None:
        assert self._channel is not None
        basic_ack = self._channel.basic_ack
        for ack in acks:
            basic_ack(ack.tag, multiple=ack.multiple)

    def ask_depth(self) -> None:
        assert self._channel is not None
        self._channel.queue_declare(self._endpoint.queue, passive=True, callback=self._on_depth)

    def _on_depth(self, frame: pika.frame.Method) -> None:
        """pika: passive declare-ok."""
        self._events.on_depth(frame.method.message_count, frame.method.consumer_count)

    def get_one(self) -> None:
        assert self._channel is not None
        self._channel.basic_get(self._endpoint.queue, self._on_get_ok)

    def _on_get_ok(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.GetOk,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: get-ok."""
        if self._on_route is not None:
            self._on_route(method.delivery_tag, method.exchange, method.routing_key)
        self._events.on_got(
            method.delivery_tag,
            bool(method.redelivered),
            body,
            wire.wire_bytes(properties),
            method.message_count,
        )

    def _on_get_empty(self, _frame: pika.frame.Method) -> None:
        """pika: get-empty."""
        self._events.on_get_empty()

    def _on_message(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Deliver,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: a source delivery (only if `inbound` did not read it first)."""
        if self._on_route is not None:
            self._on_route(method.delivery_tag, method.exchange, method.routing_key)
        self._events.on_delivery(
            method.delivery_tag, bool(method.redelivered), body, wire.wire_bytes(properties)
        )

    def _on_consumer_cancelled_by_broker(self, _frame: pika.frame.Method) -> None:
        """pika: the broker cancelled our consumer (source queue deleted, the quorum
        queue's leader moved, or a 4.3 quorum queue's consumer timeout where the
        channel supports it)."""
        self._events.on_consumer_cancelled()


class DestinationLink(_Link):
    """The destination side (`ports.DestinationLink`): confirms on, batch publish."""

    side = DESTINATION

    def __init__(
        self,
        endpoint: Endpoint,
        events: SessionEvents,
        ioloop: Any,
        label: str,
        connections: ConnectionPool,
    ) -> None:
        self._publish_frames: wire.PublishFrames | None = None
        super().__init__(endpoint, events, ioloop, label, connections)

    def _on_channel_open(self, channel: pika.channel.Channel) -> None:
        """pika: destination channel is open; turn on publisher confirms."""
        self._publish_frames = wire.PublishFrames(
            channel.channel_number,
            exchange="",
            routing_key=self._endpoint.queue,
            mandatory=True,
            max_body_frame=channel.connection._body_max_length,
        )
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=self._on_confirm_select_ok)

    def _on_confirm_select_ok(self, _frame: pika.frame.Method) -> None:
        self._events.on_ready(DESTINATION)

    def publish(self, deliveries: Sequence[Delivery]) -> None:
        """basic.publish each (mandatory, to the destination queue), in order, the
        bytes built by us and handed to pika's output buffer as one chunk.

        Same frames as `Channel.basic_publish` with `wire.ForwardedProperties`, a
        fraction of the Python work (see `wire.PublishFrames`).
        """
        assert self._channel is not None
        assert self._publish_frames is not None
        self._channel.connection._output_marshaled_frames(
            (self._publish_frames.marshal_all(deliveries),)
        )

    def ask_depth(self) -> None:
        """Passive declare on the publishing channel, after the publishes sent so far."""
        assert self._channel is not None
        self._channel.queue_declare(self._endpoint.queue, passive=True, callback=self._on_depth)

    def _on_depth(self, frame: pika.frame.Method) -> None:
        self._events.on_destination_depth(frame.method.message_count)

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        """pika: the destination's basic.ack or basic.nack for one or more publishes."""
        method = frame.method
        self._events.on_confirm(
            method.delivery_tag,
            multiple=method.multiple,
            ack=isinstance(method, pika.spec.Basic.Ack),
        )

    def _on_return(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: a mandatory publish was routed nowhere (destination queue missing)."""
        reason = f"returned by the destination: {method.reply_code} {method.reply_text}"
        self._events.on_return(body, wire.wire_bytes(properties), reason)
