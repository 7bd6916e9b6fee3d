"""The nouns every side shares: no I/O, no pika, no Spark.

A queue transfer as planned (QueueTransfer), its name in the ledger (TransferKey),
one source delivery in flight (Delivery, DeliveryState) and what became of a
transfer (MoveOutcome), and the capacity rule both sides use (task_count,
queues_at_once). The driver (planning, pipeline, verify, report) and the executors'
engine (transfer/, ledger/writer.py) meet on these.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class QueueTransfer:
    """One row of the plan: a source queue and where its messages go."""

    route: str
    source_cluster: str
    source_vhost: str
    source_queue: str
    source_type: str
    source_node: str
    destination_cluster: str
    destination_vhost: str
    destination_queue: str
    messages: int  # exact ready count at plan time
    # Sampled by the management API; planning and display only. 0 with messages ready
    # means unknown: no statistics yet, or the metrics collector is off.
    message_bytes: int
    destination_messages: int  # exact ready count at plan time
    destination_created: bool = False  # missing at plan time; created (or, dry run, would be)
    destination_node: str = ""  # node hosting the destination (quorum leader), if it existed
    # classic | quorum | stream: the destination's type (as found, or as it is created);
    # "" when unknown (planned by an earlier driver of the run, before this was kept).
    destination_type: str = ""
    # The source's quorum delivery limit (delivery_limit.py), None when unlimited, and
    # what its broker does to a message past it; the movers stop before that can happen.
    source_delivery_limit: int | None = None
    source_past_limit: str = ""

    @property
    def key(self) -> TransferKey:
        """This transfer's identity: every stage joins on it, never on a label."""
        return TransferKey(
            source_cluster=self.source_cluster,
            source_vhost=self.source_vhost,
            source_queue=self.source_queue,
            destination_cluster=self.destination_cluster,
            destination_vhost=self.destination_vhost,
            destination_queue=self.destination_queue,
        )

    # Display only (the plan table, `plan --json`'s "source"/"destination", progress
    # bars): "/" is legal inside vhost and queue names, so these strings are ambiguous.
    @property
    def source_label(self) -> str:
        return f"{self.source_cluster}/{self.source_vhost}/{self.source_queue}"

    @property
    def destination_label(self) -> str:
        return f"{self.destination_cluster}/{self.destination_vhost}/{self.destination_queue}"

    def describe(self) -> str:
        """How messages name this transfer (`TransferKey.label`)."""
        return self.key.label()

    @property
    def bytes_known(self) -> bool:
        """Whether the management API said how many bytes the source holds."""
        return self.message_bytes > 0 or self.messages == 0

    @property
    def average_message_bytes(self) -> float:
        return self.message_bytes / self.messages if self.messages else 0.0


@dataclass(frozen=True)
class TransferKey:
    """Names one queue transfer; the TRANSFER_KEY columns without run_id.

    The one identity of a transfer: plan rows, outcomes, the queues table's rows,
    verdicts and ledger files are matched on it (its six fields), never on a label,
    since RabbitMQ allows "/" (and ":") inside vhost and queue names.

    >>> TransferKey("dr", "a/b", "c", "main", "a/b", "c") == TransferKey(
    ...     "dr", "a", "b/c", "main", "a", "b/c")
    False
    """

    source_cluster: str
    source_vhost: str
    source_queue: str
    destination_cluster: str
    destination_vhost: str
    destination_queue: str

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TransferKey:
        """The key of a row holding the six columns (a ledger, counters or summary row)."""
        return cls(*(str(row[name]) for name in _KEY_FIELDS))

    def label(self) -> str:
        """`cluster:vhost:queue -> cluster:vhost:queue`, how messages and logs name it.

        For people only: the names may hold ":" and "/" (colons, not slashes, because
        the default vhost is "/").
        """
        return (
            f"{self.source_cluster}:{self.source_vhost}:{self.source_queue} -> "
            f"{self.destination_cluster}:{self.destination_vhost}:{self.destination_queue}"
        )

    @property
    def file_prefix(self) -> str:
        """Data files of this transfer start with this, so a retried task finds its own.

        A hash of the six fields, each length-prefixed, so no two transfers share it
        (vhost "a/b" + queue "c" and vhost "a" + queue "b/c" did, when it hashed a label).
        """
        encoded = b"".join(
            b"%d:%s" % (len(raw), raw)
            for raw in (getattr(self, name).encode() for name in _KEY_FIELDS)
        )
        return f"part-{hashlib.sha256(encoded).hexdigest()[:16]}-"

    @property
    def legacy_file_prefix(self) -> str:
        """The prefix earlier builds gave the transfer's files: a hash of its "/"-joined
        label, shared by transfers whose joined names collide.

        Read, never written, so a run started by an earlier build resumes under this
        one (`resume.next_position`, `tables.rows_from_intents`). Remove in the release
        after 0.1.0 (docs/LEDGER.md, "File names").
        """
        label = (
            f"{self.source_cluster}/{self.source_vhost}/{self.source_queue} -> "
            f"{self.destination_cluster}/{self.destination_vhost}/{self.destination_queue}"
        )
        return f"part-{hashlib.sha256(label.encode()).hexdigest()[:16]}-"


