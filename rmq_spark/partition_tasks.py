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

import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

#: A task: the indices of its partition (one, normally) -> its result rows.
IndexTask = Callable[[Sequence[int]], Iterable[Mapping[str, Any]]]

# Seconds between cancellations of a failed future's jobs (`cancelled_if_failed`).
CANCEL_EVERY = 0.1
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


@contextmanager
def cancelled_if_failed(spark: SparkSession, future: Future[Any]) -> Iterator[None]:
    """The Spark jobs this thread starts inside the block are cancelled once `future`
    fails (their actions raise); a future that succeeds changes nothing.

    The jobs carry a tag of their own. A tag cancels only the jobs running when asked,
    and the block's job may be submitted just after the future failed (a probe's first
    job is tens of ms of Python away from its start): so, once failed, the tag is
    cancelled again every CANCEL_EVERY seconds until the block ends.
    """
    tag = f"rmq-spark-{secrets.token_hex(6)}"
    over = threading.Event()

    def keep_cancelling() -> None:
        while not over.is_set():
            _cancel_tagged(spark, tag)
            over.wait(CANCEL_EVERY)

    def on_done(done: Future[Any]) -> None:
        if not done.cancelled() and done.exception() is not None:
            threading.Thread(target=keep_cancelling, name=f"{tag}-cancel", daemon=True).start()

    with _tagged_jobs(spark, tag):
        future.add_done_callback(on_done)
        try:
            yield
        finally:
            over.set()


@contextmanager
def _tagged_jobs(spark: SparkSession, tag: str) -> Iterator[None]:
    """The Spark jobs this thread starts inside the block carry `tag`.

    Classic PySpark pins each Python thread to a JVM thread (the default since 3.2), and
    a SparkContext job tag belongs to the thread that adds it; a Spark Connect session's
    tags likewise belong to the client thread that adds them.
    """
    if is_connect(spark):
        spark.addTag(tag)
        try:
            yield
        finally:
            spark.removeTag(tag)
        return
    context = spark.sparkContext
    context.addJobTag(tag)
    try:
        yield
    finally:
        context.removeJobTag(tag)


def _cancel_tagged(spark: SparkSession, tag: str) -> None:
    """Cancel the running jobs that carry `tag` (from any thread)."""
    if is_connect(spark):
        spark.interruptTag(tag)
    else:
        spark.sparkContext.cancelJobsWithTag(tag)


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
