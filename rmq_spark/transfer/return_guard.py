"""The executors' guard on a quorum source's delivery limit (`ReturnGuard`).

A quorum queue drops (or dead-letters) a message whose returns pass its delivery limit
(`broker.delivery_limit` says how each RabbitMQ version counts them and reads the
limit on the driver). The mover returns a message only when a session ends while it
holds it, so each lost session, and each Spark task attempt, can add one to a held
message's count: the guard, fed each delivery's `x-delivery-count`, stops the
transfer while one more such return would still be safe. Pure logic.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReturnGuard:
    """Decides, per delivery, whether the transfer must stop taking messages.

    `limit` is the source's delivery limit (None: unlimited); `later_attempts` the
    Spark task attempts that may still run after this one. A delivery arrives with
    the count of returns it has had (`x-delivery-count`). If this session is lost it
    has one more; a tripped guard ends the attempt (no reconnect), and each later
    attempt trips on the first sight of it, adding at most one each. So a message
    seen at count `c` can end at `c + 1 + later_attempts`, and the guard trips while
    that is still at most the limit: when `c + 2 + later_attempts > limit`, i.e. one
    more ordinary lost session would make it unsafe.
    """

    limit: int | None
    later_attempts: int = 0
    past_limit: str = "dropped"  # what the source's broker does past the limit
    highest_count: int = 0
    tripped: bool = False

    @property
    def active(self) -> bool:
        return self.limit is not None

    @property
    def stop_at(self) -> int | None:
        """The count at which the guard trips (None: never)."""
        if self.limit is None:
            return None
        return self.limit - self.later_attempts - 1

    def observe(self, count: int) -> bool:
        """Record a delivery's return count; True the first time it trips the guard."""
        self.highest_count = max(self.highest_count, count)
        stop_at = self.stop_at
        if stop_at is None or self.tripped or count < stop_at:
            return False
        self.tripped = True
        return True


def attempt_number(attempt: str) -> int:
    """The Spark attempt number of an executor's 'stage.partition.attempt' (0 outside)."""
    last = attempt.rsplit(".", 1)[-1]
    return int(last) if last.isdigit() else 0
