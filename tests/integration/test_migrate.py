"""Classic → quorum migration in place, on a real 3-node cluster.

Every check is independent of the migration's own bookkeeping: queue types,
arguments and bindings come from the management API, messages from an independent
consumer compared with what was published (checksums of body and property bytes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions
import pytest
from pyspark.sql import SparkSession

from rmq_spark.cli import main
from rmq_spark.config import load_config
from rmq_spark.devtools.demo import DemoMessage, demo_messages
from rmq_spark.devtools.local_brokers import LocalCluster, LocalNode
from rmq_spark.ledger import tables
from rmq_spark.migrate import (
    HOLD_PREFIX,
    PHASES,
    TEMP_PREFIX,
    MigrationError,
    MigrationOptions,
    migrate,
)
from rmq_spark.transfer.amqp091 import wire
from tests.support.brokers import PASSWORD_ENV, job_environment
from tests.support.clusters import (
    exact_depth,
    fresh_cluster_vhost,
    write_cluster_config,
)
from tests.support.faults import (
    expected_fingerprints,
    key_ordered_fingerprints,
    key_ordered_messages,
    wait_until,
)

Fingerprint = tuple[str, str]
REPO = Path(__file__).resolve().parents[2]
MESSAGES = 100
EXCHANGES = {"mig.direct": "direct", "mig.topic": "topic", "mig.headers": "headers"}


@dataclass(frozen=True)
class Spec:
    """A classic queue as the test declares it: arguments and bindings."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    bindings: tuple[tuple[str, str, dict[str, Any]], ...] = ()


def _bindings(index: int) -> tuple[tuple[str, str, dict[str, Any]], ...]:
    """Every queue gets a direct binding, every other one a topic, every third a headers."""
    result: list[tuple[str, str, dict[str, Any]]] = [("mig.direct", f"key.{index}", {})]
    if index % 2 == 0:
        result.append(("mig.topic", f"orders.{index}.*", {}))
    if index % 3 == 0:
        result.append(("mig.headers", "", {"x-match": "all", "queue": f"q{index}", "kind": "x"}))
    return tuple(result)


def twenty_queues() -> list[Spec]:
    specs = [Spec(f"mirrored.q{i:02d}", bindings=_bindings(i)) for i in range(12)]
    specs += [Spec(f"plain.q{i:02d}", bindings=_bindings(i)) for i in range(12, 16)]
    specs += [
        Spec("prio", {"x-max-priority": 5}, (("mig.direct", "prio", {}),)),
        Spec(
            "ttl",
            {
                "x-message-ttl": 3_600_000,
                "x-max-length": 10_000,
                "x-overflow": "reject-publish",
                "x-dead-letter-exchange": "mig.direct",
                "x-dead-letter-routing-key": "dead",
            },
            (("mig.topic", "ttl.#", {}),),
        ),
        Spec(
            "lazy",
            {"x-queue-mode": "lazy", "x-queue-master-locator": "min-masters"},
            (("mig.headers", "", {"x-match": "any", "region": "eu", "tier": 1}),),
        ),
        Spec("live", bindings=(("mig.topic", "live.*", {}), ("mig.direct", "live", {}))),
    ]
    return specs


# -- broker helpers ----------------------------------------------------------------------


def set_up(
    cluster: LocalCluster,
    vhost: str,
    specs: list[Spec],
    count: int,
    *,
    messages: Callable[[str, str, int], Iterable[DemoMessage]] = demo_messages,
) -> None:
    """Exchanges, mirroring policy (3.x: 4.0 removed mirroring), queues with their
    bindings, `count` messages each."""
    node = cluster.first
    mirroring = node.version.startswith("3.")
    if mirroring:
        node.management(
            "PUT",
            f"/api/policies/{quote(vhost, safe='')}/ha-all",
            json={
                "pattern": r"^mirrored\.",
                "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"},
                "apply-to": "queues",
            },
        )
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        for exchange, kind in EXCHANGES.items():
            channel.exchange_declare(exchange, kind, durable=True)
        for spec in specs:
            channel.queue_declare(spec.name, durable=True, arguments=spec.arguments or None)
            for exchange, key, arguments in spec.bindings:
                channel.queue_bind(spec.name, exchange, key, arguments=arguments or None)
            for message in messages(vhost, spec.name, count):
                channel.basic_publish("", spec.name, message.body, message.properties)
    finally:
        connection.close()
    names = [s.name for s in specs]  # published without confirms (fast); counted here
    wait_until(
        lambda: all(exact_depth(cluster, vhost, name) == count for name in names),
        f"{count} messages in each queue",
    )
    mirrored = [s.name for s in specs if mirroring and s.name.startswith("mirrored.")]
    wait_until(
        lambda: all(
            len(queue(cluster, vhost, name).get("synchronised_slave_nodes") or []) == 2
            for name in mirrored
        ),
        "the mirrored queues to have two synchronised mirrors",
    )


