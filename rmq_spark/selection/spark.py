"""The selection language on Spark: the same checked expression, in Spark SQL.

Imported only by the driver (pyspark is not on the executors' import path of the mover).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rmq_spark.selection.columns import Message, message_table, spark_ddl
from rmq_spark.selection.expression import Selection


def message_dataframe(spark: SparkSession, messages: Sequence[Message]) -> DataFrame:
    """The messages as a DataFrame with every selection column, in the documented types."""
    return spark.createDataFrame(message_table(messages), schema=spark_ddl())


def where(frame: DataFrame, selection: Selection) -> DataFrame:
    """The rows of `frame` (with the selection columns) that `selection` selects."""
    return frame.where(F.expr(selection.spark_sql).eqNullSafe(F.lit(True)))
