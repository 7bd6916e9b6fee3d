"""The selection language: which messages a move takes (docs/selection.md).

A Spark SQL boolean expression over documented message columns (`columns.py`), checked
once on the driver and evaluated per batch on the executors (`expression.py`), over
property blocks read with their AMQP types (`fields.py`).
"""

from rmq_spark.selection.columns import COLUMNS, Message, message_table
from rmq_spark.selection.expression import Selection, SelectionError

__all__ = ["COLUMNS", "Message", "Selection", "SelectionError", "message_table"]
