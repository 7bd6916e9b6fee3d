"""Recognising redeliveries an earlier session already moved: ack them, publish nothing.

Pure logic, no pika. A session that dies (its task or its driver killed, its source
connection lost) leaves messages unacked at the source; they come back to the next
session redelivered, first and in their order (a classic queue requeues them at their
place, a quorum queue returns them ahead of the rest, in the order they were delivered).
Some of them were confirmed by the destination and their rows made durable before the
session died, only their ack never reached the source: their copy is in the destination
already. Publishing them again makes a duplicate; `Recognition` names them, so the new
session acks them without publishing and records a row with decision `recognised`.

A wrong match would lose a message (acked, never published), so a match is proven,
never guessed. The earlier session is the one that logged the transfer's highest
position (`recognition_for`). Its positions are its confirmed rows (L), in order, then
the publishes it never saw confirmed (T: intents without a row, uncertain rows). What
its source had not acked is a suffix of L (acks go out in order, a durable write at a
time), then all of T (never acked), then what it received and never logged. So:

- recognition needs T not empty: T's first message is then certainly redelivered, and
  comes before anything the earlier session received and never logged;
- a message of the transfer's earlier rows whose checksums (body and property bytes)
  appear at one position only is told apart from all the others, T's included; so is
  one whose body alone does (a quorum queue re-encodes a redelivery's property bytes:
  it adds x-delivery-count, and RabbitMQ 3.x sorts the headers);
- the new session's first delivery, redelivered, with the checksums (or the body) of
  some row L[a] of that kind, can then only be L[a] itself: neither T's first (other
  checksums) nor a message never logged (those come after T's first);
- each next delivery must be L[a+1], L[a+2], ... (redelivered, its checksums or its
  body, told apart as above); recognition stops for the session at the first that is
  not, or past L's end.

Anything else is moved as before: a duplicate the ledger names, never a loss. The one
case the proof does not cover is another consumer of the source that, during the lost
session, took a message byte-identical to the last one the lost session acked and put
it back ahead of the unacked ones (`mover.recognise_redeliveries: false` turns this off
where sources have consumers of their own during a move).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from hashlib import sha256
from typing import Any

from rmq_spark.model import Delivery, DeliveryState
from rmq_spark.transfer.decisions import MOVED, RECOGNISED, Decision
from rmq_spark.transfer.ports import Connector

# Decisions a recognisable session may have made: a plain move's (null in old rows).
_PLAIN = (None, MOVED, RECOGNISED)

Checksums = tuple[str, str]  # (body_sha256, properties_sha256)


@dataclass(frozen=True)
class EarlierRow:
    """What recognition reads of one earlier ledger row or intent of the transfer."""

    position: int
    checksums: Checksums
    confirmed: bool  # a row with a confirm time (an intent has none)
    attempt: str  # task attempt
    session: int
    publish_attempts: int
    decision: str | None


class Recognition:
    """Matches one session's first redeliveries against the earlier session's confirmed
    rows (L), in order; `match` says whether a delivery is its earlier row's message."""

    def __init__(
        self,
        confirmed: list[tuple[int, Checksums]],
        unique: frozenset[Checksums],
        unique_bodies: frozenset[str],
    ) -> None:
        self._confirmed = confirmed  # L: (position, checksums), in position order
        self._by_checksums = {checksums: i for i, (_p, checksums) in enumerate(confirmed)}
        self._by_body = {checksums[0]: i for i, (_p, checksums) in enumerate(confirmed)}
        self._unique = unique
        self._unique_bodies = unique_bodies
        self._next: int | None = None  # L's index the next delivery must be
        self.active = bool(confirmed)
        self.recognised = 0
        self.last_position = -1  # the earlier row the last match named

    def match(self, redelivered: bool, checksums: Checksums) -> Checksums | None:
        """The earlier row's checksums when this delivery is that row's message (its
        position is then `last_position`), or None; after a None (or past L's end) the
        session's deliveries are never matched again."""
        if not self.active:
            return None
        index = self._index_of(checksums) if self._next is None else self._next
        if redelivered and index is not None and index < len(self._confirmed):
            position, earlier = self._confirmed[index]
            if self._same(earlier, checksums):
                self._next = index + 1
                self.recognised += 1
                self.last_position = position
                if self._next == len(self._confirmed):
                    self.active = False  # T's first comes next: moved as before
                return earlier
        self.active = False
        return None

    def _index_of(self, checksums: Checksums) -> int | None:
        index = self._by_checksums.get(checksums)
        return self._by_body.get(checksums[0]) if index is None else index

    def _same(self, earlier: Checksums, checksums: Checksums) -> bool:
        """Told apart from every other earlier message: by both checksums, or, when the
        property bytes differ, by a body no other earlier row has. A quorum queue
        re-encodes a redelivery's properties (adds x-delivery-count, RabbitMQ 3.x also
        sorts the headers), so only its body is as the earlier session received it."""
        if earlier == checksums:
            return checksums in self._unique
        return earlier[0] == checksums[0] and checksums[0] in self._unique_bodies

    def take(
        self,
        pending: Sequence[tuple[int, bool, bytes, bytes]],
        connector: Connector,
        consumed_at: datetime,
    ) -> list[Delivery]:
        """The leading deliveries of a batch (tag, redelivered, body, property bytes)
        that `match`, as the window's confirmed deliveries (`recognised_delivery`)."""
        recognised = []
        for tag, redelivered, body, property_bytes in pending:
            received = (sha256(body).hexdigest(), connector.digest_properties(property_bytes))
            earlier = self.match(redelivered, received)
            if earlier is None:
                break
            recognised.append(
                recognised_delivery(
                    tag,
                    body_size=len(body),
                    checksums=earlier,
                    message_id=connector.message_id_of(property_bytes),
                    consumed_at=consumed_at,
                    earlier=self.last_position,
                )
            )
        return recognised


