"""Federation-safe DR fail-back (issue 29): the DR node federates its queues from main.

The DR node's queues `fed.a`, `fed.b` are federated with main's same-named queues
through the upstream `up` (main itself), under the policy `fed`, which selects its
upstreams the way RabbitMQ's guide does (`federation-upstream-set: all`) or through
a named set, with other keys beside it; the policy also matches the federated
exchange `fed.x`. DR holds 3,000 orphans, main 2,000 messages of its own. A consumer
on a DR queue makes its link pull from main (the control shows it); with
`federation: pause` the job moves the orphans to main without pulling anything back,
main ends with exactly the 5,000, each once (by message id), the links run again and
DR's policies are key by key what they were. Every move test runs on 3.10, 4.0 and 4.3;
the park (`rmq-spark park`, the same pause around its movers) on 3.10 and 4.3.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark import pipeline
from rmq_spark.broker import federation
from rmq_spark.cli import main
from rmq_spark.config import load_config
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION, VERSIONS
from rmq_spark.errors import DiscoveryError
from rmq_spark.park.run import run_park
from rmq_spark.partition_tasks import run_tasks
from rmq_spark.pipeline import run_transfer
from rmq_spark.transfer.parked_table import read_parked
from tests.support.brokers import (
    Brokers,
    cluster_block,
    depth,
    fresh_vhost,
    job_environment,
    seed,
    take_all,
)
from tests.support.faults import mover_connections, wait_until
from tests.support.matrix import fault_versions

VHOST = "federation"
VQ = quote(VHOST, safe="")
FEDERATED = ("fed.a", "fed.b")
EXCHANGE = "fed.x"  # matched by the same policy: its link must run throughout
UNFEDERATED = "plain"
ORPHANS = 1_500  # per DR queue: 3,000 in all
OWN = 1_000  # main's own, per queue: 2,000 in all
POLICY = "fed"
UPSTREAM = "up"
OVERRIDE = "rmq-spark-paused-1--fed"
REPO = Path(__file__).resolve().parents[2]

# How the policy selects its upstreams -> its definition.
DEFINITIONS: dict[str, dict[str, Any]] = {
    "all": {"federation-upstream-set": "all"},
    "named-set": {
        "federation-upstream-set": "main-set",
        "max-length": 1_000_000,
        "dead-letter-exchange": "dlx",
    },
}
# What the override carries instead: the rest of the definition, or, when nothing is
# left, an upstream no one defines (RabbitMQ refuses an empty definition).
OVERRIDE_DEFINITIONS = {
    "all": {"federation-upstream": "rmq-spark-paused"},
    "named-set": {"max-length": 1_000_000, "dead-letter-exchange": "dlx"},
}

ON_EVERY_VERSION = pytest.mark.parametrize("brokers_of_version", VERSIONS, indirect=True)
# A killed run is a fault scenario: its 4.0 run is in `make soak` (tests/support/matrix.py).
FAULT_ON_EVERY_VERSION = pytest.mark.parametrize(
    "brokers_of_version", fault_versions(), indirect=True
)


@dataclass(frozen=True)
class Federated:
    """DR federated from main in VHOST, as the fixture set it up."""

    brokers: Brokers
    kind: str
    policies: dict[str, dict[str, Any]]  # DR's policies of VHOST before the run


def message_ids(node: LocalNode, queue: str) -> Counter[str]:
    """Every message id a queue holds (read and acked: the queue ends empty)."""
    found: Counter[str] = Counter()
    connection = node.connect(VHOST)
    try:
        channel = connection.channel()
        for properties, _body in take_all(channel, queue):
            found[str(properties.message_id)] += 1
        return found
    finally:
        connection.close()


def publish(node: LocalNode, queue: str, prefix: str, count: int) -> None:
    connection = node.connect(VHOST)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.exchange_declare(EXCHANGE, "topic", durable=True)
        for i in range(count):
            properties = pika.BasicProperties(delivery_mode=2, message_id=f"{prefix}/{queue}/{i}")
            channel.basic_publish("", queue, f"{prefix} {i}".encode(), properties)
    finally:
        connection.close()
    wait_until(lambda: depth(node, VHOST, queue) == count, f"{queue} on {node.label}")


def expected_ids() -> set[str]:
    return {
        f"{prefix}/{queue}/{i}"
        for queue in FEDERATED
        for prefix, count in (("dr", ORPHANS), ("main", OWN))
        for i in range(count)
    }


def policies(node: LocalNode) -> dict[str, dict[str, Any]]:
    """VHOST's policies: name -> the API's row (pattern, apply-to, priority, definition)."""
    return {row["name"]: row for row in node.management("GET", f"/api/policies/{VQ}", timeout=10)}


def links(node: LocalNode) -> dict[str, str]:
    """VHOST's federation links: queue or exchange name -> status."""
    rows = node.management("GET", f"/api/federation-links/{VQ}", timeout=10)
    return {str(row.get("queue") or row.get("exchange")): str(row["status"]) for row in rows}


