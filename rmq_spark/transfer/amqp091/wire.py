"""Keeping message properties as the exact bytes they arrived in.

pika decodes a content header into `BasicProperties` and re-encodes it on publish.
AMQP field-table wire types do not survive that: every integer comes back as a
32-bit 'I' or a 64-bit 'l' (a Java client's short 's' or unsigned byte 'B' is
gone), a 32-bit float 'f' or a double 'd' is truncated to an integer, a decimal is
renormalised, a non-UTF-8 long string 'S' becomes a byte array 'x', and a table that
repeats a name keeps only its last entry. The Shovel keeps the bytes; so do we.

The hook is one small, documented place in pika: `pika.frame.decode_frame` builds
the properties object with `pika.spec.props[class_id]()` and calls its `decode`
on the raw property bytes; `pika.frame.Header.marshal` calls `encode()` on the
object it is given. `install()` swaps the registered class for a subclass that
also keeps the raw bytes; `ForwardedProperties` hands those bytes back unchanged.
Decoding still happens (we need message_id, and users may log properties), but
nothing is ever re-encoded.

Decoding must never stop a transfer: pika raises on some blocks RabbitMQ accepts
(a timestamp 'T' past the year 9999, tables nested about a thousand deep), and an
exception in `decode_frame` kills the connection. `WireBasicProperties` then reads
every property except the headers itself (`headers` stays None, `decode_error`
says why) and the bytes are forwarded as they are.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Sequence
from typing import Any

from pika import data, exceptions, frame, spec
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport

from rmq_spark.compat import check_pika
from rmq_spark.model import Delivery

log = logging.getLogger(__name__)

_BASIC_CLASS_ID = spec.BasicProperties.INDEX

# What pika's decoder raises on blocks it cannot read: struct.error (truncated),
# ValueError/OverflowError/OSError (datetime.fromtimestamp past its range),
# ArithmeticError (decimal), RecursionError (deep nesting), unknown type tags.
_DECODE_ERRORS: tuple[type[BaseException], ...] = (
    struct.error,
    ValueError,
    ArithmeticError,
    OSError,
    RecursionError,
    exceptions.ProtocolSyntaxError,
)

_SHORT_STRING, _OCTET, _TIMESTAMP, _TABLE = "shortstr", "octet", "timestamp", "table"

# The basic class's properties in wire order: (attribute, flag bit, kind).
_LAYOUT: tuple[tuple[str, int, str], ...] = (
    ("content_type", spec.BasicProperties.FLAG_CONTENT_TYPE, _SHORT_STRING),
    ("content_encoding", spec.BasicProperties.FLAG_CONTENT_ENCODING, _SHORT_STRING),
    ("headers", spec.BasicProperties.FLAG_HEADERS, _TABLE),
    ("delivery_mode", spec.BasicProperties.FLAG_DELIVERY_MODE, _OCTET),
    ("priority", spec.BasicProperties.FLAG_PRIORITY, _OCTET),
    ("correlation_id", spec.BasicProperties.FLAG_CORRELATION_ID, _SHORT_STRING),
    ("reply_to", spec.BasicProperties.FLAG_REPLY_TO, _SHORT_STRING),
    ("expiration", spec.BasicProperties.FLAG_EXPIRATION, _SHORT_STRING),
    ("message_id", spec.BasicProperties.FLAG_MESSAGE_ID, _SHORT_STRING),
    ("timestamp", spec.BasicProperties.FLAG_TIMESTAMP, _TIMESTAMP),
    ("type", spec.BasicProperties.FLAG_TYPE, _SHORT_STRING),
    ("user_id", spec.BasicProperties.FLAG_USER_ID, _SHORT_STRING),
    ("app_id", spec.BasicProperties.FLAG_APP_ID, _SHORT_STRING),
    ("cluster_id", spec.BasicProperties.FLAG_CLUSTER_ID, _SHORT_STRING),
)


class WireBasicProperties(spec.BasicProperties):  # type: ignore[misc]
    """BasicProperties that remember the property bytes they were decoded from.

    The decoded attributes are for reading only (re-encoding them is what loses the
    wire types). `message_id` is always text, because the ledger stores it as a
    string: a non-UTF-8 id is shown with backslash escapes. `decode_error` is None
    unless pika could not decode the block; then `headers` is None and the other
    properties were read by `_decode_without_headers`.
    """

    wire: bytes = b""

    def decode(self, encoded: bytes, offset: int = 0) -> Any:
        """Read `message_id` now; the other properties when first read, the headers
        table only when asked for.

        The mover needs only `message_id` (and the bytes); decoding each message's
        header table with pika was most of its CPU time per message, and setting the
        other thirteen attributes was the next largest share.
        """
        self.wire = bytes(encoded[offset:])
        attributes = self.__dict__
        for name in _LAZY:
            attributes.pop(name, None)  # read by __getattr__ on first use
        attributes["_headers_pending"] = True
        attributes["_properties_pending"] = True
        message_id = _message_id(self.wire)
        if message_id is _UNREADABLE:
            self._decode_properties()
        else:
            attributes["message_id"] = message_id
            self._text_message_id()
        return self

    def __getattr__(self, name: str) -> Any:
        """A property not read yet (see `decode`): read them all, then answer."""
        if name in _LAZY and self.__dict__.get("_properties_pending"):
            self._decode_properties()
            return self.__dict__[name]
        raise AttributeError(name)

    def _decode_properties(self) -> None:
        self.__dict__["_properties_pending"] = False
        headers_pending = self.__dict__.get("_headers_pending", False)
        _decode_without_headers(self, self.wire)
        self.__dict__["_headers_pending"] = headers_pending
        self._text_message_id()

    @property  # type: ignore[override]
    def headers(self) -> Any:
        if self.__dict__.pop("_headers_pending", False):
            self.__dict__["_properties_pending"] = False
            try:
                spec.BasicProperties.decode(self, self.wire)
            except _DECODE_ERRORS as exc:
                self.decode_error = f"pika could not decode the properties: {exc!r}"
                log.debug("%s; headers left undecoded, bytes forwarded", self.decode_error)
                _decode_without_headers(self, self.wire)
                self.__dict__["_headers"] = None
            self._text_message_id()
        return self.__dict__.get("_headers")

    @headers.setter
    def headers(self, value: Any) -> None:
        self.__dict__["_headers"] = value

    @property
    def decode_error(self) -> str | None:
        """Why pika could not decode the headers (decoding them first if not yet done)."""
        _ = self.headers
        error: str | None = self.__dict__.get("_decode_error")
        return error

    @decode_error.setter
    def decode_error(self, value: str | None) -> None:
        self.__dict__["_decode_error"] = value

    def _text_message_id(self) -> None:
        message_id = getattr(self, "message_id", None)
        if isinstance(message_id, bytes):
            self.message_id = message_id.decode("utf-8", "backslashreplace")


class ForwardedProperties(spec.BasicProperties):  # type: ignore[misc]
    """Properties that encode to exactly the bytes they are given."""

    def __init__(self, wire: bytes) -> None:
        super().__init__()
        self.wire = wire

    def encode(self) -> list[bytes]:
        return [self.wire]


def install() -> None:
    """Make pika keep raw property bytes on every delivery decoded in this process,
    and send buffered frames in as few socket writes as possible.

    Idempotent. The subclass behaves exactly like BasicProperties otherwise, so
    other pika users in the same process are unaffected; coalescing changes how the
    bytes are cut into writes, never the bytes.
    """
    # The two patches below rely on pika internals: refuse a pika they were not made for.
    check_pika()
    spec.props[_BASIC_CLASS_ID] = WireBasicProperties
    _AsyncPlaintextTransport._produce = _produce_coalesced


# -- coalesced writes ---------------------------------------------------------------
#
# pika buffers each frame (method, header, body) of a publish as its own chunk and
# sends the chunks one `send` at a time: three syscalls and, with TCP_NODELAY, three
# TCP segments per 1 KiB message, each one a separate read for the broker's reader
# process. Measured on 2 cores: a third of the mover's CPU, and the destination
# broker used more CPU per message than for the Shovel. Joining what is buffered
# (up to a bound, so a large body is not copied whole) sends a window's worth of
# publishes in a few writes.
_COALESCE_BYTES = 256 * 1024


def _produce_coalesced(transport: Any) -> None:
    """`_AsyncTransportBase._produce`, sending up to _COALESCE_BYTES per write."""
    buffers = transport._tx_buffers
    while buffers:
        if len(buffers) > 1 and len(buffers[0]) < _COALESCE_BYTES:
            parts, size = [], 0
            while buffers and size < _COALESCE_BYTES:
                chunk = buffers.popleft()
                parts.append(chunk)
                size += len(chunk)
            buffers.appendleft(b"".join(parts))
        sent = transport._sigint_safe_send(transport._sock, buffers[0])
        chunk = buffers.popleft()
        if sent < len(chunk):
            buffers.appendleft(chunk[sent:])
        transport._tx_buffered_byte_count -= sent


def wire_bytes(properties: spec.BasicProperties) -> bytes:
    """The property bytes a delivery arrived with (requires `install()`)."""
    if not isinstance(properties, WireBasicProperties):
        raise RuntimeError(
            "delivery properties carry no wire bytes: "
            "rmq_spark.transfer.amqp091.wire.install() must run "
            "before the connection receives messages"
        )
    return properties.wire


def forward(properties: spec.BasicProperties) -> ForwardedProperties:
    """Properties to publish that encode to the delivery's original bytes."""
    return ForwardedProperties(wire_bytes(properties))


