"""The engine's seams: what a session asks of the protocol and of the loop it runs on.

Pure declarations, no pika: `session.Session` and `mover.QueueMover` are written
against these, `amqp091/links.py` implements the links over pika's SelectConnection,
and the unit tests drive sessions with fakes (tests/support/fakes.py).

Every call across the seam is per batch or per broker frame, never an object per
message: `DestinationLink.publish` takes a whole batch and writes it at once, and
the source link calls the session's bound `on_delivery` for each delivery, as
`inbound.DeliveryReader` always has.

    Session ──consume/cancel/ack/ask_depth/get_one──► SourceLink ──► source broker
    Session ──publish(batch)──► DestinationLink ──► destination broker
    links ──on_ready/on_delivery/on_confirm/...──► SessionEvents (the Session)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from rmq_spark.errors import RmqSparkError
from rmq_spark.model import Delivery
from rmq_spark.transfer.window import Ack

Side = Literal["source", "destination"]
SOURCE: Side = "source"
DESTINATION: Side = "destination"


class LedgerSink(Protocol):
    """Where the mover makes rows durable; `write` must be durable when it returns."""

    def write(self, deliveries: Sequence[Delivery]) -> None: ...

    def close(self) -> None:
        """The transfer returned an outcome: no more rows (tidy up, rows stay durable)."""


class IntentSink(Protocol):
    """Where the mover logs deliveries before publishing them; durable on return."""

    def append(self, deliveries: Sequence[Delivery]) -> None: ...

    def append_later(self, deliveries: Sequence[Delivery]) -> Callable[[], None]:
        """`append(deliveries)` as a job for a lane, its place in the log taken now:
        batches keep the order they were handed out in, whichever thread writes first."""

    def close(self, *, finished: bool) -> None:
        """The transfer ended: `finished` when it returned an outcome, not when it died."""


class Timers(Protocol):
    """Callbacks after a delay, on the loop's thread (pika's IOLoop; ManualTimers)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> object: ...


class EventLoop(Timers, Protocol):
    """The I/O loop movers share (`amqp091.links.event_loop()`)."""

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


class DurableJob(Protocol):
    """A write handed to a durability lane (`lanes.MoverLoop.submit`)."""

    def wait(self) -> None:
        """Block until it (and every job its transfer submitted before it in its lane)
        is done and their completions have run."""


class EngineLoop(Protocol):
    """What a mover runs on: an event loop and two durability lanes
    (`lanes.TransferLanes`, the transfer's view of `lanes.MoverLoop`)."""

    @property
    def ioloop(self) -> EventLoop: ...

    @property
    def overlap(self) -> int:
        """How many `overlap=True` jobs of the transfer may be under way at once."""

    def submit(
        self,
        lane: str,
        work: Callable[[], None],
        then: Callable[[BaseException | None], None],
        *,
        overlap: bool = False,
    ) -> DurableJob:
        """Run `work` on the lane, then `then(error)` on the loop, after the completions
        of the transfer's earlier jobs of that lane; `overlap=True` lets `work` run
        alongside them."""

    def clean_up(self, lane: str, work: Callable[[], None]) -> None:
        """Run `work` on the lane after the transfer's earlier jobs there, with nobody
        waiting for it: the transfer is over, and the task's next one may start. An
        error in it fails the task once every transfer is done (`lanes.run_movers`)."""


class SourceLink(Protocol):
    """One session's consumer on the source queue."""

    @property
    def is_open(self) -> bool:
        """The channel is open (acks, cancels and gets can be sent)."""

    @property
    def is_closed(self) -> bool:
        """The channel is closed (with its connection, or alone), or never opened."""

    @property
    def paused(self) -> bool:
        """Reading stopped because `on_delivery` answered False (the byte window)."""

    def resume(self) -> None:
        """Read again after a pause (no-op when not paused)."""

    def set_prefetch(self, prefetch: int) -> None:
        """basic.qos; answered by `SessionEvents.on_prefetch_set`."""

    def consume(self) -> None:
        """basic.consume; deliveries arrive at `SessionEvents.on_delivery`."""

    def cancel(self) -> None:
        """basic.cancel; what was sent before it is still delivered, then
        `SessionEvents.on_cancel_ok`."""

    def ack(self, acks: Sequence[Ack]) -> None:
        """basic.ack each, in order."""

    def ask_depth(self) -> None:
        """Passive declare; answered by `SessionEvents.on_depth`."""

    def get_one(self) -> None:
        """basic.get; answered by `SessionEvents.on_got` or `on_get_empty`."""

    def close(self) -> None:
        """Close the channel (one still opening closes once it opens); the connection
        stays for the task's other transfers."""


