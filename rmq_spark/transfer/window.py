"""The mover's bookkeeping: which source deliveries may be acked, and when.

Pure logic, no pika and no Spark, so every rule is unit-tested on its own.

A delivery moves through these states:

    PUBLISHED ──confirm──► CONFIRMED ──ledger write──► DURABLE ──ack──► (forgotten)
      │  ▲
      │  └── republish (after a backoff) ── NACKED ◄── nack
      ├──nack, out of retries / basic.return──► REFUSED  (never acked; back to the
      │                                                   source when the channel closes)
      └──connection lost before the confirm──► UNCERTAIN (written with no confirm time:
                                                          it may or may not have arrived)

A redelivery an earlier session moved (`recognition.py`) starts at CONFIRMED: it is
never published, and is acked once its row (decision `recognised`) is durable.

Positions number what the ledger records, with no gaps: every position handed out
ends as a row (confirmed or uncertain), or is given again. A session that ends
withdraws the publishes still waiting for their intents (never sent): they are the
newest positions, so the next session numbers from the first of them
(`next_position`). A nacked delivery waiting for its republish was sent at least
once, so it ends as an uncertain row like any publish without a confirm.

A transfer with a decider (`decisions.py`) publishes on two links: moved deliveries to
the destination, kept ones back to the tail of their source queue. Each link numbers its
own confirms, so each has its own sequence numbers and its own unconfirmed deliveries
(a lane); positions, states and acks are one for both, so the source is acked past a
position only when every delivery before it is durable, whichever link confirmed it.

The source is acked with `multiple=True` up to the highest delivery tag below
which every delivery is DURABLE. A REFUSED or NACKED delivery stops that prefix: a
multiple ack past it would ack it too. Deliveries after one are acked one by one
once durable, so they neither hold the prefetch window nor come back as duplicates.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from rmq_spark.model import Delivery, DeliveryState
from rmq_spark.transfer.confirm_lanes import ConfirmLanes

# Flush the ledger when this share of the window is confirmed but not yet durable
# (or nothing else is unconfirmed, or the oldest waited MAX_FLUSH_DELAY_SECONDS):
# acks, and so new deliveries, follow confirms closely, while a ledger write holds a
# quarter of a window or more (each write is one append and one fsync).
FLUSH_FRACTION = 4
# ...or when the oldest confirmed-but-unwritten delivery has waited this long.
MAX_FLUSH_DELAY_SECONDS = 0.25


# States that stop the multiple-ack prefix for longer than a confirm round trip.
_BLOCKING = (DeliveryState.REFUSED, DeliveryState.NACKED)


@dataclass(frozen=True)
class Ack:
    """A basic.ack to send to the source."""

    tag: int
    multiple: bool


def prefetch_for(window_messages: int, window_bytes: int, average_message_bytes: float) -> int:
    """Consumer prefetch that keeps in-flight bytes near the byte window.

    AMQP 0-9-1 prefetch counts messages only (RabbitMQ ignores prefetch_size), so the
    byte window becomes a message count from the queue's average message size. A
    message larger than the whole byte window still moves, alone (prefetch 1).
    """
    if average_message_bytes <= 0:
        return window_messages
    by_bytes = int(window_bytes // average_message_bytes)
    return max(1, min(window_messages, by_bytes))


class TransferWindow:
    """In-flight deliveries of one queue transfer, keyed by source tag and publish seq.

    Publish sequence numbers are assigned here, in publish order starting at 1, the
    way RabbitMQ numbers them after confirm.select on a fresh channel.
    """

    def __init__(
        self,
        window_messages: int,
        *,
        first_position: int = 0,
        session: int = 0,
        clock: Callable[[], datetime],
    ) -> None:
        self.resize(window_messages)  # checks it, and sets when rows are flushed
        self._clock = clock
        self._by_tag: OrderedDict[int, Delivery] = OrderedDict()
        self._unconfirmed = ConfirmLanes()  # per link: the destination's, the kept one's
        self._unwritten: list[Delivery] = []
        self._next_position = first_position
        # Positions of first publishes withdrawn unsent: the next session gives them again.
        self._released: set[int] = set()
        self._session = session  # a window lives for one pair of links
        # Set by the first nack or refusal: only then can single acks be needed, so
        # the common case never scans the whole window on every confirm.
        self._ever_blocked = False

        self.in_flight_bytes = 0

    def resize(self, window_messages: int) -> None:
        """The prefetch changed (the byte window follows the sizes): flush in step."""
        if window_messages < 1:
            raise ValueError(f"window_messages must be >= 1, got {window_messages}")
        self._flush_at = max(1, window_messages // FLUSH_FRACTION)

    # -- events -------------------------------------------------------------------

    def on_publish(
        self,
        tag: int,
        *,
        redelivered: bool,
        body_size: int,
        body_sha256: str,
        properties_sha256: str,
        message_id: str | None,
        body: bytes | None = None,
        properties: bytes | None = None,
        consumed_at: datetime | None = None,
        priority: bool = False,
        kept: bool = False,
    ) -> Delivery:
        """Called for a delivery about to be published: gives it a position and a seq
        (of the kept link when `kept`: published back to its source queue).

        `consumed_at` defaults to the clock's reading now.
        """
        if self._by_tag and tag <= next(reversed(self._by_tag)):
            raise ValueError(f"delivery tag {tag} is not above the last one seen")
        lanes = self._unconfirmed
        if kept:
            seq = lanes.take_seq(kept=True)
        else:  # inline: a plain move's hot path
            seq = lanes.next_seq
            lanes.next_seq = seq + 1
        delivery = Delivery(
            tag=tag,
            seq=seq,
            position=self._next_position,
            redelivered=redelivered,
            body_size=body_size,
            body_sha256=body_sha256,
            properties_sha256=properties_sha256,
            message_id=message_id,
            consumed_at=consumed_at or self._clock(),
            session=self._session,
            body=body,
            properties=properties,
            priority=priority,
        )
        self._next_position += 1
        self._by_tag[tag] = delivery
        if kept:
            delivery.decision = "kept"
            lanes.kept[seq] = delivery
        else:
            lanes.destination[seq] = delivery
        self.in_flight_bytes += body_size
        return delivery

    def on_recognised(self, delivery: Delivery) -> None:
        """A redelivery an earlier session moved (`recognition.recognised_delivery`): never
        published, so it has no seq; it waits only for its row, then its ack."""
        if self._by_tag and delivery.tag <= next(reversed(self._by_tag)):
            raise ValueError(f"delivery tag {delivery.tag} is not above the last one seen")
        delivery.position, delivery.session = self._next_position, self._session
        self._next_position += 1
        self._by_tag[delivery.tag] = delivery
        self._unwritten.append(delivery)
        self.in_flight_bytes += delivery.body_size

    def on_confirm(self, seq: int, *, multiple: bool, kept: bool = False) -> list[Delivery]:
        """A basic.ack from the destination (from the kept link when `kept`). Returns
        the deliveries it confirmed."""
        confirmed = []
        now = self._clock()
        for delivery in self._unconfirmed.settle(seq, multiple, kept):
            if delivery.state is DeliveryState.REFUSED:
                continue  # returned before its ack: routed nowhere, so not confirmed
            delivery.state = DeliveryState.CONFIRMED
            delivery.confirmed_at = now
            delivery.body = delivery.properties = None
            self._unwritten.append(delivery)
            confirmed.append(delivery)
        return confirmed

    def on_nack(self, seq: int, *, multiple: bool, kept: bool = False) -> list[Delivery]:
        """A basic.nack from the destination (the kept link when `kept`). Returns the
        deliveries it nacked.

        They wait as NACKED until the mover either republishes or refuses them.
        """
        nacked = []
        for delivery in self._unconfirmed.settle(seq, multiple, kept):
            if delivery.state is not DeliveryState.REFUSED:
                delivery.state = DeliveryState.NACKED
                self._ever_blocked = True

                nacked.append(delivery)
        return nacked

    def republish(self, delivery: Delivery) -> None:
        """The nacked delivery was published again: it waits for a new confirm."""
        if delivery.state is not DeliveryState.NACKED:
            raise ValueError(f"delivery tag {delivery.tag} is {delivery.state.value}, not nacked")
        delivery.state = DeliveryState.PUBLISHED
        delivery.seq = self._unconfirmed.take_seq(delivery.decision == "kept")
        delivery.attempts += 1
        self._unconfirmed.add(delivery)

    def refuse(self, delivery: Delivery, reason: str) -> None:
        """Give up on a nacked delivery: it is never acked and goes back to the source."""
        self._refuse(delivery, reason)

    def withdraw(self, deliveries: list[Delivery]) -> None:
        """These publishes were never sent (their session ended first).

        Nobody will confirm them. A first publish cannot have arrived: it is neither
        uncertain nor ever acked, it goes back to the source with the channel, and its
        position is given again by the next session (`next_position`). A republish
        that was never sent is NACKED again: its earlier publish was sent, so the
        session's end writes it as uncertain (`mark_uncertain`).
        """
        for delivery in deliveries:
            if delivery.state is not DeliveryState.PUBLISHED:
                continue
            self._unconfirmed.of(delivery).pop(delivery.seq, None)
            if delivery.attempts > 1:
                delivery.state = DeliveryState.NACKED
                continue
            self._refuse(delivery, "not published: the session ended first")
            self._released.add(delivery.position)

    def mark_uncertain(self) -> list[Delivery]:
        """The session ends: nobody will confirm what is unconfirmed or nacked.

        Returns those deliveries, in position order; their rows are written without a
        confirm time, so a copy that did arrive is named in the ledger when the source
        redelivers it.
        """
        uncertain = self._unconfirmed.take_all()
        # Nacked ones still waiting for their republish were sent and never confirmed
        # either (a nack is no proof of absence: another queue on the route may hold a
        # copy); without a row their positions would be a gap.
        uncertain += [d for d in self._by_tag.values() if d.state is DeliveryState.NACKED]
        uncertain.sort(key=lambda delivery: delivery.position)
        for delivery in uncertain:
            delivery.state = DeliveryState.UNCERTAIN
            delivery.body = delivery.properties = None
        return uncertain

    def refuse_oversized(self, body_size: int, reason: str) -> Delivery | None:
        """The destination closed its channel over a message too large for it: that
        publish (`ConfirmLanes.take_oversized`) never arrived, so it is REFUSED, not
        uncertain. Returns it, or None if none matches."""
        delivery = self._unconfirmed.take_oversized(body_size)
        if delivery is not None:
            self._refuse(delivery, reason)
        return delivery

    def on_return(
        self, body_sha256: str, properties_sha256: str, reason: str, *, kept: bool = False
    ) -> Delivery | None:
        """A basic.return of a publish (`ConfirmLanes.returned`): REFUSED, never acked.
        Returns it, or None if none matches."""
        delivery = self._unconfirmed.returned(body_sha256, properties_sha256, kept=kept)
        if delivery is not None:
            self._refuse(delivery, reason)
        return delivery

    # -- what to do next ------------------------------------------------------------

    def should_flush(self, *, draining: bool = False) -> bool:
        """Whether the confirmed-but-unwritten deliveries should be written now."""
        if not self._unwritten:
            return False
        if draining or len(self._unwritten) >= self._flush_at or not self.unconfirmed:
            return True
        waited = self._clock() - self._unwritten[0].confirmed_at  # type: ignore[operator]
        return waited.total_seconds() >= MAX_FLUSH_DELAY_SECONDS

    def rows_to_write(self) -> list[Delivery]:
        """Confirmed deliveries whose rows nobody is writing yet, in position order.

        Each delivery is handed out once: the caller writes the rows (maybe on another
        thread) and calls `mark_durable` when they are durable; until then they are
        neither flushed again nor acked.
        """
        rows = sorted(self._unwritten, key=lambda delivery: delivery.position)
        self._unwritten = []
        return rows

    def mark_durable(self, deliveries: list[Delivery]) -> None:
        """The ledger rows of these deliveries are durable: they may now be acked."""
        written = {id(delivery) for delivery in deliveries}
        for delivery in deliveries:
            if delivery.state is not DeliveryState.CONFIRMED:
                raise ValueError(f"delivery tag {delivery.tag} is {delivery.state.value}")
            delivery.state = DeliveryState.DURABLE
        if self._unwritten:
            self._unwritten = [d for d in self._unwritten if id(d) not in written]

    def take_acks(self) -> list[Ack]:
        """The source acks that are safe now; acked deliveries are forgotten."""
        acks: list[Ack] = []
        prefix_end: int | None = None
        for tag, delivery in self._by_tag.items():
            if delivery.state is not DeliveryState.DURABLE:
                break
            prefix_end = tag
        if prefix_end is not None:
            acks.append(Ack(prefix_end, multiple=True))
            while self._by_tag and next(iter(self._by_tag)) <= prefix_end:
                self._forget(next(iter(self._by_tag)))
        if self._ever_blocked and any(d.state in _BLOCKING for d in self._by_tag.values()):
            # Past a refused or nacked delivery only single acks are safe; without them
            # the durable ones would hold prefetch slots until the nacked one resolves.
            singles = [t for t, d in self._by_tag.items() if d.state is DeliveryState.DURABLE]
            for tag in singles:
                acks.append(Ack(tag, multiple=False))
                self._forget(tag)
        return acks

    # -- state ----------------------------------------------------------------------

    def refused(self) -> list[Delivery]:
        return [d for d in self._by_tag.values() if d.state is DeliveryState.REFUSED]

    @property
    def in_flight(self) -> int:
        """Deliveries not yet acked at the source (refused ones included)."""
        return len(self._by_tag)

    @property
    def unconfirmed(self) -> int:
        """Publishes still waiting for their confirm (the destination's or the kept link's)."""
        return len(self._unconfirmed)

    @property
    def nacked(self) -> int:
        """Nacked deliveries waiting to be republished or refused."""
        return sum(1 for d in self._by_tag.values() if d.state is DeliveryState.NACKED)

    @property
    def settled(self) -> bool:
        """Nothing waits for a confirm, a ledger write or an ack (refused ones aside)."""
        return all(d.state is DeliveryState.REFUSED for d in self._by_tag.values())

    @property
    def next_position(self) -> int:
        """Where the next session numbers: past every position that was sent, so the
        positions of first publishes withdrawn at the end (the newest ones) are given
        again and the ledger's positions stay contiguous."""
        position = self._next_position
        while position - 1 in self._released:
            position -= 1
        return position

    # -- internals ------------------------------------------------------------------

    def _refuse(self, delivery: Delivery, reason: str) -> None:
        self._ever_blocked = True
        delivery.state = DeliveryState.REFUSED
        delivery.refusal = reason
        delivery.body = delivery.properties = None

    def _forget(self, tag: int) -> None:
        delivery = self._by_tag.pop(tag)
        self.in_flight_bytes -= delivery.body_size