def _decode_without_headers(properties: WireBasicProperties, raw: bytes) -> None:
    """Set every property but `headers` from `raw`; the headers table is skipped.

    Used only when pika's decoder raised, which it does inside field tables: the
    other properties are fixed-width octets, a 64-bit timestamp or short strings.
    A block too short for what its flags announce keeps the properties read so far
    and says so in `decode_error`.
    """
    for name, _, _ in _LAYOUT:
        setattr(properties, name, None)
    try:
        flags, offset = _property_flags(raw)
        for name, flag, kind in _LAYOUT:
            if not flags & flag:
                continue
            if kind == _SHORT_STRING:
                (length,) = struct.unpack_from(">B", raw, offset)
                value = _short_string(raw, offset + 1, length)
                offset += 1 + length
                setattr(properties, name, value)
            elif kind == _OCTET:
                (octet,) = struct.unpack_from(">B", raw, offset)
                offset += 1
                setattr(properties, name, octet)
            elif kind == _TIMESTAMP:
                (seconds,) = struct.unpack_from(">Q", raw, offset)
                offset += 8
                setattr(properties, name, seconds)
            else:
                (length,) = struct.unpack_from(">I", raw, offset)
                offset += 4 + length
    except struct.error as exc:
        properties.decode_error = f"{properties.decode_error}; the block is truncated: {exc}"


