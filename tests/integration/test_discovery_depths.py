"""The exact depths a run's plan starts from (`planning.discovery.discover`, not a dry run).

The pre-flight's passive declares give them; only a destination the run creates (or
binds like its source) is counted again after that.
"""

from __future__ import annotations

from pathlib import Path

from rmq_spark.broker.management import management_clients
from rmq_spark.config import load_config
from rmq_spark.planning.discovery import discover
from tests.support.brokers import Brokers, depth, fresh_vhost, seed, write_config


def test_a_run_plans_each_side_at_its_exact_depth_and_creates_what_is_missing(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "plan-depths")
    seed(brokers.dr, vhost, "orders", 30)
    seed(brokers.main, vhost, "orders", 7)  # a destination that already holds messages
    seed(brokers.dr, vhost, "audit", 12)  # its destination does not exist yet
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "ledger")
    )

    with management_clients(config) as clients:
        transfers = {t.source_queue: t for t in discover(config, clients)}

    assert set(transfers) == {"orders", "audit"}
    orders, audit = transfers["orders"], transfers["audit"]
    assert (orders.messages, orders.destination_messages) == (30, 7)
    assert orders.destination_created is False
    assert (audit.messages, audit.destination_messages) == (12, 0)
    assert audit.destination_created is True
    # Created, empty, and nothing moved.
    assert depth(brokers.main, vhost, "audit") == 0
    assert (depth(brokers.dr, vhost, "orders"), depth(brokers.main, vhost, "orders")) == (30, 7)
