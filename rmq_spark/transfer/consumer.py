"""The source side of one session: prefetch, consuming, following the sizes, stopping.

No pika: it drives a `ports.SourceLink`. It owns the consumer's state (prefetch
granted, consuming, a prefetch change under way) and asks `drain.DrainCheck` when
the queue is drained; the `Session` owns everything received (`ConsumerHost`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from rmq_spark.transfer.byte_window import ByteWindow
from rmq_spark.transfer.drain import DrainCheck, DrainStep
from rmq_spark.transfer.ports import SourceLink
from rmq_spark.transfer.window import TransferWindow

log = logging.getLogger(__name__)


class ConsumerHost(Protocol):
    """What the consumer needs of its session."""

    @property
    def closing(self) -> bool: ...

    @property
    def failing(self) -> bool:
        """The transfer has failed: a drain needs no proof, a proof's message stays."""

    def idle(self) -> bool:
        """Nothing received that is not yet acked (published or waiting to be)."""

    def on_delivery(self, tag: int, redelivered: bool, body: bytes, properties: bytes) -> bool: ...


class Consumer:
    """One session's consumer on the source queue."""

    def __init__(
        self,
        host: ConsumerHost,
        source: SourceLink,
        *,
        flow: ByteWindow,
        window: TransferWindow,
        label: str,
        monotonic: Callable[[], float],
    ) -> None:
        self._host = host
        self._source = source
        self._flow = flow
        self._window = window
        self._label = label
        self._monotonic = monotonic
        self.drain = DrainCheck()
        self._qos_ok = False
        self._confirms_on = False
        self.consuming = False
        self.changing_prefetch = False  # consumer cancelled, to consume again (follow_sizes)
        self._new_prefetch_set = False  # ...and the new prefetch is set

    @property
    def stopping(self) -> bool:
        return self.drain.stopping_since is not None

    # -- starting -------------------------------------------------------------------

    def source_ready(self) -> None:
        """The source channel is open: ask for the byte window's prefetch."""
        prefetch = self._flow.granted
        self._flow.qos_sent(prefetch)
        self._source.set_prefetch(prefetch)

    def destination_ready(self) -> None:
        """Publisher confirms are on."""
        self._confirms_on = True
        self.start()

    def on_prefetch_set(self) -> None:
        """basic.qos-ok: the first prefetch, or a change's new one."""
        if self.changing_prefetch:
            self._flow.qos_ok()
            if self._prefetch_change_goes_on():
                self._new_prefetch_set = True
                self.consume_with_new_prefetch()
            return
        self._flow.qos_ok()
        self._qos_ok = True
        self.start()

    def start(self) -> None:
        """Consume only once both sides are ready, so every delivery can be published."""
        if not (self._qos_ok and self._confirms_on) or self._host.closing:
            return
        self.consuming = True
        self._source.consume()

    # -- following the sizes --------------------------------------------------------

    def follow_sizes(self) -> None:
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
        if (
            self.changing_prefetch
            or not self.consuming
            or self.stopping
            or self._host.closing
            or not self._source.is_open
        ):
            return
        prefetch = self._flow.wanted_prefetch()
        if prefetch is None:
            return
        log.debug(
            "%s: prefetch %d -> %d (messages up to %d bytes)",
            self._label,
            self._flow.granted,
            prefetch,
            self._flow.estimate,
        )
        self.changing_prefetch = True
        self._new_prefetch_set = False
        self._flow.qos_sent(prefetch)
        self._window.resize(prefetch)
        self._source.cancel()

    def _prefetch_change_goes_on(self) -> bool:
        """Whether the change takes its next step: not when the session is ending, nor
        when the transfer began stopping (the stop takes over the change)."""
        if self._host.closing or not self._source.is_open:
            return False
        if self.stopping:
            self._prefetch_changed_while_stopping()
            return False
        return True

    def consume_with_new_prefetch(self) -> None:
        """Consume again if the prefetch change is ready and nothing old is unacked."""
        if not (self._new_prefetch_set and self._host.idle()) or self._host.closing:
            return
        self.changing_prefetch = self._new_prefetch_set = False
        self._source.consume()

    def _prefetch_changed_while_stopping(self) -> None:
        """The transfer began stopping while it had no consumer: that cancel is the
        stop's cancel, so the drain's proof follows as after its own cancel-ok."""
        self._flow.qos_ok()
        self.changing_prefetch = self._new_prefetch_set = False
        self.consuming = False
        self._drain_cancel_ok()

    # -- stopping and the drain ------------------------------------------------------

    def tick(self, now: float) -> None:
        """Consuming with nothing in flight: ask whether the queue is drained."""
        if (
            self.consuming
            and not self.changing_prefetch
            and self.drain.tick(now, idle=self._host.idle()) is DrainStep.ASK_DEPTH
        ):
            self._source.ask_depth()

    def on_depth(self, ready: int, consumers: int) -> None:
        """A quorum queue answers a declare with "0 messages, 0 consumers" when its
        leader is busy: only a reply that counted our consumer may end the drain."""
        if self.drain.depth(ready, consumers, idle=self._host.idle()) is DrainStep.CANCEL:
            self.stop()

    def stop(self) -> None:
        """Cancel the consumer; deliveries already on the wire are still handled."""
        self.drain.stop(self._monotonic())
        if self.changing_prefetch:
            if self._new_prefetch_set:  # only waiting to consume again: stop instead
                self._prefetch_changed_while_stopping()
            return  # else the cancel or qos under way sees the stop when it completes
        if self.consuming and self._source.is_open:
            self.consuming = False
            self._source.cancel()
        elif not self.consuming:
            self.drain.nothing_to_cancel()  # never consumed (or the broker cancelled)

    def on_cancel_ok(self) -> None:
        """cancel-ok: a prefetch change's, or the stop's."""
        if self.changing_prefetch:
            if self._prefetch_change_goes_on():
                self._source.set_prefetch(self._flow.granted)
            return
        self._drain_cancel_ok()

    def _drain_cancel_ok(self) -> None:
        """Every delivery sent before the cancel-ok has reached `on_delivery`; the
        ready count left them out. Now the proof (`DrainCheck.cancel_ok`)."""
        failing = self._host.failing or not self._source.is_open
        if self.drain.cancel_ok(failing=failing) is DrainStep.GET:
            self._source.get_one()

    def on_get_empty(self) -> None:
        self.drain.got(empty=True, failing=self._host.failing)

    def on_got(
        self, tag: int, redelivered: bool, body: bytes, properties: bytes, remaining: int
    ) -> None:
        """get-ok after cancel-ok. Not drained: move this one, consume again."""
        if self.drain.got(empty=False, failing=self._host.failing) is not DrainStep.RESUME:
            return  # failed: never acked, it goes back to the source with the channel
        log.info(
            "%s: %d message(s) still ready after the drain check; consuming again",
            self._label,
            remaining + 1,
        )
        self._host.on_delivery(tag, redelivered, body, properties)
        self.start()

    def on_cancelled_by_broker(self) -> None:
        self.consuming = False
