"""The plan: the queue transfers, one row per source queue, in the partitions they move in.

Queues are bin-packed into `max_active // mover.queues_per_task` partitions (at
least one; largest first onto the least loaded), and the plan is built so that row
i lands in the partition the planner chose, with no shuffle. Spark runs one mover
task per partition, and each task moves up to `queues_per_task` of its queues at
once on one I/O loop, so at most `max_active` queue transfers are active at once.

The movers get the plan as `plan_groups` (group i: the rows of partition i), in the
closure of their Spark task, and run as task i of `partition_tasks.run_tasks`: the
driver already has the rows, and Spark Connect has no RDD to parallelize them with.
`plan_dataframe` is the same rows as a DataFrame (notebooks, tests), partitioned the
same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from rmq_spark.model import QueueTransfer
from rmq_spark.partition_tasks import index_frame
from rmq_spark.planning.partitions import assign_partitions

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PLAN_SCHEMA", "assign_partitions", "plan_dataframe", "plan_groups"]

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
        T.StructField("destination_type", T.StringType(), False),
        T.StructField("source_delivery_limit", T.LongType(), True),
        T.StructField("source_past_limit", T.StringType(), False),
    ]
)


def plan_groups(
    transfers: Sequence[QueueTransfer], assignment: Sequence[int]
) -> list[list[dict[str, Any]]]:
    """The plan rows (dicts of PLAN_SCHEMA's columns), group i holding partition i's."""
    partitions = max(assignment, default=-1) + 1
    names = PLAN_SCHEMA.fieldNames()
    groups: list[list[dict[str, Any]]] = [[] for _ in range(partitions)]
    for transfer, partition in zip(transfers, assignment, strict=True):
        row = {"partition": partition, **asdict(transfer)}
        groups[partition].append({name: row[name] for name in names})
    return groups


def plan_dataframe(
    spark: SparkSession, transfers: Sequence[QueueTransfer], assignment: Sequence[int]
) -> DataFrame:
    """The plan as a DataFrame of PLAN_SCHEMA; partition i holds exactly group i."""
    groups = plan_groups(transfers, assignment)
    if not groups:
        return spark.createDataFrame([], PLAN_SCHEMA)
    frame: DataFrame = index_frame(spark, len(groups)).mapInArrow(
        partial(_group_rows, groups=groups), PLAN_SCHEMA
    )
    return frame


def _group_rows(batches: Any, *, groups: Sequence[Sequence[dict[str, Any]]]) -> Any:
    """mapInArrow function: the rows of the partition's group."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    schema: pa.Schema = to_arrow_schema(PLAN_SCHEMA)
    for batch in batches:
        for index in batch.column(0).to_pylist():
            yield pa.RecordBatch.from_pylist(list(groups[index]), schema=schema)
