"""The byte window holds whatever the management API's statistics say (byte_window.py).

Each test measures what is in flight from exact depths while the job runs: the
destination's count, the source's ready count, and the destination's count again,
each by a passive declare. In source order (one consumer per queue), the messages
in flight are the positions from the destination's count up to what has left the
source. A sample counts only when the destination's count did not move while the
source's was read, so it is what was in flight at that moment.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import pika
import pytest
from pyspark.sql import SparkSession

from rmq_spark.config import load_config
from rmq_spark.devtools.local_brokers import LocalNode, start_nodes, stop_nodes
from rmq_spark.pipeline import RunResult, run_transfer
from tests.support.brokers import (
    Brokers,
    Transactions,
    declare,
    fresh_vhost,
    write_config,
)
from tests.support.in_flight import InFlightSampler

KiB = 1024
MiB = 1024 * KiB


def publish(node: LocalNode, vhost: str, queue: str, sizes: Sequence[int]) -> None:
    """Persistent messages of these body sizes, in order, committed by the broker."""
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        # Committed every 100: a batch of 1 MiB bodies stays a modest transaction.
        with Transactions(channel, every=100) as publish:
            for position, size in enumerate(sizes):
                body = position.to_bytes(4, "big") * (size // 4) + b"\x00" * (size % 4)
                publish(
                    "", queue, body, pika.BasicProperties(delivery_mode=2, message_id=str(position))
                )
    finally:
        connection.close()


def move_watched(
    spark: SparkSession,
    brokers: Brokers,
    tmp_path: Path,
    vhost: str,
    sizes: list[int],
    *,
    window_bytes: int,
    run_id: str,
) -> tuple[RunResult, InFlightSampler]:
    config = load_config(
        write_config(
            tmp_path / "job.yaml",
            brokers,
            vhosts=[vhost],
            ledger=tmp_path / "ledger",
            window={"messages": 5000, "bytes": window_bytes},
        )
    )
    declare(brokers.main, vhost, "q")  # so the sampler can count it from the start
    with InFlightSampler(brokers.dr, brokers.main, vhost, "q", sizes) as sampler:
        result = run_transfer(spark, config, run_id=run_id)
    assert result.verification.verified, result.verification
    assert [o.messages for o in result.outcomes] == [len(sizes)]
    assert sampler.samples > 10, "the transfer was over before it could be watched"
    return result, sampler


def test_large_messages_published_just_before_the_run_stay_within_the_byte_window(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_vhost(brokers, "byte-window-fresh")
    sizes = [MiB] * 200
    publish(brokers.dr, vhost, "q", sizes)  # the job starts at once: no byte statistics yet

    result, sampler = move_watched(
        spark, brokers, tmp_path, vhost, sizes, window_bytes=16 * MiB, run_id="bytes-fresh"
    )

    # 16 MiB window: at most 16 messages held, plus the one whose arrival crossed it.
    assert sampler.peak_messages <= 17, sampler.peak_messages
    assert sampler.peak_bytes <= 17 * MiB
    assert 0 < result.outcomes[0].peak_held_bytes <= 17 * MiB


def test_a_queue_of_small_messages_with_a_few_huge_ones_holds_the_byte_window(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_vhost(brokers, "byte-window-mixed")
    # The large ones together, after a run of small ones, so a prefetch sized for
    # 1 KiB messages would have all four out at once (128 MiB).
    sizes = [KiB] * 3000 + [32 * MiB] * 4 + [KiB] * 3000 + [32 * MiB] + [KiB] * 1000
    publish(brokers.dr, vhost, "q", sizes)

    result, _sampler = move_watched(
        spark, brokers, tmp_path, vhost, sizes, window_bytes=64 * MiB, run_id="bytes-mixed"
    )

    # What the mover held: the window plus at most the one message that crossed it.
    assert result.outcomes[0].peak_held_bytes <= 64 * MiB + 32 * MiB


@pytest.fixture(scope="module")
def statless_source(
    brokers: Brokers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Brokers]:
    """A source node whose management metrics collector is off (Prometheus shops):
    its API has queues but no message counts or bytes. The destination is `main`."""
    nodes = start_nodes(
        ["nostats"],
        tmp_path_factory.mktemp("statless"),
        password=brokers.dr.password,
        settings={"management_agent.disable_metrics_collector": "true"},
    )
    try:
        yield Brokers(dr=nodes[0], main=brokers.main)
    finally:
        stop_nodes(nodes, remove_data=True)


def test_without_management_statistics_the_job_moves_within_the_window_and_says_bytes_unknown(
    statless_source: Brokers,
    password_env: str,
    tmp_path: Path,
    spark: SparkSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    brokers = statless_source
    vhost = fresh_vhost(brokers, "byte-window-nostats")
    sizes = [MiB] * 120
    publish(brokers.dr, vhost, "q", sizes)

    with caplog.at_level(logging.INFO, logger="rmq_spark.progress"):
        result, sampler = move_watched(
            spark, brokers, tmp_path, vhost, sizes, window_bytes=8 * MiB, run_id="bytes-nostats"
        )

    assert [t.messages for t in result.transfers] == [120]
    assert sampler.peak_messages <= 9, sampler.peak_messages
    lines = [r.getMessage() for r in caplog.records if r.name == "rmq_spark.progress"]
    assert lines, "no progress line was logged"
    assert all("bytes_rate=unknown" in line for line in lines), lines
