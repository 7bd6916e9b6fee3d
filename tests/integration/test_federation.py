"""Federation-safe drain: a third node plays ART, the upstream cluster of the DR node.

The DR node's queues `fed.*` are federated with ART's same-named queues (policy
`federate-with-art`, upstream `art`) and hold orphans; ART's queues hold messages
of their own. A consumer on a DR queue makes its link pull from ART (the control
test shows it); with `federation: pause` the job drains DR without pulling anything,
and the upstreams come back with their definitions unchanged.

The control, the drain and the restore after a crash run on every RabbitMQ version
(DR, main and ART all of one version: `brokers_of_version`); the other cases, whose
logic is the same on every version, on the host's 3.10.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
import yaml
from pyspark.sql import DataFrame, SparkSession

from rmq_spark import pipeline
from rmq_spark.broker import federation
from rmq_spark.broker.management import management_clients
from rmq_spark.cli import main
from rmq_spark.config import JobConfig, load_config
from rmq_spark.devtools.demo import node_connector
from rmq_spark.devtools.local_brokers import LocalNode, start_nodes, stop_nodes
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION, VERSIONS
from rmq_spark.errors import DiscoveryError
from rmq_spark.model import MoveOutcome
from rmq_spark.pipeline import run_transfer
from tests.support.brokers import (
    Brokers,
    cluster_block,
    depth,
    drain_fingerprints,
    fresh_vhost,
    seed,
)
from tests.support.faults import (
    key_ordered_fingerprints,
    management,
    seed_key_ordered,
    wait_until,
)

VHOST = "federation"
FEDERATED = ("fed.a", "fed.b")
UNFEDERATED = "plain"
ORPHANS = 300  # per DR queue
UPSTREAM_MESSAGES = 40  # per ART queue
POLICY = "federate-with-art"
CLONE_PREFIX = "rmq-spark-paused--"
VQ = quote(VHOST, safe="")


ON_HOST = pytest.mark.parametrize("brokers_of_version", [HOST_VERSION], indirect=True)
ON_EVERY_VERSION = pytest.mark.parametrize("brokers_of_version", VERSIONS, indirect=True)


@pytest.fixture(scope="module")
def art(
    brokers_of_version: Brokers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalNode]:
    """The upstream cluster: a third node of the same version, user and password as the
    DR and main nodes."""
    dr = brokers_of_version.dr
    nodes = start_nodes(
        ["upstream"],
        tmp_path_factory.mktemp(f"upstream-{dr.version}"),
        password=dr.password,
        version=dr.version,
    )
    try:
        yield nodes[0]
    finally:
        stop_nodes(nodes, remove_data=True)


@dataclass(frozen=True)
class Federated:
    """The DR node federated with ART in VHOST, as the fixture set it up."""

    brokers: Brokers
    art: LocalNode
    definitions: dict[str, dict[str, Any]]  # upstream name -> value, as the API returns it


@pytest.fixture
def federated(
    brokers_of_version: Brokers, art: LocalNode, version_password_env: str
) -> Iterator[Federated]:
    brokers = brokers_of_version
    vhost = fresh_vhost(brokers, VHOST)
    art.add_vhost(vhost)
    dr = brokers.dr
    for queue in FEDERATED:
        seed_key_ordered(dr, vhost, queue, ORPHANS)
        publish(art, queue, [f"art {queue} {i}".encode() for i in range(UPSTREAM_MESSAGES)])
    seed(dr, vhost, UNFEDERATED, 10)
    uri = f"amqp://{art.username}:{art.password}@127.0.0.1:{art.amqp_port}/{quote(vhost, '')}"
    values = {
        "art": {"uri": uri, "prefetch-count": 50, "reconnect-delay": 1, "ack-mode": "on-confirm"},
        # Referenced by no policy: paused and restored all the same.
        "art-standby": {"uri": [uri, uri], "expires": 3_600_000, "trust-user-id": False},
    }
    for name, value in values.items():
        management(
            dr, "PUT", f"/api/parameters/federation-upstream/{VQ}/{name}", json={"value": value}
        )
    management(
        dr,
        "PUT",
        f"/api/policies/{VQ}/{POLICY}",
        json={
            "pattern": r"^fed\.",
            "definition": {"federation-upstream": "art"},
            "apply-to": "queues",
        },
    )
    wait_until(lambda: running_links(dr) == set(FEDERATED), "the federation links to run")
    assert definitions(dr) == values  # the API gives back exactly what was defined
    try:
        yield Federated(brokers, art, definitions(dr))
    finally:
        # Upstreams, clones, the policy and the queues go with the vhosts.
        management(dr, "DELETE", f"/api/vhosts/{VQ}")
        management(art, "DELETE", f"/api/vhosts/{VQ}")


def publish(node: LocalNode, queue: str, bodies: list[bytes]) -> None:
    connection = node_connector(node)(VHOST)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        for body in bodies:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()
    wait_until(lambda: depth(node, VHOST, queue) == len(bodies), f"{queue} on {node.label}")


def definitions(node: LocalNode) -> dict[str, dict[str, Any]]:
    """Federation upstreams of VHOST: name -> value."""
    rows = management(node, "GET", f"/api/parameters/federation-upstream/{VQ}")
    return {row["name"]: row["value"] for row in rows}


def all_upstream_names(node: LocalNode) -> list[str]:
    """Every federation upstream of every vhost, as vhost/name."""
    rows = management(node, "GET", "/api/parameters/federation-upstream")
    return sorted(f"{row['vhost']}/{row['name']}" for row in rows)


def running_links(node: LocalNode) -> set[str]:
    """Queues of VHOST whose link to `art` is running."""
    links = management(node, "GET", f"/api/federation-links/{VQ}")
    return {
        link["queue"] for link in links if link["upstream"] == "art" and link["status"] == "running"
    }


def wait_for_policy_listed(node: LocalNode) -> None:
    """Discovery selects by the policy the management API lists, which it learns from
    sampled statistics (every 5 s): a queue declared just now shows none yet."""

    def listed() -> set[str]:
        queues = management(node, "GET", f"/api/queues/{VQ}?columns=name,policy")
        return {queue["name"] for queue in queues if queue.get("policy") == POLICY}

    wait_until(lambda: listed() == set(FEDERATED), "the API to list the federation policy")


def upstream_depths(art: LocalNode) -> dict[str, int]:
    return {queue: depth(art, VHOST, queue) for queue in FEDERATED}


def job_config(tmp_path: Path, brokers: Brokers, *, vhosts: list[str]) -> Path:
    """Drain the DR queues under the federation policy, in any vhost, pausing federation."""
    config = {
        "clusters": {"dr": cluster_block(brokers.dr), "main": cluster_block(brokers.main)},
        "routes": [
            {
                "name": "dr-failback",
                "source": {"cluster": "dr", "vhosts": vhosts, "policy_pattern": POLICY},
                "destination": {"cluster": "main"},
            }
        ],
        "ledger": {"path": str(tmp_path / "ledger")},
        "federation": "pause",
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def pause_dr(config: JobConfig) -> list[tuple[str, str]]:
    with management_clients(config) as clients:
        return federation.pause(clients["dr"])


@ON_EVERY_VERSION
def test_a_consumer_on_a_federated_dr_queue_pulls_from_the_upstream(
    federated: Federated,
) -> None:
    """The control: without a pause, draining DR moves ART's messages into DR."""
    connection = federated.brokers.connect(federated.brokers.dr, VHOST)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=50)
        channel.basic_consume("fed.a", lambda ch, method, _p, _b: ch.basic_ack(method.delivery_tag))

        def pulled() -> bool:
            connection.process_data_events(time_limit=0.05)
            return depth(federated.art, VHOST, "fed.a") < UPSTREAM_MESSAGES

        wait_until(pulled, "the link to pull from the upstream", timeout=20)
    finally:
        connection.close()
    assert depth(federated.art, VHOST, "fed.a") < UPSTREAM_MESSAGES
    assert depth(federated.art, VHOST, "fed.b") == UPSTREAM_MESSAGES  # no consumer there