def queue(cluster: LocalCluster, vhost: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.first.management(
        "GET", f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}"
    )
    return result


def queue_names(cluster: LocalCluster, vhost: str) -> set[str]:
    rows = cluster.first.management("GET", f"/api/queues/{quote(vhost, safe='')}?columns=name")
    return {row["name"] for row in rows}


def bindings(cluster: LocalCluster, vhost: str, name: str) -> set[tuple[str, str, str]]:
    rows = cluster.first.management(
        "GET",
        f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}/bindings",
    )
    return {
        (row["source"], row["routing_key"], json.dumps(row["arguments"], sort_keys=True))
        for row in rows
        if row["source"]
    }


Binding = tuple[str, str, dict[str, Any]]  # exchange, routing key, arguments


def bind(cluster: LocalCluster, vhost: str, name: str, binding: Binding) -> None:
    exchange, key, args = binding
    connection = cluster.first.connect(vhost)
    try:
        connection.channel().queue_bind(name, exchange, key, arguments=args or None)
    finally:
        connection.close()


def unbind(cluster: LocalCluster, vhost: str, name: str, binding: Binding) -> None:
    exchange, key, args = binding
    connection = cluster.first.connect(vhost)
    try:
        connection.channel().queue_unbind(name, exchange, key, arguments=args or None)
    finally:
        connection.close()


def expected_bindings(spec: Spec) -> set[tuple[str, str, str]]:
    return {(e, k, json.dumps(a, sort_keys=True)) for e, k, a in spec.bindings}


def assert_migrated(cluster: LocalCluster, vhost: str, specs: list[Spec]) -> None:
    """Every queue is quorum with its bindings; no helper queue is left."""
    for spec in specs:
        found = queue(cluster, vhost, spec.name)
        assert found["type"] == "quorum", f"{spec.name}: still {found['type']}"
        assert found["durable"] is True
        assert bindings(cluster, vhost, spec.name) == expected_bindings(spec), spec.name
    leftovers = {n for n in queue_names(cluster, vhost) if n.startswith((TEMP_PREFIX, HOLD_PREFIX))}
    assert not leftovers, f"helper queues left: {leftovers}"


def consume_fingerprints(node: LocalNode, vhost: str, name: str) -> Counter[Fingerprint]:
    """Independent consumer: consume (and ack) the whole queue; the multiset of
    (sha256(body), sha256(exact property bytes)).

    basic.consume, not basic.get: RabbitMQ 3.10 adds an x-delivery-count header (and
    so re-encodes the properties) to every basic.get from a quorum queue, but to
    basic.consume deliveries only when they are redeliveries.
    """
    wire.install()
    found: Counter[Fingerprint] = Counter()
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        count = int(channel.queue_declare(name, passive=True).method.message_count)
        channel.basic_qos(prefetch_count=500)

        def on_message(ch: Any, method: Any, properties: pika.BasicProperties, body: bytes) -> None:
            found[
                (
                    hashlib.sha256(body).hexdigest(),
                    hashlib.sha256(wire.wire_bytes(properties)).hexdigest(),
                )
            ] += 1
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(name, on_message)
        wait_until(
            lambda: connection.process_data_events(time_limit=0.05) or found.total() >= count,
            f"{count} message(s) from {name}",
        )
        assert channel.queue_declare(name, passive=True).method.message_count == 0
    finally:
        connection.close()
    return found


