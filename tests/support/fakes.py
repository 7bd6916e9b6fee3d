"""Fakes for the engine's ports (rmq_spark/transfer/ports.py): sessions and movers
driven by hand, in milliseconds, with no broker and no threads.

Nothing here answers on its own except a closing connection (it reports closed on the
next loop turn, as pika does): a test sends each broker reply itself, so it can
hold one back (a confirm, a durable write, a get) and check what the engine does
meanwhile.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

from rmq_spark.config import Limits, MoverConfig
from rmq_spark.model import Delivery, MoveOutcome, TransferKey
from rmq_spark.selection.fields import read_properties
from rmq_spark.transfer.decisions import BatchDecider
from rmq_spark.transfer.mover import QueueMover
from rmq_spark.transfer.ports import DESTINATION, SOURCE, SessionEvents, Side
from rmq_spark.transfer.recognition import Recognition
from rmq_spark.transfer.window import Ack

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# An empty AMQP property block: no flags set.
NO_PROPERTIES = b"\x00\x00"


class FakeClock:
    """Monotonic seconds and the matching UTC time, moved only by `ManualTimers`."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def utc(self) -> datetime:
        return EPOCH + timedelta(seconds=self.now)


class ManualTimers:
    """An event loop whose timers fire only when the test runs them (`ports.EventLoop`)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._stopped = False

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        entry = (self.clock.now + delay, next(self._order), callback)
        heapq.heappush(self._due, entry)
        return entry

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        self.call_later(0, callback)

    def start(self) -> None:
        """Run timers in time order, moving the clock, until `stop` or none is left."""
        self._stopped = False
        while self._due and not self._stopped:
            self.advance(max(0.0, self._due[0][0] - self.clock.now))

    def stop(self) -> None:
        self._stopped = True

    def close(self) -> None:
        return None

    def run_due(self) -> None:
        """Fire every timer due now, including those they set for now."""
        while self._due and self._due[0][0] <= self.clock.now:
            _due, _order, callback = heapq.heappop(self._due)
            callback()

    def advance(self, seconds: float) -> None:
        """Move the clock on, firing timers in time order as it passes them."""
        until = self.clock.now + seconds
        while self._due and self._due[0][0] <= until:
            due, _order, callback = heapq.heappop(self._due)
            self.clock.now = max(self.clock.now, due)
            callback()
        self.clock.now = until
        self.run_due()


@dataclass
class _Job:
    work: Callable[[], None]
    then: Callable[[BaseException | None], None]
    lane: ManualLanes
    name: str
    done: bool = False

    def wait(self) -> None:
        """Run this lane's jobs up to this one, as the real lane would finish them."""
        while not self.done:
            self.lane.finish(self.name, 1)


class ManualLanes:
    """Durability lanes whose jobs run only when the test finishes them (`ports.EngineLoop`)."""

    def __init__(self, ioloop: ManualTimers, overlap: int = 1) -> None:
        self._ioloop = ioloop
        self._overlap = overlap
        self.jobs: dict[str, list[_Job]] = {"intents": [], "ledger": []}
        self.fail_with: dict[str, BaseException] = {}
        self.overlapping: dict[str, int] = {"intents": 0, "ledger": 0}  # overlap=True jobs
        self.cleanup_errors: list[BaseException] = []

    @property
    def ioloop(self) -> ManualTimers:
        return self._ioloop

    @property
    def overlap(self) -> int:
        return self._overlap

    def submit(
        self,
        lane: str,
        work: Callable[[], None],
        then: Callable[[BaseException | None], None],
        *,
        overlap: bool = False,
    ) -> _Job:
        self.overlapping[lane] += overlap
        job = _Job(work, then, self, lane)
        self.jobs[lane].append(job)
        return job

    def clean_up(self, lane: str, work: Callable[[], None]) -> None:
        """A job nobody waits for; its error is kept in `cleanup_errors`."""

        def keep(error: BaseException | None) -> None:
            if error is not None:
                self.cleanup_errors.append(error)

        self.submit(lane, work, keep)

    def waiting(self, lane: str) -> int:
        return len(self.jobs[lane])

    def finish(self, lane: str, count: int | None = None) -> None:
        """Run the oldest `count` jobs of `lane` (all by default), completions included."""
        jobs = self.jobs[lane]
        for _ in range(len(jobs) if count is None else count):
            job = jobs.pop(0)
            error: BaseException | None = self.fail_with.get(lane)
            if error is None:
                try:
                    job.work()
                except Exception as exc:
                    error = exc
            job.done = True
            job.then(error)


