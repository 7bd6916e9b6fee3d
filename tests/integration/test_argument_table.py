"""The one argument-compatibility table on RabbitMQ 4.0 and 4.3: both ways of making a
quorum queue from a classic one give it the same arguments, and the table's premises
hold on the real brokers.

Per version (`brokers_of_version`, a "main" and a "dr" node): the same classic queues
are declared in two vhosts of main; one vhost is moved into quorum queues on dr
(`destination.topology: copy`), the other migrated in place (`rmq-spark migrate`); the
management API then shows the same arguments on both. A queue with an overflow mode
quorum queues do not honour is refused by both, before anything is created.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pytest
import yaml
from pyspark.sql import SparkSession

from rmq_spark.broker.management import management_clients
from rmq_spark.config import load_config
from rmq_spark.devtools.local_brokers import LocalNode
from rmq_spark.errors import DestinationIncompatibleError
from rmq_spark.migrate import MigrationError, migrate
from rmq_spark.pipeline import run_transfer
from rmq_spark.planning.discovery import discover
from tests.support.brokers import Brokers, cluster_block, depth, fresh_vhost, seed_declared
from tests.support.faults import wait_until

pytestmark = pytest.mark.parametrize("brokers_of_version", ["4.0", "4.3"], indirect=True)

MESSAGES = 5
# Classic queues as a 4.x operator may have them (4.3 refuses the master locator and
# CQv1 on declare, so those only come from 3.x: the unit tests cover them).
CLASSIC: dict[str, dict[str, Any]] = {
    "lazy": {
        "x-queue-mode": "lazy",
        "x-queue-version": 2,
        "x-queue-leader-locator": "client-local",
    },
    "limits": {
        "x-message-ttl": 3_600_000,
        "x-max-length": 1_000,
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "amq.direct",
        "x-dead-letter-routing-key": "dead",
    },
    "plugin": {"x-custom-plugin": "on", "app-owner": "billing", "x-overflow": "drop-head"},
}
# What the quorum queues must carry, whichever path made them.
QUORUM: dict[str, dict[str, Any]] = {
    "lazy": {"x-queue-type": "quorum", "x-queue-leader-locator": "client-local"},
    "limits": {"x-queue-type": "quorum", **CLASSIC["limits"]},
    "plugin": {"x-queue-type": "quorum", **CLASSIC["plugin"]},
}


def queue_info(node: LocalNode, vhost: str, queue: str) -> dict[str, Any] | None:
    row: dict[str, Any] | None = node.management(
        "GET", f"/api/queues/{quote(vhost, safe='')}/{quote(queue, safe='')}", missing_ok=True
    )
    return row


def has_depth(node: LocalNode, vhost: str, queue: str) -> bool:
    return depth(node, vhost, queue) == MESSAGES


def write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def copy_config(path: Path, brokers: Brokers, vhost: str) -> Path:
    return write(
        path,
        {
            "clusters": {"main": cluster_block(brokers.main), "dr": cluster_block(brokers.dr)},
            "routes": [
                {
                    "name": "copy",
                    "source": {"cluster": "main", "vhosts": [vhost]},
                    "destination": {"cluster": "dr", "queue_type": "quorum", "topology": "copy"},
                }
            ],
            "ledger": {"path": str(path.parent / "ledger-copy")},
        },
    )


def migrate_config(path: Path, brokers: Brokers, vhost: str) -> Path:
    return write(
        path,
        {
            "clusters": {"main": cluster_block(brokers.main)},
            "routes": [
                {
                    "name": "migrate",
                    "source": {"cluster": "main", "vhosts": [vhost]},
                    "destination": {"cluster": "main"},
                }
            ],
            "ledger": {"path": str(path.parent / "ledger-migrate")},
        },
    )


@pytest.mark.usefixtures("version_password_env")
def test_copy_and_migrate_give_the_same_quorum_arguments_and_refuse_the_same_queue(
    brokers_of_version: Brokers, spark: SparkSession, tmp_path: Path
) -> None:
    brokers = brokers_of_version
    version = brokers.main.version
    copied = fresh_vhost(brokers, f"argtable-copy-{version}")
    migrated = fresh_vhost(brokers, f"argtable-migrate-{version}")
    for vhost in (copied, migrated):
        for name, arguments in CLASSIC.items():
            seed_declared(brokers.main, vhost, name, MESSAGES, arguments)
    copy_path = copy_config(tmp_path / "copy.yaml", brokers, copied)
    migrate_path = migrate_config(tmp_path / "migrate.yaml", brokers, migrated)

    moved = run_transfer(spark, load_config(copy_path), run_id=f"argtable-copy-{version}")
    result = migrate(spark, load_config(migrate_path), migration_id=f"argtable-{version}")

    assert moved.verification.verified, moved.verification
    assert result.verified
    for name in CLASSIC:
        on_dr, in_place = (
            queue_info(brokers.dr, copied, name),
            queue_info(brokers.main, migrated, name),
        )
        assert on_dr is not None
        assert in_place is not None
        assert (on_dr["type"], in_place["type"]) == ("quorum", "quorum"), name
        assert on_dr["arguments"] == in_place["arguments"] == QUORUM[name], name
        wait_until(partial(has_depth, brokers.dr, copied, name), f"{name} on dr")
        wait_until(partial(has_depth, brokers.main, migrated, name), f"{name} here")

    # reject-publish-dlx: declared by a 4.x quorum queue, which then drops heads instead
    # (test_quorum_queues_take_reject_publish_dlx_and_drop_heads): refused by both paths.
    for vhost in (copied, migrated):
        seed_declared(brokers.main, vhost, "dlx", 1, {"x-overflow": "reject-publish-dlx"})
    with (
        management_clients(load_config(copy_path)) as clients,
        pytest.raises(DestinationIncompatibleError) as copy_refusal,
    ):
        discover(load_config(copy_path), clients)
    with pytest.raises(MigrationError) as migrate_refusal:
        migrate(spark, load_config(migrate_path), migration_id=f"argtable-dlx-{version}")

    assert "argument x-overflow='reject-publish-dlx': quorum queues honour" in str(
        copy_refusal.value
    )
    assert "queue 'dlx': argument x-overflow='reject-publish-dlx': refused" in str(
        migrate_refusal.value
    )
    assert queue_info(brokers.dr, copied, "dlx") is None
    dlx = queue_info(brokers.main, migrated, "dlx")
    assert dlx is not None
    assert dlx["type"] == "classic"


def test_quorum_queues_take_reject_publish_dlx_and_unknown_arguments_and_drop_heads(
    brokers_of_version: Brokers,
) -> None:
    """The table's premises: the overflow mode is taken on declare, then every publish
    is confirmed and the oldest messages go (drop-head); an unknown x- argument is
    taken and listed as it is."""
    node = brokers_of_version.main
    vhost = fresh_vhost(brokers_of_version, "argtable-premises")
    arguments = {
        "x-queue-type": "quorum",
        "x-overflow": "reject-publish-dlx",
        "x-max-length": 2,
        "x-custom-plugin": "on",
    }
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare("dlx", durable=True, arguments=arguments)
        channel.confirm_delivery()
        for index in range(4):  # raises pika.exceptions.NackError on a refused publish
            channel.basic_publish("", "dlx", str(index).encode())
        info = queue_info(node, vhost, "dlx")
        assert info is not None
        assert info["arguments"] == arguments
        kept = []
        while (got := channel.basic_get("dlx", auto_ack=True))[0] is not None:
            kept.append(got[2].decode())
    finally:
        connection.close()

    assert kept == ["2", "3"]


PRIORITIES = [0, 9, 1, 8, 2, 5, 3, 4, None, 7]


def delivered_order(node: LocalNode, vhost: str, arguments: dict[str, Any]) -> list[int | None]:
    """Priorities in the order a queue with these arguments hands out PRIORITIES."""
    connection = node.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare("order", durable=True, arguments=arguments)
        channel.confirm_delivery()
        for priority in PRIORITIES:
            body = str(priority).encode()
            channel.basic_publish("", "order", body, pika.BasicProperties(priority=priority))
        found: list[int | None] = []
        while (got := channel.basic_get("order", auto_ack=True))[0] is not None:
            found.append(got[1].priority)
        channel.queue_delete("order")
        return found
    finally:
        connection.close()


def test_a_quorum_queue_delivers_by_the_priority_property_without_any_argument(
    brokers_of_version: Brokers,
) -> None:
    """What `QUORUM_PRIORITY_ORDER` (and docs/migration.md) say: 4.0 hands out priority
    5 and above ahead of the rest, not strictly (arrival order within each group); 4.3
    in priority order, no priority counting as 4. A classic queue: arrival order."""
    node = brokers_of_version.main
    vhost = fresh_vhost(brokers_of_version, "argtable-order")

    classic = delivered_order(node, vhost, {})
    quorum = delivered_order(node, vhost, {"x-queue-type": "quorum"})

    assert classic == PRIORITIES
    assert sorted(quorum, key=str) == sorted(PRIORITIES, key=str)
    if node.version == "4.0":
        high = [p for p in quorum if p is not None and p > 4]
        assert high == [p for p in PRIORITIES if p is not None and p > 4]
        assert [p for p in quorum if p not in high] == [p for p in PRIORITIES if p not in high]
        assert quorum[0] == 9
        assert quorum != PRIORITIES
    else:
        assert quorum == [9, 8, 7, 5, 4, None, 3, 2, 1, 0]
