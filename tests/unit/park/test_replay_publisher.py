"""broker/confirmed_publisher: what the replay's publisher raises when the broker or the
connection fails a publish. pika's blocking connection is a fake that raises pika's own
exceptions, as a restarted node, a dropped socket or a full queue make it raise."""

from __future__ import annotations

from typing import Any

import pika.exceptions
import pytest

from rmq_spark.broker import confirmed_publisher
from rmq_spark.broker.confirmed_publisher import ConfirmedPublisher
from rmq_spark.config import ClusterConfig
from rmq_spark.errors import BrokerUnreachableError, RmqSparkError, TransferError

BODY = b"order 4711 for alice"


class FailingChannel:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def confirm_delivery(self) -> None:
        pass

    def basic_publish(self, *_args: Any, **_kwargs: Any) -> None:
        raise self.error


class FakeConnection:
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.is_open = False

    def channel(self) -> FailingChannel:
        return FailingChannel(self.error)


def publisher(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> ConfirmedPublisher:
    monkeypatch.setattr(
        confirmed_publisher, "blocking_connection", lambda *_a, **_k: FakeConnection(error)
    )
    cluster = ClusterConfig(amqp=["amqp://127.0.0.1:5672"], management="http://127.0.0.1:1")
    return ConfirmedPublisher("dr", cluster, "shop")


@pytest.mark.parametrize(
    ("error", "kind", "said"),
    [
        (
            pika.exceptions.ConnectionClosedByBroker(
                320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
            ),
            BrokerUnreachableError,
            "the connection was lost while a replayed message awaited its confirm "
            '(ConnectionClosedByBroker: (320, "CONNECTION_FORCED - broker forced connection '
            "closure with reason 'shutdown'\")); nothing after it was published",
        ),
        (
            pika.exceptions.StreamLostError("Transport indicated EOF"),
            BrokerUnreachableError,
            "the connection was lost while a replayed message awaited its confirm "
            "(StreamLostError: Transport indicated EOF)",
        ),
        (
            pika.exceptions.ChannelWrongStateError("Channel is closed."),
            BrokerUnreachableError,
            "(ChannelWrongStateError: Channel is closed.)",
        ),
        (
            pika.exceptions.ChannelClosedByBroker(406, "PRECONDITION_FAILED - message too large"),
            TransferError,
            "the broker closed the channel while a replayed message awaited its confirm "
            "(406 PRECONDITION_FAILED - message too large)",
        ),
        (pika.exceptions.NackError([]), TransferError, "the broker refused a replayed message"),
        (pika.exceptions.UnroutableError([]), TransferError, "the broker returned a replayed"),
    ],
    ids=["connection-closed", "stream-lost", "channel-gone", "channel-closed", "nack", "return"],
)
def test_a_failed_publish_is_one_error_naming_the_cluster_vhost_and_queue(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, kind: type[RmqSparkError], said: str
) -> None:
    with pytest.raises(kind) as raised:
        publisher(monkeypatch, error).publish("orders", b"\x00\x00", BODY)
    message = str(raised.value)
    assert message.startswith("cluster dr vhost 'shop' queue 'orders': ")
    assert said in message
    assert raised.value.__cause__ is error
    assert BODY.decode() not in message


class ClosingConnection:
    """A node that takes the connection and closes it as the channel opens (booting or
    stopping); closing it again fails too."""

    def __init__(self) -> None:
        self.is_open = True
        self.close_calls = 0

    def channel(self) -> FailingChannel:
        raise pika.exceptions.ConnectionClosedByBroker(320, "CONNECTION_FORCED - shutdown")

    def close(self) -> None:
        self.close_calls += 1
        raise pika.exceptions.ConnectionWrongStateError("already closing")


def test_a_connection_closed_as_its_channel_opens_is_a_lost_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """BrokerUnreachableError, which the replay reconnects on, not pika's own error."""
    connection = ClosingConnection()
    monkeypatch.setattr(confirmed_publisher, "blocking_connection", lambda *_a, **_k: connection)
    cluster = ClusterConfig(amqp=["amqp://127.0.0.1:5672"], management="http://127.0.0.1:1")

    with pytest.raises(BrokerUnreachableError) as raised:
        ConfirmedPublisher("dr", cluster, "shop")

    assert str(raised.value) == (
        "cluster dr vhost 'shop': the connection closed as its channel opened "
        "(ConnectionClosedByBroker: (320, 'CONNECTION_FORCED - shutdown'))"
    )
    assert connection.close_calls == 1
