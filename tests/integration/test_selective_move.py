"""A route's `select` splits a queue: the selected messages in the destination, the rest
back in the source in their original order, every one of them in the ledger, verified.

Real nodes (3.10 from the host, 4.3 from its root), real Spark, real Delta. The queue is
split by a header value; an independent consumer reads both queues afterwards. The
interrupted moves restart the destination node mid-move (the mover reconnects and
reuses its fence) or SIGKILL the executor's Python worker (Spark runs the task again,
and the new attempt finds the fence in the ledger and publishes none of its own); each
run still ends verified with nothing lost, every copy named and no fence left behind.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.config import JobConfig, load_config
from rmq_spark.ledger import tables
from rmq_spark.pipeline import RunResult, run_transfer
from rmq_spark.transfer.selective import FENCE_BODY
from tests.support.brokers import Brokers, Transactions, fresh_vhost, take_all, write_config
from tests.support.fault_scenarios import worker_pid_of
from tests.support.faults import mover_connections, wait_until

# A third of the messages are tenant "acme" (moved), the rest stay.
MESSAGES = 6_000
INTERRUPTED_MESSAGES = 30_000
SELECT = "headers['tenant'] = 'acme'"
QUEUE = "orders"


def tenant_of(index: int) -> str:
    return "acme" if index % 3 == 0 else "other"


def publish(brokers: Brokers, vhost: str, count: int) -> None:
    """`count` persistent messages, body = index, tenant header, in index order."""
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True)
        with Transactions(channel) as publish:
            for index in range(count):
                publish(
                    "",
                    QUEUE,
                    f"{index:06d}".encode(),
                    pika.BasicProperties(
                        delivery_mode=2,
                        message_id=f"m-{index}",
                        headers={"tenant": tenant_of(index)},
                    ),
                )
    finally:
        connection.close()


def read_all(brokers: Brokers, node: str, vhost: str) -> list[tuple[int, dict[str, Any]]]:
    """Independent consumer: every message of the queue in delivery order (taken)."""
    found: list[tuple[int, dict[str, Any]]] = []
    connection = (brokers.dr if node == "dr" else brokers.main).connect(vhost)
    try:
        channel = connection.channel()
        for properties, body in take_all(channel, QUEUE):
            if body == FENCE_BODY:  # a fence left behind: index -1, so no set matches
                found.append((-1, {}))
                continue
            found.append((int(body), dict(properties.headers or {})))
    finally:
        connection.close()
    return found


def selective_config(
    tmp_path: Path,
    brokers: Brokers,
    vhost: str,
    *,
    messages_per_second: float | None = None,
    **mover: Any,
) -> JobConfig:
    path = write_config(
        tmp_path / "job.yaml",
        brokers,
        vhosts=[vhost],
        ledger=tmp_path / "ledger",
        mover={"backoff_seconds": 0.2, "max_backoff_seconds": 2.0, **mover},
    )
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["routes"][0]["select"] = SELECT
    if messages_per_second is not None:  # slow enough for the fault to land mid-move
        raw["routes"][0]["limits"] = {"messages_per_second": messages_per_second}
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(path)


def decisions(tmp_path: Path, run_id: str) -> Counter[str]:
    rows = tables.read_arrow(
        str(tmp_path / "ledger"), "messages", run_id=run_id, columns=["decision"]
    )
    return Counter(str(value) for value in rows["decision"].to_pylist())


def assert_split(
    brokers: Brokers, vhost: str, count: int, result: RunResult, *, duplicates_allowed: bool
) -> None:
    """Selected ones in the destination, the rest in the source (order kept), none lost,
    no fence left behind; extra copies only where the run named duplicates."""
    selected = {i for i in range(count) if tenant_of(i) == "acme"}
    kept = [i for i in range(count) if tenant_of(i) != "acme"]
    verification = result.verification
    assert verification.verified, verification.failed_expectations
    assert verification.lost == 0
    assert (verification.messages, verification.kept) == (len(selected), len(kept))

    destination = [index for index, _headers in read_all(brokers, "main", vhost)]
    source = [index for index, _headers in read_all(brokers, "dr", vhost)]
    assert source.count(-1) == 0, f"{source.count(-1)} fence(s) left in the source"
    assert set(destination) == selected
    assert set(source) == set(kept)  # the fence is gone: every body is a number
    first_seen = list(dict.fromkeys(source))
    assert first_seen == kept  # kept messages keep their order among themselves
    extra = (len(destination) - len(selected)) + (len(source) - len(kept))
    if duplicates_allowed:
        assert extra <= verification.duplicates + sum(v.uncertain_rows for v in verification.queues)
    else:
        assert extra == 0
        assert source == kept


@pytest.mark.parametrize("brokers_of_version", ["3.10", "4.3"], indirect=True)
def test_a_select_splits_a_queue_by_header_and_keeps_the_rest_in_order(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "selective")
    publish(brokers, vhost, MESSAGES)
    config = selective_config(tmp_path, brokers, vhost)

    result = run_transfer(spark, config, run_id="selective")

    assert_split(brokers, vhost, MESSAGES, result, duplicates_allowed=False)
    (outcome,) = result.outcomes
    assert (outcome.messages, outcome.kept, outcome.fences) == (MESSAGES // 3, MESSAGES * 2 // 3, 1)
    assert decisions(tmp_path, "selective") == Counter(
        {"moved": MESSAGES // 3, "kept": MESSAGES * 2 // 3}
    )


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_selective_move_interrupted_by_a_destination_restart_loses_nothing(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "selective-restart")
    publish(brokers, vhost, INTERRUPTED_MESSAGES)
    # The destination exists before the run, so the watcher can count it from the start.
    watcher = brokers.main.connect(vhost)
    watcher.channel().queue_declare(QUEUE, durable=True)
    # ~20 s of moving: the restart lands mid-move, not after it. `rabbitmqctl stop_app`
    # took 6.5 s here on an idle box (the CLI boots a VM first), and in a full test run
    # once more than the 9 s left of a 10 s move.
    config = selective_config(
        tmp_path, brokers, vhost, messages_per_second=1_500, reconnect_attempts=30
    )
    runs: dict[str, RunResult] = {}
    job = threading.Thread(
        target=lambda: runs.update(first=run_transfer(spark, config, run_id="restart"))
    )
    job.start()
    try:
        wait_until(
            lambda: (
                watcher.channel().queue_declare(QUEUE, passive=True).method.message_count
                >= INTERRUPTED_MESSAGES // 30
            ),
            "a tenth of the selected messages to arrive",
            timeout=120,
        )
    finally:
        watcher.close()
    brokers.main.rabbitmqctl("stop_app")
    brokers.main.rabbitmqctl("start_app")
    brokers.main.rabbitmqctl("await_startup")
    job.join(600)
    result = runs["first"]
    (outcome,) = result.outcomes
    assert outcome.sessions >= 2  # the restart was a lost session, ridden out
    assert_split(brokers, vhost, INTERRUPTED_MESSAGES, result, duplicates_allowed=True)


@pytest.mark.parametrize("brokers_of_version", ["3.10"], indirect=True)
def test_a_selective_move_whose_executor_is_killed_leaves_no_second_fence(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    """The killed attempt's fence is in the source and in the ledger: Spark's retry stops
    at it, publishes none of its own, and nothing is lost."""
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "selective-sigkill")
    publish(brokers, vhost, INTERRUPTED_MESSAGES)
    watcher = brokers.main.connect(vhost)
    watcher.channel().queue_declare(QUEUE, durable=True)
    config = selective_config(tmp_path, brokers, vhost, messages_per_second=3_000)
    runs: dict[str, RunResult] = {}
    job = threading.Thread(
        target=lambda: runs.update(first=run_transfer(spark, config, run_id="sigkill")),
        daemon=True,
    )
    job.start()
    try:
        wait_until(lambda: bool(mover_connections(brokers.dr, "consumer", "sigkill")), "a mover")
        worker = worker_pid_of(brokers, "sigkill")
        wait_until(
            lambda: (
                watcher.channel().queue_declare(QUEUE, passive=True).method.message_count
                >= INTERRUPTED_MESSAGES // 30
            ),
            "a tenth of the selected messages to arrive",
            timeout=120,
        )
    finally:
        watcher.close()
    os.kill(worker, signal.SIGKILL)
    job.join(600)

    result = runs["first"]
    rows = tables.read_arrow(
        str(tmp_path / "ledger"), "messages", run_id="sigkill", columns=["task_attempt"]
    )
    assert len(set(rows["task_attempt"].to_pylist())) >= 2, "Spark did not run the task again"
    (outcome,) = result.outcomes
    assert outcome.fences == 1  # the killed attempt's, reached by the retry
    assert_split(brokers, vhost, INTERRUPTED_MESSAGES, result, duplicates_allowed=True)
