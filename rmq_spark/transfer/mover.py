"""The transfer engine: drain one source queue into one destination queue.

One pika I/O loop drives two asynchronous connections (source and destination), so
publishes pipeline under publisher confirms instead of waiting for each one. The
consumer prefetch is the window. Every decision about what may be acked lives in
`window.TransferWindow`; this module turns broker events into calls on it:

    source delivery ──► publish (mandatory, exact property bytes) ──► window.on_publish
    destination ack/nack/return ──► window ──► ledger write (durable) ──► source ack

A source message is acked only after the destination confirmed it AND its ledger
row is durable. A nacked publish is sent again after a backoff, a few times; then,
like a returned one, it is refused: never acked, back to the source when the
channel closes, and the transfer fails with an error naming the queue.

Several movers can share one I/O loop (`run_movers`): an executor task moves several
queues at once on one thread. Intent-log appends and ledger-row appends are written by two
durability threads per loop (`MoverLoop`), so an fsync never stalls the loop; acks
still wait for the ledger row and publishes for the intent.

A run is a series of sessions, one pair of connections each. A lost connection ends
the session: confirmed deliveries are written (and acked if the source is still
there), unconfirmed ones are written as "uncertain" rows (no confirm time) because
they may have arrived, then both connections close, the source requeues what was
not acked, and a new session starts after a backoff. Redeliveries of messages whose
first copy has a row become named duplicates; duplicates per lost session are
bounded by the window.

Drain ends exactly when the source queue reports zero ready messages while nothing
is in flight.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from hashlib import sha256
from typing import Any, Protocol

import pika
import pika.channel
import pika.connection
import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.select_connection import IOLoop, SelectConnection

from rmq_spark.broker.connection import open_error
from rmq_spark.broker.delivery_limit import ReturnGuard
from rmq_spark.config import MoverConfig
from rmq_spark.errors import AccessRefusedError, TransferError
from rmq_spark.model import Delivery, MoveOutcome, TransferKey
from rmq_spark.transfer import refusals
from rmq_spark.transfer.amqp091 import inbound, wire
from rmq_spark.transfer.byte_window import ByteWindow
from rmq_spark.transfer.window import TransferWindow

log = logging.getLogger(__name__)

# How often the loop flushes a slow trickle of confirms and re-checks an idle queue.
TICK_SECONDS = 0.05
# An idle consumer re-asks the queue depth this often (other consumers may hold messages).
IDLE_DEPTH_CHECK_SECONDS = 0.5
# How long to wait for outstanding confirms once the transfer is stopping.
STOP_CONFIRM_TIMEOUT_SECONDS = 60.0
# A batch of deliveries is handed to the intents lane once this many are waiting, or
# at the end of the I/O loop iteration that received them. While a batch is being
# logged, what arrives waits for the next one, which may then be larger (group commit).
INTENT_BATCH = 256


class LedgerSink(Protocol):
    """Where the mover makes rows durable; `write` must be durable when it returns."""

    def write(self, deliveries: Sequence[Delivery]) -> None: ...

    def close(self) -> None:
        """The transfer returned an outcome: no more rows (tidy up, rows stay durable)."""


class IntentSink(Protocol):
    """Where the mover logs deliveries before publishing them; durable on return."""

    def append(self, deliveries: Sequence[Delivery]) -> None: ...

    def close(self, *, finished: bool) -> None:
        """The transfer ended: `finished` when it returned an outcome, not when it died."""


class _NoIntents:
    """For callers that accept silent duplicates after a hard crash (benchmarks)."""

    def append(self, deliveries: Sequence[Delivery]) -> None:
        return None

    def close(self, *, finished: bool) -> None:
        return None


class _Outgoing:
    """Deliveries to publish once their intents are durable."""

    def __init__(self, deliveries: list[Delivery], *, logs_intents: bool) -> None:
        self.deliveries = deliveries
        self.logs_intents = logs_intents  # a new batch (False: a republish)
        self.withdrawn = False


def _nothing_to_log() -> None:
    return None


class _DurabilityJob:
    """One durable write handed to a durability lane, and what to do when it is done."""

    def __init__(self, work: Callable[[], None], then: Callable[[BaseException | None], None]):
        self.work = work
        self.then = then
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.applied = False


# The durability lanes: intent-log appends (which publishes wait for) and ledger rows
# (which acks wait for). Each lane is one thread, so its jobs finish in order; the two
# lanes' fsyncs overlap.
INTENTS, LEDGER = "intents", "ledger"


class MoverLoop:
    """One pika I/O loop and two durability threads, shared by the movers of a task.

    Intent appends and ledger writes (an Arrow append + fsync each) run on their
    lane's thread in the order they were submitted; completions run back on the loop,
    in the same order per lane. A mover that must be sure its rows are durable (a
    session ending) waits for its last jobs with `wait_for`, which blocks the loop
    only for those writes.
    """

    def __init__(self) -> None:
        self.ioloop = IOLoop()
        self._completed: deque[_DurabilityJob] = deque()
        self._jobs: dict[str, queue.SimpleQueue[_DurabilityJob | None]] = {}
        self._threads: list[threading.Thread] = []
        for lane in (INTENTS, LEDGER):
            jobs: queue.SimpleQueue[_DurabilityJob | None] = queue.SimpleQueue()
            thread = threading.Thread(
                target=self._work, args=(jobs,), name=f"rmq-spark-{lane}", daemon=True
            )
            thread.start()
            self._jobs[lane] = jobs
            self._threads.append(thread)

    def submit(
        self, lane: str, work: Callable[[], None], then: Callable[[BaseException | None], None]
    ) -> _DurabilityJob:
        """Run `work` on the lane's thread, then `then(error)` on the loop."""
        job = _DurabilityJob(work, then)
        self._jobs[lane].put(job)
        return job

    def wait_for(self, job: _DurabilityJob) -> None:
        """Block until `job` (and every job before it in its lane) is done, and apply
        completions."""
        job.done.wait()
        self.run_completions()

    def run_completions(self) -> None:
        """Apply finished jobs' completions, in submission order per lane (loop thread)."""
        while self._completed:
            job = self._completed.popleft()
            if not job.applied:
                job.applied = True
                job.then(job.error)

    def close(self) -> None:
        """Finish queued jobs, stop the threads, close the I/O loop."""
        for jobs in self._jobs.values():
            jobs.put(None)
        for thread in self._threads:
            thread.join()
        self.ioloop.close()

    def _work(self, jobs: queue.SimpleQueue[_DurabilityJob | None]) -> None:
        while (job := jobs.get()) is not None:
            try:
                job.work()
            except BaseException as exc:
                job.error = exc
            self._completed.append(job)
            job.done.set()
            self.ioloop.add_callback_threadsafe(self.run_completions)


