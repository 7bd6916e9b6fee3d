"""The source connection's delivery reader: frames in, whole deliveries out.

Pure parsing, so the connection and channel are stand-ins that record what pika
would have been asked to do; the real path is covered end to end by the
integration tests (byte-exact, faults, multiplexing) against real brokers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from pika import exceptions, frame, spec

from rmq_spark.transfer.amqp091 import inbound, wire
from tests.support import amqp_encoding as amqp

CHANNEL = 1
FRAME_MAX_BODY = 4096 - 8  # small frames, so bodies span several


@dataclass
class StandInChannel:
    channel_number: int = CHANNEL
    is_open: bool = True
    _consumers: dict[str, Any] = field(default_factory=lambda: {"ctag": object()})
    _cancelled: set[str] = field(default_factory=set)
    _consumers_with_noack: set[str] = field(default_factory=set)
    rejected: list[int] = field(default_factory=list)

    def basic_reject(self, tag: int) -> None:
        self.rejected.append(tag)


@dataclass
class StandInConnection:
    events: list[Any] = field(default_factory=list)
    _frame_buffer: bytes = b""
    frames_received: int = 0
    bytes_received: int = 0

    def _on_data_available(self, data: bytes) -> None:
        raise AssertionError("pika's reader must not be called after the takeover")

    def _process_frame(self, value: Any) -> None:
        self.events.append(("pika", type(value).__name__, getattr(value, "method", None)))


def reader() -> tuple[StandInConnection, StandInChannel]:
    connection, channel, _reader = installed_reader()
    return connection, channel


def installed_reader() -> tuple[StandInConnection, StandInChannel, inbound.ChannelReader]:
    connection, channel = StandInConnection(), StandInChannel()

    def on_delivery(tag: int, redelivered: bool, body: bytes, props: bytes) -> bool:
        connection.events.append(("delivery", tag, redelivered, body, props))
        return True

    installed = inbound.install(connection, channel, on_delivery)  # type: ignore[arg-type]
    return connection, channel, installed


def delivery_frames(
    tag: int,
    body: bytes,
    properties: bytes,
    *,
    redelivered: bool = False,
    consumer: str = "ctag",
    channel: int = CHANNEL,
) -> bytes:
    deliver = spec.Basic.Deliver(
        consumer_tag=consumer,
        delivery_tag=tag,
        redelivered=redelivered,
        exchange="ex.é",
        routing_key="rk",
    )
    parts = [
        frame.Method(channel, deliver).marshal(),
        frame.Header(channel, len(body), wire.ForwardedProperties(properties)).marshal(),
    ]
    parts += [
        frame.Body(channel, body[start : start + FRAME_MAX_BODY]).marshal()
        for start in range(0, len(body), FRAME_MAX_BODY)
    ]
    return b"".join(parts)


def feed(connection: StandInConnection, stream: bytes, cuts: list[int]) -> None:
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        connection._on_data_available(stream[start:end])  # the reader, after install


PROPERTIES = amqp.BasicProperties(
    headers=amqp.table_bytes(("n", amqp.short(7)), ("f", amqp.float32(1.5))),
    delivery_mode=2,
    message_id="m-1",
).encode()


def test_a_delivery_split_at_every_byte_arrives_whole() -> None:
    stream = delivery_frames(5, b"body bytes", PROPERTIES, redelivered=True)
    for cut in range(1, len(stream)):
        connection, _ = reader()
        feed(connection, stream, [cut])
        assert connection.events == [("delivery", 5, True, b"body bytes", PROPERTIES)]
        assert connection.bytes_received == len(stream)


def test_deliveries_and_other_frames_keep_their_order_in_any_chunking() -> None:
    generator = random.Random(7)
    expected: list[Any] = []
    parts: list[bytes] = []
    for tag in range(1, 60):
        size = generator.choice([0, 1, 1000, FRAME_MAX_BODY, FRAME_MAX_BODY + 1, 20_000])
        body = generator.randbytes(size)
        parts.append(delivery_frames(tag, body, PROPERTIES))
        expected.append(("delivery", tag, False, body, PROPERTIES))
        if tag % 10 == 0:  # a heartbeat and another channel's method, between deliveries
            parts.append(frame.Heartbeat().marshal())
            expected.append(("pika", "Heartbeat", None))
            ok = spec.Queue.DeclareOk(queue="q", message_count=tag, consumer_count=1)
            parts.append(frame.Method(CHANNEL, ok).marshal())
            expected.append(("pika", "Method", ok))
    stream = b"".join(parts)
    cuts = sorted(generator.sample(range(1, len(stream)), 300))

    connection, _ = reader()
    feed(connection, stream, cuts)

    assert [comparable(event) for event in connection.events] == [
        comparable(event) for event in expected
    ]


def comparable(event: tuple[Any, ...]) -> tuple[Any, ...]:
    """pika's method objects have no equality: compare their name and count."""
    if event[0] == "pika" and event[2] is not None:
        return (event[0], event[1], event[2].NAME, event[2].message_count)
    return event


