"""The fault matrix: every scenario ends with nothing lost and every duplicate named.

Each test moves real messages between two real nodes, injects a fault while the
transfer runs (waiting on broker conditions, never on sleeps), and then checks with
an independent consumer and the ledger:
  lost = 0        every published message is in the destination or still in the source
  unexplained = 0 every destination copy has a ledger row (confirmed, or uncertain)
  duplicates      each extra destination copy is a named one, and at most the window
                  per lost session

Lost connections, a restarted destination node and a SIGKILLed worker run on every
RabbitMQ version (`brokers_of_version`: 3.10, 4.0, 4.3); the rest on the host's 3.10.
The queues are classic, so 4.x's quorum delivery limit never applies here.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import Counter
from pathlib import Path

import pika
import pytest
from pyspark.sql import SparkSession

from rmq_spark.errors import TransferError
from rmq_spark.pipeline import run_transfer
from tests.support.brokers import (
    Brokers,
    declare,
    depth,
    drain_fingerprints,
    fresh_vhost,
    seed,
    take_all,
)
from tests.support.fault_scenarios import (
    MESSAGES,
    WINDOW,
    assert_nothing_lost,
    close_connections_mid_window,
    finished,
    kill_a_worker_mid_job,
    start_transfer,
)
from tests.support.faults import (
    Transfer,
    account,
    expected_fingerprints,
    fault_config,
    key_ordered_fingerprints,
    mover_connections,
    wait_until,
)
from tests.support.matrix import fault_versions


# The version parametrization stands alone (not combined with another argument), so
# pytest groups the tests by version and starts each version's nodes once.
@pytest.mark.parametrize("brokers_of_version", fault_versions(), indirect=True)
def test_connection_closed_mid_window_reconnects_and_names_duplicates(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    """Both sides at once, on every version."""
    close_connections_mid_window(brokers_of_version, tmp_path, ("dr", "main"))


@pytest.mark.parametrize("sides", [("dr",), ("main",)], ids=["source", "destination"])
def test_connection_closed_on_one_side_mid_window_reconnects_and_names_duplicates(
    brokers: Brokers, password_env: str, tmp_path: Path, sides: tuple[str, ...]
) -> None:
    close_connections_mid_window(brokers, tmp_path, sides)


def restart_mid_run(brokers: Brokers, tmp_path: Path, label: str) -> None:
    """Restart one node's RabbitMQ application (stop_app, start_app) while the mover
    holds a window in flight: it reconnects, and nothing is lost."""
    node = brokers.main if label == "main" else brokers.dr
    transfer = start_transfer(brokers, tmp_path, f"restart-{label}", reconnect_attempts=30)
    wait_until(lambda: transfer.moved_at_least(MESSAGES // 10), "a tenth to arrive")

    node.rabbitmqctl("stop_app")
    node.rabbitmqctl("start_app")
    node.rabbitmqctl("await_startup")

    result = finished(transfer)
    assert transfer.outcome is not None
    assert transfer.outcome.sessions >= 2
    assert_nothing_lost(result, lost_sessions=transfer.outcome.sessions - 1)


@pytest.mark.parametrize("brokers_of_version", fault_versions(), indirect=True)
def test_destination_node_restarted_mid_run_is_ridden_out(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    restart_mid_run(brokers_of_version, tmp_path, "main")


def test_source_node_restarted_mid_run_is_ridden_out(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    """On 3.10 (a source restart returns the window to the queue, as the lost source
    connections of the tests above do on every version)."""
    restart_mid_run(brokers, tmp_path, "dr")


# -- flow control -----------------------------------------------------------------------------


def publisher_blocked(brokers: Brokers, run_id: str) -> bool:
    states = {c.get("state") for c in mover_connections(brokers.main, "publisher", run_id)}
    return bool(states & {"blocked", "blocking"})


def test_memory_alarm_blocks_publishing_then_the_transfer_resumes(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    brokers.main.rabbitmqctl("set_vm_memory_high_watermark", "0")
    try:
        transfer = start_transfer(brokers, tmp_path, "alarm")
        wait_until(lambda: publisher_blocked(brokers, "alarm"), "the publisher to be blocked")
        assert depth(brokers.main, transfer.vhost, "orders") == 0
    finally:
        brokers.main.rabbitmqctl("set_vm_memory_high_watermark", "0.4")

    result = finished(transfer)
    assert transfer.outcome is not None
    assert transfer.outcome.sessions == 1  # it waited; nothing had to reconnect
    assert_nothing_lost(result, lost_sessions=0)


def test_blocked_longer_than_the_timeout_gives_up_without_loss(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    brokers.main.rabbitmqctl("set_vm_memory_high_watermark", "0")
    try:
        transfer = start_transfer(
            brokers, tmp_path, "blocked-timeout", blocked_timeout_seconds=1.0, reconnect_attempts=1
        )
        transfer.join()
    finally:
        brokers.main.rabbitmqctl("set_vm_memory_high_watermark", "0.4")

    assert isinstance(transfer.error, TransferError)
    assert "gave up after 2 lost session(s)" in str(transfer.error)
    assert "dr:fault-blocked-timeout:orders" in str(transfer.error)
    result = account(transfer, key_ordered_fingerprints(transfer.vhost, "orders", MESSAGES))
    assert_nothing_lost(result, lost_sessions=2)


# -- refusals ---------------------------------------------------------------------------------


def test_nacked_messages_are_retried_until_the_destination_takes_them(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    """A destination that holds 100 messages and nacks more, drained by a slow consumer."""
    count = 3000
    vhost = fresh_vhost(brokers, "fault-nack-retry")
    seed(brokers.dr, vhost, "orders", count)
    connection = brokers.main.connect(vhost)
    connection.channel().queue_declare(
        "orders", durable=True, arguments={"x-max-length": 100, "x-overflow": "reject-publish"}
    )
    connection.close()
    config = fault_config(tmp_path, brokers, vhost, nack_retries=100, backoff_seconds=0.05)
    received: Counter[tuple[str, str]] = Counter()
    done = threading.Event()

    def drain_destination() -> None:
        while not done.is_set():
            received.update(drain_fingerprints(lambda: brokers.main.connect(vhost), "orders"))

    consumer = threading.Thread(target=drain_destination, daemon=True)
    consumer.start()
    transfer = Transfer(
        brokers, config, "nack-retry", vhost, "orders", "orders", count, 200
    ).start()
    transfer.join()
    done.set()
    consumer.join(30)
    received.update(drain_fingerprints(lambda: brokers.main.connect(vhost), "orders"))

    assert transfer.error is None
    assert transfer.outcome is not None
    assert transfer.outcome.status == "moved", transfer.outcome.error
    assert received == expected_fingerprints(vhost, "orders", count)
    ledger = transfer.ledger()
    assert ledger.num_rows == count
    assert max(ledger["publish_attempts"].to_pylist()) > 1  # the destination did nack


def test_destination_queue_deleted_mid_run_stops_with_returns_and_keeps_the_rest(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    transfer = start_transfer(brokers, tmp_path, "deleted")
    wait_until(lambda: transfer.moved_at_least(MESSAGES // 10), "a tenth to arrive")
    connection = brokers.main.connect(transfer.vhost)
    connection.channel().queue_delete("orders")
    connection.close()
    transfer.join()

    assert transfer.error is None
    assert transfer.outcome is not None
    assert transfer.outcome.status == "failed"
    assert "returned by the destination: 312 NO_ROUTE" in (transfer.outcome.error or "")
    assert "dr:fault-deleted:orders" in (transfer.outcome.error or "")
    # What was confirmed before the deletion has rows; everything else is in the source.
    ledger = transfer.ledger()
    confirmed = Counter(
        (r["body_sha256"], r["properties_sha256"]) for r in ledger.to_pylist() if r["confirmed_at"]
    )
    left = drain_fingerprints(lambda: brokers.dr.connect(transfer.vhost), "orders")
    assert confirmed + left == key_ordered_fingerprints(transfer.vhost, "orders", MESSAGES)


# -- order and windows ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "destination_type"),
    [(1, "classic"), (1000, "classic"), (1000, "quorum")],
)
def test_destination_receives_source_order(
    brokers: Brokers, password_env: str, tmp_path: Path, window: int, destination_type: str
) -> None:
    count = 300 if window == 1 else 5000
    vhost = fresh_vhost(brokers, f"order-{window}-{destination_type}")
    seed(brokers.dr, vhost, "orders", count)
    connection = brokers.main.connect(vhost)
    connection.channel().queue_declare(
        "orders", durable=True, arguments={"x-queue-type": destination_type}
    )
    connection.close()
    config = fault_config(tmp_path, brokers, vhost)
    transfer = Transfer(
        brokers, config, f"order-{window}", vhost, "orders", "orders", count, window
    ).start()
    transfer.join()
    assert transfer.outcome is not None
    assert transfer.outcome.status == "moved"

    connection = brokers.main.connect(vhost)
    channel = connection.channel()
    received = [properties.message_id for properties, _body in take_all(channel, "orders")]
    connection.close()
    assert received == [f"{vhost}/orders/{i}" for i in range(count)]
    ledger = transfer.ledger().sort_by("position")
    assert ledger["publish_seq"].to_pylist() == list(range(1, count + 1))


def test_messages_published_during_the_drain_are_moved_or_stay(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    """A producer keeps publishing while the job drains: nothing lost, nothing doubled."""
    transfer_vhost = fresh_vhost(brokers, "fault-live")
    seed(brokers.dr, transfer_vhost, "orders", 10_000)
    declare(brokers.main, transfer_vhost, "orders")
    config = fault_config(tmp_path, brokers, transfer_vhost)
    extra = 5000
    extra_bodies = [os.urandom(256) for _ in range(extra)]

    def produce() -> None:
        connection = brokers.dr.connect(transfer_vhost)
        channel = connection.channel()
        for body in extra_bodies:
            channel.basic_publish("", "orders", body, pika.BasicProperties(delivery_mode=2))
        connection.close()

    producer = threading.Thread(target=produce, daemon=True)
    transfer = Transfer(brokers, config, "live", transfer_vhost, "orders", "orders", 10_000, WINDOW)
    transfer.start()
    producer.start()
    producer.join(60)
    transfer.join()

    assert transfer.outcome is not None
    assert transfer.outcome.status == "moved"
    in_destination = drain_fingerprints(lambda: brokers.main.connect(transfer_vhost), "orders")
    left = drain_fingerprints(lambda: brokers.dr.connect(transfer_vhost), "orders")
    plain = hashlib.sha256(b"".join(pika.BasicProperties(delivery_mode=2).encode())).hexdigest()
    published = expected_fingerprints(transfer_vhost, "orders", 10_000) + Counter(
        (hashlib.sha256(body).hexdigest(), plain) for body in extra_bodies
    )
    assert in_destination + left == published  # each message exactly once, somewhere
    assert transfer.ledger().num_rows == sum(in_destination.values())


# -- Spark: a killed executor worker, and per-queue isolation ----------------------------------


@pytest.mark.parametrize("brokers_of_version", fault_versions(), indirect=True)
def test_killed_executor_worker_is_retried_by_spark_without_loss(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    kill_a_worker_mid_job(brokers_of_version, tmp_path, spark)


def test_one_refusing_destination_fails_alone(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    """The destination refuses one queue's messages at run time (too large for it)."""
    vhost = fresh_vhost(brokers, "fault-isolation")
    for queue in ("good-1", "good-2"):
        seed(brokers.dr, vhost, queue, 2000)
    connection = brokers.dr.connect(vhost)
    channel = connection.channel()
    channel.queue_declare("bad", durable=True)
    for _ in range(200):
        channel.basic_publish("", "bad", os.urandom(8192), pika.BasicProperties(delivery_mode=2))
    connection.close()
    wait_until(lambda: depth(brokers.dr, vhost, "bad") == 200, "the large messages to land")
    config = fault_config(tmp_path, brokers, vhost)
    brokers.main.rabbitmqctl("eval", "application:set_env(rabbit, max_message_size, 4096).")
    try:
        result = run_transfer(spark, config, run_id="isolation")
    finally:
        brokers.main.rabbitmqctl(
            "eval", "application:set_env(rabbit, max_message_size, 134217728)."
        )

    verdicts = {v.key.source_queue: v for v in result.verification.queues}
    assert verdicts["good-1"].passed
    assert verdicts["good-2"].passed
    assert not verdicts["bad"].passed
    assert verdicts["bad"].status == "failed"
    assert "fault-isolation" in (verdicts["bad"].error or "")
    assert "406" in (verdicts["bad"].error or "")
    assert not result.verification.verified
    assert depth(brokers.dr, vhost, "bad") == 200  # every refused message is still there
    assert depth(brokers.main, vhost, "bad") == 0
    assert depth(brokers.main, vhost, "good-1") == 2000
