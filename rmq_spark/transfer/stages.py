"""Where a mover's deliveries are at one moment: instrumentation for `bench.stages`.

Nothing in a transfer reads these samples; the benchmark turns them into the time
each stage takes (Little's law), docs/ARCHITECTURE.md "Where a transfer's time goes".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmq_spark.transfer.outbound import Outbound
    from rmq_spark.transfer.window import TransferWindow


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


def sample(window: TransferWindow, outbound: Outbound, moved: int) -> WindowStages:
    """Where one session's deliveries are; safe from another thread (lengths and
    counters, each consistent on its own, so a sample may be off by a batch)."""
    unlogged, being_logged = outbound.waiting()
    # Batches being logged are already publishes to the window (seq numbers given).
    unconfirmed = window.unconfirmed
    return WindowStages(
        logging=unlogged + being_logged,
        destination=max(0, unconfirmed - being_logged),
        ledger=window.in_flight - unconfirmed,
        moved=moved,
    )
