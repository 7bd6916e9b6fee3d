"""A quorum queue whose leader is too busy to count is not taken for an empty one.

RabbitMQ 3.10 answers a passive queue.declare on a quorum queue with "0 messages,
0 consumers" when the leader does not reply within 250 ms. Here the leader's Ra
process is really suspended (`sys:suspend`, over `rabbitmqctl eval`) on the test's
3-node cluster, so the broker itself gives those answers: the counts, the helper
queue emptiness check and the mover's drain check must all see through them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest
from pyspark.sql import SparkSession

from rmq_spark.broker.counts import QUORUM_STAT_TIMEOUT_SECONDS, queue_depths, queue_is_empty
from rmq_spark.config import JobConfig, load_config
from rmq_spark.devtools.local_brokers import LocalCluster
from rmq_spark.pipeline import run_transfer
from tests.support.clusters import (
    exact_depth,
    fresh_cluster_vhost,
    write_cluster_config,
)
from tests.support.faults import wait_until

pytestmark = pytest.mark.usefixtures("cluster_password_env")


@pytest.fixture
def vhost(quorum_cluster: LocalCluster, request: pytest.FixtureRequest) -> str:
    return fresh_cluster_vhost(quorum_cluster, f"busy-{request.node.name[:40]}")


def fill_quorum_queue(cluster: LocalCluster, vhost: str, queue: str, count: int) -> None:
    connection = cluster.first.connect(vhost)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        for index in range(count):
            properties = pika.BasicProperties(delivery_mode=2, message_id=f"m-{index}")
            channel.basic_publish("", queue, f"message {index}".encode(), properties)
    finally:
        connection.close()


def raw_declare(cluster: LocalCluster, vhost: str, queue: str) -> tuple[int, int, float]:
    """(messages, consumers, seconds) of one passive declare, as the broker answers it
    (a busy leader's zero included; `exact_depth` sees through that)."""
    connection = cluster.first.connect(vhost)
    try:
        asked = time.monotonic()
        ok = connection.channel().queue_declare(queue, passive=True).method
        return ok.message_count, ok.consumer_count, time.monotonic() - asked
    finally:
        connection.close()


def leader_does_not_answer(cluster: LocalCluster, vhost: str, queue: str) -> bool:
    """The broker reports the non-empty queue as empty, after the stat timeout."""
    messages, consumers, seconds = raw_declare(cluster, vhost, queue)
    return messages == 0 and consumers == 0 and seconds >= QUORUM_STAT_TIMEOUT_SECONDS


@contextmanager
def busy_leader(
    cluster: LocalCluster,
    vhost: str,
    queue: str,
    *,
    cycles: int,
    suspended_ms: int,
    awake_ms: int,
) -> Iterator[None]:
    """Suspend the queue's Ra leader `cycles` times (it is always resumed after each)."""
    expression = (
        f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"{vhost}">>, queue, <<"{queue}">>)),'
        " {Name, Node} = amqqueue:get_pid(Q),"
        " P = rpc:call(Node, erlang, whereis, [Name]),"
        " lists:foreach(fun(_) -> sys:suspend(P), timer:sleep("
        f"{suspended_ms}), sys:resume(P), timer:sleep({awake_ms}) end,"
        f" lists:seq(1, {cycles})), ok."
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            cluster.first.rabbitmqctl("eval", expression, timeout=120)
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="busy-leader", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(120)
    assert not errors, errors
    assert not thread.is_alive(), "the leader's suspend cycles did not end"


def test_counts_and_the_emptiness_check_wait_for_a_busy_leader(
    quorum_cluster: LocalCluster, vhost: str, tmp_path: Path
) -> None:
    fill_quorum_queue(quorum_cluster, vhost, "counted", 100)
    cluster_config = busy_config(tmp_path, quorum_cluster, vhost).clusters["qq"]
    with busy_leader(quorum_cluster, vhost, "counted", cycles=2, suspended_ms=3000, awake_ms=300):
        wait_until(
            lambda: leader_does_not_answer(quorum_cluster, vhost, "counted"),
            "the broker to report the busy quorum queue as empty",
        )
        assert not queue_is_empty("qq", cluster_config, vhost, "counted")
        wait_until(
            lambda: leader_does_not_answer(quorum_cluster, vhost, "counted"),
            "the second suspension",
        )
        assert queue_depths("qq", cluster_config, vhost, ["counted"]) == {"counted": 100}
    # The emptiness check put back what it took.
    assert exact_depth(quorum_cluster, vhost, "counted") == 100


MESSAGES = 1500


def test_a_transfer_out_of_a_quorum_queue_with_a_busy_leader_moves_everything(
    spark: SparkSession, quorum_cluster: LocalCluster, vhost: str, tmp_path: Path
) -> None:
    """The leader is suspended 400 ms at a time with 5 ms awake in between: most drain
    checks land in a suspension, and so would the check after the cancel."""
    fill_quorum_queue(quorum_cluster, vhost, "busy.src", MESSAGES)
    config = busy_config(tmp_path, quorum_cluster, vhost)
    with busy_leader(quorum_cluster, vhost, "busy.src", cycles=40, suspended_ms=400, awake_ms=5):
        wait_until(
            lambda: leader_does_not_answer(quorum_cluster, vhost, "busy.src"),
            "the broker to report the busy quorum queue as empty",
        )
        result = run_transfer(spark, config, run_id="busy-leader")
    assert exact_depth(quorum_cluster, vhost, "busy.src") == 0
    assert exact_depth(quorum_cluster, vhost, "busy.dst") == MESSAGES
    assert result.verification.verified, result.verification.failed_expectations


def busy_config(tmp_path: Path, cluster: LocalCluster, vhost: str) -> JobConfig:
    """busy.src -> busy.dst (a quorum queue) on the test cluster, window 100."""
    path = write_cluster_config(
        tmp_path / "busy.yaml",
        cluster,
        vhost,
        queues=["busy.src"],
        destination={"queue": "busy.dst", "queue_type": "quorum"},
        window={"messages": 100},
    )
    return load_config(path)
