"""A selective move's session: the kept link, and the fence that ends the move.

No pika. A transfer with a decider (`decisions.py`, a route's `select`) examines exactly
the messages its source held when the move began, and publishes back the ones it keeps:

1. **The kept link.** Beside the destination link the session opens a second publishing
   link, on the SOURCE cluster, with confirms, publishing through the default exchange
   with the source queue's name (`ports.Connector.connect_kept`). A kept message goes
   out on it, exact bytes, in batch order, so kept messages keep their order among
   themselves at the tail of the queue.
2. **The fence.** Before consuming, the session publishes one small message of its own
   to the source queue's tail, on the kept link, and waits for its confirm: every
   message present before it is ahead of it, every kept message behind it. The session
   consumes until the fence arrives, takes nothing after it (what was delivered past it
   is never acked and goes back with the channel), and once everything before it is
   settled acks the fence with one `multiple` ack (every earlier tag is acked already,
   so it covers only the fence and stale fences of earlier runs) and finishes. Draining
   to empty cannot end a selective move: kept messages re-enter the queue.
3. **Resume.** `FenceState` outlives a session: a session after a lost one finds the
   fence its transfer published and does not publish another. Once the fence's publish
   is confirmed, the session records it in the ledger before it consumes
   (`ledger/fences.py`), so a later Spark task attempt of the run finds it there and
   publishes none either. A fence is known by its message-id
   (`rmq-spark-fence:<run id>:<transfer>`): a fence of another run met on the way is a
   stale one, dropped (acked with ours), never moved, kept, counted or ledgered. Only a
   task killed between the fence's confirm and its record leaves a fence the next
   attempt does not know of: that attempt publishes another, stops at the earlier one
   (the same id), so order holds, and the later one stays in the queue until the next
   selective move of that queue drops it. Other consumers of the source see the fence
   while the move runs (docs/selection.md).

The kept link numbers its confirms from 1 like any channel; the fence took one of them,
so `KeptEvents` hands the window the kept publishes' own numbers (`TransferWindow` keeps
one lane per link: `confirm_lanes.py`).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from hashlib import sha256
from typing import Protocol

from rmq_spark.errors import RmqSparkError
from rmq_spark.model import Delivery, TransferKey
from rmq_spark.transfer.decisions import BatchDecider, Decision, batch_messages
from rmq_spark.transfer.ports import DestinationLink, Side, SourceLink
from rmq_spark.transfer.window import Ack, TransferWindow

log = logging.getLogger(__name__)

FENCE_PREFIX = "rmq-spark-fence:"
FENCE_BODY = (
    b"rmq-spark fence: a selective move of this queue stops here. It removes this message "
    b"when done; if it is left, the next selective move of the queue removes it."
)
# Property flags: delivery-mode (persistent, like the fence must be) and message-id.
_DELIVERY_MODE, _MESSAGE_ID = 1 << 12, 1 << 7


def fence_id(run_id: str, key: TransferKey) -> str:
    """The message-id of a transfer's fence: its run and its transfer."""
    return f"{FENCE_PREFIX}{run_id}:{key.file_prefix}"


def fence_properties(message_id: str) -> bytes:
    """The fence's AMQP property block: persistent, with its message-id."""
    raw = message_id.encode("utf-8")
    return struct.pack(">HB", _DELIVERY_MODE | _MESSAGE_ID, 2) + bytes((len(raw),)) + raw


@dataclass
class FenceState:
    """A transfer's fence, across its sessions (`mover.QueueMover` keeps one)."""

    message_id: str
    published: bool = False  # confirmed and recorded (by this task attempt or an earlier one)
    reached: bool = False  # consumed and acked: the selective move is done
    stale_dropped: int = 0  # fences of earlier runs met and dropped
    # A safety net, not the bound: if another consumer takes the fence, kept messages
    # would come round again and again. Past this many examined, the transfer fails
    # (nothing lost: the rest stays in the source). None: no limit.
    examine_limit: int | None = None
    examined: int = 0


