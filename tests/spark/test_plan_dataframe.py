"""The plan (groups and DataFrame) puts each queue in the partition the planner chose,
with no shuffle; the movers' tasks (partition_tasks.run_tasks) run group i as task i."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

from rmq_spark.partition_tasks import run_tasks
from rmq_spark.planning.plan import PLAN_SCHEMA, assign_partitions, plan_dataframe, plan_groups
from tests.support.builders import transfer


def test_rows_land_in_their_assigned_partitions(spark: SparkSession) -> None:
    transfers = [transfer(f"q{i}", n) for i, n in enumerate([50, 400, 10, 300, 200, 30, 5])]
    assignment = assign_partitions(transfers, 3)

    plan = plan_dataframe(spark, transfers, assignment)

    assert plan.schema == PLAN_SCHEMA
    assert plan.rdd.getNumPartitions() == 3
    placed = plan.rdd.glom().map(lambda rows: sorted(r.source_queue for r in rows)).collect()
    expected = [
        sorted(t.source_queue for t, p in zip(transfers, assignment, strict=True) if p == partition)
        for partition in range(3)
    ]
    assert placed == expected
    assert all(
        row.partition == index
        for index, rows in enumerate(plan.rdd.glom().collect())
        for row in rows
    )


def test_empty_plan_is_an_empty_dataframe(spark: SparkSession) -> None:
    plan = plan_dataframe(spark, [], [])
    assert plan.count() == 0
    assert plan.schema == PLAN_SCHEMA


def test_task_i_gets_group_i_whole(spark: SparkSession) -> None:
    transfers = [transfer(f"q{i}", n) for i, n in enumerate([50, 400, 10, 300, 7])]
    groups = plan_groups(transfers, assign_partitions(transfers, 3))

    def task(indices: Sequence[int]) -> list[dict[str, object]]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        return [
            {"index": i, "partition": context.partitionId(), "queue": row["source_queue"]}
            for i in indices
            for row in groups[i]
        ]

    schema = pa.schema([("index", pa.int64()), ("partition", pa.int64()), ("queue", pa.string())])
    rows = run_tasks(spark, len(groups), task, schema)

    assert sorted((r["index"], r["queue"]) for r in rows) == sorted(
        (i, row["source_queue"]) for i, group in enumerate(groups) for row in group
    )
    assert all(r["index"] == r["partition"] for r in rows)
    # move_partition reads every plan column, by name.
    assert all(list(row) == PLAN_SCHEMA.fieldNames() for group in groups for row in group)
