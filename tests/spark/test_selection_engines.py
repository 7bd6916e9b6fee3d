"""One selection expression means the same in Spark SQL and in the executors' engine.

Every case of tests/support/selection_messages.CASES (every column type, every construct
the language allows) runs over the same messages in both, and both must select exactly
the messages worked out by hand.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from rmq_spark.selection import Selection
from rmq_spark.selection.columns import COLUMNS, message_table, spark_ddl
from rmq_spark.selection.spark import message_dataframe, where
from tests.support.selection_messages import CASES, sample_messages


@pytest.fixture(scope="module")
def messages(spark: SparkSession) -> DataFrame:
    """The sample messages with each one's index in the list, for comparing selections."""
    table = message_table(sample_messages())
    table = table.append_column("_index", pa.array(range(table.num_rows), pa.int64()))
    return spark.createDataFrame(table, schema=f"{spark_ddl()}, _index BIGINT").cache()


def test_the_dataframe_has_every_documented_column_in_its_type(spark: SparkSession) -> None:
    frame = message_dataframe(spark, sample_messages())
    assert frame.columns == [column.name for column in COLUMNS]
    kinds = dict(frame.dtypes)
    assert kinds["timestamp"] == "timestamp_ntz"
    assert kinds["headers"] == "map<string,string>"
    assert isinstance(frame.schema["x_death"].dataType, T.ArrayType)
    first = frame.collect()[0]
    assert first["headers"]["tenant"] == "acme"
    assert first["header_ints"]["retries"] == 3
    assert first["last_death"]["reason"] == "rejected"
    assert first["first_death"]["original_expiration"] == "60000"


@pytest.mark.parametrize(("expression", "selected"), CASES, ids=[c[0] for c in CASES])
def test_both_engines_select_the_same_messages(
    messages: DataFrame, expression: str, selected: list[int]
) -> None:
    selection = Selection.compile(expression, where="route 0")
    executor_side = [i for i, chosen in enumerate(selection.evaluate(sample_messages())) if chosen]
    spark_side = sorted(row["_index"] for row in where(messages, selection).collect())
    assert executor_side == selected
    assert spark_side == selected