class SelectiveHost(Protocol):
    """What the selective side needs of its session."""

    @property
    def closing(self) -> bool: ...

    @property
    def failing(self) -> bool: ...

    def idle(self) -> bool: ...

    def fail(self, reason: str) -> None: ...

    def finish(self) -> None:
        """Every message before the fence is settled and the fence acked: close."""

    def consume_when_ready(self) -> None:
        """The fence is in the source: the consumer may start (once the destination is)."""

    def fence_confirmed(self) -> None:
        """The source confirmed the fence: record it, then `consume_when_ready`."""

    def kept_lost(self, reason: str) -> None: ...

    def kept_refused(self, error: RmqSparkError) -> None: ...

    def kept_closed(self) -> None: ...


class Selective:
    """One session's selective side: decides batches, publishes kept ones, watches the fence."""

    def __init__(
        self,
        host: SelectiveHost,
        *,
        key: TransferKey,
        decider: BatchDecider,
        fence: FenceState,
        window: TransferWindow,
        source: SourceLink,
        message_id_of: Callable[[bytes], str | None],
        on_delivery: Callable[[int, bool, bytes, bytes], bool],
        clock: Callable[[], datetime],
    ) -> None:
        self._host = host
        self._key = key
        self.decider = decider
        self.fence = fence
        self._window = window
        self._source = source
        self._message_id_of = message_id_of
        self._forward = on_delivery
        self._clock = clock
        self.kept: DestinationLink | None = None  # set by the session once connected
        self._fence_seq: int | None = None  # the kept link's seq of our fence publish
        self._fence_confirmed = False
        self.fence_tag: int | None = None  # the source's tag of our fence, once reached
        self.kept_messages = 0

    # -- deciding and publishing ----------------------------------------------------

    def decide(self, pending: Sequence[tuple[int, bool, bytes, bytes]]) -> list[Decision]:
        """The decider's answer for each delivery of a batch, in batch order."""
        return self.decider.decide(batch_messages(pending))

    def publish(self, deliveries: Sequence[Delivery], destination: DestinationLink) -> None:
        """Publish a logged batch: moved ones to the destination, kept ones back to the
        source's tail, each link's in batch order."""
        moved = [d for d in deliveries if d.decision != "kept"]
        kept = [d for d in deliveries if d.decision == "kept"]
        if moved:
            destination.publish(moved)
        if kept:
            assert self.kept is not None
            self.kept.publish(kept)

    @property
    def kept_open(self) -> bool:
        return self.kept is not None and self.kept.is_open

    # -- the fence ------------------------------------------------------------------

    def kept_ready(self) -> None:
        """The kept link has confirms on: publish the fence, unless this transfer's
        earlier session already did (then consume at once)."""
        if self.fence.published:
            self._host.consume_when_ready()
            return
        assert self.kept is not None
        self._fence_seq = 1
        fence = Delivery(
            tag=0,
            seq=0,
            position=-1,
            redelivered=False,
            body_size=len(FENCE_BODY),
            body_sha256="",
            properties_sha256="",
            message_id=self.fence.message_id,
            consumed_at=self._clock(),
            body=FENCE_BODY,
            properties=fence_properties(self.fence.message_id),
        )
        self.kept.publish([fence])

    def on_delivery(self, tag: int, redelivered: bool, body: bytes, properties: bytes) -> bool:
        """The source link's per-delivery call on a selective move: fences are not
        messages, and nothing past our fence is examined (never acked, it goes back)."""
        if self.fence_tag is not None:
            return True
        message_id = self._message_id_of(properties)
        fence = self.fence
        fence.examined += 1
        if fence.examine_limit is not None and fence.examined > fence.examine_limit:
            if fence.examined == fence.examine_limit + 1:
                self._host.fail(
                    f"examined {fence.examine_limit} messages without meeting the move's "
                    f"fence ({fence.message_id}): did another consumer take it? The rest "
                    f"stays in the source"
                )
            return True  # never acked: it goes back with the channel
        if message_id is not None and message_id.startswith(FENCE_PREFIX):
            if message_id == self.fence.message_id:
                self.fence_tag = tag
                log.info("%s: reached its fence; finishing", self._key.label())
            else:
                self.fence.stale_dropped += 1  # acked with ours (multiple)
                log.info("%s: dropping a stale fence %s", self._key.label(), message_id)
            return True
        return self._forward(tag, redelivered, body, properties)

    def step(self) -> None:
        """Tick: once the fence is reached and everything before it settled, ack it
        (multiple: every earlier tag is acked, stale fences are dropped with it)."""
        if self.fence_tag is None or self._host.closing or self._host.failing:
            return
        if not self._host.idle() or not self._source.is_open:
            return
        self._source.ack([Ack(self.fence_tag, multiple=True)])
        self.fence.reached = True
        self._host.finish()

    # -- the kept link's confirms ---------------------------------------------------

    def on_confirm(self, seq: int, *, multiple: bool, ack: bool) -> list[Delivery]:
        """A confirm on the kept link. Returns the deliveries it nacked (to retry)."""
        fence_seq = self._fence_seq
        waiting = fence_seq is not None and not self._fence_confirmed
        if waiting and (seq == fence_seq or (multiple and seq > (fence_seq or 0))):
            if not ack:
                self._host.fail("the source refused (nacked) the selective move's fence")
                return []
            self._fence_confirmed = True
            self._host.fence_confirmed()
        if fence_seq is not None:
            seq -= fence_seq  # the window numbers the kept publishes from 1
            if seq < 1:
                return []
        if ack:
            self.kept_messages += len(self._window.on_confirm(seq, multiple=multiple, kept=True))
            return []
        return self._window.on_nack(seq, multiple=multiple, kept=True)

    def on_return(self, body: bytes, properties: bytes, reason: str) -> None:
        returned = self._window.on_return(
            sha256(body).hexdigest(), sha256(properties).hexdigest(), reason, kept=True
        )
        position = returned.position if returned else "fence"
        self._host.fail(
            f"a kept message was {reason} on its way back to the source (position "
            f"{position}); is the source queue there?"
        )


