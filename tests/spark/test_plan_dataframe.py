"""The plan (rows and DataFrame) puts each queue in the partition the planner chose,
with no shuffle."""

from __future__ import annotations

from pyspark.sql import SparkSession

from rmq_spark.planning.plan import PLAN_SCHEMA, assign_partitions, plan_dataframe, plan_rows
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


def test_plan_rows_are_what_the_movers_get(spark: SparkSession) -> None:
    transfers = [transfer(f"q{i}", n) for i, n in enumerate([50, 400, 10, 300])]
    assignment = assign_partitions(transfers, 2)

    partitions = plan_rows(spark, transfers, assignment).glom().collect()

    assert len(partitions) == 2
    for index, rows in enumerate(partitions):
        for row in rows:
            # move_partition reads row.asDict(): every plan column, by name.
            assert list(row.asDict()) == PLAN_SCHEMA.fieldNames()
            assert row.partition == index
            assert assignment[int(row.source_queue[1:])] == index
    assert sorted(r.source_queue for rows in partitions for r in rows) == ["q0", "q1", "q2", "q3"]


def test_an_empty_plan_has_no_rows(spark: SparkSession) -> None:
    assert plan_rows(spark, [], []).collect() == []
