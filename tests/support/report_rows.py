"""Rows of a run's ledger tables (runs, queues, messages) for report tests, inline and
overridable; no Spark, no broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from rmq_spark.ledger import schema
from rmq_spark.report.html import RunLedger

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
TRANSFER = {
    "run_id": "run-1",
    "source_cluster": "dr",
    "source_vhost": "orders",
    "source_queue": "a",
    "destination_cluster": "main",
    "destination_vhost": "orders",
    "destination_queue": "a",
}


def message(position: int, **columns: Any) -> dict[str, Any]:
    """A full messages row (MESSAGES columns) for transfer `TRANSFER`, overridable."""
    row: dict[str, Any] = {
        **TRANSFER,
        "position": position,
        "publish_seq": position + 1,
        "publish_attempts": 1,
        "redelivered": False,
        "body_size": 10,
        "body_sha256": f"body-{position}",
        "properties_sha256": "props",
        "message_id": f"m{position}",
        "consumed_at": T0,
        "confirmed_at": T0,
        "task_attempt": "0.0.0",
        "session": 0,
    }
    row.update(columns)
    return row


def messages(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=schema.arrow_schema(schema.MESSAGES))


def seconds(value: float) -> datetime:
    return T0 + timedelta(seconds=value)


def queue_row(queue: str, **columns: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        **TRANSFER,
        "source_queue": queue,
        "destination_queue": queue,
        "partition": 0,
        "status": "moved",
        "error": None,
        "source_depth_before": 2,
        "source_depth_after": 0,
        "destination_depth_before": 0,
        "destination_depth_after": 2,
        "ledger_rows": 2,
        "duplicates": 0,
        "lost": 0,
        "unexpected": 0,
    }
    row.update(columns)
    return row


def run_row(**columns: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "run_id": "run-1",
        "started_at": T0,
        "finished_at": seconds(30),
        "config_digest": "ab" * 32,
        "spark_app_id": "local-1",
        "queues": 2,
        "messages": 4,
        "bytes": 40,
        "lost": 0,
        "duplicates": 0,
        "unexpected": 0,
        "verified": True,
        "seconds": 30.0,
        "verification_path": "/nowhere/verification.json",
    }
    row.update(columns)
    return row


def run_ledger(
    queue_rows: list[dict[str, Any]], message_rows: list[dict[str, Any]], **run: Any
) -> RunLedger:
    return RunLedger(
        ledger_path="/ledger",
        run=run_row(**run),
        queues=pa.Table.from_pylist(queue_rows, schema=schema.arrow_schema(schema.QUEUES)),
        messages=messages(*message_rows),
    )