class _FakeLink:
    side: Side

    def __init__(self, events: SessionEvents, timers: ManualTimers) -> None:
        self.events = events
        self._timers = timers
        self.channel_open = False
        self.connection_closed = False
        self.close_asked = False

    @property
    def is_open(self) -> bool:
        return self.channel_open and not self.connection_closed

    @property
    def is_closed(self) -> bool:
        return self.connection_closed

    def close(self) -> None:
        """Closes on the next loop turn, as pika reports a close-ok."""
        if self.close_asked:
            return
        self.close_asked = True
        self._timers.call_later(0, self._closed)

    def _closed(self) -> None:
        self.channel_open = False
        self.connection_closed = True
        self.events.on_closed(self.side)

    def lose(self, reason: str = "connection reset") -> None:
        """The broker side went away: the connection closes unasked."""
        self.channel_open = False
        self.connection_closed = True
        self.events.on_lost(self.side, reason)
        self.events.on_closed(self.side)


class FakeSourceLink(_FakeLink):
    """Records what the session asks of the source (`ports.SourceLink`)."""

    side = SOURCE

    def __init__(self, events: SessionEvents, timers: ManualTimers) -> None:
        super().__init__(events, timers)
        self.prefetches: list[int] = []
        self.consumes = 0
        self.cancels = 0
        self.acks: list[Ack] = []
        self.depth_asks = 0
        self.gets = 0
        self.paused = False

    def open(self) -> None:
        self.channel_open = True
        self.events.on_ready(SOURCE)

    def resume(self) -> None:
        self.paused = False

    def set_prefetch(self, prefetch: int) -> None:
        self.prefetches.append(prefetch)

    def consume(self) -> None:
        self.consumes += 1

    def cancel(self) -> None:
        self.cancels += 1

    def ack(self, acks: Sequence[Ack]) -> None:
        self.acks.extend(acks)

    def ask_depth(self) -> None:
        self.depth_asks += 1

    def get_one(self) -> None:
        self.gets += 1

    def deliver(
        self,
        tag: int,
        body: bytes,
        *,
        redelivered: bool = False,
        properties: bytes = NO_PROPERTIES,
    ) -> bool:
        go_on = self.events.on_delivery(tag, redelivered, body, properties)
        if not go_on:
            self.paused = True
        return go_on

    @property
    def acked_tags(self) -> list[int]:
        """Every tag acked so far (a multiple ack acks every tag up to its own)."""
        tags: set[int] = set()
        for ack in self.acks:
            tags.update(range(1, ack.tag + 1) if ack.multiple else (ack.tag,))
        return sorted(tags)


class FakeDestinationLink(_FakeLink):
    """Records each published batch (`ports.DestinationLink`)."""

    side = DESTINATION

    def __init__(self, events: SessionEvents, timers: ManualTimers) -> None:
        super().__init__(events, timers)
        self.batches: list[list[bytes]] = []
        self.sent: list[Delivery] = []  # every publish, in order (property bytes included)
        self.depth_asks = 0

    def open(self) -> None:
        self.channel_open = True
        self.events.on_ready(DESTINATION)

    def publish(self, deliveries: Sequence[Delivery]) -> None:
        assert self.is_open, "published on a closed channel"
        self.batches.append([d.body for d in deliveries if d.body is not None])
        self.sent.extend(deliveries)

    def ask_depth(self) -> None:
        self.depth_asks += 1

    @property
    def published(self) -> list[bytes]:
        return [body for batch in self.batches for body in batch]


