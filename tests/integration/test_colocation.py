"""Node addresses are discovered from the real nodes' listeners."""

from __future__ import annotations

from pathlib import Path

from rmq_spark.broker.colocation import node_uris
from rmq_spark.broker.management import management_clients
from rmq_spark.config import load_config
from tests.support.brokers import Brokers, write_config


def test_node_addresses_come_from_the_listeners_and_config_overrides_them(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=["/"], ledger=tmp_path / "ledger")
    )
    overridden = config.model_copy(
        update={
            "clusters": {
                **config.clusters,
                "main": config.clusters["main"].model_copy(
                    update={"nodes": {brokers.main.node_name: "amqp://10.9.8.7:5672"}}
                ),
            }
        }
    )

    with management_clients(overridden) as clients:
        uris = node_uris(overridden, clients)

    assert uris["dr"] == {brokers.dr.node_name: f"amqp://127.0.0.1:{brokers.dr.amqp_port}"}
    assert uris["main"] == {brokers.main.node_name: "amqp://10.9.8.7:5672"}