class DestinationLink(Protocol):
    """One session's publisher to the destination queue (confirms on)."""

    @property
    def is_open(self) -> bool:
        """The channel is open and publishes can be sent."""

    @property
    def is_closed(self) -> bool:
        """The channel is closed (with its connection, or alone), or never opened."""

    def publish(self, deliveries: Sequence[Delivery]) -> None:
        """basic.publish each (mandatory, the exact bytes received), in order, in one write."""

    def ask_depth(self) -> None:
        """Passive declare of the destination queue, on the publishing channel (so the
        count includes every publish sent before it); answered by
        `SessionEvents.on_destination_depth`."""

    def close(self) -> None:
        """Close the channel (one still opening closes once it opens); the connection
        stays for the task's other transfers."""


class SessionEvents(Protocol):
    """What the links report, on the loop's thread (implemented by `session.Session`)."""

    def on_ready(self, side: Side) -> None:
        """The source channel is open, or the destination has confirms on."""

    def on_prefetch_set(self) -> None: ...

    def on_delivery(self, tag: int, redelivered: bool, body: bytes, properties: bytes) -> bool:
        """A source delivery; False asks the link to stop reading until `resume`."""

    def on_confirm(self, seq: int, *, multiple: bool, ack: bool) -> None: ...

    def on_return(self, body: bytes, properties: bytes, reason: str) -> None: ...

    def on_depth(self, ready: int, consumers: int) -> None: ...

    def on_destination_depth(self, ready: int) -> None:
        """The destination queue's ready count (`DestinationLink.ask_depth`)."""

    def on_cancel_ok(self) -> None: ...

    def on_got(
        self, tag: int, redelivered: bool, body: bytes, properties: bytes, remaining: int
    ) -> None: ...

    def on_get_empty(self) -> None: ...

    def on_consumer_cancelled(self) -> None:
        """The broker cancelled the consumer."""

    def on_channel_closed(self, side: Side, code: int, text: str) -> None:
        """The broker closed a channel (a missing queue, no access, a 406)."""

    def on_lost(self, side: Side, reason: str) -> None:
        """A connection could not open or closed unasked."""

    def on_refused(self, side: Side, error: RmqSparkError) -> None:
        """A connection was refused for good (access refused)."""

    def on_closed(self, side: Side) -> None:
        """A link is closed (after `on_lost` or `on_channel_closed` when unasked), or
        gave up opening after `close`: the session ends once both links are closed."""


class Connections(Protocol):
    """The connections a task's links share (`amqp091.pool.ConnectionPool`)."""

    def close(self, done: Callable[[], None]) -> None:
        """Close every connection (the task's movers are done); `done()` once all are
        closed, on the loop."""


class Connector(Protocol):
    """Opens each session's links, and reads the protocol's property bytes.

    The readers are attributes (plain functions), called once per delivery in the
    publish batch, so they cost what a module function did.
    """

    message_id_of: Callable[[bytes], str | None]
    delivery_count_of: Callable[[bytes], int]
    carries_priority: Callable[[bytes], bool]
    digest_properties: Callable[[bytes], str]

    @property
    def connections(self) -> Connections:
        """Where the links' connections live: shared by the transfers of a task."""

    def connect(
        self, events: SessionEvents, ioloop: EventLoop, label: str
    ) -> tuple[SourceLink, DestinationLink]: ...

    def connect_kept(self, events: SessionEvents, ioloop: EventLoop, label: str) -> DestinationLink:
        """A selective move's kept link (selective.py): publishes, with confirms, to the
        SOURCE queue through the default exchange, on the source cluster."""

    def event_loop(self) -> EventLoop:
        """A new I/O loop the links can run on (`QueueMover.run`)."""
