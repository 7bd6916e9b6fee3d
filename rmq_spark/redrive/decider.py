"""The redrive's decision per message: back to its origin queue, or kept in the DLQ and why.

A message is moved when all three hold: the `--where` selection is TRUE for it (no
selection: every message), its `x-death` names an origin (`origin.py`), and that queue
exists (the driver lists the vhost's queues before the run). It goes through the default
exchange with the origin queue's name as routing key, so only that queue gets it; with
`to_exchange`, through the exchange and routing key its `x-death` recorded, so every queue
bound there gets it (what an application republishing it would do). Its property block
is the header policy's rewrite (`headers.py`). Anything else stays in the DLQ, in order,
with one of the reasons below, which the report counts.

Deterministic for a given message, as the engine requires (a redelivered message is
decided again and must land in the same place).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from rmq_spark.redrive.headers import HeaderAction, HeaderPolicy, rewrite
from rmq_spark.redrive.origin import Death, origin
from rmq_spark.selection import Message, Selection
from rmq_spark.selection.fields import FieldDecodeError, read_properties
from rmq_spark.transfer.decisions import KEPT, MOVED, NOT_SELECTED, Decision

NO_X_DEATH = "no x-death"
ORIGIN_GONE = "origin queue gone"
UNREADABLE = "unreadable properties"
KEPT_REASONS = (NOT_SELECTED, NO_X_DEATH, ORIGIN_GONE, UNREADABLE)


class RedriveDecider:
    """Decides a batch of a DLQ's messages (`transfer.decisions.BatchDecider`).

    >>> decider = RedriveDecider("orders.dlq", existing={"orders"})
    >>> decider.decide([Message("", "", False, b"\\x00\\x00", b"x")])[0].reason
    'no x-death'
    """

    def __init__(
        self,
        dead_letter_queue: str,
        existing: Collection[str],
        selection: Selection | None = None,
        policy: HeaderPolicy | None = None,
        to_exchange: bool = False,
    ) -> None:
        self._queue = dead_letter_queue
        self._existing = frozenset(existing)
        self._selection = selection
        self._policy = policy or HeaderPolicy()
        self._to_exchange = to_exchange

    @property
    def dead_letter_queue(self) -> str:
        return self._queue

    @property
    def selection(self) -> Selection | None:
        return self._selection

    def decide(self, messages: Sequence[Message]) -> list[Decision]:
        decisions = []
        for message, chosen in zip(messages, self._selected(messages), strict=True):
            if chosen is None:
                decisions.append(Decision(KEPT, reason=UNREADABLE))
            elif chosen:
                decisions.append(self._one(message))
            else:
                decisions.append(Decision(KEPT, reason=NOT_SELECTED))
        return decisions

    def _selected(self, messages: Sequence[Message]) -> list[bool | None]:
        """The selection's answer per message; None for a block it cannot read."""
        if self._selection is None:
            return [True] * len(messages)
        try:
            return list(self._selection.evaluate(messages))
        except FieldDecodeError:
            pass  # one block in the batch is unreadable: ask message by message
        answers: list[bool | None] = []
        for message in messages:
            try:
                answers.extend(self._selection.evaluate([message]))
            except FieldDecodeError:
                answers.append(None)
        return answers

    def _one(self, message: Message) -> Decision:
        try:
            death = origin(read_properties(message.properties), self._queue)
        except FieldDecodeError:
            return Decision(KEPT, reason=UNREADABLE)
        if death is None:
            return Decision(KEPT, reason=NO_X_DEATH)
        if death.queue not in self._existing:
            return Decision(KEPT, reason=ORIGIN_GONE)
        try:
            properties = rewrite(message.properties, self._policy, death.original_expiration)
        except FieldDecodeError:
            return Decision(KEPT, reason=UNREADABLE)
        exchange, routing_key = self._route(death)
        return Decision(
            MOVED,
            routing_key=routing_key,
            exchange=exchange,
            properties=properties,
            reason=death.reason,
        )

    def _route(self, death: Death) -> tuple[str, str]:
        if self._to_exchange and death.exchange is not None:
            return death.exchange, death.routing_key
        return "", death.queue

    def close(self) -> None:
        if self._selection is not None:
            self._selection.close()


@dataclass(frozen=True)
class RedriveSpec:
    """What builds a redrive's decider on an executor (`transfer.decisions.DeciderFactory`).

    Plain values, so it pickles into the movers' task closure; the `--where` expression
    is compiled where it runs (its DuckDB connection does not travel). The driver has
    checked it already (`preflight.compile_where`).

    >>> spec = RedriveSpec("orders.dlq", frozenset({"orders"}))
    >>> spec().dead_letter_queue
    'orders.dlq'
    """

    dead_letter_queue: str
    existing: frozenset[str]
    where: str | None = None
    broker_headers: str = HeaderAction.MOVE.value
    restore_expiration: bool = False
    to_exchange: bool = False

    def __call__(self) -> RedriveDecider:
        selection = None if self.where is None else Selection.compile(self.where, where="--where")
        return RedriveDecider(
            self.dead_letter_queue,
            self.existing,
            selection=selection,
            policy=HeaderPolicy(HeaderAction(self.broker_headers), self.restore_expiration),
            to_exchange=self.to_exchange,
        )


def plan_counts(
    decider: RedriveDecider, messages: Sequence[Message]
) -> Counter[tuple[str, str, str]]:
    """(decision, where, reason) -> how many: what `--dry-run` prints.

    `where` is the origin queue (or exchange/routing key) for a moved message and the DLQ
    for a kept one; `reason` is the death reason for a moved one and why for a kept one.
    """
    counts: Counter[tuple[str, str, str]] = Counter()
    for decision in decider.decide(messages):
        if decision.kind == MOVED:
            where = (
                decision.routing_key
                if not decision.exchange
                else f"{decision.exchange}/{decision.routing_key}"
            )
        else:
            where = decider.dead_letter_queue
        counts[(decision.kind, where or "", decision.reason or "")] += 1
    return counts
