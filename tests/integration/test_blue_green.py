"""The blue-green upgrade as an operator runs it: a 3.10 cluster drained into a 4.3 one.

Blue is the session's 3-node 3.10 cluster (`quorum_cluster`), with mirrored classic
queues (an `ha-mode` policy), a topic and a direct exchange bound to them, length
and TTL policies, and queue federation from an upstream (another vhost of the same
cluster, so no extra node is started). Green is the session's 3-node 4.3 cluster
(`quorum_cluster_4_3`). Both are shared with other tests: each test takes vhosts of
its own. The job creates green's queues as quorum queues (`destination.queue_type`)
and copies what they need (`destination.topology: copy`); an independent consumer
then finds every body on green, and a publish through green's copied exchanges
reaches the moved queues. The roll-back test runs the other way (4.3 quorum → 3.10
classic).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.broker.management import management_clients
from rmq_spark.cli import main
from rmq_spark.config import JobConfig, load_config
from rmq_spark.devtools.demo import demo_messages, wait_for_depth
from rmq_spark.devtools.local_brokers import LocalCluster, LocalNode
from rmq_spark.errors import DestinationIncompatibleError
from rmq_spark.pipeline import run_transfer
from rmq_spark.planning.discovery import discover
from tests.support.brokers import drain_fingerprints
from tests.support.faults import wait_until

MESSAGES = 150
UPSTREAM_MESSAGES = 30
BLUE_PASSWORD_ENV = "RMQ_SPARK_TEST_BLUE_PASSWORD"
GREEN_PASSWORD_ENV = "RMQ_SPARK_TEST_GREEN_PASSWORD"
UPSTREAM = "blue-peer"

# Blue's queues and the arguments 3.x operators gave them.
BLUE_QUEUES: dict[str, dict[str, Any]] = {
    "orders.eu": {
        "x-queue-mode": "lazy",
        "x-queue-master-locator": "min-masters",
        "x-max-length": 5_000,
        "x-dead-letter-exchange": "dead",
    },
    "orders.us": {},
    "audit": {"x-queue-version": 1},
    # Moved into a classic queue on 4.3 (route "legacy"): 4.3 refuses version 1 and the
    # master locator on declare.
    "legacy": {"x-queue-version": 1, "x-queue-master-locator": "client-local"},
}
EXCHANGES = {"orders": "topic", "audit-events": "direct"}
BINDINGS = (  # exchange, queue, routing key
    ("orders", "orders.eu", "orders.eu.#"),
    ("orders", "orders.us", "orders.us.#"),
    ("orders", "audit", "#"),
    ("audit-events", "audit", "audit"),
    ("audit-events", "legacy", "legacy"),
)
ORDERS_POLICY = {
    "pattern": r"^orders\.",
    "apply-to": "queues",
    "priority": 1,
    "definition": {
        "ha-mode": "exactly",
        "ha-params": 2,
        "ha-sync-mode": "automatic",
        "queue-mode": "lazy",
        "federation-upstream": UPSTREAM,
        "message-ttl": 3_600_000,
        "max-length": 10_000,
    },
}
AUDIT_POLICY = {  # mirroring only: nothing of it is left for 4.3
    "pattern": "^audit$",
    "apply-to": "queues",
    "priority": 0,
    "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"},
}


def q(name: str) -> str:
    return quote(name, safe="")


def fresh(cluster: LocalCluster, vhost: str) -> str:
    cluster.first.management("DELETE", f"/api/vhosts/{q(vhost)}", missing_ok=True)
    cluster.first.add_vhost(vhost)
    return vhost


def cluster_block(cluster: LocalCluster, password_env: str) -> dict[str, object]:
    return {
        "amqp": cluster.amqp_uris,
        "management": cluster.first.management_url,
        "username": cluster.first.username,
        "password_env": password_env,
    }


def publish_demo(node: LocalNode, vhost: str, queue: str, count: int) -> None:
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for message in demo_messages(vhost, queue, count):
            channel.basic_publish("", queue, message.body, message.properties)
        wait_for_depth(channel, queue, count)
    finally:
        connection.close()


def declare_topology(
    node: LocalNode,
    vhost: str,
    queues: dict[str, dict[str, Any]],
    exchanges: dict[str, str],
    bindings: tuple[tuple[str, str, str], ...],
) -> None:
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for name, kind in exchanges.items():
            channel.exchange_declare(name, kind, durable=True)
        for name, arguments in queues.items():
            channel.queue_declare(name, durable=True, arguments=arguments)
        for exchange, queue, key in bindings:
            channel.queue_bind(queue, exchange, key)
    finally:
        connection.close()


def queue_info(node: LocalNode, vhost: str, queue: str) -> dict[str, Any]:
    info: dict[str, Any] = node.management("GET", f"/api/queues/{q(vhost)}/{q(queue)}")
    return info


def bindings_of(node: LocalNode, vhost: str) -> set[tuple[str, str, str, str]]:
    rows = node.management("GET", f"/api/bindings/{q(vhost)}")
    return {
        (row["source"], row["destination"], row["routing_key"], repr(row["arguments"]))
        for row in rows
        if row["source"] and row["destination_type"] == "queue"
    }


def exchanges_of(node: LocalNode, vhost: str) -> dict[str, tuple[str, bool]]:
    rows = node.management("GET", f"/api/exchanges/{q(vhost)}")
    return {
        row["name"]: (row["type"], row["durable"])
        for row in rows
        if row["name"] and not row["name"].startswith("amq.")
    }


def policies_of(node: LocalNode, vhost: str) -> dict[str, dict[str, Any]]:
    rows = node.management("GET", f"/api/policies/{q(vhost)}")
    return {
        row["name"]: {k: row[k] for k in ("pattern", "apply-to", "priority", "definition")}
        for row in rows
    }


def body_digests(node: LocalNode, vhost: str, queue: str) -> Counter[str]:
    found = drain_fingerprints(lambda: node.connect(vhost), queue)
    digests: Counter[str] = Counter()
    for (body, _properties), copies in found.items():
        digests[body] += copies
    return digests


def expected_digests(vhost: str, queue: str, count: int) -> Counter[str]:
    return Counter(hashlib.sha256(m.body).hexdigest() for m in demo_messages(vhost, queue, count))


def ready(node: LocalNode, vhost: str, queue: str) -> int:
    connection = node.connect(vhost)
    try:
        declared = connection.channel().queue_declare(queue, passive=True)
        return int(declared.method.message_count)
    finally:
        connection.close()


def write_config(path: Path, blue: LocalCluster, green: LocalCluster, vhost: str) -> Path:
    config = {
        "clusters": {
            "blue": cluster_block(blue, BLUE_PASSWORD_ENV),
            "green": cluster_block(green, GREEN_PASSWORD_ENV),
        },
        "routes": [
            {
                "name": "upgrade",
                "source": {
                    "cluster": "blue",
                    "vhosts": [vhost],
                    "queue_pattern": r"orders\..*|audit",
                    "min_messages": 0,
                },
                "destination": {"cluster": "green", "queue_type": "quorum", "topology": "copy"},
            },
            {
                "name": "legacy",
                "source": {"cluster": "blue", "vhosts": [vhost], "queues": ["legacy"]},
                "destination": {"cluster": "green", "queue_type": "classic", "topology": "copy"},
            },
        ],
        "federation": "pause",
        "ledger": {"path": str(path.parent / "ledger")},
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.fixture
def passwords(
    quorum_cluster: LocalCluster,
    quorum_cluster_4_3: LocalCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(BLUE_PASSWORD_ENV, quorum_cluster.first.password)
    monkeypatch.setenv(GREEN_PASSWORD_ENV, quorum_cluster_4_3.first.password)


@pytest.fixture
def blue(quorum_cluster: LocalCluster) -> Iterator[tuple[LocalCluster, str, dict[str, Any]]]:
    """Blue's vhost, mirrored, bound, with policies and a running federation upstream.

    Yields the cluster, the vhost and the upstream's definition (which holds a password).
    """
    node = quorum_cluster.first
    vhost = fresh(quorum_cluster, "blue-green")
    upstream_vhost = fresh(quorum_cluster, "blue-green-upstream")
    declare_topology(node, vhost, BLUE_QUEUES, EXCHANGES, BINDINGS)
    for queue in BLUE_QUEUES:
        publish_demo(node, vhost, queue, MESSAGES)
    # The upstream's own messages: a running link would pull them as soon as the
    # mover consumes the downstream queue.
    declare_topology(node, upstream_vhost, {"orders.eu": {}, "orders.us": {}}, {}, ())
    for queue in ("orders.eu", "orders.us"):
        publish_demo(node, upstream_vhost, queue, UPSTREAM_MESSAGES)
    uri = f"amqp://{node.username}:{node.password}@127.0.0.1:{node.amqp_port}/{q(upstream_vhost)}"
    upstream = {"uri": uri, "prefetch-count": 50, "ack-mode": "on-confirm"}
    node.management("PUT", f"/api/parameters/federation-upstream/{q(vhost)}/{UPSTREAM}",
        json={"value": upstream},
    )  # fmt: skip
    node.management("PUT", f"/api/policies/{q(vhost)}/orders", json=ORDERS_POLICY)
    node.management("PUT", f"/api/policies/{q(vhost)}/mirror-audit", json=AUDIT_POLICY)
    wait_until(
        lambda: (
            {queue_info(node, vhost, n).get("policy") for n in ("orders.eu", "orders.us")}
            == {"orders"}
            and queue_info(node, vhost, "audit").get("policy") == "mirror-audit"
        ),
        "blue's policies to apply",
    )
    wait_until(lambda: running_links(node, vhost) == {"orders.eu", "orders.us"}, "blue's links")
    wait_until(
        lambda: len(queue_info(node, vhost, "orders.eu").get("slave_nodes") or []) == 1,
        "orders.eu to be mirrored on a second node",
    )
    yield quorum_cluster, vhost, upstream
    node.management("DELETE", f"/api/vhosts/{q(vhost)}", missing_ok=True)
    node.management("DELETE", f"/api/vhosts/{q(upstream_vhost)}", missing_ok=True)


def running_links(node: LocalNode, vhost: str) -> set[str]:
    links = node.management("GET", f"/api/federation-links/{q(vhost)}")
    return {link["queue"] for link in links if link["status"] == "running"}


def test_a_mirrored_3_10_cluster_moves_into_4_3_quorum_queues_with_its_topology(
    blue: tuple[LocalCluster, str, dict[str, Any]],
    quorum_cluster_4_3: LocalCluster,
    passwords: None,
    spark: SparkSession,
    tmp_path: Path,
    *,
    caplog: pytest.LogCaptureFixture,
) -> None:
    blue_cluster, vhost, upstream = blue
    blue_node, green_node = blue_cluster.first, quorum_cluster_4_3.first
    fresh(quorum_cluster_4_3, vhost)
    blue_bindings = bindings_of(blue_node, vhost)
    config_path = write_config(tmp_path / "job.yaml", blue_cluster, quorum_cluster_4_3, vhost)
    config = load_config(config_path)
    caplog.set_level(logging.INFO, logger="rmq_spark")
    # The dry run plans the copy and writes nothing on green.
    assert main(["plan", "--config", str(config_path), "--json"]) == 0
    assert "topology copy: 2 exchange(s), 5 binding(s), 1 polic(y/ies) to create" in caplog.text
    assert green_node.management("GET", f"/api/queues/{q(vhost)}") == []
    assert exchanges_of(green_node, vhost) == {}
    assert policies_of(green_node, vhost) == {}
    caplog.clear()

    result = run_transfer(spark, config, run_id="blue-green")

    # Moved and proven: every message, nothing lost, versions recorded.
    assert result.verification.verified, result.verification
    assert (result.verification.messages, result.verification.lost) == (4 * MESSAGES, 0)
    assert result.rabbitmq_versions["blue"].startswith("3.10.")
    assert result.rabbitmq_versions["green"].startswith("4.3.")
    for queue in BLUE_QUEUES:
        assert body_digests(green_node, vhost, queue) == expected_digests(vhost, queue, MESSAGES)
        assert ready(blue_node, vhost, queue) == 0

    # Queues: quorum (classic for the legacy route), arguments translated for 4.3.
    assert {n: queue_info(green_node, vhost, n)["type"] for n in BLUE_QUEUES} == {
        "orders.eu": "quorum", "orders.us": "quorum", "audit": "quorum", "legacy": "classic",
    }  # fmt: skip
    assert queue_info(green_node, vhost, "orders.eu")["arguments"] == {
        "x-queue-type": "quorum",
        "x-queue-leader-locator": "balanced",
        "x-max-length": 5_000,
        "x-dead-letter-exchange": "dead",
    }
    assert queue_info(green_node, vhost, "legacy")["arguments"] == {
        "x-queue-type": "classic",
        "x-queue-leader-locator": "client-local",
    }
    # Exchanges and bindings as on blue.
    assert exchanges_of(green_node, vhost) == {n: (kind, True) for n, kind in EXCHANGES.items()}
    assert bindings_of(green_node, vhost) == blue_bindings
    # Policies: what 4.3 takes of blue's; the mirroring-only one had nothing left.
    assert policies_of(green_node, vhost) == {
        "orders": {
            **{k: ORDERS_POLICY[k] for k in ("pattern", "apply-to", "priority")},
            "definition": {"message-ttl": 3_600_000, "max-length": 10_000},
        }
    }
    # The queue's `policy` field is sampled by the management stats: wait for it to show.
    wait_until(
        lambda: queue_info(green_node, vhost, "orders.us").get("policy") == "orders",
        "green's copied policy to apply to orders.us",
    )
    # Federation stays on blue: nothing of it on green.
    assert green_node.management("GET", f"/api/parameters/federation-upstream/{q(vhost)}") == []

    # Green is usable: publishes through the copied exchanges reach the moved queues.
    connection = green_node.connect(vhost)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("orders", "orders.eu.paris", b"after the move", mandatory=True)
        channel.basic_publish("audit-events", "legacy", b"after the move", mandatory=True)
    finally:
        connection.close()
    wait_until(
        lambda: (ready(green_node, vhost, "orders.eu"), ready(green_node, vhost, "audit"),
                 ready(green_node, vhost, "legacy"), ready(green_node, vhost, "orders.us"))
        == (1, 1, 1, 0),
        "the publishes through green's exchanges to land",
    )  # fmt: skip

    # Blue's federation was paused while draining and is back as it was; its upstream
    # kept its own messages (nothing was pulled into the drained queues).
    upstreams = blue_node.management("GET", f"/api/parameters/federation-upstream/{q(vhost)}")
    assert [(row["name"], row["value"]) for row in upstreams] == [(UPSTREAM, upstream)]
    for queue in ("orders.eu", "orders.us"):
        assert ready(blue_node, "blue-green-upstream", queue) == UPSTREAM_MESSAGES
    assert any("under policy 'orders' paused" in r.getMessage() for r in caplog.records)

    # Each translation is said, and no credential reaches a log line.
    said = "\n".join(record.getMessage() for record in caplog.records)
    assert "ha-mode='exactly' dropped: RabbitMQ 4.3" in said
    assert "classic mirroring was removed in 4.0" in said
    assert "policy 'mirror-audit': nothing left to copy" in said
    assert "x-queue-version=1 dropped: RabbitMQ 4.3" in said  # the legacy classic queue
    assert "x-queue-master-locator='client-local' translated" in said
    assert blue_node.password not in said
    assert green_node.password not in said

    # A re-run finds everything in place and writes nothing.
    caplog.clear()
    with management_clients(config) as clients:
        again = discover(config, clients)
    assert {t.destination_created for t in again} == {False}
    assert "topology copy: 0 exchange(s), 0 binding(s), 0 polic(y/ies) to create" in (caplog.text)
    assert bindings_of(green_node, vhost) == blue_bindings
    assert len(policies_of(green_node, vhost)) == 1


def test_a_conflicting_exchange_or_policy_on_green_stops_the_move_before_anything_is_created(
    blue: tuple[LocalCluster, str, dict[str, Any]],
    quorum_cluster_4_3: LocalCluster,
    passwords: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blue_cluster, vhost, _ = blue
    green_node = quorum_cluster_4_3.first
    fresh(quorum_cluster_4_3, vhost)
    declare_topology(green_node, vhost, {}, {"orders": "fanout"}, ())
    green_node.management("PUT", f"/api/policies/{q(vhost)}/orders",
        json={**ORDERS_POLICY, "definition": {"max-length": 10}},
    )  # fmt: skip
    config_path = write_config(tmp_path / "job.yaml", blue_cluster, quorum_cluster_4_3, vhost)
    config = load_config(config_path)
    # The dry run names the conflicts and exits 2.
    assert main(["plan", "--config", str(config_path), "--json"]) == 2
    planned = "\n".join(json.loads(capsys.readouterr().out)["problems"])
    assert f"vhost {vhost!r} exchange 'orders': exists with type 'fanout'" in planned

    with management_clients(config) as clients, pytest.raises(DestinationIncompatibleError) as err:
        discover(config, clients)

    message = str(err.value)
    assert (
        f"cluster green vhost {vhost!r} exchange 'orders': exists with type 'fanout', "
        "expected 'topic'"
    ) in message
    assert f"cluster green vhost {vhost!r} policy 'orders': exists with definition" in message
    assert "nothing was moved" in message
    green_queues = green_node.management("GET", f"/api/queues/{q(vhost)}")
    assert green_queues == []
    assert set(exchanges_of(green_node, vhost)) == {"orders"}
    assert ready(blue_cluster.first, vhost, "orders.eu") == MESSAGES


def test_4_3_quorum_queues_roll_back_into_3_10_classic_queues_with_their_topology(
    quorum_cluster: LocalCluster,
    quorum_cluster_4_3: LocalCluster,
    passwords: None,
    spark: SparkSession,
    tmp_path: Path,
) -> None:
    green_node, blue_node = quorum_cluster_4_3.first, quorum_cluster.first
    vhost = fresh(quorum_cluster_4_3, "roll-back")
    fresh(quorum_cluster, vhost)
    declare_topology(
        green_node,
        vhost,
        {"orders.eu": {"x-queue-type": "quorum", "x-queue-leader-locator": "client-local",
                       "x-delivery-limit": 50}},
        {"orders": "topic"},
        (("orders", "orders.eu", "orders.eu.#"),),
    )  # fmt: skip
    publish_demo(green_node, vhost, "orders.eu", MESSAGES)
    limits = {"pattern": "^orders", "apply-to": "queues", "priority": 0,
              "definition": {"max-length": 10_000, "delivery-limit": 50}}  # fmt: skip
    green_node.management("PUT", f"/api/policies/{q(vhost)}/limits", json=limits)
    wait_until(
        lambda: queue_info(green_node, vhost, "orders.eu").get("policy") == "limits",
        "the policy to apply on green",
    )
    config_path = tmp_path / "job.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {
                "clusters": {
                    "green": cluster_block(quorum_cluster_4_3, GREEN_PASSWORD_ENV),
                    "blue": cluster_block(quorum_cluster, BLUE_PASSWORD_ENV),
                },
                "routes": [
                    {
                        "name": "roll-back",
                        "source": {"cluster": "green", "vhosts": [vhost]},
                        "destination": {
                            "cluster": "blue",
                            "queue_type": "classic",
                            "topology": "copy",
                        },
                    }
                ],
                "ledger": {"path": str(tmp_path / "ledger")},
            }
        ),
        encoding="utf-8",
    )
    config: JobConfig = load_config(config_path)

    result = run_transfer(spark, config, run_id="roll-back")

    assert result.verification.verified, result.verification
    assert (result.verification.messages, result.verification.lost) == (MESSAGES, 0)
    moved = queue_info(blue_node, vhost, "orders.eu")
    assert (moved["type"], moved["arguments"]) == ("classic", {"x-queue-type": "classic"})
    assert exchanges_of(blue_node, vhost) == {"orders": ("topic", True)}
    assert bindings_of(blue_node, vhost) == bindings_of(green_node, vhost)
    assert policies_of(blue_node, vhost) == {"limits": limits}
    assert body_digests(blue_node, vhost, "orders.eu") == expected_digests(
        vhost, "orders.eu", MESSAGES
    )
    green_node.management("DELETE", f"/api/vhosts/{q(vhost)}", missing_ok=True)
    blue_node.management("DELETE", f"/api/vhosts/{q(vhost)}", missing_ok=True)
