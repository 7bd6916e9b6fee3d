"""Small builders of the shared nouns, for tests that need one without a broker."""

from __future__ import annotations

from datetime import UTC, datetime

from rmq_spark.model import Delivery, QueueTransfer

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def transfer(
    name: str, messages: int, message_bytes: int | None = None, *, vhost: str = "/"
) -> QueueTransfer:
    """Queue `name` of `vhost` on cluster dr into the same on main; 1 KiB a message unless told."""
    return QueueTransfer(
        route="r",
        source_cluster="dr",
        source_vhost=vhost,
        source_queue=name,
        source_type="classic",
        source_node="rabbit@dr",
        destination_cluster="main",
        destination_vhost=vhost,
        destination_queue=name,
        messages=messages,
        message_bytes=messages * 1024 if message_bytes is None else message_bytes,
        destination_messages=0,
    )


def delivery(position: int, *, body_size: int = 3, confirmed: bool = True) -> Delivery:
    """One delivery at `position`, consumed (and, unless told otherwise, confirmed) at T0."""
    return Delivery(
        tag=position + 1,
        seq=position + 1,
        position=position,
        redelivered=False,
        body_size=body_size,
        body_sha256=f"body-{position}",
        properties_sha256="props",
        message_id=f"m{position}",
        consumed_at=T0,
        confirmed_at=T0 if confirmed else None,
    )


#: Two clusters, dr into main, every vhost: a config for planning tests (password env P).
TWO_CLUSTER_CONFIG = """
clusters:
  dr: {amqp: ["amqp://dr:5672"], management: "http://dr:15672", password_env: P}
  main: {amqp: ["amqp://main:5672"], management: "http://main:15672", password_env: P}
routes:
  - name: back
    source: {cluster: dr, vhosts: ["*"]}
    destination: {cluster: main}
ledger: {path: /tmp/ledger}
"""
