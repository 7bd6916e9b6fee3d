"""What 4.x changes about a broker refusing the mover: consumer timeouts and sizes.

- A consumer holding deliveries past `consumer_timeout` (here: while the destination
  is blocked by a memory alarm, so nothing is confirmed) has its channel closed (406
  PRECONDITION_FAILED) on 3.10, 4.0 and 4.3.6 (4.3's quorum queue times the consumer
  out itself and returns its deliveries; the channel then closes). The transfer goes
  on in a new session and nothing is lost; the deliveries taken back come again and
  are named duplicates.
- A message above the destination's `max_message_size` (4.0 lowered the default to
  16 MiB) closes the destination's channel (406): the queue fails with one error naming
  the size and the limit, that message stays in the source, nothing else is lost.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pika
import pytest

from rmq_spark.broker.management import management_clients
from rmq_spark.config import JobConfig
from rmq_spark.devtools.local_brokers import LocalNode, start_nodes, stop_nodes
from rmq_spark.ledger import tables
from rmq_spark.planning.discovery import discover
from rmq_spark.transfer.executor import ExecutorSettings
from tests.support.brokers import Brokers, MoverThread, depth, fresh_vhost, take_all
from tests.support.faults import fault_config, mover_connections, wait_until

CONSUMER_TIMEOUT_MS = 3000
DEFAULT_CONSUMER_TIMEOUT_MS = 1_800_000
DEFAULT_CHANNEL_TICK_MS = 60_000
TIMEOUT_MESSAGES = 2000
TIMEOUT_WINDOW = 200
SMALL_MAX_MESSAGE_SIZE = 4096


def mover_thread(config: JobConfig, run_id: str, window: int) -> MoverThread:
    """The config's one queue transfer, as the executor would run it, in a thread."""
    with management_clients(config) as clients:
        (transfer,) = discover(config, clients)
    tables.ensure_tables(config.ledger.path)
    settings = ExecutorSettings(
        run_id=run_id,
        ledger_path=config.ledger.path,
        clusters=dict(config.clusters),
        window_messages=window,
        window_bytes=1 << 30,
        mover=config.mover,
    )
    return MoverThread(asdict(transfer), settings)


def ledger_rows(mover: MoverThread) -> list[dict[str, object]]:
    ledger_path, run_id = mover.settings.ledger_path, mover.settings.run_id
    tables.commit_run(ledger_path, run_id)
    rows: list[dict[str, object]] = tables.read_arrow(
        ledger_path, "messages", run_id=run_id
    ).to_pylist()
    return rows


def publish(node: LocalNode, brokers: Brokers, vhost: str, queue: str, bodies: list[bytes]) -> None:
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for body in bodies:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()
    wait_until(lambda: depth(node, vhost, queue) == len(bodies), "the messages to land")


def drain_bodies(brokers: Brokers, node: LocalNode, vhost: str, queue: str) -> Counter[bytes]:
    """Independent consumer: every body in the queue (taken and acked)."""
    found: Counter[bytes] = Counter()
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for _properties, body in take_all(channel, queue):
            found[body] += 1
        return found
    finally:
        connection.close()


def set_env(node: LocalNode, key: str, value: int) -> None:
    """An application setting of a running node; channels opened afterwards read it."""
    node.rabbitmqctl("eval", f"application:set_env(rabbit, {key}, {value}).")


def source_consumers(brokers: Brokers, vhost: str) -> int:
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        return int(channel.queue_declare("orders", passive=True).method.consumer_count)
    finally:
        connection.close()


def publisher_blocked(brokers: Brokers, run_id: str) -> bool:
    states = {c.get("state") for c in mover_connections(brokers.main, "publisher", run_id)}
    return bool(states & {"blocked", "blocking"})