def running_queue_links(node: LocalNode) -> set[str]:
    return {
        name for name, status in links(node).items() if name in FEDERATED and status == "running"
    }


def exchange_link_running(node: LocalNode) -> bool:
    return links(node).get(EXCHANGE) == "running"


def wait_for_policy_listed(node: LocalNode) -> None:
    """Discovery selects by the policy the management API lists, which it learns from
    sampled statistics (every 5 s): a queue declared just now shows none yet."""

    def listed() -> set[str]:
        queues = node.management("GET", f"/api/queues/{VQ}?columns=name,policy", timeout=10)
        return {queue["name"] for queue in queues if queue.get("policy") == POLICY}

    wait_until(lambda: listed() == set(FEDERATED), "the API to list the federation policy")


@pytest.fixture(params=sorted(DEFINITIONS))
def federated(
    request: pytest.FixtureRequest, brokers_of_version: Brokers, version_password_env: str
) -> Iterator[Federated]:
    brokers = brokers_of_version
    dr, upstream = brokers.dr, brokers.main
    fresh_vhost(brokers, VHOST)
    for queue in FEDERATED:
        publish(upstream, queue, "main", OWN)
        publish(dr, queue, "dr", ORPHANS)
    seed(dr, VHOST, UNFEDERATED, 10)
    uri = f"amqp://{upstream.username}:{upstream.password}@127.0.0.1:{upstream.amqp_port}/{VQ}"
    dr.management(
        "PUT",
        f"/api/parameters/federation-upstream/{VQ}/{UPSTREAM}",
        json={"value": {"uri": uri, "prefetch-count": 100, "reconnect-delay": 1}},
        timeout=10,
    )
    dr.management(
        "PUT",
        f"/api/parameters/federation-upstream-set/{VQ}/main-set",
        json={"value": [{"upstream": UPSTREAM}]},
        timeout=10,
    )
    definition = DEFINITIONS[request.param]
    dr.management(
        "PUT",
        f"/api/policies/{VQ}/{POLICY}",
        json={"pattern": r"^fed\.", "definition": definition, "apply-to": "all", "priority": 2},
        timeout=10,
    )
    wait_until(lambda: running_queue_links(dr) == set(FEDERATED), "the queues' links to run")
    wait_until(lambda: exchange_link_running(dr), "the exchange's link to run")
    try:
        yield Federated(brokers, request.param, policies(dr))
    finally:
        # Upstreams, sets, policies and queues go with the vhosts.
        for node in (dr, upstream):
            node.management("DELETE", f"/api/vhosts/{VQ}", timeout=10)


