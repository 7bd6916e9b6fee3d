"""What a redrive's ledger rows and the queues' exact depths prove, per destination.

Pure: plain ledger rows (dicts with the messages table's columns) and depth readings
in, counts and verdicts out; no Spark, no broker. A redrive is one transfer whose
moved messages go to several queues (`publish_routing_key`, `publish_exchange`), so the
plain move's one-destination figures (`verify/`) cannot say what arrived where; this
module says it for each destination.

**The witness for a destination.** A moved message is published with `mandatory` and
acked at the DLQ only after the broker confirmed it; a message routed nowhere comes
back as a return and is never confirmed (`confirm_lanes.sent_properties`). Through the default
exchange the routing key names exactly one queue, so a confirm is the broker's word
that the origin queue took the message. The origin's exact depth, read before and
after, is a second, independent witness, honest only where nothing else changes it:

- no consumer at either reading, and the rise is between the confirmed rows and all
  rows (uncertain ones may have arrived): `depth`, proven;
- no consumer at either reading, and the rise is short of the confirmed rows, when
  something could have taken them that is not a loss: the queue removes messages by
  itself (a message TTL or a length limit, by argument or policy), the redriven
  messages carry a restored per-message TTL, or the queue's delivery counter rose
  between the readings (a consumer that came and went): `confirms`, unproven, with
  that cause named, never `missing` (the confirms say the queue took every one);
- no consumer at either reading, and the rise is short of the confirmed rows with
  none of those causes: the shortfall is `missing`, and the destination fails. The
  management's counters lag by up to its statistics interval (5 s by default), so a
  consumer that came and went just before the second reading can still be `missing`;
  the console then names the possible causes;
- a consumer at either reading, messages above all rows (another publisher), or no
  depth to read (`--to-exchange`: an exchange, not a queue, was the destination):
  `confirms`, the broker's confirms alone, reported as unproven, never as clean.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MOVED, KEPT = "moved", "kept"
WITNESS_DEPTH, WITNESS_CONFIRMS = "depth", "confirms"


@dataclass(frozen=True)
class QueueReading:
    """One exact reading of a queue (passive queue.declare): ready messages, consumers;
    and from the management API what may take messages from it between two readings
    without a consumer there at either: the limits it enforces by itself (`message-ttl`,
    `max-length`, `max-length-bytes`, by argument or policy) and its delivery counter
    (deliveries and gets so far; None when the API has none yet)."""

    depth: int
    consumers: int
    removes_by_itself: tuple[str, ...] = ()
    delivered: int | None = None


# What a queue enforces by itself that removes messages with no consumer: a message TTL
# or a length limit (drop-head, or dead-lettering the overflow), by argument or policy.
_REMOVING_LIMITS = ("message-ttl", "max-length", "max-length-bytes")


def removes_by_itself(
    queue: Mapping[str, Any], policies: Iterable[Mapping[str, Any]] = ()
) -> tuple[str, ...]:
    """The limits a queue may enforce (`_REMOVING_LIMITS`): by its arguments (a management
    API queue object's) or by a policy that applies to it (`policies`: the definitions
    of the user and operator policies that match its name, `broker.policy_match`).

    >>> removes_by_itself({"arguments": {"x-message-ttl": 60000}},
    ...                   [{"definition": {"max-length": 10}}])
    ('message-ttl', 'max-length')
    """
    arguments = queue.get("arguments") or {}
    defined = [policy.get("definition") or {} for policy in policies]
    return tuple(
        name
        for name in _REMOVING_LIMITS
        if arguments.get(f"x-{name}") is not None
        or any(definition.get(name) is not None for definition in defined)
    )


def delivered_so_far(queue: Mapping[str, Any]) -> int | None:
    """The queue's delivery counter (deliveries and gets, acked or not) from a management
    API queue object; None when it has no statistics (never delivered, or collection off).

    >>> delivered_so_far({"message_stats": {"deliver_get": 7}}), delivered_so_far({})
    (7, None)
    """
    value = (queue.get("message_stats") or {}).get("deliver_get")
    return int(value) if isinstance(value, int) else None


def takers(before: QueueReading, after: QueueReading, *, expiring: bool) -> tuple[str, ...]:
    """What may have taken messages from a queue between two readings, loss aside.

    >>> takers(QueueReading(0, 0, ("message-ttl",)), QueueReading(0, 0), expiring=False)
    ('message-ttl',)
    >>> takers(QueueReading(0, 0, delivered=4), QueueReading(0, 0, delivered=9), expiring=True)
    ('restored per-message TTL', 'a consumer came and went')
    """
    found = list(dict.fromkeys(before.removes_by_itself + after.removes_by_itself))
    if expiring:
        found.append("restored per-message TTL")
    if (
        before.delivered is not None
        and after.delivered is not None
        and after.delivered > before.delivered
    ):
        found.append("a consumer came and went")
    return tuple(found)


def destination_of(row: Mapping[str, Any], dead_letter_queue: str) -> str:
    """Where a row's message went: its origin queue, `exchange/key` through another
    exchange, or the DLQ for a kept one (what the dry run's table names)."""
    if row.get("decision") != MOVED or row.get("publish_routing_key") is None:
        return dead_letter_queue
    exchange = row.get("publish_exchange") or ""
    key = str(row["publish_routing_key"])
    return key if not exchange else f"{exchange}/{key}"


def decision_counts(
    rows: Iterable[Mapping[str, Any]], dead_letter_queue: str
) -> Counter[tuple[str, str, str]]:
    """(decision, destination, reason) -> confirmed rows: the run's counterpart of the
    dry run's plan (`decider.plan_counts`), so both print as one table.

    >>> rows = [{"decision": "moved", "publish_exchange": "", "publish_routing_key": "orders",
    ...          "reason": "rejected", "confirmed_at": 1}]
    >>> decision_counts(rows, "shop.dlq")
    Counter({('moved', 'orders', 'rejected'): 1})
    """
    counts: Counter[tuple[str, str, str]] = Counter()
    for row in rows:
        if row.get("confirmed_at") is None:
            continue
        decision = str(row.get("decision") or MOVED)
        where = destination_of(row, dead_letter_queue)
        counts[(decision, where, str(row.get("reason") or ""))] += 1
    return counts


@dataclass(frozen=True)
class DestinationVerdict:
    """What arrived in one destination of a redrive, and what proves it."""

    destination: str
    confirmed: int  # moved rows the broker confirmed (duplicates included: each arrived)
    uncertain: int  # published, confirm never came: arrived or not
    before: QueueReading | None
    after: QueueReading | None
    witness: str
    missing: int  # confirmed, yet the depth (no consumer at either reading) did not rise
    # Why the depth cannot witness a shortfall (`takers`): a confirms-only verdict's cause.
    unproven_because: tuple[str, ...] = ()

    @property
    def rise(self) -> int | None:
        if self.before is None or self.after is None:
            return None
        return self.after.depth - self.before.depth

    @property
    def proven(self) -> bool:
        return self.witness == WITNESS_DEPTH and self.missing == 0


def destination_verdict(
    destination: str,
    confirmed: int,
    uncertain: int,
    before: QueueReading | None,
    after: QueueReading | None,
    *,
    expiring: bool = False,
) -> DestinationVerdict:
    """The verdict on one destination from its rows and its two readings (module doc);
    `expiring`: the redriven messages may carry a restored per-message TTL.

    >>> destination_verdict("orders", 3, 0, QueueReading(0, 0), QueueReading(3, 0)).proven
    True
    >>> destination_verdict("orders", 3, 0, QueueReading(0, 1), QueueReading(1, 1)).witness
    'confirms'
    """
    witness, missing = WITNESS_CONFIRMS, 0
    because: tuple[str, ...] = ()
    if before is not None and after is not None and before.consumers == after.consumers == 0:
        rise = after.depth - before.depth
        if rise < confirmed:
            because = takers(before, after, expiring=expiring)
            if not because:
                witness, missing = WITNESS_DEPTH, confirmed - rise
        elif rise <= confirmed + uncertain:
            witness = WITNESS_DEPTH
    return DestinationVerdict(
        destination, confirmed, uncertain, before, after, witness, missing, because
    )


def destination_verdicts(
    rows: Iterable[Mapping[str, Any]],
    dead_letter_queue: str,
    before: Mapping[str, QueueReading],
    after: Mapping[str, QueueReading],
    *,
    expiring: bool = False,
) -> list[DestinationVerdict]:
    """One verdict per destination the moved rows name, sorted by name; `before` and
    `after` hold the readings of the destinations that are queues."""
    confirmed: Counter[str] = Counter()
    uncertain: Counter[str] = Counter()
    for row in rows:
        if row.get("decision") != MOVED:
            continue
        where = destination_of(row, dead_letter_queue)
        (confirmed if row.get("confirmed_at") is not None else uncertain)[where] += 1
    return [
        destination_verdict(
            where,
            confirmed[where],
            uncertain[where],
            before.get(where),
            after.get(where),
            expiring=expiring,
        )
        for where in sorted(set(confirmed) | set(uncertain))
    ]


@dataclass(frozen=True)
class SourceVerdict:
    """The DLQ's side: every message examined has a row, moved or kept; none lost."""

    examined: int  # distinct positions in the ledger
    moved: int  # confirmed moved rows, less redelivered repeats of a confirmed one
    kept: int  # confirmed kept rows (back at the DLQ's tail), less repeats
    uncertain: int
    positions_contiguous: bool
    drop: int  # the DLQ's exact depth before less after
    lost: int  # what left the DLQ beyond what was moved
    # Confirmed, redelivered rows repeating a confirmed row's checksums and message id:
    # published twice (a killed run's last confirms, whose source acks never came), named.
    duplicates: int = 0

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.positions_contiguous


def source_verdict(
    rows: Sequence[Mapping[str, Any]],
    before: QueueReading,
    after: QueueReading,
    *,
    stale_fences: int = 0,
) -> SourceVerdict:
    """The DLQ's verdict. A kept message went back to the DLQ's tail, so what left it is
    the moved ones and the fences of earlier runs the move dropped (`stale_fences`; its
    own fence came and went): its depth may fall by no more than that (less when
    messages arrived meanwhile; never more, or some left without a row).

    >>> rows = [{"position": 0, "decision": "moved", "confirmed_at": 1},
    ...         {"position": 1, "decision": "kept", "confirmed_at": 1}]
    >>> source_verdict(rows, QueueReading(2, 0), QueueReading(1, 0)).lost
    0
    """
    positions = {int(row["position"]) for row in rows}
    contiguous = not positions or (min(positions) == 0 and len(positions) == max(positions) + 1)
    seen: set[tuple[Any, ...]] = set()
    counts: Counter[str] = Counter()
    for row in sorted(rows, key=lambda r: int(r["position"])):
        if row.get("confirmed_at") is None:
            counts["uncertain"] += 1
            continue
        content = (row.get("body_sha256"), row.get("properties_sha256"), row.get("message_id"))
        if row.get("redelivered") and content in seen:
            counts["duplicates"] += 1  # a repeat of a confirmed one, not another message
            continue
        seen.add(content)
        counts[str(row.get("decision") or MOVED)] += 1
    drop = before.depth - after.depth
    return SourceVerdict(
        examined=len(positions),
        moved=counts[MOVED],
        kept=counts[KEPT],
        uncertain=counts["uncertain"],
        positions_contiguous=contiguous,
        drop=drop,
        lost=max(drop - counts[MOVED] - stale_fences, 0),
        duplicates=counts["duplicates"],
    )
