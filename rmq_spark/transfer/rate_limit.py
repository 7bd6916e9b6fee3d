"""The brake for live destinations: how many of the waiting publishes may go now.

Pure logic, no I/O and no clock of its own (`now` is passed in), so every rule is
unit-tested over a simulated clock.

A DR fail-back pours a backlog into a production cluster while its applications
run; `limits.messages_per_second` and `limits.bytes_per_second` keep the mover to a
rate the destination can take alongside them. Each limit is a token bucket: tokens
flow in at the limit's rate up to a small burst (`BURST_SECONDS` of the rate), and a
publish spends one token per message, or one per body byte. So over any span of T
seconds a transfer publishes at most `rate * T + burst` and one message, and, while
its source has a backlog, no less than `rate * T - burst - rate * MIN_WAIT_SECONDS`:
within 1% of the limit over 10 s.

A publish goes whenever its bucket is not in debt, and spends its whole cost, which
may take the bucket below zero; the next waits until the debt is paid. So a message
larger than the burst still goes (alone), and a timer that fires late loses nothing:
the tokens that came in meanwhile are counted, as long as they stay within the
burst.

`Outbound.publish_pending` asks `admit` before each batch: it publishes what is
admitted, keeps the rest, and pauses reading the source until the timer that
`wait_seconds` asks for lets it go on (`Session`): the brake never spins.
"""

from __future__ import annotations

from collections.abc import Sequence

from rmq_spark.config import Limits

# The burst a bucket holds, in seconds of its rate: small, so the rate over short
# spans stays close to the limit, yet a few messages per I/O loop iteration.
BURST_SECONDS = 0.05
# The shortest wait the brake asks of the loop: at high limits, one timer per this
# many seconds publishes a batch instead of one message per timer.
MIN_WAIT_SECONDS = 0.01
# Float sums of refills may leave a paid debt a hair below zero.
_ROUNDING = 1e-9


class TokenBucket:
    """`rate` tokens per second, holding at most `burst`; it starts full."""

    def __init__(self, rate: float, burst: float, *, now: float) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        if burst <= 0:
            raise ValueError(f"burst must be > 0, got {burst}")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def tokens(self, now: float) -> float:
        """Tokens available at `now` (negative while in debt)."""
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
        return self._tokens

    def fits(self, now: float) -> bool:
        """Whether a publish may go now, whatever it costs: the bucket is not in debt."""
        return self.tokens(now) >= -_ROUNDING

    def spend(self, cost: float, now: float) -> None:
        self._tokens = self.tokens(now) - cost

    def seconds_until_fits(self, now: float) -> float:
        """How long until the debt is paid; 0 when a publish fits now."""
        return max(0.0, -self.tokens(now) / self.rate)


def bucket_for(rate: float | None, *, now: float, minimum_burst: float) -> TokenBucket | None:
    """The bucket for one limit, or None when it is unlimited."""
    if rate is None:
        return None
    return TokenBucket(rate, max(minimum_burst, rate * BURST_SECONDS), now=now)


class RateBrake:
    """One transfer's publish rate: messages per second and body bytes per second.

    Usage (by `outbound.Outbound`)::

        brake = RateBrake(limits, now=monotonic())
        allowed = brake.admit(monotonic(), [len(body) for ... in pending])
        # publish pending[:allowed]; if some are left:
        call_later(brake.wait_seconds(monotonic()), publish_pending)

    It also keeps the time it held publishes back (`held_seconds`), for the report.
    """

    def __init__(self, limits: Limits, *, now: float) -> None:
        self.limits = limits
        self._messages = bucket_for(limits.messages_per_second, now=now, minimum_burst=1)
        self._bytes = bucket_for(limits.bytes_per_second, now=now, minimum_burst=1)
        self._held_since: float | None = None
        self._held_total = 0.0

    @property
    def holding(self) -> bool:
        """Publishes are waiting for tokens."""
        return self._held_since is not None

    def admit(self, now: float, sizes: Sequence[int]) -> int:
        """How many of the waiting messages (body sizes, in order) may be published
        now; their tokens are spent. The rest wait: the brake holds until a later
        `admit` lets all that waits go."""
        messages, byte_bucket = self._messages, self._bytes
        allowed = 0
        for size in sizes:
            if messages is not None and not messages.fits(now):
                break
            if byte_bucket is not None and not byte_bucket.fits(now):
                break
            if messages is not None:
                messages.spend(1, now)
            if byte_bucket is not None:
                byte_bucket.spend(size, now)
            allowed += 1
        if allowed < len(sizes):
            if self._held_since is None:
                self._held_since = now
        elif self._held_since is not None:
            self._held_total += now - self._held_since
            self._held_since = None
        return allowed

    def wait_seconds(self, now: float) -> float:
        """How long until the next message may go; at least MIN_WAIT_SECONDS, so a
        timer publishes a batch, not a message."""
        wait = 0.0
        for bucket in (self._messages, self._bytes):
            if bucket is not None:
                wait = max(wait, bucket.seconds_until_fits(now))
        return max(wait, MIN_WAIT_SECONDS)

    def held_seconds(self, now: float) -> float:
        """Time spent holding publishes back so far (the current hold included)."""
        current = 0.0 if self._held_since is None else now - self._held_since
        return self._held_total + current
