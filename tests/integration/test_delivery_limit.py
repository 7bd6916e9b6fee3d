"""Quorum sources' delivery limit: read in pre-flight, and never passed by the mover.

RabbitMQ drops (or dead-letters) a quorum-queue message once a return takes its
count past the queue's delivery limit (default 20 from 4.0). Every lost session
returns what the mover holds, so these tests force lost sessions against a small
limit and check, with an independent consumer, that nothing was dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pika
import pytest
from pyspark.sql import SparkSession

from rmq_spark.broker.management import management_clients
from rmq_spark.config import JobConfig
from rmq_spark.errors import DeliveryLimitError
from rmq_spark.ledger import tables
from rmq_spark.model import QueueTransfer
from rmq_spark.pipeline import check_delivery_limits, run_transfer
from rmq_spark.planning.discovery import discover
from rmq_spark.transfer.executor import ExecutorSettings
from tests.support.brokers import Brokers, MoverThread, depth, fresh_vhost, take_all
from tests.support.faults import (
    fault_config,
    mover_connections,
    wait_until,
)

MESSAGES = 20_000
WINDOW = 40


def publish_bodies(brokers: Brokers, vhost: str, queue: str, count: int) -> list[bytes]:
    bodies = [f"{queue}-{i:05d}".encode() for i in range(count)]
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        for body in bodies:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()
    return bodies


def return_everything_once(brokers: Brokers, vhost: str, queue: str, count: int) -> None:
    """Take every message without acking and close the connection: one counted return
    each (a consumer going away counts on every version)."""
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=count)
        received: list[int] = []
        channel.basic_consume(
            queue, lambda _c, method, _p, _b: received.append(method.delivery_tag)
        )
        deadline = 60.0
        while len(received) < count and deadline > 0:
            connection.process_data_events(time_limit=0.2)
            deadline -= 0.2
        assert len(received) == count, f"got {len(received)} of {count} deliveries"
    finally:
        connection.close()


def drain(brokers: Brokers, node_label: str, vhost: str, queue: str) -> tuple[Counter[bytes], int]:
    """Independent consumer: every body in the queue (taken and acked) and the highest
    x-delivery-count among them."""
    node = brokers.dr if node_label == "dr" else brokers.main
    found: Counter[bytes] = Counter()
    highest = 0
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for properties, body in take_all(channel, queue):
            found[body] += 1
            highest = max(highest, int((properties.headers or {}).get("x-delivery-count", 0)))
    finally:
        connection.close()
    return found, highest


def quorum_route_config(tmp_path: Path, brokers: Brokers, vhost: str, **mover: Any) -> JobConfig:
    return fault_config(tmp_path, brokers, vhost, **mover)


@pytest.mark.parametrize("brokers_of_version", ["3.10", "4.0", "4.3"], indirect=True)
def test_preflight_reads_each_quorum_sources_effective_delivery_limit(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "delivery-limit-read")
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        quorum = {"x-queue-type": "quorum"}
        channel.queue_declare("qq-default", durable=True, arguments=quorum)
        channel.queue_declare(
            "qq-argument", durable=True, arguments={**quorum, "x-delivery-limit": 3}
        )
        channel.queue_declare("qq-policy", durable=True, arguments=quorum)
        channel.queue_declare(
            "qq-both",
            durable=True,
            arguments={**quorum, "x-delivery-limit": 9, "x-dead-letter-exchange": "dlx"},
        )
        channel.queue_declare("classic", durable=True)
        for queue in ("qq-default", "qq-argument", "qq-policy", "qq-both", "classic"):
            channel.basic_publish("", queue, b"selected: routes skip empty queues")
    finally:
        connection.close()
    for name, pattern, limit in (("limit-7", "^qq-policy$", 7), ("limit-5", "^qq-both$", 5)):
        brokers.dr.management(
            "PUT",
            f"/api/policies/{vhost}/{name}",
            json={
                "pattern": pattern,
                "definition": {"delivery-limit": limit},
                "apply-to": "queues",
            },
            timeout=10,
        )
    config = quorum_route_config(tmp_path, brokers, vhost)
    wait_until(
        lambda: all(
            q.get("policy")
            for q in brokers.dr.management("GET", f"/api/queues/{vhost}", timeout=10)
            if q["name"] in ("qq-policy", "qq-both")
        ),
        "the policies to apply",
    )

    with management_clients(config) as clients:
        transfers = discover(config, clients, dry_run=True)

    found = {t.source_queue: (t.source_delivery_limit, t.source_past_limit) for t in transfers}
    default = None if brokers.dr.version == "3.10" else 20
    assert found == {
        "qq-default": (default, "dropped"),
        "qq-argument": (3, "dropped"),
        "qq-policy": (7, "dropped"),
        "qq-both": (5, "dead-lettered to exchange 'dlx'"),
        "classic": (None, ""),
    }
    # The defaults (5 reconnects, 4 task attempts) need a limit of 10 or more.
    with pytest.raises(DeliveryLimitError) as refused:
        check_delivery_limits(transfers, reconnect_attempts=5, attempts=4)
    message = str(refused.value)
    for queue, limit in (("qq-argument", 3), ("qq-policy", 7), ("qq-both", 5)):
        assert f"cluster dr vhost {vhost!r} queue {queue!r}: its delivery limit {limit}" in message
    assert "qq-default" not in message
    assert len(refused.value.problems) == 3
    check_delivery_limits(
        [t for t in transfers if t.source_queue in ("qq-default", "classic")],
        reconnect_attempts=5,
        attempts=4,
    )


@pytest.mark.parametrize("brokers_of_version", ["4.3", "3.10"], indirect=True)
def test_lost_sessions_stop_the_queue_before_its_delivery_limit_and_drop_nothing(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    """Limit 3: messages already returned once, then a forced lost session mid-window.
    The redelivered ones arrive with x-delivery-count 2; another loss could take them
    to 3 and one more past it, so the mover stops: held messages are moved, the rest
    stay in the source, none is dropped."""
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "delivery-limit-stop")
    connection = brokers.dr.connect(vhost)
    try:
        connection.channel().queue_declare(
            "orders", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 3}
        )
    finally:
        connection.close()
    bodies = publish_bodies(brokers, vhost, "orders", MESSAGES)
    wait_until(lambda: depth(brokers.dr, vhost, "orders") == MESSAGES, "the messages to land")
    return_everything_once(brokers, vhost, "orders", MESSAGES)
    wait_until(lambda: depth(brokers.dr, vhost, "orders") == MESSAGES, "the returns to land")

    config = quorum_route_config(tmp_path, brokers, vhost, reconnect_attempts=1)
    with management_clients(config) as clients:
        (transfer,) = discover(config, clients)
    assert transfer.source_delivery_limit == 3
    check_delivery_limits([transfer], reconnect_attempts=1, attempts=1)  # 3 >= 1 + 1 + 1
    run_id = f"delivery-limit-{brokers.dr.version}"
    tables.ensure_tables(config.ledger.path)
    mover = MoverThread(
        plan_row(transfer),
        ExecutorSettings(
            run_id=run_id,
            ledger_path=config.ledger.path,
            clusters=dict(config.clusters),
            window_messages=WINDOW,
            window_bytes=1 << 30,
            mover=config.mover,
        ),
    )
    mover.start()
    wait_until(lambda: depth(brokers.main, vhost, "orders") >= 3 * WINDOW, "a few windows to move")
    brokers.dr.rabbitmqctl("close_all_connections", "-p", vhost, "rmq-spark fault test")
    mover.join(120)
    assert not mover.is_alive()

    assert mover.error is None, mover.error
    assert mover.outcome is not None
    assert mover.outcome.status == "failed"
    error = mover.outcome.error or ""
    assert f"cluster dr vhost {vhost!r} queue 'orders'" in error
    assert "x-delivery-count 2" in error
    assert "the limit is 3" in error
    assert "dropped" in error
    assert mover.outcome.sessions == 2
    # The mover closed its consumer (pika waits for the broker's Close-Ok); the
    # management API drops a closed connection from its listing a moment later.
    wait_until(
        lambda: not mover_connections(brokers.dr, "consumer", run_id),
        "the stopped mover's consumer connection to be gone",
        every=0.2,
    )

    # Nothing dropped: every body is in the source or the destination, and none in
    # the source was returned more often than the limit allows.
    in_source, highest = drain(brokers, "dr", vhost, "orders")
    in_destination, _ = drain(brokers, "main", vhost, "orders")
    assert in_source  # the mover stopped before the end
    assert highest <= 3
    assert set(in_source) | set(in_destination) == set(bodies)
    assert max(in_source.values()) == 1

    # The ledger agrees with the destination: a row for every copy there.
    tables.commit_run(config.ledger.path, run_id)
    rows = tables.read_arrow(config.ledger.path, "messages", run_id=run_id).to_pylist()
    confirmed = [r for r in rows if r["confirmed_at"] is not None]
    assert len(confirmed) <= sum(in_destination.values()) <= len(rows)
    assert mover.outcome.messages == len(confirmed)


def plan_row(transfer: QueueTransfer) -> dict[str, object]:
    """The executor's plan row for a transfer (plan.plan_groups builds the same)."""
    return asdict(transfer)


