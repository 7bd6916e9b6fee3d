"""The engine's part of the config: each transfer's window and how its mover rides out
refusals, alarms and lost connections (`window:` and `mover:`)."""

from __future__ import annotations

from pydantic import Field, model_validator

from rmq_spark.config.strict import Strict

# The window a transfer starts with unless `window.start_messages` says otherwise: the
# fixed window of earlier releases, which a local run fills (the window curve's plateau).
DEFAULT_START_MESSAGES = 5000


class WindowConfig(Strict):
    """In-flight limits per queue transfer: unacked deliveries and their bytes.

    A transfer is bound by round trips (deliver, publish, confirm, durable row, ack),
    so its rate grows with the window until the brokers are busy: on the benchmark's
    machine 1000 gave about three quarters of the rate of 5000 (`make bench`, the
    window curve), and a destination 40 ms away needs more. So the window starts at
    `start_messages` and grows while the rate it measures grows with it, up to
    `messages`. The byte limit keeps memory bounded whatever the message sizes.
    """

    messages: int = Field(default=20000, ge=1, le=65535)
    """The most unacked deliveries in flight per queue transfer (the consumer prefetch's
    upper bound). The window starts at `start_messages` and doubles while the rate it
    measures over three windows' worth of deliveries (and at least half a second) gains a
    tenth (a destination far away), up to this; set it to `start_messages` for a fixed window."""
    start_messages: int | None = Field(default=None, ge=1, le=65535)
    """The window a transfer starts with (the default: 5000, or `messages` if smaller).
    A queue shorter than about four times this never changes it."""
    bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Bytes in flight per queue transfer. The mover keeps it from the sizes it receives:
    the first prefetch is what the byte window allows for the largest message the queue
    may hold (no larger than all its ready bytes together, where the plan's management
    statistics say; otherwise the largest a broker accepts, so 1 for the defaults), later
    ones follow the sizes seen, and while the bytes held pass this it stops reading the
    source, so they never exceed it by more than one message."""

    @model_validator(mode="after")
    def _start_within_messages(self) -> WindowConfig:
        if self.start_messages is not None and self.start_messages > self.messages:
            raise ValueError(
                f"window.start_messages ({self.start_messages}) is larger than "
                f"window.messages ({self.messages}), the window's upper bound"
            )
        return self

    @property
    def first_messages(self) -> int:
        """The window a transfer starts with."""
        return min(self.messages, self.start_messages or DEFAULT_START_MESSAGES)


class MoverConfig(Strict):
    """How a queue transfer rides out refusals, alarms and lost connections."""

    nack_retries: int = Field(default=5, ge=0)
    """A publish the destination nacks is sent again after a backoff, at most this many
    times; then the queue fails and the message stays in the source."""
    backoff_seconds: float = Field(default=0.5, gt=0)
    """First retry and reconnect backoff; doubled on each retry up to
    max_backoff_seconds."""
    max_backoff_seconds: float = Field(default=30.0, gt=0)
    """The longest retry and reconnect backoff."""
    reconnect_attempts: int = Field(default=5, ge=0)
    """Lost connections reopened per queue transfer before the task fails and Spark
    retries it. A quorum source's delivery limit must be at least this + task attempts +
    1 (pre-flight refuses the run otherwise). `rmq-spark replay` reopens a lost
    connection up to this many times in a row for one row before it stops."""
    recognise_redeliveries: bool = True
    """A session that resumes a transfer (after a lost connection, a task retry or a
    driver restart) acks without publishing the redeliveries the earlier session had
    moved and recorded but not acked, where the ledger proves it (ledger rows with
    decision `recognised`); false moves them again, as named duplicates. Turn it off
    where other consumers take and requeue messages of a source during its move."""
    blocked_timeout_seconds: float = Field(default=300.0, gt=0)
    """How long a connection may stay blocked by a memory or disk alarm before it counts
    as lost."""
    queues_per_task: int = Field(default=2, ge=1)
    """Queues one executor task moves at once, on one I/O loop and one thread (a loop
    mostly waits for confirms, so one thread keeps several queues busy); max_active
    still caps the queues moving at once across the whole job."""
