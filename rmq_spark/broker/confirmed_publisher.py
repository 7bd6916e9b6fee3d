"""A blocking, confirmed publisher of exact property bytes (the replay's, on the driver).

`rmq-spark replay` publishes parked rows from the driver: one blocking connection per
cluster and vhost, a channel in confirm mode, each message published with `mandatory`
through the default exchange to its queue, and `basic_publish` returns only after the
broker confirmed it. A message the broker returns (no such queue any more) or nacks
(a full queue that rejects publishes), or a channel the broker closes, raises
`TransferError` naming the queue; a connection lost while a publish waits for its confirm
(a node restarted or stopped, the network gone) raises `BrokerUnreachableError`, naming it
too. Either way the message in flight may or may not be in the queue: nothing confirmed it.

The content header carries the parked property bytes unchanged (`ExactProperties`, as
`transfer/amqp091/wire.ForwardedProperties` does for a move), so header value types,
repeated names and every property survive byte for byte.
"""

from __future__ import annotations

import logging
from types import TracebackType

import pika
import pika.exceptions
from pika import spec

from rmq_spark.broker.connection import blocking_connection
from rmq_spark.config import ClusterConfig
from rmq_spark.errors import BrokerUnreachableError, DestinationIncompatibleError, TransferError

log = logging.getLogger(__name__)

_NOT_FOUND = 404


class ExactProperties(spec.BasicProperties):  # type: ignore[misc]
    """Properties that encode to exactly the bytes they are given."""

    def __init__(self, wire: bytes) -> None:
        super().__init__()
        self.wire = wire

    def encode(self) -> list[bytes]:
        return [self.wire]


class ConfirmedPublisher:
    """Publishes to queues of one cluster and vhost, each publish confirmed.

    >>> with ConfirmedPublisher("dr", cluster, "/") as publisher:  # doctest: +SKIP
    ...     publisher.require_queue("orders")
    ...     publisher.publish("orders", property_bytes, body)
    """

    def __init__(self, cluster_name: str, cluster: ClusterConfig, vhost: str) -> None:
        self.cluster_name = cluster_name
        self.vhost = vhost
        self._connection = blocking_connection(cluster_name, cluster, vhost, purpose="replay")
        try:
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
            # A node still booting (or going down) may take the connection and close it.
            self.close()
            raise BrokerUnreachableError(
                f"cluster {cluster_name} vhost {vhost!r}: the connection closed as its "
                f"channel opened ({_lost_reason(exc)})"
            ) from exc

    def __enter__(self) -> ConfirmedPublisher:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection if it is still open; one that is going already is let go."""
        if self._connection.is_open:
            try:
                self._connection.close()
            except pika.exceptions.AMQPError as exc:
                log.debug("closing the replay's connection: %s", _lost_reason(exc))

    def _where(self, queue: str) -> str:
        return f"cluster {self.cluster_name} vhost {self.vhost!r} queue {queue!r}"

    def require_queue(self, queue: str) -> int:
        """The queue's exact ready count (a passive declare); DestinationIncompatibleError
        when it does not exist."""
        try:
            declared = self._channel.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != _NOT_FOUND:
                raise DestinationIncompatibleError(
                    f"{self._where(queue)}: expected a queue this user may declare "
                    f"passively, the broker said {exc.reply_code} {exc.reply_text}"
                ) from exc
            raise DestinationIncompatibleError(
                f"{self._where(queue)}: expected an existing queue to replay into, found "
                "none (create it first; replay does not declare queues)"
            ) from exc
        finally:
            if self._channel.is_closed:
                self._channel = self._connection.channel()
                self._channel.confirm_delivery()
        return int(declared.method.message_count)

    def publish(self, queue: str, property_bytes: bytes, body: bytes) -> None:
        """Publish one message to `queue` and wait for the broker's confirm."""
        try:
            self._channel.basic_publish(
                "", queue, body, ExactProperties(property_bytes), mandatory=True
            )
        except pika.exceptions.UnroutableError as exc:
            raise TransferError(
                f"{self._where(queue)}: the broker returned a replayed message (no queue "
                "of that name any more?); nothing after it was published"
            ) from exc
        except pika.exceptions.NackError as exc:
            raise TransferError(
                f"{self._where(queue)}: the broker refused a replayed message (nack: a "
                "full queue with overflow reject-publish?); nothing after it was published"
            ) from exc
        except pika.exceptions.ChannelClosedByBroker as exc:
            raise TransferError(
                f"{self._where(queue)}: the broker closed the channel while a replayed message "
                f"awaited its confirm ({exc.reply_code} {exc.reply_text}); nothing after it "
                "was published"
            ) from exc
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
            raise BrokerUnreachableError(
                f"{self._where(queue)}: the connection was lost while a replayed message "
                f"awaited its confirm ({_lost_reason(exc)}); nothing after it was published"
            ) from exc


def _lost_reason(exc: BaseException) -> str:
    """Why pika says the connection went: its class, and the broker's words if any
    (e.g. 'ConnectionClosedByBroker: 320 CONNECTION_FORCED - broker forced connection
    closure with reason 'shutdown'')."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