# The properties `decode` leaves for first use (headers have their own property).
_LAZY = frozenset(name for name, _, _ in _LAYOUT if name != "headers")
_UNREADABLE = object()


def _message_id(raw: bytes) -> Any:
    """The message_id property read straight from the bytes (None if absent), or
    _UNREADABLE when the block is too short for what its flags announce."""
    try:
        flags, offset = _property_flags(raw)
        for name, flag, kind in _LAYOUT:
            if not flags & flag:
                continue
            if name == "message_id":
                (length,) = struct.unpack_from(">B", raw, offset)
                return _short_string(raw, offset + 1, length)
            if kind == _SHORT_STRING:
                offset += 1 + raw[offset]
            elif kind == _OCTET:
                offset += 1
            elif kind == _TIMESTAMP:
                offset += 8
            else:
                (length,) = struct.unpack_from(">I", raw, offset)
                offset += 4 + length
        return None
    except (struct.error, IndexError):
        return _UNREADABLE


def message_id_of(property_bytes: bytes) -> str | None:
    """The message_id of a property block as text (non-UTF-8 bytes backslash-escaped),
    or None when it has none or the block is too short to reach it."""
    message_id = _message_id(property_bytes)
    if message_id is _UNREADABLE or message_id is None:
        return None
    if isinstance(message_id, bytes):
        return message_id.decode("utf-8", "backslashreplace")
    return str(message_id)


_DELIVERY_COUNT = b"x-delivery-count"
_UNREADABLE_COUNT: tuple[type[BaseException], ...] = (*_DECODE_ERRORS, IndexError)


def delivery_count_of(property_bytes: bytes) -> int:
    """The `x-delivery-count` header of a delivery (0 when absent or unreadable).

    Quorum queues add it to redeliveries: on every RabbitMQ version it is the count
    their delivery limit applies to (`delivery_limit.py`). Most deliveries lack it,
    so the bytes are searched before any table is decoded.
    """
    if _DELIVERY_COUNT not in property_bytes:
        return 0
    try:
        flags, offset = _property_flags(property_bytes)
        for _name, flag, kind in _LAYOUT:
            if not flags & flag:
                continue
            if kind == _TABLE:
                headers, _end = data.decode_table(property_bytes, offset)
                value = headers.get(_DELIVERY_COUNT.decode())
                return value if isinstance(value, int) and not isinstance(value, bool) else 0
            offset += 1 + property_bytes[offset]  # content_type, content_encoding
    except _UNREADABLE_COUNT:
        log.debug(
            "x-delivery-count unreadable in a property block of %d bytes", len(property_bytes)
        )
    return 0


