"""How far the message window grows: a hill climb on the rate it measures. Pure, no pika.

A transfer's rate is bound by round trips: a message holds a prefetch slot from its
delivery through its intent, publish, confirm and durable row to its ack, so a window
of W messages moves at most W per turn. Near the brokers a turn is short and the
brokers' CPU is the limit long before the window is; far away (a destination in
another region, 40-80 ms each way) every turn carries the round trip, and a window a
local run fills makes the brokers idle. Which one holds a transfer back is not known
in advance, so the window measures it:

- It starts at `window.start_messages` and, while the transfer runs, counts the
  deliveries it takes. After a change the first window's worth is not counted (the
  consumer was just changed: the pipe refills), then `TURNS` windows' worth, and at
  least `MIN_SECONDS`, give the rate at this window.
- The first rate, or one at least `GAIN` above the best so far, means the window was
  the limit: it grows by `FACTOR`, up to `window.messages`. A rate that did not gain
  settles it where it is: the brokers (or the bytes) are the limit now, and a larger
  window would only hold more messages unacked.
- A window whose prefetch the byte bound sets (large messages) is settled at once:
  more messages could not be out anyway.

Each growth is a change of consumer (`prefetch.ConsumerState`: the old consumer's
deliveries acked first), so the window grows a few times at most (1000 to 20000 in
five steps), and a short queue finishes before it is measured at all.
"""

from __future__ import annotations

# Windows' worth of deliveries that measure one window's rate.
TURNS = 3
# ... and at least this long. Three turns of a small window far away take a tenth of
# a second, where one scheduling stall of a busy box (tens of ms) could hide even a
# doubled rate and settle the window early; half a second cannot hide it. A window of
# thousands near the brokers takes longer than this anyway.
MIN_SECONDS = 0.5
# A rate this much above the best so far says the window was the limit.
GAIN = 0.10
# How much a window grows at a time.
FACTOR = 2


class WindowGrowth:
    """The message limit of one transfer's window: `limit`, from `start` up to `ceiling`.

    >>> growth = WindowGrowth(1000, 4000)
    >>> growth.observe(1000, now=0.0, bytes_bound=False)  # the first window refills
    False
    >>> growth.observe(3000, now=1.0, bytes_bound=False)  # 3000/s: the first rate grows it
    True
    >>> growth.limit
    2000
    >>> growth.observe(2000, now=1.0, bytes_bound=False)  # the refill after the change
    False
    >>> growth.observe(6000, now=3.0, bytes_bound=False)
    False
    >>> growth.limit, growth.settled  # 3000/s again: the window is no longer the limit
    (2000, True)
    """

    def __init__(self, start: int, ceiling: int) -> None:
        if not 1 <= start <= ceiling:
            raise ValueError(f"the window's start must be in 1..{ceiling}, got {start}")
        self.limit = start
        self._ceiling = ceiling
        self.settled = start >= ceiling
        self._to_skip = start  # the window after a change refills the pipe: not counted
        self._counted = 0
        self._since = 0.0
        self._best_rate: float | None = None

    def observe(self, count: int, *, now: float, bytes_bound: bool) -> bool:
        """`count` deliveries were taken at `now` (monotonic seconds); `bytes_bound`: the
        byte window, not the message limit, sets the prefetch. True when `limit` grew."""
        if self.settled or count <= 0:
            return False
        if bytes_bound:
            self.settled = True
            return False
        if self._to_skip > 0:
            self._to_skip -= count
            if self._to_skip <= 0:
                self._counted, self._since = 0, now
            return False
        self._counted += count
        if self._counted < TURNS * self.limit or now - self._since < MIN_SECONDS:
            return False
        rate = self._counted / (now - self._since)
        if self._best_rate is not None and rate < self._best_rate * (1 + GAIN):
            self.settled = True
            return False
        self._best_rate = rate
        self.limit = min(self._ceiling, self.limit * FACTOR)
        self.settled = self.limit >= self._ceiling
        self._to_skip = self.limit
        return True
