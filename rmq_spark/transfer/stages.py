"""Where a mover's deliveries are at one moment: instrumentation for `bench.stages`.

Nothing in a transfer reads these samples; the benchmark turns them into the time
each stage takes (Little's law), docs/ARCHITECTURE.md "Where a transfer's time goes".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowStages:
    """Where a mover's deliveries are at one moment (`QueueMover.window_stages`).

    The prefetch window minus these three is what the source holds for the mover:
    acked but not yet redelivered into the window, or on its way.
    """

    logging: int  # received; waiting for, or in, their intent-log append
    destination: int  # published; waiting for the destination's confirm
    ledger: int  # confirmed; their rows being written (or waiting for the ack)
    moved: int  # rows durable and acked, since the transfer started


NOTHING_YET = WindowStages(logging=0, destination=0, ledger=0, moved=0)