class LivePublisher(threading.Thread):
    """Publishes through the topic exchange with confirms and mandatory, paced, until
    stopped; remembers what the broker confirmed and what it returned."""

    def __init__(self, node: LocalNode, vhost: str, routing_key: str) -> None:
        super().__init__(name="live-publisher", daemon=True)
        self._node, self._vhost, self._key = node, vhost, routing_key
        self.stop_event = threading.Event()
        self.confirmed: Counter[Fingerprint] = Counter()
        self.unroutable = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = self._node.connect(self._vhost)
            channel = connection.channel()
            channel.confirm_delivery()
            index = 0
            while not self.stop_event.is_set():
                body = f"live message {index}".encode()
                properties = pika.BasicProperties(
                    message_id=f"live-{index}", delivery_mode=2, headers={"n": index}
                )
                try:
                    channel.basic_publish("mig.topic", self._key, body, properties, mandatory=True)
                    self.confirmed[
                        (
                            hashlib.sha256(body).hexdigest(),
                            hashlib.sha256(b"".join(properties.encode())).hexdigest(),
                        )
                    ] += 1
                except pika.exceptions.UnroutableError:
                    self.unroutable += 1
                index += 1
                self.stop_event.wait(0.005)  # pacing, ~150 messages/s
            connection.close()
        except BaseException as exc:  # handed to the test thread, which asserts on it
            self.error = exc

    def published(self) -> int:
        return sum(self.confirmed.values())


class SimulatedCrashError(Exception):
    """Raised by a phase hook: the procedure stops there, as if its process died."""


def crash_after(phase: str) -> Callable[[str], None]:
    def hook(done: str) -> None:
        if done == phase:
            raise SimulatedCrashError(phase)

    return hook


# -- tests -------------------------------------------------------------------------------


