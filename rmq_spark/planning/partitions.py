"""Which partition (mover task) each queue transfer moves in: pure, no Spark.

`rmq-spark plan` prints it from an installed wheel without pyspark; `plan.py` builds
the Spark rows from it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from rmq_spark.model import QueueTransfer, task_count


def assign_partitions(
    transfers: Sequence[QueueTransfer], max_active: int, queues_per_task: int = 1
) -> list[int]:
    """Partition index per transfer: largest first onto the least loaded partition.

    There are `task_count(max_active, queues_per_task)` partitions at most. A queue's
    weight is its bytes plus a per-message cost, so many small messages count as
    well as few large ones. Ties keep the input order (deterministic).
    """
    partitions = min(task_count(max_active, queues_per_task), len(transfers))

    assignment = [0] * len(transfers)
    if partitions == 0:
        return assignment
    load: list[tuple[int, int]] = [(0, index) for index in range(partitions)]
    order = sorted(range(len(transfers)), key=lambda i: (-_weight(transfers[i]), i))
    for i in order:
        current, partition = heapq.heappop(load)
        assignment[i] = partition
        heapq.heappush(load, (current + _weight(transfers[i]), partition))
    return assignment


def _weight(transfer: QueueTransfer) -> int:
    per_message_cost = 1024  # a message costs about as much as a KiB of body
    return transfer.message_bytes + transfer.messages * per_message_cost
