"""The whole job, as a user runs it: spark-submit on local[*] against two real nodes."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from functools import partial
from pathlib import Path

import pyarrow.compute as pc
import pytest

from rmq_spark.devtools.demo import (
    demo_messages,
    demo_queue_names,
    seed_demo,
    wait_for_depth,
)
from rmq_spark.ledger import tables
from tests.support.brokers import (
    Brokers,
    Transactions,
    drain_fingerprints,
    fresh_vhost,
    result_of,
    spark_submit,
    write_config,
)

VHOSTS = ["e2e-orders", "e2e-billing"]
QUEUES_PER_VHOST = 10
MESSAGES_PER_QUEUE = 5000  # 20 queues x 5000 = 100,000 messages


def expected_fingerprints(vhost: str, queue: str, count: int) -> Counter[tuple[str, str]]:
    return Counter(
        (
            hashlib.sha256(message.body).hexdigest(),
            hashlib.sha256(b"".join(message.properties.encode())).hexdigest(),
        )
        for message in demo_messages(vhost, queue, count)
    )


def test_spark_submit_moves_100k_messages_exactly_and_verifies(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    for vhost in VHOSTS:
        fresh_vhost(brokers, vhost)
    seeded = seed_demo(
        brokers.dr.connect,
        vhosts=VHOSTS,
        per_vhost=QUEUES_PER_VHOST,
        messages_per_queue=MESSAGES_PER_QUEUE,
    )
    assert seeded == 100_000
    ledger = tmp_path / "ledger"
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=VHOSTS, ledger=ledger, max_active=2
    )

    completed = spark_submit(config, "e2e-1")

    assert completed.returncode == 0, completed.stderr[-5000:]
    result = result_of(completed.stdout)
    assert result["queues"] == 20
    assert result["messages"] == 100_000
    assert result["bytes"] == 100_000 * 1024
    assert (result["lost"], result["duplicates"], result["unexpected"]) == (0, 0, 0)
    assert result["verified"] is True
    # The run's HTML report is written beside the ledger, and named.
    report = ledger / "reports" / "run_id=e2e-1" / "report.html"
    assert result["report"] == str(report)
    assert "e2e-1" in report.read_text(encoding="utf-8")
    assert f"report: {report}" in completed.stdout

    # An independent consumer finds exactly what was published, queue by queue.
    ledger_rows = tables.read_arrow(str(ledger), "messages", run_id="e2e-1")
    assert ledger_rows.num_rows == 100_000
    for vhost, queue in demo_queue_names(VHOSTS, QUEUES_PER_VHOST):
        expected = expected_fingerprints(vhost, queue, MESSAGES_PER_QUEUE)
        found = drain_fingerprints(partial(brokers.main.connect, vhost), queue)
        assert found == expected, f"{vhost}/{queue}: destination differs from what was published"
        rows = ledger_rows.filter(
            pc.and_(
                pc.equal(ledger_rows["source_vhost"], vhost),
                pc.equal(ledger_rows["source_queue"], queue),
            )
        )
        in_ledger = Counter(
            zip(rows["body_sha256"].to_pylist(), rows["properties_sha256"].to_pylist(), strict=True)
        )
        assert in_ledger == expected, f"{vhost}/{queue}: ledger checksums differ from the messages"
        assert sorted(rows["position"].to_pylist()) == list(range(MESSAGES_PER_QUEUE))
        source_left = drain_fingerprints(partial(brokers.dr.connect, vhost), queue)
        assert not source_left, f"{vhost}/{queue}: source not drained"

    # Verification and run records sit beside the ledger.
    verification = json.loads(Path(str(result["verification"])).read_text())
    assert verification["totals"]["lost"] == 0
    assert Path(str(result["data_docs"])).is_file()
    runs = tables.read_arrow(str(ledger), "runs").to_pylist()
    assert [(r["run_id"], r["messages"], r["verified"]) for r in runs] == [("e2e-1", 100_000, True)]

    # No secret anywhere a user or analyst can see.
    assert password_env not in completed.stdout
    assert password_env not in completed.stderr
    secret = password_env.encode()
    for path in ledger.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), f"password found in {path}"


# On 4.x the same job on a smaller volume: 2 vhosts x 2 queues x 2,500 = 10,000 messages.
VHOSTS_4X = ["e2e4-orders", "e2e4-billing"]
QUEUES_PER_VHOST_4X = 2
MESSAGES_PER_QUEUE_4X = 2500
REFERENCE_VHOST = "e2e4-reference"


def delivered_by_source(brokers: Brokers, vhost: str, queue: str) -> Counter[tuple[str, str]]:
    """What the source node delivers for a queue's demo messages, read from a copy.

    From 3.13 on the broker writes 0-9-1 properties anew on delivery (headers sorted by
    name), so what a consumer of the source gets is the reference for byte-exact, not
    what pika published. The copy sits in a vhost the job does not touch.
    """
    brokers.dr.add_vhost(REFERENCE_VHOST)
    reference = f"ref.{vhost}.{queue}"
    connection = brokers.dr.connect(REFERENCE_VHOST)
    try:
        channel = connection.channel()
        channel.queue_declare(reference, durable=True)
        channel.queue_purge(reference)
        with Transactions(channel) as publish:
            for message in demo_messages(vhost, queue, MESSAGES_PER_QUEUE_4X):
                publish("", reference, message.body, message.properties)
        wait_for_depth(channel, reference, MESSAGES_PER_QUEUE_4X)
    finally:
        connection.close()
    return drain_fingerprints(lambda: brokers.dr.connect(REFERENCE_VHOST), reference)


@pytest.mark.parametrize("brokers_of_version", ["4.0", "4.3"], indirect=True)
def test_spark_submit_moves_messages_as_the_source_delivered_them_on_4x(
    brokers_of_version: Brokers, version_password_env: str, tmp_path: Path
) -> None:
    brokers = brokers_of_version
    for vhost in VHOSTS_4X:
        fresh_vhost(brokers, vhost)
    seeded = seed_demo(
        brokers.dr.connect,
        vhosts=VHOSTS_4X,
        per_vhost=QUEUES_PER_VHOST_4X,
        messages_per_queue=MESSAGES_PER_QUEUE_4X,
    )
    assert seeded == 10_000
    ledger = tmp_path / "ledger"
    config = write_config(
        tmp_path / "job.yaml", brokers, vhosts=VHOSTS_4X, ledger=ledger, max_active=2
    )

    completed = spark_submit(config, "e2e-4x")

    assert completed.returncode == 0, completed.stderr[-5000:]
    result = result_of(completed.stdout)
    version = brokers.dr.version
    assert (result["queues"], result["messages"], result["bytes"]) == (4, 10_000, 10_000 * 1024)
    assert (result["lost"], result["duplicates"], result["unexpected"]) == (0, 0, 0)
    assert result["verified"] is True
    versions = result["rabbitmq_versions"]
    assert isinstance(versions, dict)
    assert sorted(versions) == ["dr", "main"]
    assert all(v.startswith(f"{version}.") for v in versions.values()), versions
    runs = tables.read_arrow(str(ledger), "runs").to_pylist()
    assert [json.loads(r["rabbitmq_versions"]) for r in runs] == [versions]

    ledger_rows = tables.read_arrow(str(ledger), "messages", run_id="e2e-4x")
    assert ledger_rows.num_rows == 10_000
    for vhost, queue in demo_queue_names(VHOSTS_4X, QUEUES_PER_VHOST_4X):
        expected = delivered_by_source(brokers, vhost, queue)
        published = expected_fingerprints(vhost, queue, MESSAGES_PER_QUEUE_4X)
        # The premise: the source re-encodes properties (the bodies stay as published).
        assert expected != published
        assert sorted(b for b, _ in expected.elements()) == sorted(
            b for b, _ in published.elements()
        )
        found = drain_fingerprints(partial(brokers.main.connect, vhost), queue)
        assert found == expected, f"{vhost}/{queue}: destination differs from what source delivered"
        rows = ledger_rows.filter(
            pc.and_(
                pc.equal(ledger_rows["source_vhost"], vhost),
                pc.equal(ledger_rows["source_queue"], queue),
            )
        )
        in_ledger = Counter(
            zip(rows["body_sha256"].to_pylist(), rows["properties_sha256"].to_pylist(), strict=True)
        )
        assert in_ledger == expected, f"{vhost}/{queue}: ledger checksums differ from deliveries"
        assert sorted(rows["position"].to_pylist()) == list(range(MESSAGES_PER_QUEUE_4X))
        source_left = drain_fingerprints(partial(brokers.dr.connect, vhost), queue)
        assert not source_left, f"{vhost}/{queue}: source not drained"
    assert version_password_env not in completed.stdout + completed.stderr
