"""Shared connections: one per (side, cluster, vhost, URIs), a channel per link.

pika's SelectConnection and Channel are stand-ins that record what they were asked
and let a test play the broker (open, close a channel, lose the connection); the
links are the real `links.SourceLink`/`DestinationLink`, reporting to a recorder.
The real thing runs against brokers in tests/integration/test_shared_connections.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import pika
import pika.exceptions
import pytest

from rmq_spark.errors import AccessRefusedError, RmqSparkError
from rmq_spark.transfer.amqp091.links import DestinationLink, Endpoint, SourceLink
from rmq_spark.transfer.amqp091.pool import ConnectionPool
from rmq_spark.transfer.ports import Side


class StandInChannel:
    def __init__(self, connection: StandInConnection, number: int) -> None:
        self.connection = connection
        self.channel_number = number
        self.is_open = False
        self.closing = False
        self._close_callbacks: list[Callable[..., None]] = []
        self._cancelled: set[str] = set()
        self._consumers: dict[str, Any] = {}
        self._consumers_with_noack: set[str] = set()
        self.asked: list[str] = []

    def add_on_close_callback(self, callback: Callable[..., None]) -> None:
        self._close_callbacks.append(callback)

    def add_on_cancel_callback(self, callback: Callable[..., None]) -> None:
        pass

    def add_on_return_callback(self, callback: Callable[..., None]) -> None:
        pass

    def add_callback(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def confirm_delivery(self, *_args: Any, **_kwargs: Any) -> None:
        self.asked.append("confirm.select")

    def close(self) -> None:
        self.closing = True
        self.asked.append("channel.close")

    def closed(self, reason: Exception) -> None:
        """The broker's close, or its close-ok, or the connection's end."""
        self.is_open = False
        for callback in self._close_callbacks:
            callback(self, reason)


class StandInConnection:
    """What `pool.SharedConnection` asks of pika's SelectConnection."""

    made: ClassVar[list[StandInConnection]] = []

    def __init__(
        self,
        parameters: pika.ConnectionParameters,
        *,
        on_open_callback: Callable[..., None],
        on_open_error_callback: Callable[..., None],
        on_close_callback: Callable[..., None],
        custom_ioloop: Any,
    ) -> None:
        self.parameters = parameters
        self._on_open = on_open_callback
        self._on_open_error = on_open_error_callback
        self._on_close = on_close_callback
        self._blocked: list[Callable[..., None]] = []
        self._unblocked: list[Callable[..., None]] = []
        self.is_open = False
        self.is_closed = False
        self.close_asked = False
        self.channels: list[StandInChannel] = []
        self._pending: list[tuple[StandInChannel, Callable[..., None]]] = []
        self._frame_buffer = b""
        self.bytes_received = 0
        self.frames_received = 0
        self._body_max_length = 131_072 - 8
        StandInConnection.made.append(self)

    def add_on_connection_blocked_callback(self, callback: Callable[..., None]) -> None:
        self._blocked.append(callback)

    def add_on_connection_unblocked_callback(self, callback: Callable[..., None]) -> None:
        self._unblocked.append(callback)

    def channel(self, on_open_callback: Callable[..., None]) -> StandInChannel:
        channel = StandInChannel(self, len(self.channels) + 1)
        self.channels.append(channel)
        self._pending.append((channel, on_open_callback))
        return channel

    def close(self) -> None:
        self.close_asked = True

    # -- the broker's side --------------------------------------------------------------

    def opens(self) -> None:
        self.is_open = True
        self._on_open(self)

    def open_channels(self) -> None:
        pending, self._pending = self._pending, []
        for channel, callback in pending:
            channel.is_open = True
            callback(channel)

    def fails(self, exc: Exception) -> None:
        self.is_closed = True
        self._on_open_error(self, exc)

    def closes(self, reason: Exception) -> None:
        self.is_open, self.is_closed = False, True
        for channel in self.channels:
            if channel.is_open:
                channel.closed(reason)
        self._on_close(self, reason)

    def blocks(self, blocked: bool) -> None:
        for callback in self._blocked if blocked else self._unblocked:
            callback(self, None)


