"""The plan: the queue transfers, one row per source queue, in the partitions they move in.

Queues are bin-packed into `max_active // mover.queues_per_task` partitions (at
least one; largest first onto the least loaded), and the plan is built so that row
i lands in the partition the planner chose, with no shuffle. Spark runs one mover
task per partition, and each task moves up to `queues_per_task` of its queues at
once on one I/O loop, so at most `max_active` queue transfers are active at once.

The movers run on `plan_rows`, an RDD of plan Rows; `plan_dataframe` is the same
rows as a DataFrame (notebooks, tests). Moving from the DataFrame would pass every
row through the JVM and back into a second Python worker per task: 2.5 s more
before the first message of a job on a fresh JVM (2-core box), for rows the driver
already has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from pyspark import RDD
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import types as T

from rmq_spark.model import QueueTransfer
from rmq_spark.planning.partitions import assign_partitions

__all__ = ["PLAN_SCHEMA", "assign_partitions", "plan_dataframe", "plan_rows"]

PLAN_SCHEMA = T.StructType(
    [
        T.StructField("partition", T.IntegerType(), False),
        T.StructField("route", T.StringType(), False),
        T.StructField("source_cluster", T.StringType(), False),
        T.StructField("source_vhost", T.StringType(), False),
        T.StructField("source_queue", T.StringType(), False),
        T.StructField("source_type", T.StringType(), False),
        T.StructField("source_node", T.StringType(), False),
        T.StructField("destination_cluster", T.StringType(), False),
        T.StructField("destination_vhost", T.StringType(), False),
        T.StructField("destination_queue", T.StringType(), False),
        T.StructField("messages", T.LongType(), False),
        T.StructField("message_bytes", T.LongType(), False),
        T.StructField("destination_messages", T.LongType(), False),
        T.StructField("destination_created", T.BooleanType(), False),
        T.StructField("destination_node", T.StringType(), False),
        T.StructField("source_delivery_limit", T.LongType(), True),
        T.StructField("source_past_limit", T.StringType(), False),
    ]
)


def plan_rows(
    spark: SparkSession, transfers: Sequence[QueueTransfer], assignment: Sequence[int]
) -> RDD[Row]:
    """The plan as Rows of PLAN_SCHEMA; partition i holds exactly the rows assigned to i."""
    partitions = max(assignment, default=-1) + 1
    plan_row = Row(*PLAN_SCHEMA.fieldNames())
    groups: list[list[Row]] = [[] for _ in range(partitions)]
    for transfer, partition in zip(transfers, assignment, strict=True):
        row = {"partition": partition, **asdict(transfer)}
        groups[partition].append(plan_row(*(row[name] for name in PLAN_SCHEMA.fieldNames())))
    if not groups:
        return spark.sparkContext.emptyRDD()
    # parallelize() with as many slices as elements puts one group in each slice.
    return spark.sparkContext.parallelize(groups, len(groups)).flatMap(lambda group: group)


def plan_dataframe(
    spark: SparkSession, transfers: Sequence[QueueTransfer], assignment: Sequence[int]
) -> DataFrame:
    """The plan as a DataFrame of PLAN_SCHEMA, partitioned as `plan_rows`."""
    if not transfers:
        return spark.createDataFrame([], PLAN_SCHEMA)
    return spark.createDataFrame(plan_rows(spark, transfers, assignment), PLAN_SCHEMA)