# The `priority` bit of the first property flags word, as the byte it sits in.
_PRIORITY_BIT = spec.BasicProperties.FLAG_PRIORITY >> 8


def carries_priority(property_bytes: bytes) -> bool:
    """Whether a property block sets `priority` (its flags word says so; nothing is
    decoded): a RabbitMQ 4.x quorum queue delivers such messages by it."""
    return bool(property_bytes) and bool(property_bytes[0] & _PRIORITY_BIT)


class DigestCache:
    """sha256 hex digests of property blocks, remembering the last one.

    Messages of a queue often carry identical property bytes (same content type,
    delivery mode and headers), so one digest serves a run of them.
    """

    def __init__(self) -> None:
        self._last: bytes | None = None
        self._last_digest = ""

    def digest(self, block: bytes) -> str:
        if block != self._last:
            self._last = block
            self._last_digest = hashlib.sha256(block).hexdigest()
        return self._last_digest


def _property_flags(raw: bytes) -> tuple[int, int]:
    """The property flag words (bit 0 of each says another follows) and the next offset."""
    flags, offset, word_index = 0, 0, 0
    while True:
        (word,) = struct.unpack_from(">H", raw, offset)
        offset += 2
        flags |= word << (16 * word_index)
        if not word & 1:
            return flags, offset
        word_index += 1


def _short_string(raw: bytes, start: int, length: int) -> str | bytes:
    """Text when it is UTF-8, else the bytes (what pika's decoder returns)."""
    value = raw[start : start + length]
    if len(value) != length:
        raise struct.error(f"short string of {length} bytes at offset {start} runs past the end")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


# -- publishing from bytes --------------------------------------------------------------


class PublishFrames:
    """Marshals basic.publish frames for one destination from a body and property bytes.

    The bytes are what `Channel.basic_publish` with `ForwardedProperties` produces
    (method frame, content header, body frames cut at the connection's frame size),
    built in one join: the method frame never changes for a destination, so it is
    encoded once instead of once per message.

    A moved delivery whose decision names its own route (`Delivery.routed`: a
    redrive's origin queue, or the exchange and key its `x-death` recorded) is
    published through that exchange with that key instead; its method frame is
    encoded once per route and kept (a DLQ's messages come from a few origins).
    """

    def __init__(
        self,
        channel_number: int,
        *,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        max_body_frame: int,
    ) -> None:
        self._channel = channel_number
        self._mandatory = mandatory
        self._max_body_frame = max_body_frame
        self._method = self._method_frame(exchange, routing_key)
        self._routed: dict[tuple[str, str], bytes] = {}

    def _method_frame(self, exchange: str, routing_key: str) -> bytes:
        publish = spec.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=self._mandatory
        )
        marshalled: bytes = frame.Method(self._channel, publish).marshal()
        return marshalled

    def method_for(self, delivery: Delivery) -> bytes:
        """The basic.publish frame of a delivery: the link's, or its decision's route."""
        route = delivery.routed
        if route is None:
            return self._method
        method = self._routed.get(route)
        if method is None:
            if len(self._routed) > 1024:  # routes come from message headers: stay bounded
                self._routed.clear()
            method = self._routed[route] = self._method_frame(*route)
        return method

    def marshal_all(self, deliveries: Sequence[Delivery]) -> bytes:
        """The frames of every delivery's publish, in order, in one bytes object."""
        marshal, method_for = self.marshal, self.method_for
        return b"".join(
            [marshal(d.body, d.properties, method_for(d)) for d in deliveries]  # type: ignore[arg-type]
        )

    def marshal(self, body: bytes, property_bytes: bytes, method: bytes | None = None) -> bytes:
        header = _CONTENT_HEADER.pack(_BASIC_CLASS_ID, 0, len(body)) + property_bytes
        parts = [
            self._method if method is None else method,
            _FRAME_START.pack(spec.FRAME_HEADER, self._channel, len(header)),
        ]
        parts += (header, _FRAME_END)
        for start in range(0, len(body), self._max_body_frame):
            fragment = body[start : start + self._max_body_frame]
            parts += (_FRAME_START.pack(spec.FRAME_BODY, self._channel, len(fragment)), fragment)
            parts.append(_FRAME_END)
        return b"".join(parts)


_FRAME_START = struct.Struct(">BHI")  # frame type, channel, payload size
_CONTENT_HEADER = struct.Struct(">HHQ")  # class id, weight (0), body size
_FRAME_END = bytes((spec.FRAME_END,))
