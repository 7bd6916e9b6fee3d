"""A quorum queue on RabbitMQ 4.x delivers by the `priority` property, with no queue
argument: the run says how many moved messages set it, per transfer into one.

A 4.0 and a 4.3 pair (the session's `brokers_of_version`): the same six messages,
three with a priority and three without, move into a quorum queue and into a classic one. Only the
quorum destination reorders them, and only it is named, with the count, in the queues
table, on the console and in the HTML report.
"""

from __future__ import annotations

import io
from pathlib import Path

import pika
import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.config import load_config
from rmq_spark.devtools.demo import wait_for_depth
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.ledger import tables
from rmq_spark.pipeline import run_transfer
from rmq_spark.report.console import print_queue_table
from rmq_spark.report.html import load_run, render_report
from tests.support.brokers import Brokers, cluster_block, fresh_vhost, take_all

# Published in this order; None: no priority property at all.
PRIORITIES = (0, None, 9, None, 5, None)
WITH_PRIORITY = sum(p is not None for p in PRIORITIES)


def seed(node: LocalNode, vhost: str, queue: str) -> None:
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        for index, priority in enumerate(PRIORITIES):
            properties = pika.BasicProperties(delivery_mode=2, priority=priority)
            channel.basic_publish("", queue, f"m{index}".encode(), properties)
        wait_for_depth(channel, queue, len(PRIORITIES))
    finally:
        connection.close()


def priorities_in_order(node: LocalNode, vhost: str, queue: str) -> list[int | None]:
    """The priority property of each message, in the order the queue delivers them."""
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        return [properties.priority for properties, _body in take_all(channel, queue)]
    finally:
        connection.close()


@pytest.mark.parametrize("brokers_of_version", ["4.0", "4.3"], indirect=True)
@pytest.mark.usefixtures("version_password_env")
def test_the_run_counts_the_messages_a_quorum_destination_on_4_x_reorders_by_priority(
    brokers_of_version: Brokers, tmp_path: Path, spark: SparkSession, request: pytest.FixtureRequest
) -> None:
    version = request.node.callspec.params["brokers_of_version"]
    source, destination = brokers_of_version.dr, brokers_of_version.main
    vhost = fresh_vhost(brokers_of_version, "priority-order")
    for queue in ("into-quorum", "into-classic"):
        seed(source, vhost, queue)
    ledger = tmp_path / "ledger"
    config_path = tmp_path / "job.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "clusters": {
                    "dr": cluster_block(source),
                    "main": cluster_block(destination),
                },
                "routes": [
                    {
                        "name": f"to-{kind}",
                        "source": {"cluster": "dr", "vhosts": [vhost], "queues": [queue]},
                        "destination": {"cluster": "main", "queue_type": kind},
                    }
                    for kind, queue in (("quorum", "into-quorum"), ("classic", "into-classic"))
                ],
                "ledger": {"path": str(ledger)},
            }
        ),
        encoding="utf-8",
    )

    result = run_transfer(spark, load_config(config_path), run_id="priority-order")

    assert result.verification.verified, result.verification
    moved = {o.key.source_queue: o for o in result.outcomes}
    assert {q: o.priority_messages for q, o in moved.items()} == {
        "into-quorum": WITH_PRIORITY,
        "into-classic": WITH_PRIORITY,
    }
    rows = tables.read_rows(str(ledger), "queues", "priority-order")
    assert {r["source_queue"]: r["reordered_by_priority"] for r in rows} == {
        "into-quorum": WITH_PRIORITY,
        "into-classic": 0,
    }
    console = io.StringIO()
    print_queue_table(result, console)
    text = " ".join(console.getvalue().split())
    assert (
        f"priority order: {WITH_PRIORITY} of {len(PRIORITIES)} moved messages set a priority; "
        f"the quorum queue main/{vhost}/into-quorum (RabbitMQ {version}."
    ) in text
    assert "into-classic (RabbitMQ" not in text
    page = render_report(load_run(str(ledger), "priority-order"), None, report_dir=tmp_path)
    section = page.split("<h2>Priority order</h2>", 1)[1].split("</section>", 1)[0]
    assert f'into-quorum</td><td class="num">{WITH_PRIORITY}</td>' in section
    assert "into-classic" not in section
    # What the count warns of: the quorum queue delivers 9 first (4.3: in priority order;
    # 4.0: 5 and above first); the classic one keeps the source's order.
    assert priorities_in_order(destination, vhost, "into-quorum")[0] == 9
    assert priorities_in_order(destination, vhost, "into-classic") == list(PRIORITIES)
