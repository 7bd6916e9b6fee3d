"""Unconfirmed publishes, per link: the destination's, and the kept link's.

Pure, no pika. A transfer with a decider (`decisions.py`) publishes on two links:
moved deliveries to the destination, kept ones back to the tail of their source queue
(on the source cluster). Each channel numbers its publisher confirms from 1 on its own,
so each link has its own sequence numbers and its own unconfirmed publishes, in publish
order; `window.TransferWindow` keeps one set of positions, states and acks over both.
A transfer without a decider only ever uses the destination's lane.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from hashlib import sha256

from rmq_spark.model import Delivery, DeliveryState

KEPT = "kept"


class ConfirmLanes:
    """The publishes awaiting a confirm, keyed by sequence number, one lane per link."""

    def __init__(self) -> None:
        self.destination: OrderedDict[int, Delivery] = OrderedDict()
        self.kept: OrderedDict[int, Delivery] = OrderedDict()
        # The next sequence number of each link (read and bumped inline by the window's
        # hot path for the destination).
        self.next_seq = 1
        self.next_kept_seq = 1

    def take_seq(self, kept: bool) -> int:
        """The next sequence number of the link a (kept or moved) delivery goes out on."""
        if kept:
            seq, self.next_kept_seq = self.next_kept_seq, self.next_kept_seq + 1
        else:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
        return seq

    def of(self, delivery: Delivery) -> OrderedDict[int, Delivery]:
        """The lane of the link `delivery` goes out on."""
        return self.kept if delivery.decision == KEPT else self.destination

    def lane(self, kept: bool) -> OrderedDict[int, Delivery]:
        return self.kept if kept else self.destination

    def add(self, delivery: Delivery) -> None:
        self.of(delivery)[delivery.seq] = delivery

    def settle(self, seq: int, multiple: bool, kept: bool) -> list[Delivery]:
        """The publishes a confirm (or nack) of `seq` on one link settles, leaving the lane."""
        lane = self.lane(kept)
        if multiple:
            settled = []
            while lane and next(iter(lane)) <= seq:
                settled.append(lane.popitem(last=False)[1])
            return settled
        delivery = lane.pop(seq, None)
        return [] if delivery is None else [delivery]

    def take_oversized(self, body_size: int) -> Delivery | None:
        """The destination closed its channel over a message of `body_size` bytes (too
        large for it): the earliest unconfirmed publish of that size, which never
        arrived, leaves the destination's lane. None if none matches."""
        lane = self.destination
        delivery = earliest_published(lane, lambda d: d.body_size == body_size)
        if delivery is not None:
            lane.pop(delivery.seq)
        return delivery

    def returned(self, body_sha256: str, properties_sha256: str, *, kept: bool) -> Delivery | None:
        """The publish a basic.return sent back (mandatory, routed nowhere; on the kept
        link when `kept`). It stays in its lane: its confirm follows.

        RabbitMQ sends the return before the confirm of the same message, and returns
        come in publish order, so the returned message is the earliest unconfirmed
        delivery with the same content. None if none matches.
        """
        return earliest_published(
            self.lane(kept),
            lambda d: d.body_sha256 == body_sha256 and sent_properties(d) == properties_sha256,
        )

    def take_all(self) -> list[Delivery]:
        """Every unconfirmed publish of both links (the session ends); the lanes empty."""
        every = [*self.destination.values(), *self.kept.values()]
        self.destination.clear()
        self.kept.clear()
        return every

    def __len__(self) -> int:
        return len(self.destination) + len(self.kept)

    def __iter__(self) -> Iterator[Delivery]:
        yield from self.destination.values()
        yield from self.kept.values()


def sent_properties(delivery: Delivery) -> str:
    """The digest of the property bytes a delivery was published with: the received ones'
    (the ledger's), or, when a decision rewrote them (a redrive's header policy), the
    rewritten ones', so a return of a rewritten message is matched and never confirmed."""
    if delivery.detail is None or delivery.detail.properties is None:
        return delivery.properties_sha256
    return sha256(delivery.detail.properties).hexdigest()


def earliest_published(
    lane: OrderedDict[int, Delivery], match: Callable[[Delivery], bool]
) -> Delivery | None:
    """The earliest publish of `lane` still waiting for its first answer that matches."""
    for delivery in lane.values():
        if delivery.state is DeliveryState.PUBLISHED and match(delivery):
            return delivery
    return None