def run_movers(
    movers: Sequence[Callable[[], QueueMover]], *, concurrent: int = 1
) -> list[MoveOutcome]:
    """Run transfers on one I/O loop, at most `concurrent` at a time, in the given order.

    Each item makes its mover when its turn comes (so files open only then). Returns
    the outcomes in the same order. After an error (refused access, connections lost
    through every reconnect attempt) no further transfer starts; those running finish,
    then the first error is raised (Spark retries the task; drained queues are quick).
    """
    if concurrent < 1:
        raise ValueError(f"concurrent must be >= 1, got {concurrent}")
    loop = MoverLoop()
    waiting = deque(enumerate(movers))
    outcomes: dict[int, MoveOutcome] = {}
    errors: list[BaseException] = []
    active = 0

    def start_next() -> None:
        nonlocal active
        while waiting and active < concurrent and not errors:
            index, make = waiting.popleft()
            active += 1
            try:
                make().start(loop, partial(finished, index))

            except Exception as exc:
                finished(index, exc)
        if active == 0:
            loop.ioloop.stop()

    def finished(index: int, result: MoveOutcome | BaseException) -> None:
        nonlocal active
        active -= 1
        if isinstance(result, BaseException):
            errors.append(result)
        else:
            outcomes[index] = result
        start_next()

    loop.ioloop.add_callback_threadsafe(start_next)
    try:
        loop.ioloop.start()
    finally:
        loop.close()
    if errors:
        raise errors[0]
    return [outcomes[index] for index in sorted(outcomes)]


@dataclass(frozen=True)
class Endpoint:
    """One side of the transfer: where to connect and which queue."""

    cluster: str
    vhost: str
    queue: str
    parameters: tuple[pika.ConnectionParameters, ...]


@dataclass(frozen=True)
class WindowStages:
    """Where a mover's deliveries are at one moment (`QueueMover.window_stages`).

    The prefetch window minus these three is what the source holds for the mover:
    acked but not yet redelivered into the window, or on its way.
    """

    logging: int  # received; waiting for, or in, their intent-log append
    destination: int  # published; waiting for the destination's confirm
    ledger: int  # confirmed; their rows being written (or waiting for the ack)
    moved: int  # rows durable and acked, since the transfer started


def utc_now() -> datetime:
    return datetime.now(UTC)


def backoff_seconds(attempt: int, limits: MoverConfig) -> float:
    """Exponential backoff: first, double, double... capped."""
    return float(min(limits.backoff_seconds * 2 ** (attempt - 1), limits.max_backoff_seconds))