@pytest.fixture
def vhost(quorum_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = fresh_cluster_vhost(quorum_cluster, f"mig-{request.node.name[:40]}")
    yield name
    quorum_cluster.first.management(
        "DELETE", f"/api/vhosts/{quote(name, safe='')}", missing_ok=True
    )


def test_dry_run_names_every_refused_queue_and_changes_nothing(
    quorum_cluster: LocalCluster,
    cluster_password_env: str,
    vhost: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    specs = [
        Spec("ok", {"x-queue-mode": "lazy", "x-queue-master-locator": "client-local"}),
        Spec("prio", {"x-max-priority": 5}),
        Spec("dlx-overflow", {"x-overflow": "reject-publish-dlx"}),
        Spec("odd", {"x-something-new": 1}),
    ]
    set_up(quorum_cluster, vhost, specs, 3)
    connection = quorum_cluster.first.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare("transient", durable=False)
        channel.queue_declare("autodel", durable=True, auto_delete=True)
        channel.queue_declare(".", durable=True)
        channel.queue_declare("consumed", durable=True)
        channel.basic_consume("consumed", lambda *_: None)
        wait_until(
            lambda: queue(quorum_cluster, vhost, "consumed").get("consumers") == 1,
            "the consumer to show in the management API",
        )
        config = write_cluster_config(tmp_path / "migrate.yaml", quorum_cluster, vhost)

        code = main(["migrate", "--config", str(config), "--dry-run", "--replicas", "5"])
    finally:
        connection.close()

    out, err = capsys.readouterr()
    assert code == 2
    for expected in (
        "queue 'prio': argument x-max-priority=5: refused",
        "queue 'dlx-overflow': argument x-overflow='reject-publish-dlx': refused",
        "queue 'transient': not durable",
        "queue 'autodel': auto-delete",
        "queue '.': the management API cannot name a queue '.' in its URL paths",
        "queue 'consumed': 1 consumer(s) attached",
        "--replicas 5 but only 3 node(s) run",
    ):
        assert expected in err, f"missing {expected!r} in:\n{err}"
    assert "queue 'ok'" not in err
    assert "queue 'odd'" not in err  # a plugin's x- argument: kept (one table, issue 28)
    assert "x-queue-mode='lazy': dropped" in out
    assert "x-queue-master-locator='client-local': translated -> x-queue-leader-locator" in out
    assert cluster_password_env not in out + err
    # Nothing changed: no helper queue, every queue still classic with its messages.
    assert not {n for n in queue_names(quorum_cluster, vhost) if n.startswith(TEMP_PREFIX)}
    assert queue(quorum_cluster, vhost, "ok")["type"] == "classic"
    assert exact_depth(quorum_cluster, vhost, "ok") == 3


@pytest.mark.usefixtures("cluster_password_env")
def test_twenty_queues_migrate_in_place_through_crashes_and_a_live_publisher(
    spark: SparkSession,
    quorum_cluster: LocalCluster,
    vhost: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """20 classic queues (12 mirrored by policy, priority, TTL and length limits, lazy,
    bindings on direct, topic and headers exchanges); the procedure is stopped after
    each phase in turn and run again, while a publisher keeps publishing to one queue's
    bindings through every swap; the last re-run is the CLI's."""
    specs = twenty_queues()
    set_up(quorum_cluster, vhost, specs, MESSAGES)
    path = write_cluster_config(tmp_path / "migrate.yaml", quorum_cluster, vhost)
    config = load_config(path)
    options = MigrationOptions(priorities="drop")
    publisher = LivePublisher(quorum_cluster.nodes[1], vhost, "live.eu")
    published_at: dict[str, int] = {}

    def held(name: str) -> int:
        """The queue's messages wherever the migration keeps them now (exact depths)."""
        names = queue_names(quorum_cluster, vhost)
        return sum(
            exact_depth(quorum_cluster, vhost, queue_name)
            for queue_name in (name, TEMP_PREFIX + name, HOLD_PREFIX + name)
            if queue_name in names
        )

    publisher.start()
    wait_until(lambda: publisher.published() > 20, "the live publisher to publish")
    try:
        for phase in PHASES[:-1]:
            crash = crash_after(phase)

            def hook(done: str, crash: Callable[[str], None] = crash) -> None:
                published_at.setdefault(done, publisher.published())
                if done == "drain-holding":  # publishing into the final queues, too
                    publisher.stop_event.set()
                    publisher.join(30)
                crash(done)

            with pytest.raises(SimulatedCrashError):
                migrate(spark, config, options=options, migration_id="mig-20", after_phase=hook)
            for spec in specs:
                if spec.name != "live":
                    assert held(spec.name) == MESSAGES, f"{spec.name} after a crash in {phase}"
            if phase == "prepare":
                # A binding added to a queue after its migration started would be lost
                # by the hold: the run stops there (half the queues already held) ...
                late: Binding = ("mig.direct", "late", {})
                bind(quorum_cluster, vhost, "plain.q12", late)
                with pytest.raises(MigrationError, match=r"queue 'plain\.q12': bound since its"):
                    migrate(spark, config, options=options, migration_id="mig-20")
                assert bindings(quorum_cluster, vhost, "mirrored.q00") == set()  # held
                assert ("mig.direct", "late", "{}") in bindings(quorum_cluster, vhost, "plain.q12")
                unbind(quorum_cluster, vhost, "plain.q12", late)  # ... until it is removed
    finally:
        publisher.stop_event.set()
        publisher.join(30)
    assert publisher.error is None, publisher.error
    assert publisher.unroutable == 0
    # The publisher kept publishing through every phase up to the last hop.
    counts = [published_at[p] for p in PHASES[: PHASES.index("drain-holding") + 1]]
    assert counts == sorted(counts), published_at
    assert len(set(counts)) == len(counts), published_at

    # The last re-run, through the CLI as an operator would, finishes the migration.
    assert main(["migrate", "--config", str(path), "--drop-priorities"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1].removeprefix("MIGRATION "))
    assert summary["verified"] is True
    assert summary["missing"] == 0
    assert summary["queues"] == len(specs)
    # This last call ran no hop (the earlier ones did), so it wrote no hop report.
    assert (summary["runs"], summary["reports"]) == ([], [])
    runs = tables.read_arrow(config.ledger.path, "runs").to_pylist()
    # Every hop verified, the last one too: it moved into the live queue while the
    # publisher used it, declared shared, so the publisher's messages are counted as
    # live arrivals (the queues table shows no unexpected copy).
    assert sorted((r["run_id"], r["verified"]) for r in runs) == [
        ("mig-20-back", True),
        ("mig-20-held", True),
        ("mig-20-out", True),
    ]
    held_queues = tables.read_rows(config.ledger.path, "queues", "mig-20-held")
    assert held_queues
    assert all(q["unexpected"] == 0 and q["lost"] == 0 for q in held_queues)
    live_verification = json.loads(
        (
            Path(config.ledger.path) / "verification" / "run_id=mig-20-held" / "verification.json"
        ).read_text()
    )
    assert live_verification["totals"]["live_arrivals"] > 0
    per_queue = [
        line
        for line in out.splitlines()
        if line.startswith(tuple(f"vhost {vhost!r} queue {s.name!r}:" for s in specs))
    ]
    assert len(per_queue) == len(specs), out
    for line in per_queue:
        if "queue 'live'" not in line:
            assert f"moved out {MESSAGES}, back {MESSAGES}, held 0, missing 0" in line, line

    assert_migrated(quorum_cluster, vhost, specs)
    arguments = {s.name: queue(quorum_cluster, vhost, s.name)["arguments"] for s in specs}
    assert arguments["prio"] == {"x-queue-type": "quorum"}
    assert arguments["ttl"] == {"x-queue-type": "quorum", **specs[-3].arguments}
    assert arguments["lazy"] == {"x-queue-type": "quorum", "x-queue-leader-locator": "balanced"}
    assert len(queue(quorum_cluster, vhost, "mirrored.q00")["members"]) == 3

    # An independent consumer finds every message byte for byte: the seeded ones
    # exactly, and every confirmed live publish at least once (a message published
    # while both queues of a swap were bound is in both, so it may arrive twice).
    for spec in specs:
        found = consume_fingerprints(quorum_cluster.first, vhost, spec.name)
        expected = expected_fingerprints(vhost, spec.name, MESSAGES)
        if spec.name != "live":
            assert found == expected, f"{spec.name}: final queue differs from what was published"
            continue
        expected += publisher.confirmed
        assert not expected - found, f"live: {sum((expected - found).values())} message(s) lost"
        assert not (found - expected).keys() - publisher.confirmed.keys()


KILL_MESSAGES = 3000
KILL_WINDOW = 50


@pytest.mark.usefixtures("cluster_password_env")
@pytest.mark.usefixtures("spark")  # active, so the CLI's run uses it and leaves it running
def test_a_migration_killed_in_the_middle_of_a_hop_is_finished_by_a_rerun(
    quorum_cluster: LocalCluster,
    vhost: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """spark-submit jobs/migrate.py is SIGKILLed (driver, JVM and workers) while it moves
    messages out; the same command again finishes: nothing lost, duplicates named."""
    specs = [Spec("mirrored.k1", bindings=_bindings(0)), Spec("k2", bindings=_bindings(1))]
    set_up(quorum_cluster, vhost, specs, KILL_MESSAGES)
    path = write_cluster_config(
        tmp_path / "migrate.yaml", quorum_cluster, vhost, window={"messages": KILL_WINDOW}
    )
    temps = [TEMP_PREFIX + s.name for s in specs]
    first = subprocess.Popen(
        [str(REPO / "spark-submit.sh"), "--config", str(path), "--migration-id", "mig-kill"],
        env=job_environment(
            {PASSWORD_ENV: quorum_cluster.first.password, "RMQ_SPARK_JOB": "jobs/migrate.py"}
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the driver, JVM and workers
    )
    try:
        wait_until(
            lambda: (
                set(temps) <= queue_names(quorum_cluster, vhost)
                and sum(exact_depth(quorum_cluster, vhost, t) for t in temps) >= KILL_MESSAGES // 5
            ),
            "a tenth of the messages to be moved out",
            timeout=240,
        )
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    # Every message is in the original or the temporary queue (once the broker has
    # requeued what the killed movers held unacked).
    wait_until(
        lambda: all(
            exact_depth(quorum_cluster, vhost, s.name)
            + exact_depth(quorum_cluster, vhost, TEMP_PREFIX + s.name)
            >= KILL_MESSAGES
            for s in specs
        ),
        "the unacked messages back in their queues",
    )

    capsys.readouterr()
    # The operator's re-run, through the CLI (in this process: the suite's Spark session).
    assert main(["migrate", "--config", str(path), "--migration-id", "another-id"]) == 0

    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1].removeprefix("MIGRATION "))
    assert summary["verified"] is True
    assert summary["runs"] == ["mig-kill-out", "mig-kill-back", "mig-kill-held"]
    runs = {r["run_id"]: r for r in tables.read_arrow(str(tmp_path / "ledger"), "runs").to_pylist()}
    assert runs["mig-kill-out"]["messages"] == len(specs) * KILL_MESSAGES  # both drivers
    # Each hop it ran has its HTML report beside the ledger, printed and in the summary.
    reports = [Path(report) for report in summary["reports"]]
    assert [r.parent.name for r in reports] == [f"run_id={run}" for run in summary["runs"]]
    assert all(report.is_file() and f"report: {report}" in out for report in reports)
    assert_migrated(quorum_cluster, vhost, specs)
    for spec in specs:
        found = consume_fingerprints(quorum_cluster.first, vhost, spec.name)
        expected = expected_fingerprints(vhost, spec.name, KILL_MESSAGES)
        assert not expected - found, f"{spec.name}: a message is missing"
        assert not (found - expected).keys() - expected.keys()
        assert sum((found - expected).values()) <= KILL_WINDOW  # the named duplicates


@pytest.mark.usefixtures("cluster_password_env")
def test_waiting_for_consumers_gives_up_naming_the_queue_and_changes_nothing(
    spark: SparkSession, quorum_cluster: LocalCluster, vhost: str, tmp_path: Path
) -> None:
    set_up(quorum_cluster, vhost, [Spec("busy", bindings=_bindings(1))], 5)
    config = load_config(write_cluster_config(tmp_path / "migrate.yaml", quorum_cluster, vhost))
    connection = quorum_cluster.nodes[2].connect(vhost)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume("busy", lambda *_: None)  # holds one message, never acks
        # The count comes from the statistics the nodes emit every few seconds; two
        # fresh-clone runs under load saw it take over 60 s on this 3-node 3.10 cluster
        # (never alone), so a longer bound, polled gently.
        wait_until(
            lambda: queue(quorum_cluster, vhost, "busy").get("consumers") == 1,
            "the consumer to show in the management API",
            timeout=180,
            every=0.5,
        )
        with pytest.raises(MigrationError, match=r"queue 'busy': still 1 consumer\(s\) after 1 s"):
            migrate(
                spark,
                config,
                options=MigrationOptions(consumers="wait", consumer_wait_seconds=1.0),
            )
    finally:
        connection.close()
    assert queue(quorum_cluster, vhost, "busy")["type"] == "classic"
    assert bindings(quorum_cluster, vhost, "busy") == expected_bindings(
        Spec("busy", bindings=_bindings(1))
    )
    assert queue_names(quorum_cluster, vhost) == {"busy"}
    wait_until(lambda: exact_depth(quorum_cluster, vhost, "busy") == 5, "the unacked message back")


def test_already_migrated_queues_are_left_alone(
    quorum_cluster: LocalCluster,
    cluster_password_env: str,
    vhost: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    connection = quorum_cluster.first.connect(vhost)
    try:
        connection.channel().queue_declare(
            "done", durable=True, arguments={"x-queue-type": "quorum"}
        )
    finally:
        connection.close()
    path = write_cluster_config(tmp_path / "migrate.yaml", quorum_cluster, vhost)

    assert main(["migrate", "--config", str(path), "--dry-run"]) == 0

    assert "nothing to migrate on cluster qq" in capsys.readouterr().out


# -- RabbitMQ 4.3: classic queues are single-replica, no mirroring --------------------------


@pytest.fixture
def cluster_4_3_password_env(
    quorum_cluster_4_3: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> str:
    monkeypatch.setenv(PASSWORD_ENV, quorum_cluster_4_3.first.password)
    return quorum_cluster_4_3.first.password


@pytest.fixture
def vhost_4_3(quorum_cluster_4_3: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A vhost of its own on the 4.3 cluster (the blue-green tests share the cluster)."""
    name = fresh_cluster_vhost(quorum_cluster_4_3, f"mig43-{request.node.name[:40]}")
    yield name
    quorum_cluster_4_3.first.management(
        "DELETE", f"/api/vhosts/{quote(name, safe='')}", missing_ok=True
    )


def declare_refusal(node: LocalNode, vhost: str, queue: str, arguments: dict[str, Any]) -> str:
    """The broker's reply-text closing the channel (or connection) for this declare."""
    connection = node.connect(vhost)
    try:
        connection.channel().queue_declare(queue, durable=True, arguments=arguments)
    except (pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker) as exc:
        return f"{exc.reply_code} {exc.reply_text}"
    finally:
        if connection.is_open:
            connection.close()
    raise AssertionError(f"RabbitMQ {node.version} accepted {queue!r} with {arguments}")


def test_rabbitmq_4_3_refuses_on_declare_what_migrate_drops_or_translates(
    quorum_cluster_4_3: LocalCluster, vhost_4_3: str
) -> None:
    """The premise of the translation table, on the real broker: quorum queues refuse
    the classic-only arguments (so migrate drops or translates them), and 4.3 classic
    queues refuse CQv1 and the master locator, so only queues from before an upgrade
    carry those; x-queue-mode is still taken by a 4.3.6 classic queue, although the
    4.3.0 release notes say it is refused."""
    node = quorum_cluster_4_3.first
    quorum = {"x-queue-type": "quorum"}
    for argument, value in (
        ("x-queue-mode", "lazy"),
        ("x-queue-version", 2),
        ("x-queue-master-locator", "min-masters"),
        ("x-max-priority", 5),
    ):
        refusal = declare_refusal(node, vhost_4_3, "probe", {**quorum, argument: value})
        assert refusal.startswith("406 PRECONDITION_FAILED"), refusal
        assert f"invalid arg '{argument}'" in refusal
    cqv1 = declare_refusal(node, vhost_4_3, "probe", {"x-queue-version": 1})
    assert cqv1.startswith("406 PRECONDITION_FAILED"), cqv1
    assert "unsupported queue version '1'" in cqv1
    master = declare_refusal(node, vhost_4_3, "probe", {"x-queue-master-locator": "client-local"})
    assert "Feature `queue_master_locator` is deprecated" in master  # closes the connection
    assert "probe" not in queue_names(quorum_cluster_4_3, vhost_4_3)
    set_up(quorum_cluster_4_3, vhost_4_3, [Spec("lazy", {"x-queue-mode": "lazy"})], 1)
    assert queue(quorum_cluster_4_3, vhost_4_3, "lazy")["arguments"]["x-queue-mode"] == "lazy"


@pytest.mark.usefixtures("cluster_4_3_password_env", "spark")
def test_migrate_on_4_3_refuses_what_quorum_queues_cannot_keep_and_changes_nothing(
    quorum_cluster_4_3: LocalCluster,
    vhost_4_3: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    specs = [
        Spec("prio", {"x-max-priority": 5}, (("mig.direct", "prio", {}),)),
        # 4.3 would declare this quorum queue, then ignore the overflow mode (drop-head)
        Spec("dlx-overflow", {"x-overflow": "reject-publish-dlx"}),
        Spec("fine", {"x-queue-mode": "lazy"}, (("mig.direct", "fine", {}),)),
    ]
    set_up(quorum_cluster_4_3, vhost_4_3, specs, 3)
    path = write_cluster_config(tmp_path / "migrate.yaml", quorum_cluster_4_3, vhost_4_3)

    assert main(["migrate", "--config", str(path)]) == 2

    err = capsys.readouterr().err
    assert "migration pre-flight found 2 problems; nothing was changed" in err
    assert f"vhost {vhost_4_3!r} queue 'prio': argument x-max-priority=5: refused" in err
    assert "queue 'dlx-overflow': argument x-overflow='reject-publish-dlx': refused" in err
    assert "queue 'fine'" not in err
    assert queue_names(quorum_cluster_4_3, vhost_4_3) == {s.name for s in specs}
    for spec in specs:
        assert queue(quorum_cluster_4_3, vhost_4_3, spec.name)["type"] == "classic"
        assert bindings(quorum_cluster_4_3, vhost_4_3, spec.name) == expected_bindings(spec)
        assert exact_depth(quorum_cluster_4_3, vhost_4_3, spec.name) == 3


MESSAGES_4_3 = 200


@pytest.mark.usefixtures("cluster_4_3_password_env")
def test_classic_queues_on_4_3_migrate_in_place_through_a_crash(
    spark: SparkSession,
    *,
    quorum_cluster_4_3: LocalCluster,
    vhost_4_3: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Single-replica classic queues (bindings on direct, topic and headers exchanges,
    x-queue-mode, CQv2, a leader locator, TTL and limits) become 3-member quorum queues;
    the procedure stops after the recreate (the classic queues gone, every message in
    the quorum temporaries) and the CLI's re-run finishes it."""
    cluster, vhost = quorum_cluster_4_3, vhost_4_3
    specs = [Spec(f"plain.q{i}", bindings=_bindings(i)) for i in range(4)]
    specs += [
        Spec(
            "lazy",
            {
                "x-queue-mode": "lazy",
                "x-queue-version": 2,
                "x-queue-leader-locator": "client-local",
            },
            (("mig.headers", "", {"x-match": "any", "region": "eu", "tier": 1}),),
        ),
        Spec(
            "ttl",
            {
                "x-message-ttl": 3_600_000,
                "x-max-length": 10_000,
                "x-overflow": "reject-publish",
                "x-dead-letter-exchange": "mig.direct",
                "x-dead-letter-routing-key": "dead",
            },
            (("mig.topic", "ttl.#", {}),),
        ),
    ]
    # 4.x re-encodes properties on delivery (headers sorted by key): messages already in
    # that form are delivered as published, so the consumer below compares byte for byte.
    set_up(cluster, vhost, specs, MESSAGES_4_3, messages=key_ordered_messages)
    assert {queue(cluster, vhost, s.name)["type"] for s in specs} == {"classic"}
    path = write_cluster_config(tmp_path / "migrate.yaml", cluster, vhost)
    version = cluster.first.management("GET", "/api/overview")["rabbitmq_version"]
    assert version.startswith("4.3.")

    with (
        caplog.at_level(logging.INFO, logger="rmq_spark.migrate"),
        pytest.raises(SimulatedCrashError),
    ):
        migrate(spark, load_config(path), migration_id="mig43", after_phase=crash_after("recreate"))

    logged = [r.getMessage() for r in caplog.records if r.name == "rmq_spark.migrate"]
    lazy = f"cluster qq (RabbitMQ {version}) vhost {vhost!r} queue 'lazy': argument"
    assert f"{lazy} x-queue-mode='lazy': dropped (quorum queues refuse it;" in " ".join(logged)
    assert f"{lazy} x-queue-version=2: dropped (quorum queues refuse it;" in " ".join(logged)
    for spec in specs:  # quorum and empty now; every message in its temporary queue
        assert queue(cluster, vhost, spec.name)["type"] == "quorum"
        assert exact_depth(cluster, vhost, TEMP_PREFIX + spec.name) == MESSAGES_4_3
    capsys.readouterr()

    assert main(["migrate", "--config", str(path)]) == 0

    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1].removeprefix("MIGRATION "))
    assert summary["verified"] is True
    assert (summary["queues"], summary["missing"]) == (len(specs), 0)
    assert summary["runs"] == ["mig43-back", "mig43-held"]
    assert summary["rabbitmq_versions"] == {"qq": version}
    assert_migrated(cluster, vhost, specs)
    arguments = {s.name: queue(cluster, vhost, s.name)["arguments"] for s in specs}
    assert arguments["lazy"] == {"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"}
    assert arguments["ttl"] == {"x-queue-type": "quorum", **specs[-1].arguments}
    for spec in specs:
        assert len(queue(cluster, vhost, spec.name)["members"]) == 3
        found = consume_fingerprints(cluster.first, vhost, spec.name)
        expected = key_ordered_fingerprints(vhost, spec.name, MESSAGES_4_3)
        assert found == expected, f"{spec.name}: final queue differs from what was published"
