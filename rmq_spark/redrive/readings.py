"""A redrive's readings of its queues, and the first ones, recorded for a resumed run.

The witnesses (`tally.py`) compare each queue before and after the run. A driver killed
mid-move leaves rows of its run in the ledger and messages in the origins; run again
with the same `--run-id`, the redrive continues the run (its transfer finds the earlier
attempt's positions and fence in the ledger, as a retried task does) and must compare
against the readings taken before ANY of it moved, or what the first driver moved would
count as missing. So the first readings are written to the ledger before anything moves,
`redrives/run_id=<run>/before.json` (`durable.write_file`: fsync and rename, or one PUT),
and a later driver of the run reads them instead of reading the queues again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from rmq_spark.broker.counts import queue_readings
from rmq_spark.broker.management import ManagementClient
from rmq_spark.broker.policy_match import policy_applies
from rmq_spark.config import JobConfig
from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store
from rmq_spark.ledger.durable import write_file
from rmq_spark.redrive.preflight import DeadLetterQueue
from rmq_spark.redrive.tally import QueueReading, delivered_so_far, removes_by_itself

BEFORE_FILE = "before.json"


def readings_dir(ledger_path: str, run_id: str) -> Any:
    return store.root(ledger_path) / "redrives" / f"run_id={run_id}"


def readings_recorded(config: JobConfig, run_id: str) -> bool:
    """Whether a driver of this run recorded its first readings: the run was started."""
    try:
        return bool((readings_dir(store.use_ledger(config.ledger), run_id) / BEFORE_FILE).exists())
    except OSError as exc:
        raise LedgerError(f"ledger {config.ledger.path}: cannot be read ({exc})") from exc


def starting_readings(
    config: JobConfig, ledger_path: str, dlq: DeadLetterQueue, run_id: str, queues: list[str]
) -> dict[str, QueueReading]:
    """The run's readings before anything moved: recorded by an earlier driver of this
    run, or read now and recorded (durable before the move starts). Keyed by queue, the
    DLQ first; a resumed run watches the queues the first one did."""
    directory = readings_dir(ledger_path, run_id)
    recorded = directory / BEFORE_FILE
    try:
        if recorded.exists():
            return decode(recorded.read_bytes(), where=str(recorded))
        readings = read_queues(config, dlq, queues)
        directory.mkdir(parents=True, exist_ok=True)
        write_file(directory, BEFORE_FILE, encode(readings))
    except OSError as exc:
        raise LedgerError(
            f"ledger {directory}: cannot keep the redrive's readings ({exc})"
        ) from exc
    return readings


def encode(readings: dict[str, QueueReading]) -> bytes:
    return json.dumps({queue: asdict(reading) for queue, reading in readings.items()}).encode()


def decode(content: bytes, *, where: str) -> dict[str, QueueReading]:
    """Readings `encode` wrote; anything else is a LedgerError naming the file.

    >>> decode(encode({"orders": QueueReading(3, 0, ("message-ttl",), 7)}), where="x")
    {'orders': QueueReading(depth=3, consumers=0, removes_by_itself=('message-ttl',), delivered=7)}
    """
    try:
        found = json.loads(content)
        return {
            str(queue): QueueReading(
                int(value["depth"]),
                int(value["consumers"]),
                tuple(str(name) for name in value["removes_by_itself"]),
                None if value["delivered"] is None else int(value["delivered"]),
            )
            for queue, value in found.items()
        }
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LedgerError(f"{where}: not a redrive's readings ({exc})") from exc


def read_queues(
    config: JobConfig, dlq: DeadLetterQueue, queues: Iterable[str]
) -> dict[str, QueueReading]:
    """Each queue's exact depth and consumers (passive declare), and from the management
    API what may take its messages without a consumer there (`tally.QueueReading`)."""
    found = queue_readings(dlq.cluster, config.clusters[dlq.cluster], dlq.vhost, queues)
    client = ManagementClient(
        dlq.cluster, config.clusters[dlq.cluster], timeout=config.management_timeout_seconds
    )
    readings = {}
    try:
        # Read exactly, not the queue object's effective policy (it lags: policy_match.py).
        policies = client.vhost_policies(dlq.vhost) + client.vhost_operator_policies(dlq.vhost)
        for queue, (depth, consumers) in found.items():
            details = client.queue_details(dlq.vhost, queue) or {}
            applying = [policy for policy in policies if policy_applies(policy, queue)]
            readings[queue] = QueueReading(
                depth, consumers, removes_by_itself(details, applying), delivered_so_far(details)
            )
    finally:
        client.close()
    return readings
