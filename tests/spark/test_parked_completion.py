"""A park's commit in Spark tasks: the staged rows completed with the selection columns
(`park/table.completed_in_tasks`, `transfer/parked_completion.complete_partition`), on real
local Spark whose Python workers import the package, then committed with delta-rs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rmq_spark.model import TransferKey
from rmq_spark.park.table import commit_parked, completed_in_tasks, ensure_parked_table
from rmq_spark.transfer.parked_rows import ParkedRowsWriter, run_partition, staged_partition
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


def test_the_commit_completes_each_transfers_staged_files_in_spark_tasks(
    spark: SparkSession, tmp_path: Path
) -> None:
    ensure_parked_table(str(tmp_path))
    stage(tmp_path, "orders", 3, 2)
    stage(tmp_path, "orders", 0, 3)
    stage(tmp_path, "invoices", 0, 4)
    complete = completed_in_tasks(spark, str(tmp_path), None, RUN)
    done: list[dict[str, Any]] = []

    def recorded(groups: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
        rows = complete(groups)
        done.extend(rows)
        return rows

    assert commit_parked(str(tmp_path), RUN, recorded) == 9

    # One data file a transfer (its staged files together), each written by a task.
    assert sorted(row["rows"] for row in done) == [4, 5]
    written = sorted(p.name for p in Path(run_partition(str(tmp_path), RUN)).iterdir())
    assert written == sorted(row["file"] for row in done)
    rows = read_parked(str(tmp_path), RUN).to_pylist()
    assert sorted((r["source_queue"], r["position"], r["message_id"]) for r in rows) == sorted(
        [("orders", p, f"orders-{p}") for p in range(5)]
        + [("invoices", p, f"invoices-{p}") for p in range(4)]
    )
    assert {dict(r["headers"])["tenant"] for r in rows} == {"t-0", "t-1"}
    assert not Path(staged_partition(str(tmp_path), RUN)).exists()
