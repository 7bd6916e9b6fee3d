"""Reading the source connection's deliveries straight off the bytes.

pika turns every inbound frame into objects: a `Method` with a decoded `Deliver`,
a `Header` with decoded properties, a `Body`, then a content assembler and a
callback lookup per message, and it trims its frame buffer by copying the rest of
it after every frame. On the source connection that was about half of the mover's
CPU. The mover needs four things of a delivery: its tag, the redelivered flag, the
body and the property bytes as they arrived, so `DeliveryReader` reads exactly
those from a basic.deliver and its content frames, and hands every other frame
(declare-ok, cancel-ok, heartbeats, connection.close...) to pika unchanged and in
order, so pika's state machine sees everything it did before except the
deliveries of the consuming channels it is told about (a source connection is
shared by the transfers of a task that read one vhost: a channel each, `pool.py`).

The hook is `Connection._on_data_available(data)`, the one method pika's
transport calls with the bytes it received (pika is pinned).

The reader is also where the byte window is enforced (`byte_window.py`): when the
mover's `on_delivery` answers False, the reader stops after that delivery and takes
the socket out of pika's I/O loop until `resume` (of every channel that paused).
Bytes already read by then (at most one transport read, `CONSUME_BYTES`) wait
unparsed.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any

import pika.connection
from pika import exceptions, frame, spec

log = logging.getLogger(__name__)

# (delivery tag, redelivered, body, property bytes) -> whether to go on reading
OnDelivery = Callable[[int, bool, bytes, bytes], bool]
# (delivery tag, exchange, routing key): told just before `OnDelivery`, only to a
# reader that asked for the route (a park keeps it; a move does not read it).
OnRoute = Callable[[int, str, str], None]

_FRAME_START = struct.Struct(">BHI")  # frame type, channel, payload size
_FRAME_OVERHEAD = 8  # 7 bytes before the payload, 1 after (FRAME_END)
_METHOD_ID = struct.Struct(">I")
_DELIVER_ID = spec.Basic.Deliver.INDEX
_CONTENT_HEADER = struct.Struct(">HHQ")  # class id, weight, body size
_LONG_LONG = struct.Struct(">Q")


class ChannelReader:
    """One consuming channel's share of a connection's `DeliveryReader`: its
    deliveries go to its `on_delivery`, and it can pause the connection's reading.

    What a basic.deliver and its content frames are being read into is kept per
    channel: AMQP lets frames of different channels interleave between a delivery's
    method and its last body frame.
    """

    def __init__(
        self,
        reader: DeliveryReader,
        channel: pika.channel.Channel,
        on_delivery: OnDelivery,
        on_route: OnRoute | None = None,
    ) -> None:
        self._reader = reader
        self._channel = channel
        self.channel_number: int = channel.channel_number
        self._on_delivery = on_delivery
        self._on_route = on_route
        self._exchange = self._routing_key = ""
        # The basic.deliver whose content frames are being read, if any.
        self._consumer_tag = ""
        self._tag = 0
        self._redelivered = False
        self._properties: bytes | None = None
        self._body_size = 0
        self._body_parts: list[bytes] = []
        self._body_received = 0
        self.in_content = False
        # Consumers cancelled to consume again with another prefetch: what they were
        # sent before the cancel-ok is a delivery like any other, not to be requeued.
        self._kept: set[str] = set()

    def keep_after_cancel(self, consumer_tag: str) -> None:
        """Deliver, not reject, what `consumer_tag` is sent until its cancel-ok."""
        self._kept.add(consumer_tag)

    @property
    def paused(self) -> bool:
        return self.channel_number in self._reader.paused_channels

    def pause(self) -> None:
        self._reader.pause(self.channel_number)

    def resume(self) -> None:
        self._reader.resume(self.channel_number)

    def remove(self) -> None:
        """The channel closed: its frames go to pika again, and it pauses nothing."""
        self._reader.remove(self)

    def deliver_method(self, buffer: bytes, at: int) -> None:
        """basic.deliver: consumer-tag, delivery-tag, redelivered, then exchange and
        routing key (read only when the reader was asked for the route)."""
        length = buffer[at]
        self._consumer_tag = buffer[at + 1 : at + 1 + length].decode("utf-8")
        at += 1 + length
        (self._tag,) = _LONG_LONG.unpack_from(buffer, at)
        self._redelivered = bool(buffer[at + 8] & 1)
        if self._on_route is not None:
            at += 9
            length = buffer[at]
            self._exchange = buffer[at + 1 : at + 1 + length].decode("utf-8", "replace")
            at += 1 + length
            length = buffer[at]
            self._routing_key = buffer[at + 1 : at + 1 + length].decode("utf-8", "replace")
        self._properties = None
        self._body_parts = []
        self._body_received = 0
        self.in_content = True

    def content_frame(self, frame_type: int, buffer: bytes, start: int, end: int) -> None:
        if self._properties is None:
            if frame_type != spec.FRAME_HEADER:
                raise exceptions.UnexpectedFrameError(
                    f"frame type {frame_type} where a content header was expected"
                )
            _class, _weight, self._body_size = _CONTENT_HEADER.unpack_from(buffer, start)
            self._properties = buffer[start + 12 : end]
        else:
            if frame_type != spec.FRAME_BODY:
                raise exceptions.UnexpectedFrameError(
                    f"frame type {frame_type} where a content body was expected"
                )
            part = buffer[start:end]
            self._body_parts.append(part)
            self._body_received += len(part)
        if self._body_received >= self._body_size:
            self.in_content = False
            parts = self._body_parts
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            self._deliver(body, self._properties)

    def _deliver(self, body: bytes, properties: bytes) -> None:
        """What `pika.channel.Channel._on_deliver` decides, then the mover's callback."""
        channel = self._channel
        tag = self._consumer_tag
        if tag in channel._cancelled and tag not in self._kept:
            if channel.is_open and tag not in channel._consumers_with_noack:
                channel.basic_reject(self._tag)
            return
        if tag not in channel._consumers:
            log.error("unexpected delivery for consumer %r (tag %d)", tag, self._tag)
            return
        if self._on_route is not None:
            self._on_route(self._tag, self._exchange, self._routing_key)
        if not self._on_delivery(self._tag, self._redelivered, body, properties):
            self.pause()