_KEY_FIELDS: tuple[str, ...] = (
    "source_cluster",
    "source_vhost",
    "source_queue",
    "destination_cluster",
    "destination_vhost",
    "destination_queue",
)


class DeliveryState(enum.Enum):
    PUBLISHED = "published"
    NACKED = "nacked"
    CONFIRMED = "confirmed"
    DURABLE = "durable"
    REFUSED = "refused"
    UNCERTAIN = "uncertain"


@dataclass
class Delivery:
    """One source delivery in flight, and what the ledger will say about it."""

    tag: int
    seq: int
    position: int
    redelivered: bool
    body_size: int
    body_sha256: str
    properties_sha256: str
    message_id: str | None
    consumed_at: datetime
    session: int = 0
    confirmed_at: datetime | None = None
    state: DeliveryState = DeliveryState.PUBLISHED
    attempts: int = 1
    refusal: str | None = field(default=None, repr=False)
    # Kept until the destination confirms, so a nacked message can be published again
    # without going back to the source. Bounded by the window like the delivery itself.
    body: bytes | None = field(default=None, repr=False)
    properties: bytes | None = field(default=None, repr=False)
    # Its properties set `priority` (a RabbitMQ 4.x quorum destination delivers by it).
    priority: bool = False
    # What a decider (transfer/decisions.py) made of it: "moved" to the destination, or
    # "kept" (published back to the tail of its source queue, on the source's kept link).
    decision: str = "moved"
    # The decider's `transfer.decisions.Decision` when it says more than moved or kept
    # (why it was kept, a redrive's origin queue, rewritten properties); None otherwise.
    # One field, not four: every delivery of a plain move builds it.
    detail: Any = field(default=None, repr=False)

    @property
    def routed(self) -> tuple[str, str] | None:
        """(exchange, routing key) a moved delivery's decision sends it through, or None:
        to the link's own queue (a plain move's destination, a kept one's source)."""
        detail = self.detail
        if detail is None or self.decision == "kept" or detail.routing_key is None:
            return None
        return (detail.exchange, detail.routing_key)

    @property
    def publish_exchange(self) -> str | None:
        """The ledger's `publish_exchange`: the routed exchange, None for the link's own."""
        route = self.routed
        return None if route is None else route[0]

    @property
    def publish_routing_key(self) -> str | None:
        """The ledger's `publish_routing_key`: the routed key, None for the link's own."""
        route = self.routed
        return None if route is None else route[1]

    @property
    def reason(self) -> str | None:
        """Why a decider kept it, or a redrive's death reason for a moved one."""
        return None if self.detail is None else self.detail.reason


@dataclass(frozen=True)
class MoveOutcome:
    """What happened to one queue transfer (the ledger holds the per-message truth)."""

    key: TransferKey
    status: str  # "moved" | "failed"
    error: str | None
    messages: int
    bytes: int
    first_position: int
    next_position: int
    seconds: float
    sessions: int
    # A selective move's messages published back to their source (not in `messages`).
    kept: int = 0
    # Redeliveries an earlier session had moved, acked without a publish (not in
    # `messages`; transfer/recognition.py).
    recognised: int = 0
    # Fences a selective move acked at its source (its own, and stale ones of earlier
    # runs): removed from the source by the mover, never ledgered (transfer/selective.py).
    fences: int = 0
    # Most body bytes held at once (received, not yet acked at the source): the byte
    # window's bound is window.bytes plus one message (byte_window.py).
    peak_held_bytes: int = 0
    # The message window it ended with: window.messages, or what it grew to from
    # window.start_messages as the rate it measured grew (window_growth.py).
    window_messages: int = 0
    # The limits this transfer kept to (a config.Limits; None: unlimited), and how
    # long the rate brake and the destination depth bound held its publishes back.
    rate_limits: Any = None
    rate_held_seconds: float = 0.0
    depth_held_seconds: float = 0.0
    # Moved messages whose properties set `priority`: a quorum destination on RabbitMQ
    # 4.x delivers them by it, not in source order (read from the flags word alone).
    priority_messages: int = 0


# The capacity rule both sides use: the driver plans task_count partitions, each
# executor task moves queues_at_once of its queues at a time.
def task_count(max_active: int, queues_per_task: int) -> int:
    """Mover tasks for a plan: each moves up to queues_per_task queues at once, and
    together they never move more than max_active."""
    if max_active < 1 or queues_per_task < 1:
        raise ValueError(
            f"max_active and queues_per_task must be >= 1, got {max_active}, {queues_per_task}"
        )
    return max(1, max_active // queues_per_task)


def queues_at_once(max_active: int, queues_per_task: int) -> int:
    """How many queues one task moves at once (see task_count)."""
    return min(queues_per_task, max_active)