def test_a_cancelled_consumers_delivery_is_rejected_not_delivered() -> None:
    connection, channel = reader()
    channel._cancelled.add("ctag")
    connection._on_data_available(delivery_frames(9, b"x", PROPERTIES))
    assert connection.events == []
    assert channel.rejected == [9]


def test_an_unknown_consumers_delivery_is_dropped() -> None:
    connection, channel = reader()
    connection._on_data_available(delivery_frames(3, b"x", PROPERTIES, consumer="other"))
    assert connection.events == []
    assert channel.rejected == []


def test_another_channels_delivery_goes_to_pika() -> None:
    connection, _ = reader()
    deliver = spec.Basic.Deliver(consumer_tag="ctag", delivery_tag=1, exchange="", routing_key="")
    connection._on_data_available(frame.Method(CHANNEL + 1, deliver).marshal())
    assert [(kind, name, method.NAME) for kind, name, method in connection.events] == [
        ("pika", "Method", "Basic.Deliver")
    ]


def test_bytes_pika_had_buffered_are_read_first() -> None:
    stream = delivery_frames(2, b"abc", PROPERTIES)
    connection, _ = reader()
    connection._frame_buffer = stream[:10]
    connection._on_data_available(stream[10:])
    assert connection.events == [("delivery", 2, False, b"abc", PROPERTIES)]
    assert connection._frame_buffer == b""


def test_a_bad_frame_end_is_a_protocol_error() -> None:
    stream = bytearray(delivery_frames(2, b"abc", PROPERTIES))
    stream[-1] = 0
    connection, _ = reader()
    with pytest.raises(exceptions.InvalidFrameError):
        connection._on_data_available(bytes(stream))


def test_a_body_frame_where_a_header_belongs_is_a_protocol_error() -> None:
    deliver = spec.Basic.Deliver(consumer_tag="ctag", delivery_tag=1, exchange="", routing_key="")
    stream = frame.Method(CHANNEL, deliver).marshal() + frame.Body(CHANNEL, b"x").marshal()
    connection, _ = reader()
    with pytest.raises(exceptions.UnexpectedFrameError):
        connection._on_data_available(stream)


@dataclass
class StandInLoop:
    """pika's I/O loop and transport as far as pausing a reader uses them."""

    callbacks: list[Any] = field(default_factory=list)
    readers: dict[int, Any] = field(default_factory=dict)

    def call_later(self, _delay: float, callback: Any) -> None:
        self.callbacks.append(callback)

    def run_callbacks(self) -> None:
        while self.callbacks:
            self.callbacks.pop(0)()

    def set_reader(self, fd: int, callback: Any) -> None:
        self.readers[fd] = callback

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd)


@dataclass
class StandInSocket:
    def fileno(self) -> int:
        return 7


@dataclass
class StandInTransport:
    _nbio: StandInLoop
    _sock: StandInSocket = field(default_factory=StandInSocket)

    def _on_socket_readable(self) -> None:
        raise AssertionError("not read in this test")


def test_reader_stops_after_the_delivery_the_mover_refuses_and_resumes_in_order() -> None:
    connection, channel = StandInConnection(), StandInChannel()
    loop = StandInLoop()
    transport = StandInTransport(loop)
    loop.readers[7] = transport._on_socket_readable
    connection.ioloop = loop  # type: ignore[attr-defined]
    connection._transport = transport  # type: ignore[attr-defined]
    room = {"left": 2}

    def on_delivery(tag: int, redelivered: bool, body: bytes, props: bytes) -> bool:
        connection.events.append(("delivery", tag, redelivered, body, props))
        room["left"] -= 1
        return room["left"] > 0

    reader = inbound.install(connection, channel, on_delivery)  # type: ignore[arg-type]
    stream = b"".join(delivery_frames(tag, b"m%d" % tag, PROPERTIES) for tag in range(1, 6))
    connection._on_data_available(stream[:-3])

    assert [event[1] for event in connection.events] == [1, 2]
    assert reader.paused
    loop.run_callbacks()
    assert 7 not in loop.readers  # the socket left the loop
    connection._on_data_available(stream[-3:])  # read before it left: kept, not parsed
    assert [event[1] for event in connection.events] == [1, 2]

    room["left"] = 10
    reader.resume()
    assert loop.readers[7] == transport._on_socket_readable
    loop.run_callbacks()
    assert [event[1] for event in connection.events] == [1, 2, 3, 4, 5]
    assert connection.bytes_received == len(stream)


