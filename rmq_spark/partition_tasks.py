"""One Spark task per index, on classic Spark and Spark Connect alike.

Spark Connect (Databricks Standard access mode, serverless, Databricks Connect) has
no RDDs, no SparkContext and no broadcast: there `DataFrame.mapInArrow` over
`spark.range(0, n, 1, n)` runs the tasks (n partitions of one number each: a range is
split evenly, so index i is partition i and runs as task i, no shuffle). On classic
Spark the same task runs through `parallelize(range(n), n).mapPartitions`: the
DataFrame hook's first call costs 2-3 s more on a fresh session (Spark SQL's first
plan, the Arrow worker's imports; `bench/spark_hook.py`), and its worker needs pyarrow
before any code of ours runs, where the RDD hook answers from a bare Python (the
executors' pre-flight relies on that). Either way, what the tasks need travels in the
task function's closure, not in a broadcast, and the task is the same function.

Runs on executors too (`_arrow_task`, `_rdd_task`): the module imports neither
pyarrow nor pyspark at the top, so a probe task unpickles where they are missing
(`missing_arrow` tells Spark Connect's error for a worker without pyarrow apart).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

#: A task: the indices of its partition (one, normally) -> its result rows.
IndexTask = Callable[[Sequence[int]], Iterable[Mapping[str, Any]]]

# What Spark's Python worker says when the executor's Python has no pyarrow.
_NO_ARROW = "No module named 'pyarrow'"


def run_tasks(
    spark: SparkSession, count: int, task: IndexTask, schema: pa.Schema
) -> list[dict[str, Any]]:
    """Run `task([i])` for each i in range(count), each as Spark task i; their rows.

    `schema` is the rows' Arrow schema (over Spark Connect their Spark schema is
    derived from it).
    """
    if count == 0:
        return []
    if not is_connect(spark):
        rows: list[dict[str, Any]] = (
            spark.sparkContext.parallelize(range(count), count)
            .mapPartitions(partial(_rdd_task, task=task))
            .collect()
        )
        return rows
    frame = index_frame(spark, count).mapInArrow(
        partial(_arrow_task, task=task, schema=schema), spark_schema_of(schema)
    )
    arrow_rows: list[dict[str, Any]] = frame.toArrow().to_pylist()
    return arrow_rows


def index_frame(spark: SparkSession, count: int) -> Any:
    """0 .. count-1, one number in each of `count` partitions (partition i holds i)."""
    return spark.range(0, count, 1, count)


def spark_schema_of(schema: pa.Schema) -> Any:
    """The Spark StructType of an Arrow schema."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _arrow_task(
    batches: Iterable[pa.RecordBatch], *, task: IndexTask, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: the partition's indices in, the task's rows out."""
    import pyarrow as pa

    indices = [int(i) for batch in batches for i in batch.column(0).to_pylist()]
    yield pa.RecordBatch.from_pylist(list(task(indices)), schema=schema)


def _rdd_task(partition: Iterable[int], *, task: IndexTask) -> Iterator[dict[str, Any]]:
    """mapPartitions function: the partition's indices in, the task's rows out."""
    for row in task([int(i) for i in partition]):
        yield dict(row)


def missing_arrow(error: BaseException) -> bool:
    """Whether a failed task's error says the executor's Python lacks pyarrow."""
    return _NO_ARROW in str(error)


def is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect session (no SparkContext, no JVM here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism: the cores its executors offer.

    Over Spark Connect there is no SparkContext to ask: a range without a partition
    count is split into that many partitions (one JVM-only job, no Python task).
    """
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    partitions = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("partition"))
    row = partitions.agg(F.max("partition").alias("last")).first()
    return 1 + int(row["last"]) if row is not None else 1
