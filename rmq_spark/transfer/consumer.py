"""The source side of one session: prefetch, consuming, following the sizes, stopping.

No pika: it drives a `ports.SourceLink`. What to send next is decided by two pure
state machines: `prefetch.ConsumerState` (consuming, a prefetch change, the stop
taking one over) and `drain.DrainCheck` (when the queue is drained); the `Session`
owns everything received (`ConsumerHost`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from rmq_spark.transfer.byte_window import ByteWindow
from rmq_spark.transfer.drain import DrainCheck, DrainStep
from rmq_spark.transfer.ports import SourceLink
from rmq_spark.transfer.prefetch import ConsumerState, ConsumerStep, Phase
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
    """One session's consumer on the source queue: sends what `ConsumerState` decides."""

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
        self.state = ConsumerState()

    @property
    def stopping(self) -> bool:
        return self.drain.stopping_since is not None

    def _ending(self) -> bool:
        """The session is closing or the source is gone: nothing more is sent."""
        return self._host.closing or not self._source.is_open

    def _send(self, step: ConsumerStep) -> None:
        """Send the step `ConsumerState` decided."""
        if step is ConsumerStep.CONSUME:
            self._source.consume()
        elif step is ConsumerStep.CANCEL:
            self._source.cancel()
        elif step is ConsumerStep.SET_PREFETCH:
            self._source.set_prefetch(self._flow.granted)
        elif step is ConsumerStep.PROVE:
            self._drain_cancel_ok()
        elif step is ConsumerStep.NOTHING_TO_CANCEL:
            self.drain.nothing_to_cancel()  # never consumed (or the broker cancelled)

    # -- starting -------------------------------------------------------------------

    def source_ready(self) -> None:
        """The source channel is open: ask for the byte window's prefetch."""
        prefetch = self._flow.granted
        self._flow.qos_sent(prefetch)
        self._source.set_prefetch(prefetch)

    def destination_ready(self) -> None:
        """Publisher confirms are on: consume once the prefetch is set too, so every
        delivery can be published."""
        self._send(self.state.confirms_on(ending=self._host.closing))

    def on_prefetch_set(self) -> None:
        """basic.qos-ok: the first prefetch, or a change's new one."""
        self._flow.qos_ok()
        self._send(self.state.prefetch_set(idle=self._host.idle(), ending=self._ending()))

    # -- following the sizes --------------------------------------------------------

    def follow_sizes(self) -> None:
        """Give the source the prefetch the sizes received so far call for.

        A new prefetch means a new consumer (`prefetch.ConsumerState`): cancel,
        basic.qos, consume again. What the old consumer was sent before its cancel-ok is
        delivered and acked as usual (`DeliveryReader.keep_after_cancel`); the new
        consumer starts once all of it is acked. Its deliveries follow the old ones, so
        source order is kept.
        """
        if not self.state.consuming or self._ending():
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
        self._flow.qos_sent(prefetch)
        self._window.resize(prefetch)
        self._send(self.state.change(ending=False))

    def on_acked(self) -> None:
        """Acks went out: a prefetch change waiting for them may consume again."""
        if self.state.phase is Phase.WAITING:
            self._send(self.state.acked(idle=self._host.idle(), ending=self._host.closing))

    # -- stopping and the drain ------------------------------------------------------

    def tick(self, now: float) -> None:
        """Consuming with nothing in flight: ask whether the queue is drained."""
        if (
            self.state.consuming
            and self.drain.tick(now, idle=self._host.idle()) is DrainStep.ASK_DEPTH
        ):
            self._source.ask_depth()

    def on_depth(self, ready: int, consumers: int) -> None:
        """A quorum queue answers a declare with "0 messages, 0 consumers" when its
        leader is busy: only a reply that counted our consumer may end the drain."""
        if self.drain.depth(ready, consumers, idle=self._host.idle()) is DrainStep.CANCEL:
            self.stop()

    def stop(self) -> None:
        """Cancel the consumer; deliveries already on the wire are still handled. A
        prefetch change under way is taken over: its cancel or qos is the stop's."""
        self.drain.stop(self._monotonic())
        self._send(self.state.stop(ending=self._ending()))

    def on_cancel_ok(self) -> None:
        """cancel-ok: a prefetch change's, or the stop's."""
        self._send(self.state.cancel_ok(ending=self._ending()))

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
        self._send(self.state.resume(ending=self._host.closing))

    def on_cancelled_by_broker(self) -> None:
        self.state.cancelled_by_broker()
