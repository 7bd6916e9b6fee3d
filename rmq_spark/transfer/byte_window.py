"""The byte window: how many deliveries the source may have out, from the sizes seen.

Pure logic, no pika, so every rule is unit-tested on its own.

AMQP 0-9-1 prefetch counts messages (RabbitMQ ignores `prefetch_size`), and the
management API's byte statistics are no guide to a queue's sizes: they lag by
seconds after a publish, are missing where the metrics collector is off, and an
average hides the few large messages of a mixed queue. So the mover keeps the
byte window itself, from the sizes it actually receives, in two parts:

1. **The prefetch follows the sizes.** It starts at what `window.bytes` allows
   for the largest message the source may hold (`first_estimate`: no larger than
   all the queue's ready bytes together, where the plan sampled them; otherwise
   `LARGEST_MESSAGE_BYTES`, so 1 for the default 64 MiB window) and, after each batch, is
   `window.bytes // estimate`, where the estimate is the largest message among
   the recent deliveries (this generation and the last, a generation being one
   prefetch's worth). Within the message limit: `window.messages`, or, from
   `window.start_messages`, what the measured rate says it has grown to
   (`window_growth.WindowGrowth`). The prefetch changes only when the
   new one is `CHANGE_FACTOR` times larger or smaller than the current one: a
   change means consuming again (see `Consumer.follow_sizes`), so a steady queue
   changes once, and sizes that wander a little change nothing. Between changes the
   source may send up to that factor more bytes than the window; the hard bound
   below keeps them out of the executor's memory.
2. **The hard bound.** The prefetch can only guess the size of messages the
   source has not sent yet. When the bytes held (received and not yet acked at
   the source: waiting to be logged, publishing, unconfirmed, being written)
   pass `window.bytes`, the mover stops reading the source connection until
   acks bring them back under (`DeliveryReader.pause`). So the bytes held never
   exceed `window.bytes` by more than the one message whose arrival crossed it.
   Messages the broker has already sent sit in the socket buffers meanwhile:
   the kernel's memory, not the executor's.
"""

from __future__ import annotations

from rmq_spark.transfer.window_growth import WindowGrowth

# RabbitMQ's default max_message_size from 3.8 to 3.13 (4.0 lowered it to 16 MiB):
# the largest message a source queue holds unless its broker says otherwise.
LARGEST_MESSAGE_BYTES = 128 * 1024 * 1024
# A prefetch this many times larger or smaller than the current one is worth a
# change (a new consumer, after the old one's deliveries are acked).
CHANGE_FACTOR = 1.25


def first_estimate(messages: object, message_bytes: object) -> int:
    """The largest message a source may hold, from its plan row's `messages` (exact) and
    `message_bytes` (the management API's sample of its ready bytes), for the first
    prefetch: no message is larger than all of them together.

    Why this bound and not the average the sample would also give: an average hides
    the one large message of a mixed queue; a sum cannot. Where the sample is no bound:
    it lags a publish by seconds, so messages that came after it are not counted (a
    live source); then the first prefetch is a guess like every later one, and the
    hard bound keeps the executor's memory to the window as it does for those. Why it
    matters: a queue that fits the window many times over (the many small queues of a
    fail-back) moves in one batch instead of one message, a change of consumer and then
    the rest, each round a ledger write before the publish and one before the ack.

    >>> first_estimate(20, 20 * 1024)
    20480
    >>> first_estimate(20, 0)  # no statistics: the largest RabbitMQ accepts
    134217728
    >>> first_estimate(None, None)  # a row without the plan's sample (a redrive's)
    134217728
    """
    if not (isinstance(messages, int) and isinstance(message_bytes, int)):
        return LARGEST_MESSAGE_BYTES
    if messages > 0 and 0 < message_bytes < LARGEST_MESSAGE_BYTES:
        return message_bytes
    return LARGEST_MESSAGE_BYTES


class ByteWindow:
    """The prefetch to ask of the source for one transfer, from the sizes received.

    `observe` is called once per batch of deliveries; `wanted_prefetch` says what
    the prefetch should be now, `qos_sent`/`qos_ok` track what the broker has.
    """

    def __init__(
        self,
        window_messages: int,
        window_bytes: int,
        *,
        largest_message: int = LARGEST_MESSAGE_BYTES,
        start_messages: int | None = None,
    ) -> None:
        if window_messages < 1:
            raise ValueError(f"window_messages must be >= 1, got {window_messages}")
        if window_bytes < 1:
            raise ValueError(f"window_bytes must be >= 1, got {window_bytes}")
        self.window_messages = window_messages
        self.window_bytes = window_bytes
        # The message limit: fixed at window_messages unless it starts lower and grows.
        self.growth = WindowGrowth(start_messages or window_messages, window_messages)
        self._estimate = max(1, largest_message)
        self._generation_max = 0  # largest message seen in this generation
        self._previous_max = 0  # ...and in the one before
        self._generation_left = 0
        self.granted = self._for(self._estimate)  # what the broker was last told
        self._asking = False  # a basic.qos is on its way
        self._generation_left = self.granted

    @property
    def estimate(self) -> int:
        """The message size the prefetch is sized for."""
        return self._estimate

    def observe(self, count: int, largest: int, *, now: float | None = None) -> None:
        """A batch of `count` deliveries arrived, the largest `largest` bytes; `now`
        (monotonic seconds) lets the message limit measure the rate and grow."""
        if count <= 0:
            return
        self._generation_max = max(self._generation_max, largest)
        self._generation_left -= count
        if self._generation_left <= 0:
            self._previous_max, self._generation_max = self._generation_max, 0
            self._generation_left = max(1, self._for(max(self._previous_max, 1)))
        self._estimate = max(self._generation_max, self._previous_max, 1)
        if now is not None and not self.growth.settled:
            bytes_bound = self.window_bytes // self._estimate <= self.growth.limit
            self.growth.observe(count, now=now, bytes_bound=bytes_bound)

    def wanted_prefetch(self) -> int | None:
        """The prefetch to send now, or None to leave the broker's as it is."""
        if self._asking:
            return None  # qos_ok asks again with what was learned meanwhile
        wanted = self._for(self._estimate)
        if wanted * CHANGE_FACTOR <= self.granted or wanted >= self.granted * CHANGE_FACTOR:
            return wanted
        return None

    def qos_sent(self, prefetch: int) -> None:
        self._asking = True
        self.granted = prefetch

    def qos_ok(self) -> None:
        self._asking = False

    def _for(self, size: int) -> int:
        return max(1, min(self.growth.limit, self.window_bytes // size))
