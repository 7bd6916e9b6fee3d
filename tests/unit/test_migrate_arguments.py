"""Classic → quorum argument translation and the migration's saved state (pure)."""

from __future__ import annotations

import logging

import pytest

from rmq_spark.config import parse_config
from rmq_spark.errors import ConfigError
from rmq_spark.migrate import (
    MigrationOptions,
    QueueMigration,
    log_decisions,
    migration_cluster,
    translate_arguments,
)


def actions(arguments: dict[str, object], **options: object) -> dict[str, str]:
    _, decisions = translate_arguments(arguments, MigrationOptions(**options))  # type: ignore[arg-type]
    return {d.argument: d.action for d in decisions}


def test_supported_arguments_are_kept_unchanged() -> None:
    arguments = {
        "x-message-ttl": 60_000,
        "x-expires": 3_600_000,
        "x-max-length": 10,
        "x-max-length-bytes": 1 << 20,
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "dead",
        "x-single-active-consumer": True,
        "app-owner": "billing",
    }

    quorum, decisions = translate_arguments(arguments, MigrationOptions())

    assert quorum == {"x-queue-type": "quorum", **arguments}
    assert {d.action for d in decisions} == {"kept"}


def test_lazy_mode_and_version_are_dropped_and_the_master_locator_translated() -> None:
    quorum, decisions = translate_arguments(
        {"x-queue-mode": "lazy", "x-queue-version": 2, "x-queue-master-locator": "min-masters"},
        MigrationOptions(),
    )

    assert quorum == {"x-queue-type": "quorum", "x-queue-leader-locator": "balanced"}
    assert (
        decisions[0]
        .describe()
        .startswith(
            "x-queue-master-locator='min-masters': translated -> x-queue-leader-locator=balanced"
        )
    )
    assert actions({"x-queue-mode": "lazy", "x-queue-version": 2}) == {
        "x-queue-mode": "dropped",
        "x-queue-version": "dropped",
    }


def test_client_local_master_locator_stays_client_local() -> None:
    quorum, _ = translate_arguments({"x-queue-master-locator": "client-local"}, MigrationOptions())

    assert quorum["x-queue-leader-locator"] == "client-local"


def test_priorities_are_refused_unless_dropping_them_was_asked_for() -> None:
    assert actions({"x-max-priority": 5}) == {"x-max-priority": "refused"}
    quorum, _ = translate_arguments({"x-max-priority": 5}, MigrationOptions(priorities="drop"))
    assert quorum == {"x-queue-type": "quorum"}


def test_overflow_quorum_queues_ignore_is_refused_and_unknown_arguments_kept() -> None:
    """The one table's answers (tests/unit/planning/test_queue_arguments.py)."""
    assert actions({"x-overflow": "reject-publish-dlx", "x-something": 1}) == {
        "x-overflow": "refused",
        "x-something": "kept",
    }


def test_a_4x_classic_queues_leader_locator_is_kept() -> None:
    """RabbitMQ 4.x classic queues take x-queue-leader-locator (4.3 refuses the master
    locator on declare); quorum queues take the same values."""
    quorum, decisions = translate_arguments(
        {"x-queue-leader-locator": "client-local", "x-queue-version": 2}, MigrationOptions()
    )

    assert quorum == {"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"}
    assert [(d.argument, d.action) for d in decisions] == [
        ("x-queue-leader-locator", "kept"),
        ("x-queue-version", "dropped"),
    ]


def test_every_argument_not_kept_as_it_is_is_logged_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    arguments = {"x-queue-mode": "lazy", "x-max-length": 5, "x-queue-master-locator": "random"}
    quorum, decisions = translate_arguments(arguments, MigrationOptions())
    plan = QueueMigration(
        vhost="v",
        queue="orders",
        migration_id="m-1",
        state="new",
        durable=True,
        arguments=arguments,
        quorum_arguments=quorum,
        bindings=[],
        decisions=decisions,
    )

    with caplog.at_level(logging.INFO, logger="rmq_spark.migrate"):
        log_decisions("qq", "4.3.6", [plan])

    assert [r.getMessage() for r in caplog.records] == [
        "cluster qq (RabbitMQ 4.3.6) vhost 'v' queue 'orders': argument "
        "x-queue-master-locator='random': translated -> x-queue-leader-locator=balanced "
        "(quorum queues refuse it; they place leaders instead of masters)",
        "cluster qq (RabbitMQ 4.3.6) vhost 'v' queue 'orders': argument "
        "x-queue-mode='lazy': dropped (quorum queues refuse it; they keep every message on "
        "disk, so lazy mode does not apply)",
    ]


def test_replicas_become_the_initial_group_size() -> None:
    quorum, decisions = translate_arguments({}, MigrationOptions(replicas=3))

    assert quorum == {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}
    assert [d.action for d in decisions] == ["added"]


def test_the_saved_state_round_trips_through_the_marker() -> None:
    plan = QueueMigration(
        vhost="/",
        queue="orders",
        migration_id="m-1",
        state="new",
        durable=True,
        arguments={"x-max-length": 5},
        quorum_arguments={"x-queue-type": "quorum", "x-max-length": 5},
        bindings=[{"source": "hx", "routing_key": "", "arguments": {"x-match": "all", "a": 1}}],
        policy="ha-all",
    )

    restored = QueueMigration.from_marker(plan.marker())

    assert restored.state == "in progress"
    assert (restored.vhost, restored.queue, restored.migration_id) == ("/", "orders", "m-1")
    assert restored.bindings == plan.bindings
    assert restored.quorum_arguments == plan.quorum_arguments
    assert restored.temp == "rmq-spark-migrating--orders"
    assert restored.holding == "rmq-spark-holding--orders"


CONFIG = """
clusters:
  a: {amqp: ["amqp://h:5672"], management: "http://h:15672"}
  b: {amqp: ["amqp://k:5672"], management: "http://k:15672"}
routes:
  - name: r
    source: {cluster: a, vhosts: ["/"]}
    destination: DESTINATION
ledger: {path: /tmp/l}
"""


def test_a_migration_config_names_one_cluster_and_keeps_names() -> None:
    ok = parse_config(CONFIG.replace("DESTINATION", "{cluster: a}"), {})
    assert migration_cluster(ok) == "a"
    other = parse_config(CONFIG.replace("DESTINATION", "{cluster: b}"), {})
    with pytest.raises(ConfigError, match=r"expected destination\.cluster 'a'"):
        migration_cluster(other)
    renamed = parse_config(CONFIG.replace("DESTINATION", '{cluster: a, queue: "x-{queue}"}'), {})
    with pytest.raises(ConfigError, match="keeps each queue's vhost and name"):
        migration_cluster(renamed)
