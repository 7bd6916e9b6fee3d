"""A session of a selective move: a `Session` with a kept link and a fence.

No pika. `mover.QueueMover` runs these instead of plain sessions when its transfer has
a decider (a route's `select`); a plain move never builds one, so its path is today's.
What it adds (`selective.py` says why):

- a third link, the kept link (`ports.Connector.connect_kept`), publishing kept messages
  back to the source queue's tail with confirms; the session ends once all three links
  are closed;
- the consumer starts once the destination has confirms on AND the fence is in the
  source (its publish confirmed and recorded in the ledger, by this session or an
  earlier one of the transfer, or by an earlier task attempt);
- no drain-to-empty: the session ends when the fence arrives and everything before it
  is settled (`Selective.step` on each tick), or when the transfer fails.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from rmq_spark.errors import RmqSparkError
from rmq_spark.transfer.lanes import LEDGER
from rmq_spark.transfer.ports import DESTINATION, SOURCE, Side
from rmq_spark.transfer.selective import KeptEvents, Selective
from rmq_spark.transfer.session import FINISHING, Ending, Session, SessionEnd, Shared


class SelectiveSession(Session):
    """One session of a selective move (`selective.Selective` is its selective side)."""

    def __init__(
        self,
        number: int,
        shared: Shared,
        *,
        first_position: int,
        error: str | None,
        on_end: Callable[[SessionEnd], None],
    ) -> None:
        # Built with the session, as its other collaborators are (the links' events
        # reach it on the loop, after this).
        self._destination_confirms = False
        self._fence_in_source = False
        super().__init__(number, shared, first_position=first_position, error=error, on_end=on_end)
        assert shared.decider is not None
        assert shared.fence is not None
        self.selective = Selective(
            self,
            key=shared.key,
            decider=shared.decider,
            fence=shared.fence,
            window=self._window,
            source=self._source,
            message_id_of=shared.connector.message_id_of,
            on_delivery=self.outbound.on_delivery,
            clock=shared.clock,
        )
        self.settlement.counts_kept = True
        events = KeptEvents(self.selective, self, self.settlement.settle)
        events.retry = self.outbound.retry_or_refuse
        # The source link binds `on_delivery` when its channel opens, a loop turn later.
        self.on_delivery = self.selective.on_delivery
        self.outbound.decide = self.selective.decide
        self.outbound.publish_batch = partial(self.selective.publish, destination=self._destination)
        self.selective.kept = shared.connector.connect_kept(events, shared.loop.ioloop, self._label)

    # -- starting: the destination's confirms and the fence -----------------------------

    def on_ready(self, side: Side) -> None:
        if side == DESTINATION:
            self._destination_confirms = True
            self._consume_if_ready()
        else:
            super().on_ready(side)

    def consume_when_ready(self) -> None:
        self._fence_in_source = True
        self._consume_if_ready()

    def fence_confirmed(self) -> None:
        """Record the confirmed fence in the ledger on the ledger lane (a later task
        attempt then publishes no second one: `ledger/fences.py`), then consume."""
        fence = self._shared.fence
        assert fence is not None

        def recorded(error: BaseException | None) -> None:
            if error is not None:
                self.fail(f"cannot record the selective move's fence in the ledger ({error})")
                return
            fence.published = True
            if not self.closing:
                self.consume_when_ready()

        self._shared.loop.submit(LEDGER, self._shared.record_fence, recorded)

    def _consume_if_ready(self) -> None:
        if self._destination_confirms and self._fence_in_source:
            self._consumer.destination_ready()

    # -- ending at the fence ------------------------------------------------------------

    def drain_step(self) -> None:
        """The fence, not an empty queue, ends a selective move (kept ones re-enter it)."""
        if self.closing:
            return
        if self._consumer.stopping:
            super().drain_step()  # the transfer failed: settle what is held, then close
        else:
            self.selective.step()

    def finish(self) -> None:
        """The fence arrived and everything before it is settled (`Selective.step`)."""
        self._close(FINISHING)

    def _close(self, why: Ending) -> None:
        super()._close(why)
        self.selective.kept.close()  # type: ignore[union-attr]
        self._end_if_closed()

    def _end_if_closed(self) -> None:
        kept = getattr(self, "selective", None)
        if kept is not None and kept.kept is not None and not kept.kept.is_closed:
            return
        super()._end_if_closed()

    # -- the kept link's news -----------------------------------------------------------

    def kept_lost(self, reason: str) -> None:
        self._connection_lost(f"kept link: {reason}")

    def kept_refused(self, error: RmqSparkError) -> None:
        self.on_refused(SOURCE, error)

    def kept_closed(self) -> None:
        self._end_if_closed()