@ON_EVERY_VERSION
def test_draining_the_dr_node_pulls_nothing_from_the_upstream_and_restores_it(
    federated: Federated,
    tmp_path: Path,
    spark: SparkSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    brokers, art = federated.brokers, federated.art
    config = load_config(job_config(tmp_path, brokers, vhosts=["*"]))
    wait_for_policy_listed(brokers.dr)

    with caplog.at_level(logging.INFO, logger="rmq_spark.broker.federation"):
        result = run_transfer(spark, config, run_id="federation-1")

    assert result.verification.verified
    assert sorted((t.source_vhost, t.source_queue) for t in result.transfers) == [
        (VHOST, queue) for queue in FEDERATED
    ]
    # Not one message came from the upstream: ART still has all of its own ...
    assert upstream_depths(art) == dict.fromkeys(FEDERATED, UPSTREAM_MESSAGES)
    # ... and main received exactly the DR orphans.
    for queue in FEDERATED:
        found = drain_fingerprints(lambda: brokers.connect(brokers.main, VHOST), queue)
        assert found == key_ordered_fingerprints(VHOST, queue, ORPHANS), queue
        assert depth(brokers.dr, VHOST, queue) == 0
    assert depth(brokers.dr, VHOST, UNFEDERATED) == 10  # no federation policy: not selected
    # The upstreams are back, exactly as they were, and no clone is left.
    assert definitions(brokers.dr) == federated.definitions
    assert not [name for name in all_upstream_names(brokers.dr) if CLONE_PREFIX in name]
    wait_until(lambda: running_links(brokers.dr) == set(FEDERATED), "the links to come back")
    logged = [r.getMessage() for r in caplog.records if r.name == "rmq_spark.broker.federation"]
    for name in ("art", "art-standby"):
        assert f"cluster dr vhost {VHOST!r}: federation upstream {name!r} paused" in logged
        assert f"cluster dr vhost {VHOST!r}: federation upstream {name!r} restored" in logged
    assert not any(art.password in line for line in logged)


@ON_HOST
def test_upstreams_are_restored_when_the_move_fails(
    federated: Federated,
    tmp_path: Path,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dr = federated.brokers.dr
    config = load_config(job_config(tmp_path, federated.brokers, vhosts=[VHOST]))
    wait_for_policy_listed(dr)
    during: dict[str, Any] = {}

    def failing_move(
        _spark: SparkSession,
        _plan: DataFrame,
        _config: JobConfig,
        _run_id: str,
        _nodes: dict[str, dict[str, str]] | None = None,
        **_options: Any,
    ) -> list[MoveOutcome]:
        during["upstreams"] = sorted(definitions(dr))
        during["links"] = running_links(dr)
        raise RuntimeError("executor lost")

    monkeypatch.setattr(pipeline, "move", failing_move)

    with pytest.raises(RuntimeError, match="executor lost"):
        run_transfer(spark, config, run_id="federation-failed")

    assert during == {
        "upstreams": [CLONE_PREFIX + "art", CLONE_PREFIX + "art-standby"],
        "links": set(),
    }
    assert definitions(dr) == federated.definitions
    assert upstream_depths(federated.art) == dict.fromkeys(FEDERATED, UPSTREAM_MESSAGES)


@ON_HOST
def test_nothing_is_paused_when_pre_flight_fails(
    federated: Federated, tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(job_config(tmp_path, federated.brokers, vhosts=[VHOST, "no-such-vhost"]))
    pauses: list[str] = []

    def recording_pause(client: Any, **_: Any) -> list[tuple[str, str]]:
        pauses.append(client.cluster_name)
        return []

    monkeypatch.setattr(federation, "pause", recording_pause)

    with pytest.raises(DiscoveryError, match="vhost 'no-such-vhost': source vhost not found"):
        run_transfer(spark, config, run_id="federation-preflight")

    assert pauses == []
    assert definitions(federated.brokers.dr) == federated.definitions


@ON_EVERY_VERSION
def test_restore_federation_command_finishes_what_a_crash_left_paused(
    federated: Federated, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dr = federated.brokers.dr
    path = job_config(tmp_path, federated.brokers, vhosts=[VHOST])
    assert pause_dr(load_config(path)) == [(VHOST, "art"), (VHOST, "art-standby")]
    assert sorted(definitions(dr)) == [CLONE_PREFIX + "art", CLONE_PREFIX + "art-standby"]
    assert running_links(dr) == set()
    # A crash while restoring, between re-creating the original and deleting its clone.
    standby = federated.definitions["art-standby"]
    management(
        dr, "PUT", f"/api/parameters/federation-upstream/{VQ}/art-standby", json={"value": standby}
    )

    assert main(["restore-federation", "--config", str(path)]) == 0

    assert capsys.readouterr().out.splitlines() == [
        f"restored cluster dr vhost {VHOST!r} federation upstream 'art'",
        f"restored cluster dr vhost {VHOST!r} federation upstream 'art-standby'",
    ]
    assert definitions(dr) == federated.definitions
    wait_until(lambda: running_links(dr) == set(FEDERATED), "the links to come back")
    # Idempotent: a second run finds nothing to do.
    assert main(["restore-federation", "--config", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "nothing to restore: no paused federation upstream on cluster(s) dr"
    ]
    assert definitions(dr) == federated.definitions


@ON_HOST
def test_pausing_again_after_a_crash_never_clones_a_clone(
    federated: Federated, tmp_path: Path
) -> None:
    dr = federated.brokers.dr
    config = load_config(job_config(tmp_path, federated.brokers, vhosts=[VHOST]))
    # A crash while pausing, between cloning `art` and deleting it.
    art_value = federated.definitions["art"]
    management(
        dr,
        "PUT",
        f"/api/parameters/federation-upstream/{VQ}/{CLONE_PREFIX}art",
        json={"value": art_value},
    )
    paused = [(VHOST, "art"), (VHOST, "art-standby")]
    clones = {CLONE_PREFIX + name: federated.definitions[name] for name in ("art", "art-standby")}

    assert pause_dr(config) == paused
    assert definitions(dr) == clones
    assert pause_dr(config) == paused  # a re-run finds them paused already
    assert definitions(dr) == clones

    with management_clients(config) as clients:
        assert federation.restore(clients["dr"]) == paused
    assert definitions(dr) == federated.definitions
