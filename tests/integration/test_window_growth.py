"""The window grows with the round trip it measures (window_growth.py), on real nodes.

The destination sits behind `bench.delay_proxy`, 20 ms each way (a 40 ms round trip,
another datacenter); the job runs as a user runs it (`run_transfer`: Spark, the
ledger, verification) with each window starting at 100 and bound at 1600. A window of
100 moves at most 100 messages a round trip there, so each doubling nearly doubles
the rate and the window grows. What the source had out is sampled from exact depths
while the job runs (`InFlightSampler`), so the growth is seen at the brokers, not only
in the mover's own account; the destination is read back in order after.
"""

from __future__ import annotations

from pathlib import Path

import pika
import yaml
from pyspark.sql import SparkSession

from bench.delay_proxy import DelayProxy
from rmq_spark.config import load_config
from rmq_spark.pipeline import run_transfer
from tests.support.brokers import (
    Brokers,
    Transactions,
    declare,
    fresh_vhost,
    take_all,
    write_config,
)
from tests.support.in_flight import InFlightSampler

MESSAGES = 12_000
START, BOUND = 100, 1600
ONE_WAY_DELAY = 0.020
KiB = 1024


def seed_numbered(brokers: Brokers, vhost: str, queue: str) -> None:
    """1 KiB persistent messages whose message_id is their position in the source."""
    connection = brokers.dr.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        with Transactions(channel) as publish:
            for position in range(MESSAGES):
                body = position.to_bytes(4, "big") * (KiB // 4)
                properties = pika.BasicProperties(delivery_mode=2, message_id=str(position))
                publish("", queue, body, properties)
    finally:
        connection.close()


def test_a_window_starting_small_grows_toward_its_bound_when_the_destination_is_far(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_vhost(brokers, "window-growth")
    seed_numbered(brokers, vhost, "q")
    declare(brokers.main, vhost, "q")  # so the sampler can count it from the start

    with DelayProxy(brokers.main.amqp_port, ONE_WAY_DELAY) as proxy:
        path = write_config(
            tmp_path / "job.yaml",
            brokers,
            vhosts=[vhost],
            ledger=tmp_path / "ledger",
            window={"start_messages": START, "messages": BOUND},
        )
        job = yaml.safe_load(path.read_text(encoding="utf-8"))
        far = f"amqp://127.0.0.1:{proxy.port}"
        # The cluster's address and its node's (the mover connects to the node that
        # hosts the queue, found from its listeners unless the config names it).
        job["clusters"]["main"] |= {"amqp": [far], "nodes": {brokers.main.node_name: far}}
        path.write_text(yaml.safe_dump(job), encoding="utf-8")
        config = load_config(path)
        with InFlightSampler(brokers.dr, brokers.main, vhost, "q", [KiB] * MESSAGES) as sampler:
            result = run_transfer(spark, config, run_id="window-growth")
        relayed = proxy.cpu_seconds()

    assert result.verification.verified, result.verification
    (outcome,) = result.outcomes
    assert outcome.messages == MESSAGES
    assert relayed > 0, "the proxy spent no CPU: the destination was not behind it"
    # 100 -> 200 -> 400 -> ... : it grew at least twice, and never past its bound.
    assert 4 * START <= outcome.window_messages <= BOUND, outcome.window_messages
    # The brokers saw it: more out at once than the window started with, never more
    # than the bound.
    assert START < sampler.peak_messages <= BOUND, sampler.peak_messages
    # Every change of consumer kept source order.
    connection = brokers.main.connect(vhost)
    try:
        ids = [properties.message_id for properties, _body in take_all(connection.channel(), "q")]
    finally:
        connection.close()
    assert ids == [str(position) for position in range(MESSAGES)]