class Recorder:
    """`ports.SessionEvents`: what the links reported."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_ready(self, side: Side) -> None:
        self.events.append(("ready", side))

    def on_delivery(self, tag: int, redelivered: bool, body: bytes, properties: bytes) -> bool:
        return True

    def on_channel_closed(self, side: Side, code: int, text: str) -> None:
        self.events.append(("channel closed", side, code))

    def on_lost(self, side: Side, reason: str) -> None:
        self.events.append(("lost", side))

    def on_refused(self, side: Side, error: RmqSparkError) -> None:
        self.events.append(("refused", side))

    def on_closed(self, side: Side) -> None:
        self.events.append(("closed", side))


def parameters(port: int = 5672) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host="127.0.0.1", port=port, virtual_host="v")


def endpoint(queue: str, *, vhost: str = "v", ports: tuple[int, ...] = (5672,)) -> Endpoint:
    return Endpoint("dr", vhost, queue, tuple(parameters(port) for port in ports))


@pytest.fixture
def pool() -> ConnectionPool:
    StandInConnection.made = []
    return ConnectionPool(factory=StandInConnection)


def source(pool: ConnectionPool, queue: str, **where: Any) -> tuple[SourceLink, Recorder]:
    events = Recorder()
    return SourceLink(endpoint(queue, **where), events, None, queue, pool), events  # type: ignore[arg-type]


def test_links_of_one_vhost_share_one_connection_with_a_channel_each(
    pool: ConnectionPool,
) -> None:
    links = [source(pool, f"q{index}") for index in range(3)]
    other_vhost, _ = source(pool, "q9", vhost="w")
    destination = DestinationLink(endpoint("q0"), Recorder(), None, "q0", pool)  # type: ignore[arg-type]
    assert pool.opened == 3  # source v, source w, destination v
    shared = StandInConnection.made[0]
    shared.opens()
    assert len(shared.channels) == 3  # one per link, asked once the connection opened
    shared.open_channels()
    assert all(events.events == [("ready", "source")] for _link, events in links)
    assert all(link.is_open for link, _events in links)
    assert not other_vhost.is_open
    assert not destination.is_open


def test_a_link_joining_an_open_connection_opens_its_channel_at_once(
    pool: ConnectionPool,
) -> None:
    source(pool, "q0")
    StandInConnection.made[0].opens()
    _later, _ = source(pool, "q1")
    assert pool.opened == 1
    assert len(StandInConnection.made[0].channels) == 2


def test_a_channel_closed_by_the_broker_ends_only_its_link(pool: ConnectionPool) -> None:
    (missing, missing_events), (other, other_events) = source(pool, "gone"), source(pool, "q1")
    shared = StandInConnection.made[0]
    shared.opens()
    shared.open_channels()
    shared.channels[0].closed(pika.exceptions.ChannelClosedByBroker(404, "NOT_FOUND"))
    assert missing_events.events[1:] == [("channel closed", "source", 404), ("closed", "source")]
    assert missing.is_closed
    assert other.is_open
    assert other_events.events == [("ready", "source")]
    assert not shared.close_asked
    # The next transfer of the vhost still uses the connection.
    source(pool, "q2")
    assert pool.opened == 1


def test_a_lost_connection_ends_every_link_on_it_and_the_next_join_opens_anew(
    pool: ConnectionPool,
) -> None:
    links = [source(pool, f"q{index}") for index in range(3)]
    shared = StandInConnection.made[0]
    shared.opens()
    shared.open_channels()
    shared.closes(pika.exceptions.ConnectionClosedByBroker(320, "CONNECTION_FORCED"))
    for link, events in links:
        assert link.is_closed
        assert events.events[1:] == [("lost", "source"), ("closed", "source")]
    source(pool, "q0")  # a mover's reconnect
    assert pool.opened == 2
    assert StandInConnection.made[1] is not shared


def test_closing_a_link_closes_its_channel_not_the_connection(pool: ConnectionPool) -> None:
    (link, events), (other, _) = source(pool, "q0"), source(pool, "q1")
    shared = StandInConnection.made[0]
    shared.opens()
    shared.open_channels()
    link.close()
    assert shared.channels[0].asked == ["channel.close"]
    assert not link.is_closed  # until the close-ok
    shared.channels[0].closed(pika.exceptions.ChannelClosedByClient(200, "Normal shutdown"))
    assert link.is_closed
    assert events.events[-1] == ("closed", "source")
    assert ("lost", "source") not in events.events
    assert other.is_open
    assert not shared.close_asked


def test_a_link_closed_before_its_connection_opened_opens_no_channel(
    pool: ConnectionPool,
) -> None:
    (early, events), (other, _) = source(pool, "q0"), source(pool, "q1")
    early.close()
    shared = StandInConnection.made[0]
    shared.opens()
    assert events.events == [("closed", "source")]
    assert early.is_closed
    assert len(shared.channels) == 1  # only the other link's
    shared.open_channels()
    assert other.is_open


def test_a_link_closed_while_its_channel_opens_closes_it_once_open(pool: ConnectionPool) -> None:
    link, events = source(pool, "q0")
    shared = StandInConnection.made[0]
    shared.opens()
    link.close()
    shared.open_channels()
    assert shared.channels[0].asked == ["channel.close"]
    assert ("ready", "source") not in events.events
    shared.channels[0].closed(pika.exceptions.ChannelClosedByClient(200, "Normal shutdown"))
    assert events.events == [("closed", "source")]


def test_the_next_uri_is_tried_and_a_connection_no_uri_opens_fails_every_link(
    pool: ConnectionPool,
) -> None:
    links = [source(pool, f"q{index}", ports=(5672, 5673)) for index in range(2)]
    StandInConnection.made[0].fails(pika.exceptions.AMQPConnectionError("refused"))
    assert StandInConnection.made[1].parameters.port == 5673
    StandInConnection.made[1].fails(pika.exceptions.AMQPConnectionError("refused"))
    for link, events in links:
        assert link.is_closed
        assert events.events == [("lost", "source")]
    source(pool, "q0", ports=(5672, 5673))
    assert pool.opened == 2  # a fresh one (its first URI again)


def test_refused_access_is_final_for_every_link(pool: ConnectionPool) -> None:
    links = [source(pool, f"q{index}") for index in range(2)]
    StandInConnection.made[0].fails(pika.exceptions.ProbableAccessDeniedError("no vhost"))
    assert [events.events for _link, events in links] == [[("refused", "source")]] * 2


def test_blocked_and_unblocked_reach_every_link(
    pool: ConnectionPool, caplog: pytest.LogCaptureFixture
) -> None:
    source(pool, "q0")
    source(pool, "q1")
    shared = StandInConnection.made[0]
    shared.opens()
    with caplog.at_level(logging.INFO):
        shared.blocks(True)
        shared.blocks(False)
    blocked = [
        r.getMessage() for r in caplog.records if "blocked by a broker alarm" in r.getMessage()
    ]
    unblocked = [r.getMessage() for r in caplog.records if "connection unblocked" in r.getMessage()]
    assert sorted(blocked) == [
        f"{queue}: source connection blocked by a broker alarm" for queue in ("q0", "q1")
    ]
    assert len(unblocked) == 2


def test_close_closes_every_connection_and_calls_back_once_all_are_closed(
    pool: ConnectionPool,
) -> None:
    source(pool, "q0")
    source(pool, "q1", vhost="w")
    first, opening = StandInConnection.made
    first.opens()
    done: list[bool] = []
    pool.close(lambda: done.append(True))
    assert first.close_asked
    assert not opening.close_asked
    first.closes(pika.exceptions.ConnectionClosedByClient(200, "Normal shutdown"))
    assert done == []
    opening.opens()
    assert opening.close_asked
    opening.closes(pika.exceptions.ConnectionClosedByClient(200, "Normal shutdown"))
    assert done == [True]


def test_close_with_no_connection_calls_back_at_once(pool: ConnectionPool) -> None:
    done: list[bool] = []
    pool.close(lambda: done.append(True))
    assert done == [True]


def test_access_refused_error_is_the_one_the_link_reports() -> None:
    # The refusal a user acts on names the cluster and vhost (broker.connection.open_error).
    pool = ConnectionPool(factory=StandInConnection)
    StandInConnection.made = []
    errors: list[RmqSparkError] = []

    class Keeps(Recorder):
        def on_refused(self, side: Side, error: RmqSparkError) -> None:
            errors.append(error)

    SourceLink(endpoint("q0"), Keeps(), None, "q0", pool)  # type: ignore[arg-type]
    StandInConnection.made[0].fails(pika.exceptions.ProbableAuthenticationError("bad"))
    assert isinstance(errors[0], AccessRefusedError)
    assert "cluster dr" in str(errors[0])
    assert "'v'" in str(errors[0])
