"""Helpers for tests on a local RabbitMQ cluster: management calls, connections, configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from rmq_spark.broker.counts import ready_count
from rmq_spark.devtools.local_brokers import LocalCluster
from tests.support.brokers import PASSWORD_ENV


def fresh_cluster_vhost(cluster: LocalCluster, vhost: str) -> str:
    node = cluster.first
    node.management("DELETE", f"/api/vhosts/{quote(vhost, safe='')}", missing_ok=True)
    node.add_vhost(vhost)
    return vhost


def exact_depth(cluster: LocalCluster, vhost: str, name: str) -> int:
    """Ready count, asked again while a busy quorum leader answers 0 (`ready_count`)."""
    connection = cluster.first.connect(vhost)
    try:
        return ready_count(connection.channel(), name, f"vhost {vhost!r} queue {name!r}")
    finally:
        connection.close()


def write_cluster_config(
    path: Path,
    cluster: LocalCluster,
    vhost: str,
    *,
    queues: list[str] | None = None,
    destination: dict[str, object] | None = None,
    **top_level: object,
) -> Path:
    source: dict[str, Any] = {"cluster": "qq", "vhosts": [vhost]}
    if queues is not None:
        source["queues"] = queues
    config = {
        "clusters": {
            "qq": {
                "amqp": cluster.amqp_uris,
                "management": cluster.first.management_url,
                "username": cluster.first.username,
                "password_env": PASSWORD_ENV,
            }
        },
        "routes": [
            {
                "name": "migrate",
                "source": source,
                "destination": {"cluster": "qq", **(destination or {})},
            }
        ],
        "ledger": {"path": str(path.parent / "ledger")},
        "max_active": 4,
        **top_level,
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path