@pytest.mark.parametrize("brokers_of_version", ["4.3"], indirect=True)
def test_job_stops_a_queue_at_its_delivery_limit_and_verification_agrees(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    """The whole job (local[2,4]: 4 task attempts) on a limit-6 source whose messages
    were returned twice: the guard keeps a return for each later attempt, so it stops
    at once; verification counts what moved, loses nothing, and fails the queue."""
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, "delivery-limit-job")
    connection = brokers.dr.connect(vhost)
    try:
        connection.channel().queue_declare(
            "orders", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 6}
        )
        connection.channel().queue_declare("untouched", durable=True)
    finally:
        connection.close()
    bodies = publish_bodies(brokers, vhost, "orders", 500)
    publish_bodies(brokers, vhost, "untouched", 50)
    wait_until(lambda: depth(brokers.dr, vhost, "orders") == 500, "the messages to land")
    for _ in range(2):
        return_everything_once(brokers, vhost, "orders", 500)
    config = quorum_route_config(tmp_path, brokers, vhost, reconnect_attempts=1)

    result = run_transfer(spark, config, run_id="delivery-limit-job")

    verdicts = {v.key.source_queue: v for v in result.verification.queues}
    assert verdicts["untouched"].passed
    stopped = verdicts["orders"]
    assert stopped.status == "failed"
    assert "the limit is 6" in (stopped.error or "")
    assert "x-delivery-count 2" in (stopped.error or "")
    assert (stopped.lost, stopped.unexpected) == (0, 0)
    assert stopped.source_drop == stopped.distinct_messages > 0
    assert not result.verification.verified
    in_source, highest = drain(brokers, "dr", vhost, "orders")
    in_destination, _ = drain(brokers, "main", vhost, "orders")
    assert sum(in_destination.values()) == stopped.destination_rise
    assert set(in_source) | set(in_destination) == set(bodies)  # nothing dropped
    assert in_source
    assert highest <= 6
