"""What the engine does with each message of a batch: the decision seam.

Pure, no pika and no Spark. A transfer without a decider takes today's path, byte
for byte: every delivery is published to the destination and nothing here runs. A
transfer with one (a route's `select`, a redrive) hands each batch the outbound side
has formed for its intents to `BatchDecider.decide` once, before positions and
intents are given, and gets one `Decision` per message, in the batch's order:

    batch of deliveries ──decide (once per batch)──► [Decision, ...]
        moved ──► published (routing_key None: to the route's destination queue;
                  else through `exchange` with `routing_key`, e.g. a redrive's origin)
        kept  ──► published back to the tail of its source queue (default exchange,
                  on the source cluster), exact bytes, in batch order

Both end as ledger rows (`decision` says which) and are acked at the source only once
the row is durable and the publish confirmed, whichever link confirmed it
(`window.TransferWindow`). A decider must be deterministic for a given message: a
message redelivered after a lost session is decided again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from rmq_spark.model import Delivery

if TYPE_CHECKING:  # imported when a batch is decided: a plain move never loads DuckDB
    from rmq_spark.selection import Message, Selection

DecisionKind = Literal["moved", "kept", "recognised"]
MOVED: DecisionKind = "moved"
KEPT: DecisionKind = "kept"
# A plain move's redelivery an earlier session already moved, acked without a publish
# (`recognition.py`); never a decider's.
RECOGNISED: DecisionKind = "recognised"
# Not the engine's: `rmq-spark replay` records a parked row it published so.
REPLAYED = "replayed"

NOT_SELECTED = "not selected"


@dataclass(frozen=True)
class Decision:
    """What happens to one message of a batch.

    `routing_key` None publishes to the route's destination queue as today; a string
    publishes through `exchange` with that key instead (a redrive: the origin queue
    through the default exchange). `properties` None sends the exact property bytes
    received; bytes send those instead (a redrive's header policy); the body is never
    changed. `reason` says why a message was kept, for the report.
    """

    kind: DecisionKind
    routing_key: str | None = None
    exchange: str = ""
    properties: bytes | None = None
    reason: str | None = None

    @property
    def kept(self) -> bool:
        return self.kind == KEPT


# Builds a transfer's decider where it runs (an executor): a decider holds a database
# connection, which does not travel, so the driver ships this instead. Pickled into the
# movers' task closure; e.g. a redrive's `redrive.decider.RedriveSpec`.
DeciderFactory = Callable[[], "BatchDecider"]

# The two decisions a selection gives, shared by every message (no object per message).
MOVE = Decision(MOVED)
KEEP_NOT_SELECTED = Decision(KEPT, reason=NOT_SELECTED)


class BatchDecider(Protocol):
    """Decides a batch at once; one `Decision` per message, in the batch's order."""

    def decide(self, messages: Sequence[Message]) -> list[Decision]: ...

    def close(self) -> None:
        """The transfer is over: free what deciding held (a database connection)."""


class SelectDecider:
    """A route's `select`: TRUE moves the message, FALSE or NULL keeps it in the source.

    >>> from rmq_spark.selection import Message, Selection
    >>> decider = SelectDecider(Selection.compile("body_size > 1", where="routes[0]"))
    >>> [d.kind for d in decider.decide([Message("", "", False, b"\\x00\\x00", b"ab")])]
    ['moved']
    """

    def __init__(self, selection: Selection) -> None:
        self._selection = selection

    @property
    def selection(self) -> Selection:
        return self._selection

    def decide(self, messages: Sequence[Message]) -> list[Decision]:
        return [
            MOVE if selected else KEEP_NOT_SELECTED
            for selected in self._selection.evaluate(messages)
        ]

    def close(self) -> None:
        self._selection.close()


def batch_messages(pending: Sequence[tuple[int, bool, bytes, bytes]]) -> list[Message]:
    """The selection's view of a batch of deliveries (tag, redelivered, body, properties).

    The exchange and routing key are not read off the wire: they are empty here, and a
    route's expression may not name them (`selection.columns.ROUTE_UNREAD`).
    """
    from rmq_spark.selection import Message

    return [
        Message("", "", redelivered, properties, body)
        for _tag, redelivered, body, properties in pending
    ]


def apply_decisions(batch: Sequence[Delivery], decisions: Sequence[Decision]) -> None:
    """Note on each delivery of a batch its decision when it says more than moved or kept
    (`TransferWindow.on_publish` has put it on its link): why it was kept, where a
    re-routed one goes (`Delivery.detail`); the property bytes a header policy rewrote
    replace the received ones for the publish (the ledger keeps the received ones'
    digest)."""
    for delivery, decision in zip(batch, decisions, strict=True):
        if decision is MOVE:
            continue
        delivery.detail = decision
        if decision.properties is not None:
            delivery.properties = decision.properties
