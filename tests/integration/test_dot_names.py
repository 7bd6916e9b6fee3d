"""Queues named `.` and `..`: created over AMQP, moved and verified (real brokers, Spark).

The management API cannot name them in a URL path (dot segments are removed before
the broker sees them), so pre-flight declares missing destinations with queue.declare.
A declare the broker refuses is one pre-flight error naming the queue, and nothing moves.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.config import load_config
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.errors import AccessRefusedError
from rmq_spark.pipeline import run_transfer
from tests.support.brokers import (
    Brokers,
    cluster_block,
    depth,
    fresh_vhost,
    queue_names,
    seed,
    write_config,
)

DOT_QUEUES = {".": 40, "..": 25}
# Management-tagged (not administrator, so pre-flight cannot read its permissions), and
# may publish and consume but declare nothing: only the broker can refuse its declares.
NO_CONFIGURE_USER = "rmq-spark-no-configure"


def test_queues_named_dot_and_dot_dot_are_created_moved_and_verified(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_vhost(brokers, "dot-names")
    for queue, count in DOT_QUEUES.items():
        seed(brokers.dr, vhost, queue, count)
    config = load_config(
        write_config(
            tmp_path / "job.yaml",
            brokers,
            vhosts=[vhost],
            queue_pattern=r"\.{1,2}",
            ledger=tmp_path / "ledger",
        )
    )
    assert queue_names(brokers.main, vhost) == []

    result = run_transfer(spark, config, run_id="dot-names-1")

    assert sorted(t.source_queue for t in result.transfers) == [".", ".."]
    assert all(t.destination_created for t in result.transfers)
    assert result.verification.verified, result.verification
    assert result.verification.messages == sum(DOT_QUEUES.values())
    assert result.verification.lost == 0
    assert queue_names(brokers.main, vhost) == [".", ".."]
    for queue, count in DOT_QUEUES.items():
        assert depth(brokers.main, vhost, queue) == count
        assert depth(brokers.dr, vhost, queue) == 0


def test_declare_refused_by_the_broker_is_one_error_and_nothing_moves(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_vhost(brokers, "dot-names-refused")
    for queue, count in DOT_QUEUES.items():
        seed(brokers.dr, vhost, queue, count)
    _no_configure_user(brokers.main, vhost)
    path = write_config(
        tmp_path / "job.yaml",
        brokers,
        vhosts=[vhost],
        queue_pattern=r"\.{1,2}",
        ledger=tmp_path / "ledger",
    )
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["clusters"]["main"] = {**cluster_block(brokers.main), "username": NO_CONFIGURE_USER}
    path.write_text(yaml.safe_dump(document), encoding="utf-8")

    with pytest.raises(AccessRefusedError) as info:
        run_transfer(spark, load_config(path), run_id="dot-names-refused-1")

    message = str(info.value)
    assert message.startswith("pre-flight found 2 problems; nothing was moved:\n"), message
    for queue in DOT_QUEUES:
        assert (
            f"cluster main vhost '{vhost}' queue '{queue}': missing, and the broker refused "
            f"to declare it (403 ACCESS_REFUSED - access to queue '{queue}' in vhost "
            f"'{vhost}' refused for user '{NO_CONFIGURE_USER}')"
        ) in message
    assert message.count("\n  ") == 2  # one line per problem
    assert brokers.main.password not in message
    assert queue_names(brokers.main, vhost) == []
    for queue, count in DOT_QUEUES.items():
        assert depth(brokers.dr, vhost, queue) == count


# -- helpers ----------------------------------------------------------------------------


def _no_configure_user(node: LocalNode, vhost: str) -> None:
    """The user, with the node's password, allowed everything on `vhost` but declaring."""
    node.management(
        "PUT",
        f"/api/users/{NO_CONFIGURE_USER}",
        json={"tags": "management", "password": node.password},
        timeout=10,
    )
    node.management(
        "PUT",
        f"/api/permissions/{quote(vhost, safe='')}/{NO_CONFIGURE_USER}",
        json={"configure": "^$", "write": ".*", "read": ".*"},
        timeout=10,
    )
