"""The one argument-compatibility table, as both of its readers see it (pure).

`destination.topology: copy` calls `translate_queue_arguments` for the destination's
type and version; `rmq-spark migrate` calls it through `translate_arguments` for a
quorum queue on the same cluster. The facts behind the cases were measured on RabbitMQ
4.0.5 and 4.3.6 (tests/integration/test_argument_table.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from rmq_spark.migrate import MigrationOptions, translate_arguments
from rmq_spark.planning.queue_arguments import QUORUM_OVERFLOW, translate_queue_arguments

CLASSIC_QUEUES: list[dict[str, Any]] = [
    {},
    {"x-queue-mode": "lazy", "x-queue-version": 2, "x-queue-master-locator": "min-masters"},
    {"x-queue-master-locator": "client-local", "x-queue-leader-locator": "balanced"},
    {"x-message-ttl": 1_000, "x-overflow": "reject-publish", "x-max-length": 10},
    {"x-overflow": "drop-head", "x-dead-letter-exchange": "dlx", "x-expires": 60_000},
    {"x-custom-plugin": "on", "app-owner": "billing", "x-single-active-consumer": True},
    {"x-overflow": "reject-publish-dlx", "x-max-length": 10},
    {"x-max-priority": 5, "x-message-ttl": 1_000},
    {"x-queue-type": "classic", "x-consumer-timeout": 60_000},
]


@pytest.mark.parametrize("version", ["4.0.5", "4.3.6", "3.10.8", "unknown"])
@pytest.mark.parametrize("priorities", ["refuse", "drop"])
@pytest.mark.parametrize("arguments", CLASSIC_QUEUES, ids=range(len(CLASSIC_QUEUES)))
def test_copy_and_migrate_give_a_quorum_queue_the_same_arguments_and_decisions(
    arguments: dict[str, Any], priorities: str, version: str
) -> None:
    copied, copy_decisions = translate_queue_arguments(
        arguments,
        destination_type="quorum",
        destination_version=version,
        priorities="drop" if priorities == "drop" else "keep",
    )
    migrated, migrate_decisions = translate_arguments(
        arguments,
        MigrationOptions(priorities=priorities),  # type: ignore[arg-type]
        rabbitmq_version=version,
    )

    assert migrated == copied
    assert [(d.argument, d.value, d.action, d.becomes, d.reason) for d in migrate_decisions] == [
        (d.key, d.value, d.action, d.becomes, d.reason) for d in copy_decisions
    ]


def test_reject_publish_dlx_is_refused_for_a_quorum_queue_and_kept_for_a_classic_one() -> None:
    """4.0.5 and 4.3.6 quorum queues take it on declare, then drop heads."""
    _, into_quorum = translate_queue_arguments(
        {"x-overflow": "reject-publish-dlx"}, destination_type="quorum", destination_version="4.3.6"
    )
    classic, into_classic = translate_queue_arguments(
        {"x-overflow": "reject-publish-dlx"},
        destination_type="classic",
        destination_version="4.3.6",
    )

    assert [(d.action, d.key) for d in into_quorum] == [("refused", "x-overflow")]
    assert "drops heads" in into_quorum[0].reason
    assert classic == {"x-overflow": "reject-publish-dlx", "x-queue-type": "classic"}
    assert [d.action for d in into_classic] == ["kept"]


@pytest.mark.parametrize("overflow", QUORUM_OVERFLOW)
def test_the_overflow_modes_quorum_queues_honour_are_kept(overflow: str) -> None:
    quorum, decisions = translate_queue_arguments(
        {"x-overflow": overflow}, destination_type="quorum", destination_version="4.0.5"
    )

    assert quorum == {"x-overflow": overflow, "x-queue-type": "quorum"}
    assert [d.action for d in decisions] == ["kept"]


@pytest.mark.parametrize("destination_type", ["quorum", "classic"])
def test_unknown_x_arguments_are_kept_as_not_rabbitmqs(destination_type: str) -> None:
    """4.0.5 and 4.3.6 take an x- argument they do not know and list it as it is."""
    translated, decisions = translate_queue_arguments(
        {"x-custom-plugin": "on", "app-owner": "billing"},
        destination_type=destination_type,
        destination_version="4.3.6",
    )

    assert translated == {
        "x-custom-plugin": "on",
        "app-owner": "billing",
        "x-queue-type": destination_type,
    }
    by_key = {d.key: d for d in decisions}
    assert by_key["x-custom-plugin"].action == "kept"
    assert "not a RabbitMQ argument" in by_key["x-custom-plugin"].reason
    assert by_key["app-owner"].reason == "not a RabbitMQ argument"


def test_dropped_priorities_say_a_4x_quorum_queue_still_orders_by_priority() -> None:
    _, decisions = translate_queue_arguments(
        {"x-max-priority": 5},
        destination_type="quorum",
        destination_version="4.0.5",
        priorities="drop",
    )

    assert [d.action for d in decisions] == ["dropped"]
    assert "4.3 in priority order" in decisions[0].reason
    assert "arrival order" not in decisions[0].reason


def test_migrate_adds_the_replicas_after_the_tables_decisions() -> None:
    quorum, decisions = translate_arguments(
        {"x-quorum-initial-group-size": 5, "x-queue-mode": "lazy"},
        MigrationOptions(replicas=3),
        rabbitmq_version="4.3.6",
    )

    assert quorum == {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}
    assert [(d.argument, d.action) for d in decisions] == [
        ("x-queue-mode", "dropped"),
        ("x-quorum-initial-group-size", "kept"),
        ("x-quorum-initial-group-size", "added"),
    ]