def job_config(tmp_path: Path, brokers: Brokers, **top_level: Any) -> Path:
    """Move the DR queues under the federation policy to main, pausing federation."""
    config = {
        "clusters": {"dr": cluster_block(brokers.dr), "main": cluster_block(brokers.main)},
        "routes": [
            {
                "name": "dr-failback",
                "source": {"cluster": "dr", "vhosts": [VHOST], "policy_pattern": POLICY},
                "destination": {"cluster": "main"},
            }
        ],
        "ledger": {"path": str(tmp_path / "ledger")},
        "federation": "pause",
        **top_level,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def assert_failed_back(federated: Federated, duplicates: int = 0) -> None:
    """Main holds its own and the orphans, once each (but for the `duplicates` the
    verification named); DR is empty; federation is back."""
    brokers = federated.brokers
    assert policies(brokers.dr) == federated.policies  # key by key, the override gone
    wait_until(lambda: running_queue_links(brokers.dr) == set(FEDERATED), "the links to run again")
    assert exchange_link_running(brokers.dr)
    for queue in FEDERATED:
        assert depth(brokers.dr, VHOST, queue) == 0, queue
    found = message_ids(brokers.main, "fed.a") + message_ids(brokers.main, "fed.b")
    assert set(found) == expected_ids()
    # Nothing pulled back and forth: one copy of each but those a killed run published
    # and could not ack (at-least-once, named by the verification).
    assert found.total() - len(found) == duplicates
    assert depth(brokers.dr, VHOST, UNFEDERATED) == 10  # under no federation policy


@ON_EVERY_VERSION
@pytest.mark.parametrize("federated", ["all"], indirect=True)
def test_a_consumer_on_a_federated_dr_queue_pulls_from_main(federated: Federated) -> None:
    """The control: without a pause, draining a DR queue pulls main's messages into DR."""
    brokers = federated.brokers
    connection = brokers.dr.connect(VHOST)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        channel.basic_consume("fed.a", lambda ch, method, _p, _b: ch.basic_ack(method.delivery_tag))

        def pulled() -> bool:
            connection.process_data_events(time_limit=0.05)
            return depth(brokers.main, VHOST, "fed.a") < OWN

        wait_until(pulled, "the link to pull from main", timeout=30)
    finally:
        connection.close()
    assert depth(brokers.main, VHOST, "fed.b") == OWN  # no consumer there


@ON_EVERY_VERSION
def test_the_fail_back_pauses_federation_whatever_the_policy_selects(
    federated: Federated,
    tmp_path: Path,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dr = federated.brokers.dr
    path = job_config(tmp_path, federated.brokers)
    config = load_config(path)
    wait_for_policy_listed(dr)
    # The dry run shows how each queue's federation will be paused, and changes nothing.
    assert main(["plan", "--config", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)["queues"]
    entry = {
        "paused_by": OVERRIDE,
        "priority": 3,
        "definition": OVERRIDE_DEFINITIONS[federated.kind],
        "dropped": ["federation-upstream-set"],
        "restored": POLICY,
    }
    assert {q["source_queue"]: q["federation"] for q in planned} == {q: entry for q in FEDERATED}
    assert policies(dr) == federated.policies
    during: dict[str, Any] = {}
    real_move = pipeline.move

    def recording_move(*args: Any, **kwargs: Any) -> Any:
        during["policies"] = policies(dr)
        during["links"] = links(dr)
        return real_move(*args, **kwargs)

    monkeypatch.setattr(pipeline, "move", recording_move)

    result = run_transfer(spark, config, run_id=f"federation-{federated.kind}")

    assert result.verification.verified
    assert sorted(t.source_queue for t in result.transfers) == list(FEDERATED)
    # While moving: the override matched exactly the moved queues, kept the policy's
    # other keys, and stopped their links; the exchange kept its policy and link.
    override = during["policies"][OVERRIDE]
    assert (override["pattern"], override["apply-to"], override["priority"]) == (
        "^(?:fed\\.a|fed\\.b)\\z",
        "queues",
        3,
    )
    assert override["definition"] == OVERRIDE_DEFINITIONS[federated.kind]
    assert {k: v for k, v in during["policies"].items() if k != OVERRIDE} == federated.policies
    assert during["links"] == {EXCHANGE: "running"}
    assert_failed_back(federated)


def submit(config: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(REPO / "spark-submit.sh"), "--config", str(config), "--run-id", run_id],
        env=job_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the driver, JVM and workers
    )


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, as the driver host's crash would. Its
    process group is not enough: PySpark's daemon puts itself and the Python workers
    running the movers in a group of their own (pyspark/daemon.py `os.setpgid(0, 0)`),
    and they would go on moving without their driver."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


@FAULT_ON_EVERY_VERSION
@pytest.mark.parametrize("federated", ["all"], indirect=True)
def test_a_run_killed_while_paused_is_restored_then_finished(
    federated: Federated,
    tmp_path: Path,
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    brokers = federated.brokers
    dr = brokers.dr
    # Slow enough to be killed while moving: 3,000 messages at 500/s.
    path = job_config(tmp_path, brokers, limits={"messages_per_second": 500})
    wait_for_policy_listed(dr)

    first = submit(path, "federation-killed")
    try:
        wait_until(
            lambda: OVERRIDE in policies(dr) and depth(brokers.main, VHOST, "fed.a") > OWN,
            "the run to pause federation and move",
            timeout=240,
        )
    finally:
        kill_tree(first.pid)  # the driver dies, and its executors with it
        first.wait(30)
    assert sum(depth(brokers.main, VHOST, q) for q in FEDERATED) < 2 * (OWN + ORPHANS)
    # The broker closes a killed client's connections as it notices; until then its
    # consumers hold what they prefetched (and restore-federation refuses).
    wait_until(
        lambda: not mover_connections(dr, "consumer", "federation-killed"),
        "the killed run's consumers to be gone",
    )
    # The pause outlives the run, in RabbitMQ: the override, no queue link.
    assert OVERRIDE in policies(dr)
    assert links(dr) == {EXCHANGE: "running"}

    # Refused (exit 2) until the broker has dropped the killed consumers from the queues.
    wait_until(
        lambda: main(["restore-federation", "--config", str(path)]) == 0,
        "restore-federation to find no mover consuming",
    )

    assert capsys.readouterr().out.splitlines() == [
        f"restored cluster dr vhost {VHOST!r} federation of policy {POLICY!r} "
        f"(override {OVERRIDE!r} deleted)"
    ]
    assert policies(dr) == federated.policies
    wait_until(lambda: running_queue_links(dr) == set(FEDERATED), "the links to run again")
    assert main(["restore-federation", "--config", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "nothing to restore: no paused federation on cluster(s) dr"
    ]

    wait_for_policy_listed(dr)
    result = run_transfer(spark, load_config(path), run_id="federation-killed")

    assert result.verification.verified
    assert_failed_back(federated, duplicates=result.verification.duplicates)


ON_HOST = pytest.mark.parametrize("brokers_of_version", [HOST_VERSION], indirect=True)


@ON_HOST
@pytest.mark.parametrize("federated", ["all"], indirect=True)
def test_federation_is_restored_when_the_move_fails(
    federated: Federated, tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    dr = federated.brokers.dr
    config = load_config(job_config(tmp_path, federated.brokers))
    wait_for_policy_listed(dr)
    during: dict[str, Any] = {}

    def failing_move(*_args: Any, **_kwargs: Any) -> Any:
        during["overrides"] = [name for name in policies(dr) if name != POLICY]
        during["links"] = links(dr)
        raise RuntimeError("executor lost")

    monkeypatch.setattr(pipeline, "move", failing_move)

    with pytest.raises(RuntimeError, match="executor lost"):
        run_transfer(spark, config, run_id="federation-failed")

    assert during == {"overrides": [OVERRIDE], "links": {EXCHANGE: "running"}}
    assert policies(dr) == federated.policies
    wait_until(lambda: running_queue_links(dr) == set(FEDERATED), "the links to run again")


@ON_HOST
@pytest.mark.parametrize("federated", ["all"], indirect=True)
def test_nothing_is_paused_when_pre_flight_fails(
    federated: Federated, tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = job_config(tmp_path, federated.brokers)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["routes"][0]["source"]["vhosts"] = [VHOST, "no-such-vhost"]
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    pauses: list[str] = []
    monkeypatch.setattr(federation, "pause", lambda client, *_a, **_k: pauses.append("paused"))

    with pytest.raises(DiscoveryError, match="vhost 'no-such-vhost': source vhost not found"):
        run_transfer(spark, load_config(path), run_id="federation-preflight")

    assert pauses == []
    assert policies(federated.brokers.dr) == federated.policies


@pytest.mark.parametrize("brokers_of_version", [HOST_VERSION, "4.3"], indirect=True)
@pytest.mark.parametrize("federated", ["all"], indirect=True)
def test_a_park_pauses_federation_and_parks_only_the_orphans(
    federated: Federated,
    tmp_path: Path,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`rmq-spark park` with `federation: pause`: DR's federated queues are parked while
    their links are stopped, so the table holds DR's orphans and nothing of main's."""
    brokers = federated.brokers
    dr = brokers.dr
    raw = yaml.safe_load(job_config(tmp_path, brokers).read_text(encoding="utf-8"))
    raw["routes"][0]["destination"] = {"table": "parked"}
    path = tmp_path / "park.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    config = load_config(path)
    wait_for_policy_listed(dr)
    during: dict[str, Any] = {}

    def recording_run_tasks(*args: Any, **kwargs: Any) -> Any:
        during["policies"] = policies(dr)
        during["links"] = links(dr)
        return run_tasks(*args, **kwargs)

    monkeypatch.setattr("rmq_spark.park.run.run_tasks", recording_run_tasks)

    result = run_park(spark, config, run_id="park-federated")

    assert result.verified
    assert sorted(q.transfer.source_queue for q in result.queues) == list(FEDERATED)
    assert OVERRIDE in during["policies"]
    assert during["links"] == {EXCHANGE: "running"}  # the queues' links stopped
    rows = read_parked(str(tmp_path / "ledger"), "park-federated", ["message_id"])
    parked = Counter(rows.column("message_id").to_pylist())
    assert parked == Counter(f"dr/{queue}/{i}" for queue in FEDERATED for i in range(ORPHANS))
    # Federation is back as it was, and main kept its own.
    assert policies(dr) == federated.policies
    wait_until(lambda: running_queue_links(dr) == set(FEDERATED), "the links to run again")
    for queue in FEDERATED:
        assert depth(brokers.main, VHOST, queue) == OWN, queue
        assert depth(dr, VHOST, queue) == 0, queue