@pytest.mark.parametrize("brokers_of_version", ["4.3", "4.0", "3.10"], indirect=True)
def test_consumer_timeout_while_the_destination_is_blocked_is_ridden_out(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    brokers = brokers_of_version
    version = brokers.dr.version
    vhost = fresh_vhost(brokers, "consumer-timeout")
    connection = brokers.dr.connect(vhost)
    try:
        connection.channel().queue_declare(
            "orders", durable=True, arguments={"x-queue-type": "quorum"}
        )
    finally:
        connection.close()
    bodies = [f"timeout-{i:05d}".encode() * 20 for i in range(TIMEOUT_MESSAGES)]
    publish(brokers.dr, brokers, vhost, "orders", bodies)
    config = fault_config(tmp_path, brokers, vhost)
    run_id = f"consumer-timeout-{version}"
    mover = mover_thread(config, run_id, TIMEOUT_WINDOW)

    # Channels read consumer_timeout when they open; 3.10 and 4.0 check it on the
    # channel's tick, every channel_tick_interval.
    set_env(brokers.dr, "consumer_timeout", CONSUMER_TIMEOUT_MS)
    set_env(brokers.dr, "channel_tick_interval", 500)
    brokers.main.rabbitmqctl("set_vm_memory_high_watermark", "0")
    try:
        mover.start()
        wait_until(lambda: publisher_blocked(brokers, run_id), "the publisher to be blocked")
        assert depth(brokers.main, vhost, "orders") == 0
        # The source takes its consumer away: cancelled (4.3) or its channel closed.
        wait_until(lambda: source_consumers(brokers, vhost) == 0, "the consumer to time out")
    finally:
        brokers.main.rabbitmqctl("set_vm_memory_high_watermark", "0.4")
        set_env(brokers.dr, "consumer_timeout", DEFAULT_CONSUMER_TIMEOUT_MS)
        set_env(brokers.dr, "channel_tick_interval", DEFAULT_CHANNEL_TICK_MS)
    mover.join(180)
    assert not mover.is_alive()

    assert mover.error is None, mover.error
    assert mover.outcome is not None
    assert (mover.outcome.status, mover.outcome.error) == ("moved", None)
    # 4.3.6 closes the channel too (406, "Timeout value used: -1 ms"): its quorum
    # queue takes the deliveries back and the channel falls back to closing.
    assert mover.outcome.sessions >= 2
    in_destination = drain_bodies(brokers, brokers.main, vhost, "orders")
    assert depth(brokers.dr, vhost, "orders") == 0
    assert set(in_destination) == set(bodies)  # nothing lost
    # Every copy in the destination has a ledger row, and each repeat is named.
    rows = ledger_rows(mover)
    confirmed = [r for r in rows if r["confirmed_at"] is not None]
    uncertain = len(rows) - len(confirmed)
    seen: set[object] = set()
    named = 0
    for row in sorted(confirmed, key=lambda r: int(str(r["position"]))):
        named += row["body_sha256"] in seen and bool(row["redelivered"])
        seen.add(row["body_sha256"])
    duplicates = sum(in_destination.values()) - len(bodies)
    assert duplicates > 0 or uncertain > 0  # the deliveries taken back came again
    assert named <= duplicates <= named + uncertain
    assert duplicates <= TIMEOUT_WINDOW * mover.outcome.sessions


@pytest.fixture(scope="module")
def small_destination(
    brokers: Brokers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Brokers]:
    """The session's 3.10 source, and a 4.3 destination refusing messages above 4 KiB."""
    (node,) = start_nodes(
        ["small"],
        tmp_path_factory.mktemp("small-destination"),
        password=brokers.dr.password,
        version="4.3",
        settings={"max_message_size": str(SMALL_MAX_MESSAGE_SIZE)},
    )
    try:
        yield Brokers(dr=brokers.dr, main=node)
    finally:
        stop_nodes([node], remove_data=True)


def test_message_too_large_for_a_4x_destination_stops_the_queue_and_stays(
    small_destination: Brokers, password_env: str, tmp_path: Path
) -> None:
    brokers = small_destination
    vhost = fresh_vhost(brokers, "oversize-" + secrets.token_hex(3))
    connection = brokers.dr.connect(vhost)
    try:
        connection.channel().queue_declare("orders", durable=True)
    finally:
        connection.close()
    big = b"B" * (2 * SMALL_MAX_MESSAGE_SIZE)
    bodies = [f"small-{i:04d}".encode() * 50 for i in range(150)]
    bodies = [*bodies[:100], big, *bodies[100:]]
    publish(brokers.dr, brokers, vhost, "orders", bodies)
    config = fault_config(tmp_path, brokers, vhost)
    mover = mover_thread(config, "oversize", 20)
    mover.start()
    mover.join(120)
    assert not mover.is_alive()

    assert mover.error is None, mover.error
    assert mover.outcome is not None
    assert mover.outcome.status == "failed"
    error = mover.outcome.error or ""
    assert f"destination cluster main vhost {vhost!r} queue 'orders'" in error
    assert f"406 PRECONDITION_FAILED) a message of {len(big)} bytes" in error
    assert f"max_message_size {SMALL_MAX_MESSAGE_SIZE}" in error
    assert "source position 100" in error
    assert error.count("refused (") == 1  # one error, not one per message

    in_source = drain_bodies(brokers, brokers.dr, vhost, "orders")
    in_destination = drain_bodies(brokers, brokers.main, vhost, "orders")
    assert in_source[big] == 1  # never acked
    assert big not in in_destination
    assert set(in_source) | set(in_destination) == set(bodies)  # nothing else lost
    rows = ledger_rows(mover)
    assert all(r["body_size"] != len(big) for r in rows)  # refused: no row
    confirmed = [r for r in rows if r["confirmed_at"] is not None]
    assert len(confirmed) <= sum(in_destination.values()) <= len(rows)
