"""Reading what a broker meant when it closed a channel (pure, no pika).

RabbitMQ closes a channel with 406 PRECONDITION_FAILED for several unrelated
reasons, and only the reply text tells them apart. The mover reacts differently:

- "message size N is larger than [configured] max size M" (every version): the
  destination refuses a message above its `max_message_size` (128 MiB by default up
  to 3.13, 16 MiB from 4.0). No retry can help: the transfer fails, naming the size
  and the limit, and the message stays in the source.
- "delivery acknowledgement on channel N timed out" (3.x and 4.0): the source's
  consumer held a delivery longer than `consumer_timeout`, e.g. while the
  destination was blocked by an alarm. A new session rides it out. (4.3 evaluates
  the timeout in quorum queues and sends basic.cancel instead; classic queues and
  streams no longer time out there.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_OVERSIZE = re.compile(r"message size (\d+) is larger than (?:configured )?max size (\d+)")
_CONSUMER_TIMEOUT = re.compile(r"delivery acknowledgement on channel \d+ timed out")
PRECONDITION_FAILED = 406


@dataclass(frozen=True)
class Oversize:
    """A publish the destination refused for its size."""

    message_bytes: int
    max_message_size: int


def oversize(reply_code: int, reply_text: str) -> Oversize | None:
    """The sizes of a "message too large" channel close, or None for any other close.

    >>> oversize(406, "message size 8192 is larger than configured max size 4096")
    Oversize(message_bytes=8192, max_message_size=4096)
    """
    if reply_code != PRECONDITION_FAILED:
        return None
    found = _OVERSIZE.search(reply_text)
    if found is None:
        return None
    return Oversize(int(found.group(1)), int(found.group(2)))


def consumer_timed_out(reply_code: int, reply_text: str) -> bool:
    """Whether a channel close is the 3.x/4.0 consumer timeout."""
    return reply_code == PRECONDITION_FAILED and bool(_CONSUMER_TIMEOUT.search(reply_text))