class QueueMover:
    """Moves every message of one source queue to one destination queue.

    Usage::

        outcome = QueueMover(
            key, source, destination, ledger, window_messages=1000, window_bytes=64 << 20
        ).run()
    """

    def __init__(
        self,
        key: TransferKey,
        source: Endpoint,
        destination: Endpoint,
        ledger: LedgerSink,
        *,
        window_messages: int,
        window_bytes: int,
        first_position: int = 0,
        limits: MoverConfig | None = None,
        intents: IntentSink | None = None,
        clock: Callable[[], datetime] = utc_now,
        delivery_guard: ReturnGuard | None = None,
    ) -> None:
        wire.install()
        self._key = key
        self._source = source
        self._destination = destination
        self._ledger = ledger
        self._intents = intents or _NoIntents()
        # Learned sizes outlive a session: a reconnect starts at the learned prefetch.
        self._flow = ByteWindow(window_messages, window_bytes)
        self._window_bytes = window_bytes
        self._peak_held_bytes = 0
        self._first_position = first_position
        self._limits = limits or MoverConfig()
        self._clock = clock
        self._properties_digests = wire.DigestCache()
        # A quorum source's delivery limit (delivery_limit.py); inactive when unlimited.
        self._guard = delivery_guard or ReturnGuard(None)
        self._next_position = first_position
        self._session = -1
        self._error: str | None = None
        self._moved_messages = 0
        self._moved_bytes = 0

    @property
    def prefetch(self) -> int:
        """The consumer prefetch now: how many deliveries may be unacked at once."""
        return self._flow.granted

    # -- running --------------------------------------------------------------------

    def run(self) -> MoveOutcome:
        """Run sessions until the queue is drained or the transfer stops.

        Returns a "failed" outcome for refusals a user must act on (the source keeps
        the messages). Raises AccessRefusedError at once, and TransferError when
        connections stay lost through every reconnect attempt (Spark then retries).
        """
        return run_movers([lambda: self])[0]

    def start(
        self, loop: MoverLoop, on_finished: Callable[[MoveOutcome | BaseException], None]
    ) -> None:
        """Begin on `loop`; `on_finished` gets the outcome or the error, on the loop."""
        self._loop = loop
        self._ioloop = loop.ioloop
        self._on_finished = on_finished
        self._started = time.monotonic()
        self._failures = 0
        log.info(
            "moving %s (window %d messages, %d bytes)",
            self._key.describe(),
            self._flow.window_messages,
            self._window_bytes,
        )
        self._start_session()

    def _after_session(self) -> None:
        """Both connections of a session are closed: finish, or reconnect after a backoff."""
        self._next_position = self._window.next_position
        if self._fatal is not None:
            self._finish(self._fatal)
        elif self._lost is None or self._guard.tripped:
            # A tripped delivery-limit guard never consumes again in this attempt: the
            # held messages had their one return, the rest stay in the source.
            self._finish(self._outcome())
        else:
            self._failures += 1
            if self._failures > self._limits.reconnect_attempts:
                self._finish(
                    TransferError(
                        f"{self._key.describe()}: gave up after {self._failures} lost "
                        f"session(s): {self._lost}; unacked messages stay in the source"
                    )
                )
                return
            delay = backoff_seconds(self._failures, self._limits)
            log.warning("%s: %s; reconnecting in %.1fs", self._key.describe(), self._lost, delay)
            self._ioloop.call_later(delay, self._start_session)

    def _outcome(self) -> MoveOutcome:
        seconds = time.monotonic() - self._started
        status = "failed" if self._error else "moved"
        log.info(
            "%s: %s, %d messages, %d bytes in %.2fs (%d session(s))",
            self._key.describe(),
            status,
            self._moved_messages,
            self._moved_bytes,
            seconds,
            self._session + 1,
        )
        return MoveOutcome(
            key=self._key,
            status=status,
            error=self._error,
            messages=self._moved_messages,
            bytes=self._moved_bytes,
            first_position=self._first_position,
            next_position=self._next_position,
            seconds=seconds,
            sessions=self._session + 1,
            peak_held_bytes=self._peak_held_bytes,
        )

    def _finish(self, result: MoveOutcome | BaseException) -> None:
        """Close the ledger (on its lane: it may write a data file), then report.

        A mover that returns an outcome has a row for every publish that may have
        arrived, so its intents are spent; one that dies keeps them for the retry.
        """
        if isinstance(result, BaseException):
            self._intents.close(finished=False)
            self._on_finished(result)
            return

        def closed(error: BaseException | None) -> None:
            self._intents.close(finished=error is None)
            self._on_finished(result if error is None else error)

        self._loop.submit(LEDGER, self._ledger.close, closed)

    def _start_session(self) -> None:
        """Fresh per-session state; positions continue where the last session stopped."""
        self._session += 1
        self._window = TransferWindow(
            self._flow.granted,
            first_position=self._next_position,
            session=self._session,
            clock=self._clock,
        )
        self._source_connection: SelectConnection | None = None
        self._destination_connection: SelectConnection | None = None
        self._source_channel: pika.channel.Channel | None = None
        self._destination_channel: pika.channel.Channel | None = None
        self._publish_frames: wire.PublishFrames | None = None
        # Deliveries received but not yet logged and published (one loop iteration's worth).
        self._pending: list[tuple[int, bool, bytes, bytes]] = []
        self._pending_bytes = 0
        self._pending_largest = 0
        self._reader: inbound.DeliveryReader | None = None
        self._flush_scheduled = False
        # This session's newest job per durability lane (a lane's jobs finish in order).
        self._last_jobs: dict[str, _DurabilityJob] = {}
        # Batches whose intents are being logged; published in this order when durable.
        self._outgoing: list[_Outgoing] = []
        self._logging_intents = False
        self._writing_rows = False  # a ledger write of this session is under way
        self._qos_ok = False
        self._confirms_on = False
        self._consumer_tag: str | None = None
        self._consuming = False
        self._changing_prefetch = False  # consumer cancelled, to consume again (_follow_sizes)
        self._new_prefetch_set = False  # ...and the new prefetch is set
        self._cancel_ok = False
        self._drain_get_pending = False  # the get that proves a drain (_on_cancel_ok)
        self._depth_check_pending = False
        self._last_depth_check = 0.0
        self._published_since_depth_check = True
        self._stopping_since: float | None = None
        self._closing = False
        self._session_ended = False
        self._lost: str | None = None
        self._fatal: BaseException | None = None
        self._connect(self._source, 0)
        self._connect(self._destination, 0)
        self._call_later(TICK_SECONDS, self._on_tick)

    def _call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """A timer that fires only if this session is still the current one.

        Sessions share the loop, so a timer set in a session that has since ended
        must not act on the next one (publish on its channel, tick twice).
        """
        session = self._session

        def fire() -> None:
            if session == self._session and not self._session_ended:
                callback()

        self._ioloop.call_later(delay, fire)

    def window_stages(self) -> WindowStages:
        """A sample of where this mover's deliveries are (`bench.stages`).

        Safe to call from another thread while the loop runs: it only reads lengths
        and counters, each consistent on its own, so a sample may be off by a batch.
        All zeros before the first session has begun.
        """
        window = getattr(self, "_window", None)
        if window is None:
            return WindowStages(logging=0, destination=0, ledger=0, moved=0)
        unlogged = len(getattr(self, "_pending", ()))
        # Batches being logged are already publishes to the window (seq numbers given).
        being_logged = sum(len(o.deliveries) for o in list(getattr(self, "_outgoing", ())))
        unconfirmed = window.unconfirmed
        return WindowStages(
            logging=unlogged + being_logged,
            destination=max(0, unconfirmed - being_logged),
            ledger=window.in_flight - unconfirmed,
            moved=self._moved_messages,
        )

    # -- connections ----------------------------------------------------------------

    def _connect(self, endpoint: Endpoint, index: int) -> None:
        is_source = endpoint is self._source
        connection = SelectConnection(
            endpoint.parameters[index],
            on_open_callback=self._on_source_open if is_source else self._on_destination_open,
            on_open_error_callback=lambda _c, exc: self._on_open_error(endpoint, index, exc),
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._ioloop,
        )
        connection.add_on_connection_blocked_callback(self._on_blocked)
        connection.add_on_connection_unblocked_callback(self._on_unblocked)
        if is_source:
            self._source_connection = connection
        else:
            self._destination_connection = connection

    def _on_open_error(self, endpoint: Endpoint, index: int, exc: BaseException) -> None:
        """pika: a connection could not open. Try the next URI; refused access is final."""
        if self._closing:
            self._end_session_if_closed()
            return
        if index + 1 < len(endpoint.parameters):
            self._connect(endpoint, index + 1)
            return
        error = open_error(endpoint.cluster, endpoint.vhost, endpoint.parameters[index], exc)
        if isinstance(error, AccessRefusedError):
            self._fatal = error
            self._close()
        else:
            self._connection_lost(str(error))

    def _on_source_open(self, connection: pika.connection.Connection) -> None:
        """pika: source connection is open; open its channel next (unless ending)."""
        if self._closing:
            connection.close()
            return
        connection.channel(on_open_callback=self._on_source_channel_open)

    def _on_destination_open(self, connection: pika.connection.Connection) -> None:
        """pika: destination connection is open; open its channel next (unless ending)."""
        if self._closing:
            connection.close()
            return
        connection.channel(on_open_callback=self._on_destination_channel_open)

    def _on_source_channel_open(self, channel: pika.channel.Channel) -> None:
        """pika: source channel is open; ask for the byte window's prefetch."""
        self._source_channel = channel
        self._reader = inbound.install(channel.connection, channel, self._on_delivery)
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_cancel_callback(self._on_consumer_cancelled_by_broker)
        channel.add_callback(self._on_get_empty, [pika.spec.Basic.GetEmpty], one_shot=False)
        prefetch = self._flow.granted
        self._flow.qos_sent(prefetch)
        channel.basic_qos(prefetch_count=prefetch, callback=self._on_qos_ok)

    def _on_destination_channel_open(self, channel: pika.channel.Channel) -> None:
        """pika: destination channel is open; turn on publisher confirms."""
        self._destination_channel = channel
        self._publish_frames = wire.PublishFrames(
            channel.channel_number,
            exchange="",
            routing_key=self._destination.queue,
            mandatory=True,
            max_body_frame=channel.connection._body_max_length,
        )
        channel.add_on_close_callback(self._on_channel_closed)

        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=self._on_confirm_select_ok)

    def _on_qos_ok(self, _frame: pika.frame.Method) -> None:
        self._flow.qos_ok()
        self._qos_ok = True
        self._start_consuming()

    def _follow_sizes(self) -> None:
        """Give the source the prefetch the sizes received so far call for.

        RabbitMQ fixes a consumer's prefetch when it consumes (basic.qos with
        global=false applies to new consumers only, and quorum queues refuse a
        global one), so a new prefetch means a new consumer: cancel, basic.qos,
        consume again. What the old consumer was sent before its cancel-ok is
        delivered and acked as usual (`DeliveryReader.keep_after_cancel`); the new
        consumer starts once all of it is acked, because the broker would not count
        the old consumer's unacked deliveries against the new one's prefetch. Its
        deliveries follow the old ones, so source order is kept.
        """
        channel = self._source_channel
        if (
            self._changing_prefetch
            or not self._consuming
            or self._stopping_since is not None
            or self._closing
            or channel is None
            or not channel.is_open
        ):
            return
        prefetch = self._flow.wanted_prefetch()
        if prefetch is None:
            return
        log.debug(
            "%s: prefetch %d -> %d (messages up to %d bytes)",
            self._key.describe(),
            self._flow.granted,
            prefetch,
            self._flow.estimate,
        )
        self._changing_prefetch = True
        self._new_prefetch_set = False
        self._flow.qos_sent(prefetch)
        self._window.resize(prefetch)
        assert self._consumer_tag is not None
        assert self._reader is not None
        self._reader.keep_after_cancel(self._consumer_tag)
        channel.basic_cancel(self._consumer_tag, callback=self._on_prefetch_cancel_ok)

    def _on_prefetch_cancel_ok(self, _frame: pika.frame.Method) -> None:
        """pika: the old consumer is gone; set the new prefetch (or stop, if asked to)."""
        channel = self._prefetch_change_goes_on()
        if channel is not None:
            channel.basic_qos(prefetch_count=self._flow.granted, callback=self._on_prefetch_qos_ok)

    def _on_prefetch_qos_ok(self, _frame: pika.frame.Method) -> None:
        """pika: the new prefetch is set; consume again once the old deliveries are acked."""
        self._flow.qos_ok()
        if self._prefetch_change_goes_on() is not None:
            self._new_prefetch_set = True
            self._consume_with_new_prefetch()

    def _prefetch_change_goes_on(self) -> pika.channel.Channel | None:
        """The source channel for the change's next step; None when the session is
        ending, or when the transfer began stopping (the stop takes over the change)."""
        channel = self._source_channel
        if self._closing or channel is None or not channel.is_open:
            return None
        if self._stopping_since is not None:
            self._prefetch_changed_while_stopping()
            return None
        return channel

    def _consume_with_new_prefetch(self) -> None:
        """Consume again if the prefetch change is ready and nothing old is unacked."""
        channel = self._source_channel
        if not (self._new_prefetch_set and self._idle()) or channel is None or self._closing:
            return
        self._changing_prefetch = self._new_prefetch_set = False
        self._consumer_tag = channel.basic_consume(
            self._source.queue, self._on_message, auto_ack=False
        )

    def _prefetch_changed_while_stopping(self) -> None:
        """The transfer began stopping while it had no consumer: that cancel is the
        stop's cancel, so the drain's proof follows as after its own cancel-ok."""
        self._flow.qos_ok()
        self._changing_prefetch = self._new_prefetch_set = False
        self._consuming = False
        self._on_cancel_ok(None)

    def _held_bytes(self) -> int:
        """Body bytes received and not yet acked at the source (the byte window's measure)."""
        return self._pending_bytes + self._window.in_flight_bytes

    def _on_confirm_select_ok(self, _frame: pika.frame.Method) -> None:
        self._confirms_on = True
        self._start_consuming()

    def _start_consuming(self) -> None:
        """Consume only once both sides are ready, so every delivery can be published."""
        if not (self._qos_ok and self._confirms_on) or self._closing:
            return
        assert self._source_channel is not None
        self._consuming = True
        self._consumer_tag = self._source_channel.basic_consume(
            self._source.queue, self._on_message, auto_ack=False
        )

    def _on_blocked(self, connection: pika.connection.Connection, _frame: Any) -> None:
        """pika: the broker blocked publishing (memory or disk alarm).

        Nothing to do but wait: publishes stay buffered, confirms stop, so acks stop and
        the prefetch window stops new deliveries. pika closes the connection if the
        block outlasts blocked_timeout_seconds, which ends the session as lost.
        """
        side = "destination" if connection is self._destination_connection else "source"
        log.warning("%s: %s connection blocked by a broker alarm", self._key.describe(), side)

    def _on_unblocked(self, connection: pika.connection.Connection, _frame: Any) -> None:
        """pika: the alarm cleared; publishing resumes by itself."""
        side = "destination" if connection is self._destination_connection else "source"
        log.info("%s: %s connection unblocked", self._key.describe(), side)

    # -- the transfer ---------------------------------------------------------------

    def _on_message(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Deliver,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: a source delivery (only if `inbound` did not read it first)."""
        self._on_delivery(
            method.delivery_tag, bool(method.redelivered), body, wire.wire_bytes(properties)
        )

    def _on_delivery(self, tag: int, redelivered: bool, body: bytes, properties: bytes) -> bool:
        """A source delivery, read by `inbound.DeliveryReader`. It is published with
        its batch (`_publish_pending`).

        Returns whether the reader may go on: False once the bytes held pass the byte
        window, and the reader pauses until `_send_acks` resumes it.
        """
        size = len(body)
        self._pending.append((tag, redelivered, body, properties))
        self._pending_bytes += size
        self._pending_largest = max(self._pending_largest, size)
        self._published_since_depth_check = True
        if self._guard.active and self._guard.observe(wire.delivery_count_of(properties)):
            self._stop_before_delivery_limit()
        held = self._pending_bytes + self._window.in_flight_bytes
        self._peak_held_bytes = max(self._peak_held_bytes, held)
        if len(self._pending) >= INTENT_BATCH:
            self._publish_pending()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._call_later(0, self._publish_pending)
        # Closing: the connection must read its close-ok; what arrives goes back anyway.
        return held <= self._window_bytes or self._closing

    def _stop_before_delivery_limit(self) -> None:
        """A delivery's return count leaves no room for another lost session: take no
        more messages. What is held is still moved (and acked); the rest stays in the
        source, returned no more than the limit allows."""
        guard, source = self._guard, self._source
        self._fail(
            f"stopped before the delivery limit of cluster {source.cluster} vhost "
            f"{source.vhost!r} queue {source.queue!r}: a message arrived with x-delivery-count "
            f"{guard.highest_count} (returns it has had) and the limit is {guard.limit} (past "
            f"it a message is {guard.past_limit}); another lost session could pass it, so the "
            f"rest stays in the source. Find what returned them (lost connections, consumers "
            f"that requeue) or raise the limit, then run again"
        )

    def _publish_pending(self) -> None:
        """Log the batch as intents (durable, on the intents lane), then publish
        each delivery unchanged.

        Logging first means a process killed after a publish still leaves a row for it.
        One batch is logged at a time: what arrives meanwhile waits and goes out as the
        next batch, so a slow fsync means larger batches, not a queue of small ones
        (group commit). Dropped or withdrawn batches (the session is ending) are never
        acked: they go back to the source, and since they are the newest deliveries no
        multiple ack can cover them.
        """
        self._flush_scheduled = False
        if self._logging_intents:
            return  # _send_logged calls again when the batch being logged is out
        pending, self._pending = self._pending, []
        self._flow.observe(len(pending), self._pending_largest)
        self._pending_bytes = self._pending_largest = 0
        if not pending or self._closing:
            return
        if self._destination_channel is None or not self._destination_channel.is_open:
            return
        on_publish = self._window.on_publish
        consumed_at = self._clock()  # one reading per batch: they arrived together
        digest_properties = self._properties_digests.digest
        batch = [
            on_publish(
                tag,
                redelivered=redelivered,
                body_size=len(body),
                body_sha256=sha256(body).hexdigest(),
                properties_sha256=digest_properties(property_bytes),
                message_id=wire.message_id_of(property_bytes),
                body=body,
                properties=property_bytes,
                consumed_at=consumed_at,
            )
            for tag, redelivered, body, property_bytes in pending
        ]
        intents = self._intents
        self._logging_intents = True
        self._send_when_durable(batch, lambda: intents.append(batch))
        self._follow_sizes()

    def _send_when_durable(
        self, deliveries: list[Delivery], log_intents: Callable[[], None]
    ) -> None:
        """Publish `deliveries` once `log_intents` has run on the intents lane.

        Every publish goes through the intents lane (a republish with nothing to log
        too), so frames leave in the order sequence numbers were given out, which is
        the order the destination numbers its confirms.
        """
        outgoing = _Outgoing(deliveries, logs_intents=log_intents is not _nothing_to_log)
        self._outgoing.append(outgoing)
        session = self._session
        self._last_jobs[INTENTS] = self._loop.submit(
            INTENTS, log_intents, lambda error: self._send_logged(session, outgoing, error)
        )

    def _send_logged(self, session: int, outgoing: _Outgoing, error: BaseException | None) -> None:
        """Loop: the intents of `outgoing` are durable (or failed): publish, in order."""
        if session != self._session or outgoing.withdrawn:
            return  # its session ended and withdrew it
        self._outgoing.remove(outgoing)
        channel = self._destination_channel
        if error is not None or self._closing or channel is None or not channel.is_open:
            self._window.withdraw(outgoing.deliveries)
            outgoing.withdrawn = True
            if error is not None:
                if self._fatal is None:
                    self._fatal = error
                self._close()
            return
        self._publish(outgoing.deliveries)
        if self._logging_intents and outgoing.logs_intents:
            self._logging_intents = False
            if self._pending:
                self._publish_pending()

    def _withdraw_unsent(self) -> None:
        """Session end: publishes still waiting for their intents will never be sent."""
        for outgoing in self._outgoing:
            self._window.withdraw(outgoing.deliveries)
            outgoing.withdrawn = True
        self._outgoing.clear()

    def _publish(self, deliveries: list[Delivery]) -> None:
        """basic.publish each (mandatory, to the destination queue), in order, the
        bytes built by us and handed to pika's output buffer as one chunk.

        Same frames as `Channel.basic_publish` with `wire.ForwardedProperties`, a
        fraction of the Python work (see `wire.PublishFrames`).
        """
        assert self._destination_connection is not None
        assert self._publish_frames is not None
        self._destination_connection._output_marshaled_frames(
            (self._publish_frames.marshal_all(deliveries),)
        )

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        """pika: the destination's basic.ack or basic.nack for one or more publishes."""
        method = frame.method
        if isinstance(method, pika.spec.Basic.Ack):
            self._window.on_confirm(method.delivery_tag, multiple=method.multiple)
        else:
            for delivery in self._window.on_nack(method.delivery_tag, multiple=method.multiple):
                self._retry_or_refuse(delivery)
        self._settle()

    def _retry_or_refuse(self, delivery: Delivery) -> None:
        """A nacked publish: send it again after a backoff, or give up on it."""
        if delivery.attempts > self._limits.nack_retries:
            self._window.refuse(delivery, "nacked by the destination")
            self._fail(
                f"the destination refused (nacked) the message at source position "
                f"{delivery.position} {delivery.attempts} time(s); it stays in the source"
            )
            return
        delay = backoff_seconds(delivery.attempts, self._limits)
        log.warning(
            "%s: destination nacked position %d; publishing it again in %.2fs",
            self._key.describe(),
            delivery.position,
            delay,
        )
        self._call_later(delay, lambda: self._republish(delivery))

    def _republish(self, delivery: Delivery) -> None:
        """Timer: publish a nacked delivery again (same bytes, same position)."""
        channel = self._destination_channel
        if self._closing or channel is None or not channel.is_open:
            return  # the session ended; the source redelivers it
        self._window.republish(delivery)
        self._send_when_durable([delivery], _nothing_to_log)  # its intent is logged already

    def _on_return(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.Return,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: a mandatory publish was routed nowhere (destination queue missing)."""
        reason = f"returned by the destination: {method.reply_code} {method.reply_text}"
        returned = self._window.on_return(
            hashlib.sha256(body).hexdigest(),
            hashlib.sha256(wire.wire_bytes(properties)).hexdigest(),
            reason,
        )
        position = returned.position if returned else "?"
        self._fail(f"a message was {reason} (source position {position}); is the queue there?")

    def _settle(self) -> None:
        """Start writing ledger rows for confirmed deliveries; ack what is already durable."""
        if self._source_channel is None or not self._source_channel.is_open or self._closing:
            return
        if self._window.should_flush(draining=self._stopping_since is not None):
            self._write_confirmed_async()
        self._send_acks()

    def _send_acks(self) -> None:
        assert self._source_channel is not None
        for ack in self._window.take_acks():
            self._source_channel.basic_ack(ack.tag, multiple=ack.multiple)
        reader = self._reader
        if reader is not None and reader.paused and self._held_bytes() <= self._window_bytes:
            reader.resume()
        if self._changing_prefetch:
            self._consume_with_new_prefetch()

    def _write_confirmed_async(self) -> None:
        """Hand the rows of every confirmed delivery to the ledger lane (one write).

        One write at a time per transfer: confirms arriving meanwhile go into the next
        write as soon as this one is durable (group commit), so acks flow continuously
        when writes are fast and writes grow when they are slow.
        """
        if self._writing_rows:
            return  # _on_rows_durable settles again
        rows = self._window.rows_to_write()
        if not rows:
            return
        window, ledger = self._window, self._ledger
        self._writing_rows = True
        self._last_jobs[LEDGER] = self._loop.submit(
            LEDGER,
            lambda: ledger.write(rows),
            lambda error: self._on_rows_durable(window, rows, error),
        )

    def _on_rows_durable(
        self, window: TransferWindow, rows: list[Delivery], error: BaseException | None
    ) -> None:
        """Loop: a ledger write is durable (or failed). Its deliveries may now be acked."""
        if window is self._window:
            self._writing_rows = False
        if error is not None:
            if self._fatal is None:
                self._fatal = error
            if window is self._window and not self._closing:
                self._close()
            return
        window.mark_durable(rows)
        self._count_moved(rows)
        channel = self._source_channel
        if window is self._window and not self._closing and channel is not None and channel.is_open:
            self._settle()  # acks these, and writes what was confirmed meanwhile

    def _count_moved(self, rows: list[Delivery]) -> None:
        self._moved_messages += len(rows)
        self._moved_bytes += sum(row.body_size for row in rows)

    def _write_confirmed_now(self) -> None:
        """Session end: wait for this session's jobs, then write the rest here (durable)."""
        for job in self._last_jobs.values():
            self._loop.wait_for(job)
        rows = self._window.rows_to_write()
        if not rows:
            return
        self._ledger.write(rows)
        self._window.mark_durable(rows)
        self._count_moved(rows)

    def _on_tick(self) -> None:
        """Timer: flush slow confirms, check whether an idle queue is drained, or finish."""
        if self._closing:
            return
        self._settle()
        now = time.monotonic()
        if self._stopping_since is not None:
            self._finish_if_settled(now)
        elif (
            self._consuming
            and not self._changing_prefetch
            and self._idle()
            and not self._depth_check_pending
        ):
            # Ask at once when the window just emptied; an idle queue only now and then.
            idle_for = now - self._last_depth_check
            if self._published_since_depth_check or idle_for >= IDLE_DEPTH_CHECK_SECONDS:
                self._check_drained()
        if not self._closing:
            self._call_later(TICK_SECONDS, self._on_tick)

    def _check_drained(self) -> None:
        assert self._source_channel is not None
        self._depth_check_pending = True
        self._published_since_depth_check = False
        self._last_depth_check = time.monotonic()
        self._source_channel.queue_declare(
            self._source.queue, passive=True, callback=self._on_depth
        )

    def _on_depth(self, frame: pika.frame.Method) -> None:
        """pika: passive declare-ok. Zero ready and nothing in flight means drained,
        but only from a reply that counted our own consumer.

        A quorum queue answers a declare with "0 messages, 0 consumers" when its leader
        does not reply within 250 ms (or is unavailable); RabbitMQ 3.10's
        `rabbit_quorum_queue:stat/1`. Such a reply is asked again on a later tick.
        """
        self._depth_check_pending = False
        counted = frame.method.consumer_count > 0
        if frame.method.message_count == 0 and counted and self._idle():
            self._stop_consuming()

    def _idle(self) -> bool:
        """Nothing received that is not yet acked (published or waiting to be)."""
        return self._window.in_flight == 0 and not self._pending

    def _stop_consuming(self) -> None:
        """Cancel the consumer; deliveries already on the wire are still handled."""
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()
        if self._changing_prefetch:
            if self._new_prefetch_set:  # only waiting to consume again: stop instead
                self._prefetch_changed_while_stopping()
            return  # else the cancel or qos under way sees the stop when it completes
        if self._consuming and self._source_channel is not None and self._source_channel.is_open:
            self._consuming = False
            # What the consumer was sent before the cancel took effect is moved, not
            # rejected: a requeue would count against a quorum source's delivery limit.
            if self._reader is not None and self._consumer_tag is not None:
                self._reader.keep_after_cancel(self._consumer_tag)
            self._source_channel.basic_cancel(self._consumer_tag, callback=self._on_cancel_ok)
        elif not self._consuming:
            self._cancel_ok = True  # never consumed (or the broker cancelled): nothing to wait for

    def _on_cancel_ok(self, _frame: pika.frame.Method | None) -> None:
        """pika: cancel-ok. Every delivery sent before it has reached _on_message.

        A drain is confirmed only now: RabbitMQ's ready count leaves out deliveries
        already on their way to us (the reader hands those to `_on_delivery`, so they
        are moved like the others). The proof is a basic.get, not a count: a get goes
        through the queue itself (a quorum queue's log) and waits for a busy leader
        where a declare would answer 0 (`_on_depth`).
        """
        if self._error is None and self._source_channel is not None:
            self._drain_get_pending = True
            self._source_channel.basic_get(self._source.queue, self._on_get_after_cancel)
            return
        self._cancel_ok = True

    def _on_get_empty(self, _frame: pika.frame.Method) -> None:
        """pika: get-empty. After cancel-ok (the only get the mover sends): drained."""
        if self._drain_get_pending:
            self._drain_get_pending = False
            self._cancel_ok = True

    def _on_get_after_cancel(
        self,
        _channel: pika.channel.Channel,
        method: pika.spec.Basic.GetOk,
        properties: pika.spec.BasicProperties,
        body: bytes,
    ) -> None:
        """pika: get-ok after cancel-ok. Not drained: move this one, consume again."""
        self._drain_get_pending = False
        if self._error is not None:
            # Never acked: the message goes back to the source when the channel closes.
            self._cancel_ok = True
            return
        log.info(
            "%s: %d message(s) still ready after the drain check; consuming again",
            self._key.describe(),
            method.message_count + 1,
        )
        self._stopping_since = None
        self._on_delivery(
            method.delivery_tag, bool(method.redelivered), body, wire.wire_bytes(properties)
        )
        self._start_consuming()

    def _finish_if_settled(self, now: float) -> None:
        assert self._stopping_since is not None
        waiting = (
            not self._cancel_ok
            or bool(self._pending)
            or self._window.unconfirmed > 0
            or not self._window.settled
        )
        if waiting and now - self._stopping_since < STOP_CONFIRM_TIMEOUT_SECONDS:
            return
        if waiting and self._error is None:
            self._error = (
                f"{self._key.describe()}: {self._window.unconfirmed} publish(es) were not "
                f"confirmed within {STOP_CONFIRM_TIMEOUT_SECONDS:.0f}s; they stay in the source"
            )
        self._close()

    def _fail(self, reason: str) -> None:
        """Stop this transfer: no new deliveries; confirmed ones are still written and acked."""
        if self._error is None:
            self._error = f"{self._key.describe()}: {reason}"
            log.error("%s", self._error)
        self._stop_consuming()

    # -- ending a session -----------------------------------------------------------

    def _connection_lost(self, reason: str) -> None:
        """A connection is gone: settle what can be settled, then end the session."""
        if self._lost is None and self._fatal is None:
            self._lost = reason
        self._close()

    def _close(self) -> None:
        """Close both connections; what the source has not acked goes back to its queue.

        Confirmed deliveries are in the destination whether or not they can still be
        acked, so their rows are written (and acked, if the source is still open)
        first. Unconfirmed publishes may have arrived too: their rows are written
        without a confirm time, so a copy that did arrive is named.
        """
        if not self._closing:
            self._closing = True
            self._write_confirmed_now()
            if self._source_channel is not None and self._source_channel.is_open:
                self._send_acks()
            self._withdraw_unsent()  # never sent: they cannot have arrived
            # Normally nothing is unconfirmed here; after a lost connection, a channel
            # closed by the broker or a confirm timeout, these may have arrived.
            uncertain = self._window.mark_uncertain()
            if uncertain:
                self._ledger.write(uncertain)
            if self._reader is not None:
                self._reader.resume()  # a paused source could not read its close-ok
        for connection in (self._source_connection, self._destination_connection):
            # A connection still opening is left to finish: pika's connect workflow
            # cannot be closed mid-way. Its open (or open-error) callback closes it.
            if connection is not None and connection.is_open:
                connection.close()
        self._end_session_if_closed()

    def _end_session_if_closed(self) -> None:
        connections = (self._source_connection, self._destination_connection)
        if self._session_ended or not all(c is None or c.is_closed for c in connections):
            return
        self._session_ended = True
        self._after_session()

    def _on_connection_closed(self, connection: pika.connection.Connection, reason: Any) -> None:
        """pika: a connection closed. Expected when closing; otherwise the session is lost."""
        if not self._closing:
            side = self._source if connection is self._source_connection else self._destination
            self._connection_lost(
                f"connection to cluster {side.cluster} vhost {side.vhost!r} was lost ({reason})"
            )
        self._end_session_if_closed()

    def _on_channel_closed(self, channel: pika.channel.Channel, reason: Any) -> None:
        """pika: a channel closed. The broker does that for a missing queue or no access.

        Not retryable by a new session or task attempt, so the transfer fails with the
        reason. A channel closed because its connection went is handled as a lost session.
        """
        if self._closing:
            return
        side = self._source if channel is self._source_channel else self._destination
        if not isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            return  # the connection is closing; _on_connection_closed follows
        code, text = reason.reply_code, reason.reply_text
        if channel is self._source_channel and refusals.consumer_timed_out(code, text):
            # 3.10, 4.0 and 4.3.6: the source held a delivery past consumer_timeout (e.g.
            # the destination was blocked); what it held goes back, a new session goes on.
            self._connection_lost(f"the source consumer timed out ({code} {text})")
            return
        too_large = refusals.oversize(code, text) if channel is self._destination_channel else None
        if self._error is None and too_large is not None:
            self._error = self._oversize_error(too_large)
            log.error("%s", self._error)
        elif self._error is None:
            self._error = (
                f"{self._key.describe()}: the broker closed the channel on cluster "
                f"{side.cluster} vhost {side.vhost!r} queue {side.queue!r} "
                f"({reason.reply_code} {reason.reply_text})"
            )
            log.error("%s", self._error)
        self._close()

    def _oversize_error(self, too_large: refusals.Oversize) -> str:
        """The destination refused a message for its size: name it, the size, the limit."""
        refused = self._window.refuse_oversized(
            too_large.message_bytes, "larger than the destination's max_message_size"
        )
        position = refused.position if refused is not None else "?"
        source, destination = self._source, self._destination
        return (
            f"{self._key.describe()}: the destination cluster {destination.cluster} vhost "
            f"{destination.vhost!r} queue {destination.queue!r} refused (closed its channel, "
            f"{refusals.PRECONDITION_FAILED} PRECONDITION_FAILED) a message of "
            f"{too_large.message_bytes} bytes from cluster {source.cluster} vhost "
            f"{source.vhost!r} queue {source.queue!r} (source position {position}): larger "
            f"than the destination's max_message_size {too_large.max_message_size}. It stays "
            f"in the source, never acked; raise max_message_size on the destination (4.0 "
            f"lowered the default to 16 MiB) or move it another way"
        )

    def _on_consumer_cancelled_by_broker(self, _frame: pika.frame.Method) -> None:
        """pika: the broker cancelled our consumer (source queue deleted, the quorum
        queue's leader moved, or a 4.3 quorum queue's consumer timeout where the
        channel supports it). A new session consumes again; a deleted queue then fails
        its passive declare."""
        self._consuming = False
        self._connection_lost("the broker cancelled the source consumer")
