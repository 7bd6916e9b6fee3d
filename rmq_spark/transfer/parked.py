"""A park's destination: the `parked` Delta table, behind the engine's `DestinationLink`.

`rmq-spark park` runs the movers unchanged (windows, byte window, rate brake, intents,
ledger rows, selective moves, resume); only the destination differs. `ParkedConnector`
opens the usual AMQP source link (asking it for each delivery's exchange and routing
key) and, instead of a channel to a destination queue, a `ParkedTableLink`:

    Session ──publish(batch)──► ParkedTableLink ──(its own thread)──► one Parquet data file,
        durable (fsync + rename, or one PUT) ──► on_confirm(last seq, multiple) on the loop

So the row's durability is the confirm: the window then writes the ledger row, and the
source is acked only after both are durable, exactly as for a broker's confirm. A
selective park (`routes[].select`) keeps the rest with the AMQP kept link, to the
source's tail, as a selective move does.

A write still under way when its session ends (a lost source connection) may finish
after the session marked its deliveries uncertain: the row exists and the ledger names
it uncertain; the source redelivers the message and it is parked again, a duplicate the
ledger names, as a move's unconfirmed publish would be.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from rmq_spark.errors import LedgerError, RmqSparkError
from rmq_spark.model import Delivery
from rmq_spark.transfer.amqp091.links import (
    Amqp091Connector,
    DestinationLink,
    Endpoint,
    SourceLink,
)
from rmq_spark.transfer.amqp091.pool import ConnectionPool
from rmq_spark.transfer.parked_rows import ParkedRowsWriter
from rmq_spark.transfer.ports import DESTINATION, EventLoop, SessionEvents

log = logging.getLogger(__name__)


class RouteBook:
    """The exchange and routing key of each delivery tag of one session's source link,
    from the link's `on_route` until the batch holding the tag is parked."""

    def __init__(self) -> None:
        self._routes: dict[int, tuple[str, str]] = {}

    def record(self, tag: int, exchange: str, routing_key: str) -> None:
        self._routes[tag] = (exchange, routing_key)

    def take(self, deliveries: Sequence[Delivery]) -> dict[int, tuple[str, str]]:
        """The routes of `deliveries`; forgets every tag up to the batch's last, so the
        tags of messages a selective park kept (never parked) do not pile up."""
        taken = {d.tag: route for d in deliveries if (route := self._routes.get(d.tag))}
        last = max((d.tag for d in deliveries), default=0)
        for tag in [tag for tag in self._routes if tag <= last]:
            del self._routes[tag]
        return taken

    def __len__(self) -> int:
        return len(self._routes)


class ParkedTableLink:
    """`ports.DestinationLink` over the parked table: a batch's rows are written on the
    link's own thread, then confirmed (`multiple`, up to the batch's last seq) on the loop.

    Writes run one at a time, in publish order, so a confirm covers every earlier batch.
    A failed write is fatal to the session (`SessionEvents.on_refused` with a
    LedgerError): its messages stay in the source, never acked.
    """

    def __init__(
        self,
        writer: ParkedRowsWriter,
        events: SessionEvents,
        ioloop: EventLoop,
        routes: RouteBook,
        label: str,
        *,
        lane: Executor | None = None,
    ) -> None:
        self._writer = writer
        self._events = events
        self._ioloop = ioloop
        self._routes = routes
        self._label = label
        self._open = False
        self._closed = False
        # One thread: batches become durable in publish order (a test passes its own).
        self._lane = lane or ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmq-spark-park")
        # Ready on the loop, after the session that asked for the link is built.
        ioloop.call_later(0, self._on_open)

    def _on_open(self) -> None:
        if self._closed:
            return
        self._open = True
        self._events.on_ready(DESTINATION)

    @property
    def is_open(self) -> bool:
        return self._open and not self._closed

    @property
    def is_closed(self) -> bool:
        return self._closed

    def publish(self, deliveries: Sequence[Delivery]) -> None:
        """Park the batch: its rows become one durable data file, then one confirm."""
        batch = list(deliveries)
        if not batch:
            return
        routes = self._routes.take(batch)
        last_seq = batch[-1].seq
        future = self._lane.submit(self._writer.write, batch, routes.get)
        future.add_done_callback(
            lambda done: self._ioloop.add_callback_threadsafe(
                partial(self._on_written, last_seq, done)
            )
        )

    def _on_written(self, last_seq: int, done: Future[Any]) -> None:
        """On the loop: the batch is durable (a confirm), or its write failed (fatal)."""
        if self._closed:
            return  # the session ended; its deliveries were written as uncertain
        error = done.exception()
        if error is None:
            self._events.on_confirm(last_seq, multiple=True, ack=True)
            return
        log.error("%s: parking failed: %s", self._label, error)
        refused = (
            error
            if isinstance(error, RmqSparkError)
            else LedgerError(f"{self._label}: parking failed ({error})")
        )
        self._events.on_refused(DESTINATION, refused)

    def ask_depth(self) -> None:
        """A table has no depth to bound: `rmq-spark park` refuses
        `limits.destination_max_depth`, so the session never asks."""
        raise RmqSparkError(f"{self._label}: the parked table has no depth to ask")

    def close(self) -> None:
        """No more publishes; a write under way finishes on its thread, unconfirmed."""
        if self._closed:
            return
        self._closed = True
        self._lane.shutdown(wait=False)
        self._ioloop.call_later(0, partial(self._events.on_closed, DESTINATION))


class ParkedConnector:
    """`ports.Connector` of a park: the source over AMQP (routes kept), the destination
    the parked table; a selective park's kept link is the AMQP one to the source."""

    def __init__(
        self,
        source: Endpoint,
        writer: ParkedRowsWriter,
        connections: ConnectionPool | None = None,
    ) -> None:
        # The AMQP connector of the source alone: its property readers, its pool, its
        # kept link and its loop. Its own `connect` (a destination channel) is never used.
        self._amqp = Amqp091Connector(source, source, connections)
        self._source = source
        self._writer = writer
        self.message_id_of = self._amqp.message_id_of
        self.delivery_count_of = self._amqp.delivery_count_of
        self.carries_priority = self._amqp.carries_priority
        self.digest_properties = self._amqp.digest_properties

    @property
    def connections(self) -> ConnectionPool:
        return self._amqp.connections

    def connect(
        self, events: SessionEvents, ioloop: EventLoop, label: str
    ) -> tuple[SourceLink, ParkedTableLink]:
        routes = RouteBook()
        source = SourceLink(
            self._source, events, ioloop, label, self._amqp.connections, on_route=routes.record
        )
        return source, ParkedTableLink(self._writer, events, ioloop, routes, label)

    def connect_kept(self, events: SessionEvents, ioloop: EventLoop, label: str) -> DestinationLink:
        return self._amqp.connect_kept(events, ioloop, label)

    def event_loop(self) -> EventLoop:
        return self._amqp.event_loop()