class DeliveryReader:
    """Takes over an open connection's inbound bytes; deliveries on the channels
    added (`add`) go to their `ChannelReader`, every other frame to pika.

    A delivery whose consumer was cancelled is rejected (requeued) and one for an
    unknown consumer is dropped with an error, as pika's own `Channel._on_deliver`
    does. One per connection: the connection is shared by the channels of several
    transfers (`pool.py`).
    """

    def __init__(self, connection: pika.connection.Connection) -> None:
        self._connection = connection
        self._channels: dict[int, ChannelReader] = {}
        # Bytes not yet a whole frame; pika's own buffer is taken over on first data.
        self._rest = b""
        # Channels whose transfer asked to stop reading (the byte window). The socket
        # is one for all of them, so reading stops while any one is paused: what the
        # others are sent waits in the socket, and memory stays bounded.
        self.paused_channels: set[int] = set()
        connection._on_data_available = self.data_received

    def add(
        self,
        channel: pika.channel.Channel,
        on_delivery: OnDelivery,
        on_route: OnRoute | None = None,
    ) -> ChannelReader:
        reader = ChannelReader(self, channel, on_delivery, on_route)
        self._channels[reader.channel_number] = reader
        return reader

    def remove(self, reader: ChannelReader) -> None:
        if self._channels.get(reader.channel_number) is reader:
            del self._channels[reader.channel_number]
            self.resume(reader.channel_number)

    @property
    def paused(self) -> bool:
        return bool(self.paused_channels)

    def pause(self, channel_number: int) -> None:
        """Stop reading the socket; what was read already waits for `resume`.

        The socket leaves the I/O loop on the loop's next turn, once pika's transport
        is out of its read loop (its SSL transport re-registers the reader on the
        way out of a read otherwise).
        """
        if not self.paused_channels:
            self._connection.ioloop.call_later(0, self._stop_reading)
        self.paused_channels.add(channel_number)

    def resume(self, channel_number: int) -> None:
        """Read again once no channel is paused: first what was read, then the socket."""
        if channel_number not in self.paused_channels:
            return
        self.paused_channels.discard(channel_number)
        if self.paused_channels:
            return
        self._start_reading()
        if self._rest:
            self._connection.ioloop.call_later(0, lambda: self.data_received(b""))

    def _stop_reading(self) -> None:
        transport = getattr(self._connection, "_transport", None)
        if not self.paused_channels or transport is None or transport._sock is None:
            return
        if hasattr(transport, "_ssl_readable_action"):
            if transport._ssl_readable_action != transport._consume:
                return  # mid-handshake or a write waiting to read: let SSL finish it
            transport._ssl_readable_action = None
        transport._nbio.remove_reader(transport._sock.fileno())

    def _start_reading(self) -> None:
        transport = getattr(self._connection, "_transport", None)
        if transport is None or transport._sock is None:
            return
        if hasattr(transport, "_ssl_readable_action"):
            if transport._ssl_readable_action is not None:
                return  # never stopped
            transport._ssl_readable_action = transport._consume
            # SSL may hold decrypted bytes the socket will not signal again.
            transport._nbio.add_callback_threadsafe(transport._on_socket_readable)
        transport._nbio.set_reader(transport._sock.fileno(), transport._on_socket_readable)

    def data_received(self, data: bytes) -> None:
        """pika's transport: bytes from the socket, in order."""
        connection = self._connection
        connection.bytes_received += len(data)  # counted when read: the peer is alive
        if connection._frame_buffer:  # what pika had buffered before the takeover
            data = bytes(connection._frame_buffer) + data
            connection._frame_buffer = b""
        paused = self.paused_channels
        if paused:
            self._rest += data  # bounded by one transport read: the socket is leaving the loop
            return
        buffer = self._rest + data if self._rest else data
        size = len(buffer)
        offset = 0
        channels = self._channels
        unpack_start = _FRAME_START.unpack_from
        try:
            while size - offset >= _FRAME_OVERHEAD and not paused:
                frame_type, channel, payload = unpack_start(buffer, offset)
                end = offset + 7 + payload
                if end >= size:
                    break  # the frame is not all here yet
                if buffer[end] != spec.FRAME_END:
                    raise exceptions.InvalidFrameError("Invalid FRAME_END marker")
                start = offset + 7
                offset = end + 1
                reader = channels.get(channel)
                if reader is not None:
                    if reader.in_content:
                        connection.frames_received += 1
                        reader.content_frame(frame_type, buffer, start, end)
                        continue
                    if (
                        frame_type == spec.FRAME_METHOD
                        and _METHOD_ID.unpack_from(buffer, start)[0] == _DELIVER_ID
                    ):
                        connection.frames_received += 1
                        reader.deliver_method(buffer, start + 4)
                        continue
                self._to_pika(buffer[start - 7 : end + 1])
        finally:
            self._rest = buffer[offset:]

    def _to_pika(self, raw: bytes) -> None:
        """Any other frame: decoded and processed by pika, as it would have been."""
        _consumed, value = frame.decode_frame(raw)
        if value is not None:
            self._connection._process_frame(value)


# pika reads the socket 4 KiB at a time and at most 100 KiB per readiness event: for
# 1 KiB messages that was a recv and a parse call per four messages.
RECV_BYTES = 256 * 1024
CONSUME_BYTES = 1024 * 1024


def install(
    connection: Any,
    channel: pika.channel.Channel,
    on_delivery: OnDelivery,
    on_route: OnRoute | None = None,
) -> ChannelReader:
    """Read `channel`'s deliveries on `connection` with the connection's
    `DeliveryReader` (made on the first channel, with large reads)."""
    reader: DeliveryReader | None = getattr(connection, _READER_ATTRIBUTE, None)
    if reader is None:
        reader = DeliveryReader(connection)
        setattr(connection, _READER_ATTRIBUTE, reader)
        transport = getattr(connection, "_transport", None)
        if transport is not None:
            transport._MAX_RECV_BYTES = RECV_BYTES
            transport._MAX_CONSUME_BYTES = CONSUME_BYTES
    return reader.add(channel, on_delivery, on_route)


_READER_ATTRIBUTE = "_rmq_spark_delivery_reader"
