"""The depth bound: publish only while the destination queue is below a bound.

Pure logic, no I/O: the session asks the destination's depth (a passive
queue.declare on its own publishing channel, `DestinationLink.ask_depth`) when this
class says so, and tells it the answer.

Asking the broker before every batch would cost a round trip per batch. So the
bound keeps an upper estimate instead: the last depth the broker gave, plus the
publishes it may not have counted: those unconfirmed when the question was sent,
and those sent after it. (The declare follows the publishes on their channel, but a
classic queue answers its count ahead of the messages waiting in its mailbox, so
only a confirmed publish is surely counted.) Consumers only lower the real depth,
so while the estimate is below the bound, the queue is; the mover asks again only
when the estimate reaches it. Then it holds (the source paused) and asks every
`POLL_SECONDS` until the depth is a tenth of the bound below it (hysteresis: a slow
consumer does not make it ask and publish a few messages at a time), and goes on.

So the depth this mover causes never passes the bound; other publishers to a shared
destination (`destination.shared`) can add to it, and the bound holds back only
this mover.
"""

from __future__ import annotations

# While held, how often the depth is asked again: one passive declare per second is
# nothing to a broker, and a consumer draining a tenth of the bound takes longer.
POLL_SECONDS = 1.0


class DepthBound:
    """Publishes allowed by one destination queue's depth, for one transfer.

    Usage (by `gate.PublishGate`)::

        bound = DepthBound(10_000)
        bound.session_started()  # the depth is unknown: ask it (`wants_depth`)
        bound.asked(unconfirmed); ...; bound.answered(ready, now)
        allowed = bound.admit(count, now)  # then bound.published(allowed)
    """

    def __init__(self, bound: int) -> None:
        if bound < 1:
            raise ValueError(f"bound must be >= 1, got {bound}")
        self.bound = bound
        self.resume_at = bound - max(1, bound // 10)  # go on at or below this depth
        self._reading: int | None = None  # the broker's last answer
        self._published = 0  # publishes in this session
        self._published_at_reading = 0  # ...when the question `_reading` answers was sent
        self._published_at_ask = 0  # ...when the question out now was sent
        self._unconfirmed_at_reading = 0  # unconfirmed publishes when `_reading` was asked
        self._unconfirmed_at_ask = 0
        self._asking = False
        self._held_since: float | None = None
        self._held_total = 0.0

    @property
    def holding(self) -> bool:
        return self._held_since is not None

    @property
    def wants_depth(self) -> bool:
        """The depth must be asked (held, or unknown) and no question is out."""
        return not self._asking and (self._reading is None or self.holding)

    def session_started(self) -> None:
        """A new session: what the last one knew is stale; nothing goes until the
        depth is asked again (a hold carries over: it ends as any hold does)."""
        self._reading = None
        self._published = self._published_at_reading = self._published_at_ask = 0
        self._unconfirmed_at_reading = self._unconfirmed_at_ask = 0
        self._asking = False

    def asked(self, unconfirmed: int) -> None:
        """The question is sent; `unconfirmed` publishes of this session were not yet
        confirmed (the answer may leave them out)."""
        self._asking = True
        self._published_at_ask = self._published
        self._unconfirmed_at_ask = unconfirmed

    def answered(self, ready: int, now: float) -> None:
        """The broker's count of ready messages, as of the question."""
        self._asking = False
        self._reading = ready
        self._published_at_reading = self._published_at_ask
        self._unconfirmed_at_reading = self._unconfirmed_at_ask
        estimate = self._estimate()
        if estimate >= self.bound or (self.holding and estimate > self.resume_at):
            self._hold(now)
        else:
            self._release(now)

    def admit(self, count: int, now: float) -> int:
        """How many of `count` waiting publishes may go now (call `published` for
        those that did); past the estimate's room, it holds."""
        if self.holding or self._reading is None:
            return 0
        allowed = max(0, min(count, self.bound - self._estimate()))
        if allowed < count:
            self._hold(now)
        return allowed

    def published(self, count: int) -> None:
        self._published += count

    def held_seconds(self, now: float) -> float:
        current = 0.0 if self._held_since is None else now - self._held_since
        return self._held_total + current

    def _estimate(self) -> int:
        assert self._reading is not None
        return (
            self._reading
            + self._unconfirmed_at_reading
            + self._published
            - self._published_at_reading
        )

    def _hold(self, now: float) -> None:
        if self._held_since is None:
            self._held_since = now

    def _release(self, now: float) -> None:
        if self._held_since is not None:
            self._held_total += now - self._held_since
            self._held_since = None
