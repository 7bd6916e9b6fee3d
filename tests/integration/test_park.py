"""`rmq-spark park`: a queue's messages into the ledger's `parked` Delta table.

Real nodes (3.10 from the host, 4.3 from its root), real Spark, real Delta. The queue is
filled by pika (an independent client) through a direct exchange, with the demo's
messages in the form every version delivers unchanged (`faults.key_ordered_messages`:
header tables in key order; every basic property, headers of many AMQP types). After
the park the table is read back with pyarrow, Spark and DuckDB and compared with what
was published: the exact property bytes and bodies (sha256 of each), in position order,
with the exchange and routing key they arrived with; the source is empty (or, with a
`select`, holds exactly the kept messages in their order); the run verifies, lost 0.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.devtools.s3_server import REGION, S3Server
from rmq_spark.ledger import tables
from rmq_spark.park.command import format_result
from rmq_spark.park.run import ParkResult, run_park
from rmq_spark.park.table import read_parked_spark
from rmq_spark.transfer.parked_table import parked_files, read_parked
from tests.support.brokers import Brokers, depth, fresh_vhost, take_all
from tests.support.fault_scenarios import worker_pid_of
from tests.support.faults import mover_connections, wait_until
from tests.support.parking import EXCHANGE, QUEUE, ROUTING_KEY, park_config, published, seed

MESSAGES = 2_000
KILLED_MESSAGES = 12_000
SELECTED_TENANTS = ("tenant-07", "tenant-21", "tenant-33")
SELECT = "headers['tenant'] IN ('tenant-07', 'tenant-21', 'tenant-33')"


def table_rows(tmp_path: Path, run_id: str) -> list[dict[str, Any]]:
    rows = read_parked(str(tmp_path / "ledger"), run_id).to_pylist()
    return sorted(rows, key=lambda row: row["position"])


def message_ids_left(node: LocalNode, vhost: str) -> list[str]:
    """Independent consumer: the message ids the source still holds, in order (taken)."""
    found: list[str] = []
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for properties, _body in take_all(channel, QUEUE):
            found.append(str(properties.message_id))
    finally:
        connection.close()
    return found


def assert_verified(result: ParkResult) -> None:
    assert result.verified, format_result(result)
    assert result.lost == 0
    assert result.duplicates == 0


@pytest.mark.parametrize("brokers_of_version", ["3.10", "4.3"], indirect=True)
def test_a_parked_queue_is_in_the_table_byte_for_byte_in_order(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "park")
    seed(brokers.dr, vhost, MESSAGES)
    config = park_config(tmp_path, brokers, vhost)

    result = run_park(spark, config, run_id="park-all")

    assert_verified(result)
    assert result.parked == MESSAGES
    assert depth(brokers.dr, vhost, QUEUE) == 0
    rows = table_rows(tmp_path, "park-all")
    expected = published(vhost, MESSAGES)
    assert [row["position"] for row in rows] == list(range(MESSAGES))
    assert [hashlib.sha256(row["body"]).hexdigest() for row in rows] == [
        e["body_sha256"] for e in expected
    ]
    assert [hashlib.sha256(row["properties"]).hexdigest() for row in rows] == [
        e["properties_sha256"] for e in expected
    ]
    assert [row["body_sha256"] for row in rows] == [e["body_sha256"] for e in expected]
    assert {(row["exchange"], row["routing_key"]) for row in rows} == {(EXCHANGE, ROUTING_KEY)}
    assert {(row["source_cluster"], row["source_vhost"], row["source_queue"]) for row in rows} == {
        ("dr", vhost, QUEUE)
    }
    assert not any(row["body_excluded"] for row in rows)
    # The selection language's columns, decoded from the same bytes.
    assert [row["message_id"] for row in rows] == [e["message_id"] for e in expected]
    assert [dict(row["headers"])["tenant"] for row in rows] == [e["tenant"] for e in expected]
    assert dict(rows[0]["header_types"])["amount"] == "decimal"
    assert dict(rows[0]["header_types"])["trace"] == "table"

    # Spark reads it (and its SQL chooses as the selection language does) ...
    frame = read_parked_spark(spark, str(tmp_path / "ledger")).where(F.col("run_id") == "park-all")
    tenants = Counter(e["tenant"] for e in expected)
    assert frame.count() == MESSAGES
    assert frame.where("headers['tenant'] = 'tenant-07'").count() == tenants["tenant-07"]
    # ... and so does DuckDB, from the snapshot's files.
    files = [uri.removeprefix("file://") for uri in parked_files(str(tmp_path / "ledger"))]
    counted = duckdb.execute(
        "SELECT count(*), count(DISTINCT position), sum(body_size) "
        f"FROM read_parquet({files!r}, hive_partitioning = true) WHERE run_id = 'park-all'"
    ).fetchall()[0]
    assert counted == (MESSAGES, MESSAGES, sum(row["body_size"] for row in rows))


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_selective_park_keeps_the_rest_in_the_source_in_order(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "park-select")
    seed(brokers.dr, vhost, MESSAGES)
    config = park_config(tmp_path, brokers, vhost, select=SELECT)

    result = run_park(spark, config, run_id="park-select")

    expected = published(vhost, MESSAGES)
    selected = [e for e in expected if e["tenant"] in SELECTED_TENANTS]
    kept = [e for e in expected if e["tenant"] not in SELECTED_TENANTS]
    assert selected
    assert kept
    assert_verified(result)
    assert (result.parked, result.kept) == (len(selected), len(kept))
    rows = table_rows(tmp_path, "park-select")
    assert [row["message_id"] for row in rows] == [e["message_id"] for e in selected]
    assert [hashlib.sha256(row["properties"]).hexdigest() for row in rows] == [
        e["properties_sha256"] for e in selected
    ]
    assert message_ids_left(brokers.dr, vhost) == [e["message_id"] for e in kept]


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_park_without_bodies_keeps_checksums_and_says_so(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "park-nobody")
    seed(brokers.dr, vhost, 200)
    config = park_config(tmp_path, brokers, vhost, park={"exclude_body": True})

    result = run_park(spark, config, run_id="park-nobody")

    assert_verified(result)
    assert result.exclude_body
    rows = table_rows(tmp_path, "park-nobody")
    assert len(rows) == 200
    assert all(row["body"] is None and row["body_excluded"] for row in rows)
    assert [row["body_sha256"] for row in rows] == [e["body_sha256"] for e in published(vhost, 200)]
    assert depth(brokers.dr, vhost, QUEUE) == 0


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_park_whose_executor_is_killed_loses_nothing_and_names_its_copies(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    """Spark runs the killed task again; every published message is in the table, the
    copies the retry parked again are named by the ledger, and the run verifies."""
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "park-sigkill")
    seed(brokers.dr, vhost, KILLED_MESSAGES)
    config = park_config(tmp_path, brokers, vhost, limits={"messages_per_second": 2_000})
    results: dict[str, ParkResult] = {}
    job = threading.Thread(
        target=lambda: results.update(run=run_park(spark, config, run_id="park-sigkill")),
        daemon=True,
    )
    job.start()
    wait_until(lambda: bool(mover_connections(brokers.dr, "consumer", "park-sigkill")), "a mover")
    worker = worker_pid_of(brokers, "park-sigkill")
    wait_until(
        lambda: depth(brokers.dr, vhost, QUEUE) <= KILLED_MESSAGES - KILLED_MESSAGES // 10,
        "a tenth of the messages to be parked",
        timeout=120,
    )
    os.kill(worker, signal.SIGKILL)
    job.join(600)

    result = results["run"]
    assert_verified_with_copies(result)
    ledger = tables.read_arrow(
        str(tmp_path / "ledger"), "messages", run_id="park-sigkill", columns=["task_attempt"]
    )
    assert len(set(ledger["task_attempt"].to_pylist())) >= 2, "Spark did not run the task again"
    rows = table_rows(tmp_path, "park-sigkill")
    expected = published(vhost, KILLED_MESSAGES)
    fingerprints = Counter(
        (hashlib.sha256(row["body"]).hexdigest(), hashlib.sha256(row["properties"]).hexdigest())
        for row in rows
    )
    assert set(fingerprints) == {(e["body_sha256"], e["properties_sha256"]) for e in expected}
    uncertain = sum(q.verdict.uncertain for q in result.queues)
    assert len(rows) - KILLED_MESSAGES <= result.duplicates + uncertain
    assert depth(brokers.dr, vhost, QUEUE) == 0


def assert_verified_with_copies(result: ParkResult) -> None:
    assert result.verified, format_result(result)
    assert result.lost == 0


@pytest.fixture
def s3_ledger(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A fresh ledger prefix on the S3 server, its keys in the variables the block names."""
    monkeypatch.setenv("TEST_PARK_S3_KEY_ID", s3.access_key_id)
    monkeypatch.setenv("TEST_PARK_S3_SECRET", s3.secret_access_key)
    return {
        "path": f"s3://{s3.bucket}/park-{secrets.token_hex(4)}",
        "storage_options": {
            "endpoint": s3.endpoint,
            "region": REGION,
            "access_key_id_env": "TEST_PARK_S3_KEY_ID",
            "secret_access_key_env": "TEST_PARK_S3_SECRET",
        },
    }


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_park_with_its_ledger_on_s3_verifies_and_reads_back(
    brokers_of_version: Brokers,
    version_password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    s3_ledger: dict[str, Any],
) -> None:
    """Each parked batch is one PUT (no rename, no fsync) and the table lives on S3."""
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "park-s3")
    seed(brokers.dr, vhost, 500)
    config = park_config(tmp_path, brokers, vhost, ledger=s3_ledger)

    result = run_park(spark, config, run_id="park-s3")

    assert_verified(result)
    uri = str(s3_ledger["path"])
    rows = sorted(read_parked(uri, "park-s3").to_pylist(), key=lambda row: row["position"])
    assert [hashlib.sha256(row["properties"]).hexdigest() for row in rows] == [
        e["properties_sha256"] for e in published(vhost, 500)
    ]
    assert depth(brokers.dr, vhost, QUEUE) == 0
