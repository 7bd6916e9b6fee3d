"""Moves between RabbitMQ versions: 3.10 into 4.3 (the blue-green upgrade) and back.

The source is a 3.10 node of the session's `brokers` or a 4.3 node of
`brokers_of_version`; the destination the other. Each cluster has its own password,
so each names its own variable.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.config import load_config
from rmq_spark.devtools.demo import demo_messages
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.pipeline import run_transfer
from tests.support.brokers import (
    Brokers,
    drain_fingerprints,
    fresh_vhost,
    seed_declared,
)

MESSAGES = 400
SOURCE_PASSWORD_ENV = "RMQ_SPARK_TEST_SOURCE_PASSWORD"
DESTINATION_PASSWORD_ENV = "RMQ_SPARK_TEST_DESTINATION_PASSWORD"


def cluster(node: LocalNode, password_env: str) -> dict[str, object]:
    return {
        "amqp": [node.amqp_uri],
        "management": node.management_url,
        "username": node.username,
        "password_env": password_env,
    }


def write_cross_config(
    path: Path,
    source: LocalNode,
    destination: LocalNode,
    vhost: str,
    monkeypatch: pytest.MonkeyPatch,
    **spec: object,
) -> Path:
    monkeypatch.setenv(SOURCE_PASSWORD_ENV, source.password)
    monkeypatch.setenv(DESTINATION_PASSWORD_ENV, destination.password)
    config = {
        "clusters": {
            "old": cluster(source, SOURCE_PASSWORD_ENV),
            "new": cluster(destination, DESTINATION_PASSWORD_ENV),
        },
        "routes": [
            {
                "name": "upgrade",
                "source": {"cluster": "old", "vhosts": [vhost]},
                "destination": {"cluster": "new", **spec},
            }
        ],
        "ledger": {"path": str(path.parent / "ledger")},
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def body_digests(node: LocalNode, vhost: str, queue: str) -> Counter[str]:
    """The sha256 of every body an independent consumer finds in the queue."""
    found = drain_fingerprints(lambda: node.connect(vhost), queue)
    digests: Counter[str] = Counter()
    for (body, _properties), copies in found.items():
        digests[body] += copies
    return digests


def queue_info(node: LocalNode, vhost: str, queue: str) -> dict[str, Any]:
    info: dict[str, Any] = node.management(
        "GET", f"/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}", timeout=10
    )
    return info


@pytest.mark.parametrize("brokers_of_version", ["4.3"], indirect=True)
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_lazy_classic_queue_on_3_10_moves_into_4_3_and_verifies(
    brokers: Brokers,
    brokers_of_version: Brokers,
    tmp_path: Path,
    spark: SparkSession,
    *,
    monkeypatch: pytest.MonkeyPatch,
    queue_type: str,
) -> None:
    """4.3 ignores x-queue-mode (its release notes announce a refusal on declare): the
    destination is created without it."""
    old, new = brokers.dr, brokers_of_version.main
    vhost = fresh_vhost(Brokers(dr=old, main=new), f"upgrade-{queue_type}")
    seed_declared(old, vhost, "orders", MESSAGES, {"x-queue-mode": "lazy"})  # as 3.x had it
    config = load_config(
        write_cross_config(
            tmp_path / "job.yaml",
            old,
            new,
            vhost,
            monkeypatch,
            queue_type=queue_type,
        )
    )

    result = run_transfer(spark, config, run_id=f"upgrade-{queue_type}")

    assert result.verification.verified, result.verification
    assert (result.verification.messages, result.verification.lost) == (MESSAGES, 0)
    assert result.rabbitmq_versions["old"].startswith("3.10.")
    assert result.rabbitmq_versions["new"].startswith("4.3.")
    created = queue_info(new, vhost, "orders")
    assert created["type"] == queue_type
    assert "x-queue-mode" not in created["arguments"]
    # An independent consumer finds every body once (4.x re-encodes the properties on
    # delivery, so their bytes are compared by the byte-exact tests, not here).
    expected = Counter(
        hashlib.sha256(m.body).hexdigest() for m in demo_messages(vhost, "orders", MESSAGES)
    )
    assert body_digests(new, vhost, "orders") == expected


@pytest.mark.parametrize("brokers_of_version", ["4.3"], indirect=True)
def test_a_quorum_queue_on_4_3_rolls_back_into_a_classic_queue_on_3_10(
    brokers: Brokers,
    brokers_of_version: Brokers,
    tmp_path: Path,
    spark: SparkSession,
    *,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old, new = brokers_of_version.dr, brokers.main
    vhost = fresh_vhost(Brokers(dr=old, main=new), "rollback")
    seed_declared(old, vhost, "orders", MESSAGES, {"x-queue-type": "quorum"})
    config = load_config(
        write_cross_config(
            tmp_path / "job.yaml", old, new, vhost, monkeypatch, queue_type="classic"
        )
    )

    result = run_transfer(spark, config, run_id="rollback")

    assert result.verification.verified, result.verification
    assert (result.verification.messages, result.verification.lost) == (MESSAGES, 0)
    assert queue_info(new, vhost, "orders")["type"] == "classic"
    expected = Counter(
        hashlib.sha256(m.body).hexdigest() for m in demo_messages(vhost, "orders", MESSAGES)
    )
    assert body_digests(new, vhost, "orders") == expected
