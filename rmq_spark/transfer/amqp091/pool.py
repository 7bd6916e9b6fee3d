"""Connections shared by the transfers of one executor task: a channel per queue.

A task moves many queues, often many small ones of few vhosts (a DR fail-back).
Opening two connections per queue cost more than moving its messages, so the
links of every transfer that reads (or writes) one vhost of one cluster through
the same URIs share one connection per side, each link on a channel of its own
(`links.py`). What each guarantee needs of that:

- A channel the broker closes (a missing queue, refused access, a message too
  large) is that link's alone: the others on the connection carry on.
- A connection that closes unasked (the network, an operator, a broker restart)
  ends every session on it as lost; each mover's reconnect joins a fresh
  connection, since a connection leaves the pool the moment it is gone.
- connection.blocked/unblocked reach every link on the connection.
- A link closing closes its channel: the source returns what it had not acked.

The pool keeps a connection open while no link uses it, until the task's movers
are done (`close`): the next queue of the vhost (a task moves its queues a few at
a time) starts on it at once instead of opening a new one. A task holds at most
one connection per (side, cluster, vhost, URIs) in use or idle, and its movers
end together, so idle connections cost nothing worth a timer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import pika
import pika.connection
from pika.adapters.select_connection import SelectConnection

from rmq_spark.broker.connection import open_error

log = logging.getLogger(__name__)

# (side, cluster, vhost, (host, port, user, TLS) of each URI in the order tried)
ConnectionKey = tuple[str, str, str, tuple[tuple[Any, ...], ...]]


class ChannelUser(Protocol):
    """What a link is to its shared connection (`links._Link`)."""

    def connection_open(self, connection: pika.connection.Connection) -> None:
        """The connection is open (or was, when the link joined): open a channel."""

    def connection_failed(self, error: Exception) -> None:
        """No URI opened the connection (`error` names the last one and why)."""

    def connection_lost(self, reason: str) -> None:
        """The connection closed: every channel on it is gone."""

    def connection_blocked(self, blocked: bool) -> None:
        """connection.blocked (a broker alarm), or unblocked."""


def connection_key(
    side: str, cluster: str, vhost: str, parameters: tuple[Any, ...]
) -> ConnectionKey:
    """Which transfers may share a connection: the same side, cluster, vhost and URIs.

    Not the parameters themselves: their connection name differs per queue, and the
    URIs' order (the queue's hosting node first, `broker.colocation`) must match.
    """
    uris = tuple(
        (p.host, p.port, getattr(p.credentials, "username", None), p.ssl_options is not None)
        for p in parameters
    )
    return (side, cluster, vhost, uris)


class SharedConnection:
    """One pika connection and the links that have a channel on it."""

    def __init__(
        self,
        cluster: str,
        vhost: str,
        parameters: tuple[pika.ConnectionParameters, ...],
        ioloop: Any,
        on_gone: Callable[[SharedConnection], None],
        *,
        factory: Callable[..., Any] = SelectConnection,
    ) -> None:
        self._factory = factory
        self._cluster = cluster
        self._vhost = vhost
        self._parameters = parameters
        self._ioloop = ioloop
        self._on_gone = on_gone
        self.users: list[ChannelUser] = []
        self.connection: Any = None  # a SelectConnection
        self.opened = False
        self.gone = False
        self._closing = False
        self._connect(0)

    def join(self, user: ChannelUser) -> None:
        self.users.append(user)
        # A connection the broker is closing is not gone yet: the link hears of it then.
        if self.opened and self.connection is not None and self.connection.is_open:
            user.connection_open(self.connection)

    def leave(self, user: ChannelUser) -> None:
        if user in self.users:
            self.users.remove(user)

    def close(self) -> None:
        """Close once no link needs it; one still opening closes once it opens."""
        self._closing = True
        if self.connection is not None and self.connection.is_open:
            self.connection.close()

    def _connect(self, index: int) -> None:
        connection = self._factory(
            self._parameters[index],
            on_open_callback=self._on_open,
            on_open_error_callback=lambda _c, exc: self._on_open_error(index, exc),
            on_close_callback=self._on_closed,
            custom_ioloop=self._ioloop,
        )
        connection.add_on_connection_blocked_callback(lambda _c, _f: self._blocked(True))
        connection.add_on_connection_unblocked_callback(lambda _c, _f: self._blocked(False))
        self.connection = connection

    def _on_open(self, connection: pika.connection.Connection) -> None:
        """pika: open. Every link waiting for it opens its channel."""
        if self._closing:
            connection.close()
            return
        self.opened = True
        for user in list(self.users):
            user.connection_open(connection)

    def _on_open_error(self, index: int, exc: BaseException) -> None:
        """pika: could not open. Try the next URI; after the last, every link is told."""
        if not self._closing and index + 1 < len(self._parameters):
            self._connect(index + 1)
            return
        error = open_error(self._cluster, self._vhost, self._parameters[index], exc)
        self._gone()
        for user in list(self.users):
            user.connection_failed(error)

    def _on_closed(self, _connection: pika.connection.Connection, reason: Any) -> None:
        """pika: closed, asked (`close`) or not. Every link on it is gone."""
        self._gone()
        lost = f"connection to cluster {self._cluster} vhost {self._vhost!r} was lost ({reason})"
        for user in list(self.users):
            user.connection_lost(lost)

    def _blocked(self, blocked: bool) -> None:
        for user in list(self.users):
            user.connection_blocked(blocked)

    def _gone(self) -> None:
        if not self.gone:
            self.gone = True
            self._on_gone(self)


class ConnectionPool:
    """The shared connections of one task's links (`ports.Connections`).

    Usage (by `executor.move_queues`; a connector makes its own when given none)::

        pool = ConnectionPool()
        connector = Amqp091Connector(source, destination, pool)  # one per transfer
        run_movers(..., connections=pool)  # closes the pool when the movers are done
    """

    def __init__(self, factory: Callable[..., Any] = SelectConnection) -> None:
        self._factory = factory  # pika's SelectConnection; a stand-in in unit tests
        self._connections: dict[ConnectionKey, SharedConnection] = {}
        self._closing: list[SharedConnection] = []
        self._done: Callable[[], None] | None = None
        self.opened = 0  # connections opened, for tests and benchmarks

    def join(
        self,
        side: str,
        cluster: str,
        vhost: str,
        parameters: tuple[pika.ConnectionParameters, ...],
        *,
        ioloop: Any,
        user: ChannelUser,
    ) -> SharedConnection:
        """The connection `user` opens its channel on: an open or opening one of the
        same key, else a new one."""
        key = connection_key(side, cluster, vhost, parameters)
        shared = self._connections.get(key)
        if shared is None or shared.gone:
            shared = SharedConnection(
                cluster,
                vhost,
                parameters,
                ioloop,
                lambda gone: self._forget(key, gone),
                factory=self._factory,
            )
            self.opened += 1
            self._connections[key] = shared
        shared.join(user)
        return shared

    def close(self, done: Callable[[], None]) -> None:
        """Close every connection; `done()` once all are closed (on the loop)."""
        self._done = done
        self._closing = list(self._connections.values())
        for shared in self._closing:
            shared.close()
        self._done_if_closed()

    def _forget(self, key: ConnectionKey, shared: SharedConnection) -> None:
        if self._connections.get(key) is shared:
            del self._connections[key]
        self._done_if_closed()

    def _done_if_closed(self) -> None:
        done = self._done
        if done is not None and all(shared.gone for shared in self._closing):
            self._done = None
            done()