def test_a_consumer_cancelled_to_change_its_prefetch_keeps_its_deliveries() -> None:
    connection, channel, installed = installed_reader()
    channel._cancelled.add("ctag")
    installed.keep_after_cancel("ctag")
    connection._on_data_available(delivery_frames(9, b"x", PROPERTIES))
    assert channel.rejected == []
    assert connection.events == [("delivery", 9, False, b"x", PROPERTIES)]


def test_channels_sharing_a_connection_each_get_their_own_deliveries() -> None:
    """Two transfers' channels on one source connection (`pool.py`): the frames of a
    delivery on one channel may be interleaved with the other's; each gets its own."""
    connection = StandInConnection()
    got: dict[int, list[tuple[int, bytes]]] = {1: [], 2: []}

    def on(number: int) -> inbound.OnDelivery:
        def on_delivery(tag: int, redelivered: bool, body: bytes, props: bytes) -> bool:
            got[number].append((tag, body))
            return True

        return on_delivery

    first = inbound.install(connection, StandInChannel(channel_number=1), on(1))
    second = inbound.install(connection, StandInChannel(channel_number=2), on(2))
    assert first._reader is second._reader  # one reader per connection
    big = bytes(range(256)) * 40  # several body frames
    one = delivery_frames(1, big, PROPERTIES, channel=1)
    two = delivery_frames(1, b"two", PROPERTIES, channel=2)
    method_and_header = len(delivery_frames(1, b"", PROPERTIES, channel=1))
    # Channel 2's whole delivery arrives between channel 1's header and its body.
    stream = one[:method_and_header] + two + one[method_and_header:]
    feed(connection, stream, [5, 100, len(stream) - 3])
    assert got == {1: [(1, big)], 2: [(1, b"two")]}
    assert connection.events == []  # nothing for pika

    second.remove()  # its channel closed: its frames are pika's again
    connection._on_data_available(delivery_frames(2, b"late", PROPERTIES, channel=2))
    assert got[2] == [(1, b"two")]
    assert [event[0] for event in connection.events] == ["pika", "pika", "pika"]


def test_a_paused_channel_pauses_the_connection_until_it_resumes_or_leaves() -> None:
    connection = StandInConnection()
    loop = StandInLoop()
    transport = StandInTransport(loop)
    loop.readers[7] = transport._on_socket_readable
    connection.ioloop = loop  # type: ignore[attr-defined]
    connection._transport = transport  # type: ignore[attr-defined]
    got: list[tuple[int, int]] = []
    room = {1: 1, 2: 10}

    def on(number: int) -> inbound.OnDelivery:
        def on_delivery(tag: int, redelivered: bool, body: bytes, props: bytes) -> bool:
            got.append((number, tag))
            room[number] -= 1
            return room[number] > 0

        return on_delivery

    first = inbound.install(connection, StandInChannel(channel_number=1), on(1))
    second = inbound.install(connection, StandInChannel(channel_number=2), on(2))
    stream = b"".join(
        delivery_frames(tag, b"m", PROPERTIES, channel=number)
        for tag in (1, 2)
        for number in (1, 2)
    )
    connection._on_data_available(stream)
    assert got == [(1, 1)]  # channel 1 is full: nothing more is read, for either channel
    assert first.paused
    assert not second.paused
    loop.run_callbacks()
    assert 7 not in loop.readers
    first.remove()  # its session closed: the others read on
    assert 7 in loop.readers
    loop.run_callbacks()
    assert got == [(1, 1), (2, 1), (2, 2)]  # channel 1's later delivery went to pika


def test_a_reader_asked_for_the_route_tells_each_deliverys_exchange_and_key_first() -> None:
    connection, channel = StandInConnection(), StandInChannel()

    def on_delivery(tag: int, redelivered: bool, body: bytes, props: bytes) -> bool:
        connection.events.append(("delivery", tag))
        return True

    def on_route(tag: int, exchange: str, routing_key: str) -> None:
        connection.events.append(("route", tag, exchange, routing_key))

    inbound.install(connection, channel, on_delivery, on_route)  # type: ignore[arg-type]
    stream = delivery_frames(3, b"a", PROPERTIES) + delivery_frames(4, b"b" * 9000, PROPERTIES)
    feed(connection, stream, [7, len(stream) - 5])
    assert connection.events == [
        ("route", 3, "ex.é", "rk"),
        ("delivery", 3),
        ("route", 4, "ex.é", "rk"),
        ("delivery", 4),
    ]
