"""The planner's bin packing (pure); the DataFrame placement is in tests/spark."""

from __future__ import annotations

import pytest

from rmq_spark.model import QueueTransfer, queues_at_once, task_count
from rmq_spark.planning.plan import assign_partitions
from rmq_spark.planning.rules import queue_mode_applies
from tests.support.builders import transfer


def loads(transfers: list[QueueTransfer], assignment: list[int]) -> dict[int, int]:
    result: dict[int, int] = {}
    for t, partition in zip(transfers, assignment, strict=True):
        result[partition] = result.get(partition, 0) + t.messages
    return result


def test_never_more_partitions_than_max_active() -> None:
    transfers = [transfer(f"q{i}", 100) for i in range(10)]
    assignment = assign_partitions(transfers, 3)
    assert set(assignment) == {0, 1, 2}


def test_fewer_queues_than_max_active_gives_one_partition_each() -> None:
    transfers = [transfer("a", 5), transfer("b", 7)]
    assert sorted(assign_partitions(transfers, 8)) == [0, 1]


def test_largest_first_onto_least_loaded_balances_load() -> None:
    sizes = [900, 500, 400, 300, 300, 100]
    transfers = [transfer(f"q{i}", n) for i, n in enumerate(sizes)]
    assignment = assign_partitions(transfers, 2)
    assert sorted(loads(transfers, assignment).values()) == [1200, 1300]
    # The biggest queue starts first, alone on its partition until smaller ones fill the other.
    assert assignment[0] != assignment[1]


def test_bytes_count_as_well_as_messages() -> None:
    few_huge = transfer("huge", 10, message_bytes=10 * (16 << 20))
    many_small = [transfer(f"s{i}", 1000) for i in range(3)]
    assignment = assign_partitions([few_huge, *many_small], 2)
    assert assignment.count(assignment[0]) == 1  # the 160 MiB queue gets a partition alone


def test_assignment_is_deterministic() -> None:
    transfers = [transfer(f"q{i}", 100) for i in range(7)]
    assert assign_partitions(transfers, 3) == assign_partitions(transfers, 3)


def test_empty_plan() -> None:
    assert assign_partitions([], 4) == []


def test_max_active_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_active"):
        assign_partitions([transfer("a", 1)], 0)


@pytest.mark.parametrize(
    ("max_active", "per_task", "tasks", "at_once"),
    [(4, 1, 4, 1), (4, 2, 2, 2), (5, 2, 2, 2), (1, 4, 1, 1), (3, 4, 1, 3), (8, 4, 2, 4)],
)
def test_tasks_times_queues_at_once_never_exceeds_max_active(
    max_active: int, per_task: int, tasks: int, at_once: int
) -> None:
    assert task_count(max_active, per_task) == tasks
    assert queues_at_once(max_active, per_task) == at_once
    assert tasks * at_once <= max_active


def test_queues_per_task_packs_queues_into_fewer_partitions() -> None:
    transfers = [transfer(f"q{i}", 100) for i in range(8)]
    assignment = assign_partitions(transfers, 4, queues_per_task=2)
    assert sorted(set(assignment)) == [0, 1]
    assert loads(transfers, assignment) == {0: 400, 1: 400}


def test_queues_per_task_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queues_per_task"):
        task_count(4, 0)


@pytest.mark.parametrize(
    ("version", "applies"),
    [("3.10.8", True), ("3.11.28", True), ("3.12.0", False), ("4.0.5", False),
     ("4.3.6", False), ("unknown", True)],
)  # fmt: skip
def test_x_queue_mode_is_inherited_only_where_classic_queues_take_it(
    version: str, applies: bool
) -> None:
    # 3.12 and later ignore it (4.3.6 accepts it on a classic queue, although 4.3's
    # release notes announce a refusal); an unknown version keeps it.
    assert queue_mode_applies(version) is applies