def recognised_delivery(
    tag: int,
    *,
    body_size: int,
    checksums: Checksums,
    message_id: str | None,
    consumed_at: datetime,
    earlier: int,
) -> Delivery:
    """The window's delivery for a redelivery recognised as `earlier`'s message: never
    published (no seq, no attempt), confirmed already; its row names the earlier
    position (`reason`) and carries the earlier row's checksums (a quorum queue
    re-encodes a redelivery's property bytes), and the window gives it its own position
    (`TransferWindow.on_recognised`)."""
    return Delivery(
        tag=tag,
        seq=0,
        position=-1,
        redelivered=True,
        body_size=body_size,
        body_sha256=checksums[0],
        properties_sha256=checksums[1],
        message_id=message_id,
        consumed_at=consumed_at,
        confirmed_at=consumed_at,
        state=DeliveryState.CONFIRMED,
        attempts=0,
        decision=RECOGNISED,
        detail=Decision(RECOGNISED, reason=f"moved earlier at position {earlier}"),
    )


def recognition_for(rows: Iterable[EarlierRow]) -> Recognition | None:
    """A `Recognition` from the transfer's earlier rows and intents (every session of
    every attempt), or None when nothing can be proven (see the module's docstring)."""
    by_position: dict[int, list[EarlierRow]] = {}
    for row in rows:
        by_position.setdefault(row.position, []).append(row)
    if not by_position:
        return None
    copies: Counter[Checksums] = Counter()
    bodies: Counter[str] = Counter()
    for entries in by_position.values():
        for checksums in {entry.checksums for entry in entries}:
            copies[checksums] += 1
        for body in {entry.checksums[0] for entry in entries}:
            bodies[body] += 1
    unique = frozenset(checksums for checksums, count in copies.items() if count == 1)
    unique_bodies = frozenset(body for body, count in bodies.items() if count == 1)
    # A position given again after a session withdrew it has entries of two sessions
    # of one task attempt: the later one logged it last.
    last = max(by_position[max(by_position)], key=lambda entry: entry.session)
    session = (last.attempt, last.session)
    confirmed: list[tuple[int, Checksums]] = []
    unconfirmed = 0
    for position in sorted(by_position):
        entries = [e for e in by_position[position] if (e.attempt, e.session) == session]
        if not entries:
            continue
        if any(e.publish_attempts > 1 or e.decision not in _PLAIN for e in entries):
            return None  # a nack, a refusal, a selective move: acks were not in order
        if any(e.confirmed for e in entries):
            if unconfirmed:
                return None  # a confirmed row after an unconfirmed one: not L then T
            confirmed.append((position, entries[0].checksums))
        else:
            unconfirmed += 1
    if not unconfirmed or not confirmed:
        return None  # no T: its first message is what proves a match
    return Recognition(confirmed, unique, unique_bodies)


def earlier_rows(columns: Mapping[str, Sequence[Any]]) -> list[EarlierRow]:
    """`EarlierRow`s from ledger columns (a `pa.Table.to_pydict()` of DATA_SCHEMA's)."""
    decisions = columns.get("decision") or [None] * len(columns["position"])
    return [
        EarlierRow(
            position=position,
            checksums=(body, properties),
            confirmed=confirmed_at is not None,
            attempt=attempt,
            session=session,
            publish_attempts=attempts,
            decision=decision,
        )
        for position, body, properties, confirmed_at, attempt, session, attempts, decision in zip(
            columns["position"],
            columns["body_sha256"],
            columns["properties_sha256"],
            columns["confirmed_at"],
            columns["task_attempt"],
            columns["session"],
            columns["publish_attempts"],
            decisions,
            strict=True,
        )
    ]
