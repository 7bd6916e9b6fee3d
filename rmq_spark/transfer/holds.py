"""Why a session waits to publish, or to read the source: one set of reasons. Pure.

Each reason is set where it begins and released where it ends; `Holds.release`
is the one place that says whether anything still holds, so the caller resumes
only then (`Outbound.release`, `Outbound.may_read`):

    reason    holds        set when                                released when
    INTENTS   publishing   a batch goes to the intents lane        its intents are durable
                           (one batch at a time: group commit)     and it is published
    RATE      publishing   the rate brake admits fewer than wait   its timer fires (tokens came in)
    DEPTH     publishing   the depth bound admits fewer than wait  the destination's depth answer
                           (at its bound, or its depth unknown)    is below the bound
    BYTES     reading      the bytes held pass the byte window     acks bring them back under

What publishing waits for is never lost: it is not acked, so the source's prefetch
bounds how much waits, and a hold on publishing does not pause reading (a pause
would stop every queue sharing the connection, `amqp091/pool.py`). Two waits are
kept elsewhere, each by its own state machine: the consumer's (a prefetch change
consumes again once the old consumer's deliveries are acked, `prefetch.py`) and the
end (a closing session publishes nothing more, `session.Ending`). A destination
connection blocked by a broker alarm is not a hold here: the broker stops reading
the socket, so what is published waits in its buffers, and `blocked_timeout_seconds`
ends a session blocked for too long (`amqp091/links.py`).
"""

from __future__ import annotations

import enum


class Activity(enum.Enum):
    PUBLISHING = "publishing"
    READING = "reading the source"


class Hold(enum.Enum):
    """One reason to wait, and what it holds."""

    INTENTS = "a batch's intents are being logged"
    RATE = "the rate brake"
    DEPTH = "the destination's depth bound"
    BYTES = "the byte window"

    @property
    def activity(self) -> Activity:
        return Activity.READING if self is Hold.BYTES else Activity.PUBLISHING


_PUBLISHING = frozenset(hold for hold in Hold if hold.activity is Activity.PUBLISHING)
_READING = frozenset(hold for hold in Hold if hold.activity is Activity.READING)


class Holds:
    """The reasons one session waits now."""

    __slots__ = ("_reasons",)

    def __init__(self) -> None:
        self._reasons: set[Hold] = set()

    def __contains__(self, reason: Hold) -> bool:
        return reason in self._reasons

    @property
    def reasons(self) -> frozenset[Hold]:
        return frozenset(self._reasons)

    @property
    def publishing_held(self) -> bool:
        """Something holds publishing: what waits stays pending."""
        return not self._reasons.isdisjoint(_PUBLISHING)

    def hold(self, reason: Hold) -> None:
        self._reasons.add(reason)

    def release(self, reason: Hold) -> bool:
        """`reason` no longer holds; whether nothing else holds what it held (its
        activity), so that activity may resume now."""
        self._reasons.discard(reason)
        same = _READING if reason.activity is Activity.READING else _PUBLISHING
        return self._reasons.isdisjoint(same)
