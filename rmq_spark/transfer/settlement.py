"""Settling one session's confirmed deliveries: ledger rows first, then source acks.

No pika. A confirmed delivery is acked at the source only once its ledger row is
durable: rows are written on the loop's ledger lane (`lanes.MoverLoop`), and each
durable write lets `window.TransferWindow` hand out the acks that are now safe. Up to
`EngineLoop.overlap` writes of a session are under way at once (one on a local disk;
several on an object store, where each is a PUT's round trip); their completions
arrive in the order they were submitted, so rows become durable, and acks go out,
in that order.
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

from rmq_spark.model import Delivery
from rmq_spark.transfer.consumer import Consumer
from rmq_spark.transfer.decisions import RECOGNISED
from rmq_spark.transfer.lanes import LEDGER
from rmq_spark.transfer.ports import DurableJob, EngineLoop, LedgerSink, SourceLink
from rmq_spark.transfer.window import TransferWindow


class SettlementHost(Protocol):
    """What settling needs of its session."""

    @property
    def closing(self) -> bool: ...

    def may_read(self) -> bool:
        """Whether a paused source may be read again: nothing holds reading (holds.py)."""

    def write_failed(self, error: BaseException) -> None:
        """A durable write failed: the session ends, and the transfer with it."""

    def drain_step(self) -> None:
        """Acks went out: the window may be idle, so the drain may take its next step."""


class Settlement:
    """Rows, then acks, for one session's window."""

    def __init__(
        self,
        host: SettlementHost,
        *,
        window: TransferWindow,
        source: SourceLink,
        consumer: Consumer,
        loop: EngineLoop,
        ledger: LedgerSink,
    ) -> None:
        self._host = host
        self._window = window
        self._source = source
        self._consumer = consumer
        self._loop = loop
        self._ledger = ledger
        self._writes_under_way = 0  # ledger writes of this session not yet completed
        self._last_write: DurableJob | None = None  # the lane's jobs complete in order
        self.moved_messages = 0
        self.moved_bytes = 0
        self.moved_with_priority = 0  # of moved_messages, those whose properties set priority
        self.kept_messages = 0  # a selective move's rows of messages kept in the source
        self.counts_kept = False  # set by a selective session: only then are rows split
        self.recognised_messages = 0  # acked without a publish (recognition.py)
        self.counts_recognised = False  # set when the session recognises: rows are split

    def settle(self) -> None:
        """Start writing ledger rows for confirmed deliveries; ack what is already durable."""
        if not self._source.is_open or self._host.closing:
            return
        if self._window.should_flush(draining=self._consumer.stopping):
            self._write_confirmed_async()
        self.send_acks()

    def send_acks(self) -> None:
        acks = self._window.take_acks()
        source = self._source
        if acks:
            source.ack(acks)
        if source.paused and self._host.may_read():
            source.resume()
        self._consumer.on_acked()

    def _write_confirmed_async(self) -> None:
        """Hand the rows of every confirmed delivery to the ledger lane (one write).

        At most `overlap` writes per session at a time: confirms arriving meanwhile go
        into the next write as soon as one is durable (group commit), so acks flow
        continuously when writes are fast and writes grow when they are slow. Writes
        may overlap (each is a file or object of its own, rows handed out once by the
        window); acks still wait for every earlier write, as completions run in order.
        """
        if self._writes_under_way >= self._loop.overlap:
            return  # _on_rows_durable settles again
        rows = self._window.rows_to_write()
        if not rows:
            return
        ledger = self._ledger
        self._writes_under_way += 1
        self._last_write = self._loop.submit(
            LEDGER,
            lambda: ledger.write(rows),
            partial(self._on_rows_durable, rows),
            overlap=True,
        )

    def _on_rows_durable(self, rows: list[Delivery], error: BaseException | None) -> None:
        """Loop: a ledger write is durable (or failed), and every earlier one of the
        session completed. Its deliveries may now be acked."""
        self._writes_under_way -= 1
        if error is not None:
            self._host.write_failed(error)
            return
        self._window.mark_durable(rows)
        self._count_moved(rows)
        if not self._host.closing and self._source.is_open:
            self.settle()  # acks these, and writes what was confirmed meanwhile
            self._host.drain_step()

    def _count_moved(self, rows: list[Delivery]) -> None:
        if self.counts_recognised:
            recognised = [row for row in rows if row.decision == RECOGNISED]
            self.recognised_messages += len(recognised)
            rows = [row for row in rows if row.decision != RECOGNISED]
        if self.counts_kept:
            kept = [row for row in rows if row.decision == "kept"]
            self.kept_messages += len(kept)
            rows = [row for row in rows if row.decision != "kept"]
        self.moved_messages += len(rows)
        self.moved_bytes += sum(row.body_size for row in rows)
        self.moved_with_priority += sum(row.priority for row in rows)

    def write_confirmed_now(self) -> None:
        """Session end: wait for the writes under way, then write the rest here (durable)."""
        if self._last_write is not None:
            self._last_write.wait()
        rows = self._window.rows_to_write()
        if not rows:
            return
        self._ledger.write(rows)
        self._window.mark_durable(rows)
        self._count_moved(rows)