class KeptEvents:
    """`ports.SessionEvents` of the kept link: its news, told to the selective side."""

    def __init__(self, selective: Selective, host: SelectiveHost, settle: Callable[[], None]):
        self._selective = selective
        self._host = host
        self._settle = settle
        self.retry: Callable[[Delivery], None] = lambda _delivery: None

    def on_ready(self, side: Side) -> None:
        self._selective.kept_ready()

    def on_confirm(self, seq: int, *, multiple: bool, ack: bool) -> None:
        for delivery in self._selective.on_confirm(seq, multiple=multiple, ack=ack):
            self.retry(delivery)
        self._settle()

    def on_return(self, body: bytes, properties: bytes, reason: str) -> None:
        self._selective.on_return(body, properties, reason)

    def on_channel_closed(self, side: Side, code: int, text: str) -> None:
        self._host.kept_lost(f"the broker closed the kept link's channel ({code} {text})")

    def on_lost(self, side: Side, reason: str) -> None:
        self._host.kept_lost(reason)

    def on_refused(self, side: Side, error: RmqSparkError) -> None:
        self._host.kept_refused(error)

    def on_closed(self, side: Side) -> None:
        self._host.kept_closed()

    # A publishing link never consumes: these never come.
    def on_prefetch_set(self) -> None:
        return None

    def on_delivery(self, tag: int, redelivered: bool, body: bytes, properties: bytes) -> bool:
        return True

    def on_depth(self, ready: int, consumers: int) -> None:
        return None

    def on_destination_depth(self, ready: int) -> None:
        return None

    def on_cancel_ok(self) -> None:
        return None

    def on_got(
        self, tag: int, redelivered: bool, body: bytes, properties: bytes, remaining: int
    ) -> None:
        return None

    def on_get_empty(self) -> None:
        return None

    def on_consumer_cancelled(self) -> None:
        return None
