"""A park's commit in Spark tasks: the staged rows completed with the selection columns
(`park/table.completed_in_tasks`, `transfer/parked_completion.complete_partition`), on real
local Spark whose Python workers import the package, then committed with delta-rs."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from rmq_spark.model import TransferKey
from rmq_spark.park.table import commit_parked, completed_in_tasks, ensure_parked_table
from rmq_spark.transfer.parked_rows import ParkedRowsWriter, staged_partition
from rmq_spark.transfer.parked_table import read_parked
from tests.support import amqp_encoding as amqp
from tests.support import builders

RUN = "park-1"


def stage(ledger: Path, queue: str, first: int, count: int) -> None:
    """One staged file of `count` messages of `queue`, each with its message id and a
    header, as an executor's park stages a batch."""
    key = TransferKey("dr", "/", queue, "parked", "/", queue)
    found = []
    for position in range(first, first + count):
        delivery = builders.delivery(position, body_size=1, confirmed=False)
        delivery.body = b"b"
        delivery.properties = amqp.BasicProperties(
            message_id=f"{queue}-{position}",
            headers=amqp.table_bytes(("tenant", amqp.long_string(f"t-{position % 2}"))),
        ).encode()
        found.append(delivery)
    ParkedRowsWriter(str(ledger), RUN, key, "0.0.0").write(found, lambda _tag: ("ex", queue))


def test_the_commit_completes_each_staged_file_in_spark_tasks(
    spark: SparkSession, tmp_path: Path
) -> None:
    ensure_parked_table(str(tmp_path))
    stage(tmp_path, "orders", 0, 3)
    stage(tmp_path, "orders", 3, 2)
    stage(tmp_path, "invoices", 0, 4)
    staged = sorted(p.name for p in Path(staged_partition(str(tmp_path), RUN)).iterdir())

    complete = completed_in_tasks(spark, str(tmp_path), None, RUN)
    done = complete(staged)

    # Each staged file completed once, whichever task it was dealt to.
    assert sorted(row["file"] for row in done) == staged
    assert sorted(row["rows"] for row in done) == [2, 3, 4]
    # Written already: the commit adds them without completing them again.
    assert commit_parked(str(tmp_path), RUN, complete) == 9
    rows = read_parked(str(tmp_path), RUN).to_pylist()
    assert sorted((r["source_queue"], r["position"], r["message_id"]) for r in rows) == sorted(
        [("orders", p, f"orders-{p}") for p in range(5)]
        + [("invoices", p, f"invoices-{p}") for p in range(4)]
    )
    assert {dict(r["headers"])["tenant"] for r in rows} == {"t-0", "t-1"}
    assert not Path(staged_partition(str(tmp_path), RUN)).exists()