class FakeConnections:
    """`ports.Connections` of fake links: nothing to close but the count."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self, done: Callable[[], None]) -> None:
        self.closed += 1
        done()


class FakeConnector:
    """Hands out a fresh pair of fake links per session (`ports.Connector`)."""

    def __init__(self, timers: ManualTimers) -> None:
        self._timers = timers
        self.connections = FakeConnections()
        self.links: list[tuple[FakeSourceLink, FakeDestinationLink]] = []
        self.kept_links: list[FakeDestinationLink] = []  # a selective move's, per session
        self.message_id_of: Callable[[bytes], str | None] = lambda _properties: None
        self.delivery_count_of: Callable[[bytes], int] = lambda _properties: 0
        # The flags word's priority bit, as amqp091/wire.py reads it.
        self.carries_priority: Callable[[bytes], bool] = lambda block: (
            len(block) >= 2 and bool(block[0] & 0x08)
        )
        self.digest_properties: Callable[[bytes], str] = lambda block: hashlib.sha256(
            block
        ).hexdigest()

    def connect(
        self, events: SessionEvents, ioloop: object, label: str
    ) -> tuple[FakeSourceLink, FakeDestinationLink]:
        pair = (FakeSourceLink(events, self._timers), FakeDestinationLink(events, self._timers))
        self.links.append(pair)
        return pair

    def connect_kept(
        self, events: SessionEvents, ioloop: object, label: str
    ) -> FakeDestinationLink:
        link = FakeDestinationLink(events, self._timers)
        self.kept_links.append(link)
        return link

    def event_loop(self) -> ManualTimers:
        return self._timers


class RecordingLedger:
    """A LedgerSink that keeps the rows it was given, in order."""

    def __init__(self) -> None:
        self.rows: list[Delivery] = []
        self.closed = False
        self.fences: list[str] = []  # selective moves' fences recorded (`mover_rig`)

    def write(self, deliveries: Sequence[Delivery]) -> None:
        self.rows.extend(deliveries)

    def close(self) -> None:
        self.closed = True


class RecordingIntents:
    """An IntentSink that keeps what it was given."""

    def __init__(self) -> None:
        self.logged: list[Delivery] = []
        self.closed: bool | None = None

    def append(self, deliveries: Sequence[Delivery]) -> None:
        self.logged.extend(deliveries)

    def append_later(self, deliveries: Sequence[Delivery]) -> Callable[[], None]:
        return partial(self.append, deliveries)

    def close(self, *, finished: bool) -> None:
        self.closed = finished


KEY = TransferKey(
    source_cluster="blue",
    source_vhost="/",
    source_queue="orders",
    destination_cluster="green",
    destination_vhost="/",
    destination_queue="orders",
)


@dataclass
class MoverRig:
    """One QueueMover wired to fakes and started; `results` gets its outcome or error."""

    clock: FakeClock
    timers: ManualTimers
    lanes: ManualLanes
    connector: FakeConnector
    ledger: RecordingLedger
    intents: RecordingIntents
    mover: QueueMover
    results: list[MoveOutcome | BaseException] = field(default_factory=list)

    @property
    def source(self) -> FakeSourceLink:
        return self.connector.links[-1][0]

    @property
    def destination(self) -> FakeDestinationLink:
        return self.connector.links[-1][1]

    def open_session(self) -> None:
        """Both links open, the prefetch is set: the session consumes."""
        self.source.open()
        self.source.events.on_prefetch_set()
        self.destination.open()
        assert self.source.consumes == 1

    def receive(
        self, *bodies: bytes, first_tag: int = 1, properties: bytes = NO_PROPERTIES
    ) -> None:
        """Deliveries arrive together and go out as one batch once their intents are durable."""
        for tag, body in enumerate(bodies, start=first_tag):
            self.source.deliver(tag, body, properties=properties)
        self.timers.run_due()  # the end of the loop iteration: the batch is taken
        self.lanes.finish("intents")

    def confirm(self, seq: int, *, multiple: bool = True, ack: bool = True) -> None:
        self.destination.events.on_confirm(seq, multiple=multiple, ack=ack)

    def drain_to_the_end(self) -> None:
        """The source is empty: the drain's depth, cancel and basic.get prove it, then
        the last rows and the spent intent log (on its lane) are written."""
        self.timers.advance(0.5)
        self.source.events.on_depth(0, 1)
        self.source.events.on_cancel_ok()
        self.source.events.on_get_empty()
        self.timers.advance(0.05)
        self.lanes.finish("ledger")
        self.lanes.finish("intents")


def mover_rig(
    *,
    window_messages: int = 8,
    window_bytes: int = 1 << 30,  # 8 messages of 128 MiB: the prefetch starts at 8
    limits: MoverConfig | None = None,
    rate_limits: Limits | None = None,
    decider: BatchDecider | None = None,
    examine_limit: int | None = None,
    fence_recorded: bool = False,
    overlap: int = 1,
    first_position: int = 0,
    recognise: Callable[[bool], Recognition | None] | None = None,
) -> MoverRig:
    clock = FakeClock()
    timers = ManualTimers(clock)
    lanes = ManualLanes(timers, overlap)
    connector = FakeConnector(timers)
    ledger, intents = RecordingLedger(), RecordingIntents()
    mover = QueueMover(
        KEY,
        connector,
        ledger,
        intents,
        window_messages=window_messages,
        window_bytes=window_bytes,
        limits=limits,
        clock=clock.utc,
        monotonic=clock.monotonic,
        rate_limits=rate_limits,
        decider=decider,
        fence_id=None if decider is None else "rmq-spark-fence:run-1:orders",
        examine_limit=examine_limit,
        fence_recorded=fence_recorded,
        record_fence=lambda: ledger.fences.append("rmq-spark-fence:run-1:orders"),
        first_position=first_position,
        recognise=recognise,
    )
    if decider is not None:  # the fence is told by its message-id
        connector.message_id_of = lambda block: read_properties(block).values.get("message_id")
    rig = MoverRig(clock, timers, lanes, connector, ledger, intents, mover)
    mover.start(lanes, rig.results.append)
    return rig
