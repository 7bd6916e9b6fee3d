"""Exact depths are counted for several vhosts at once, each on its own connection,
and land on the right transfer."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest

from rmq_spark.config import ClusterConfig, parse_config
from rmq_spark.planning import discovery
from tests.support.builders import TWO_CLUSTER_CONFIG, transfer


def test_each_vhost_is_counted_at_once_on_its_own_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three source vhosts and the same three on the destination: six counts at once.
    started = threading.Barrier(6, timeout=10)
    threads: set[int] = set()

    def queue_depths(
        cluster: str, _config: ClusterConfig, vhost: str, queues: Iterable[str]
    ) -> dict[str, int]:
        started.wait()
        threads.add(threading.get_ident())
        base = 100 if cluster == "dr" else 0
        return {name: base + int(name[1:]) + ord(vhost) for name in queues}

    monkeypatch.setattr(discovery, "queue_depths", queue_depths)
    transfers = [transfer(f"q{i}", 1, vhost=vhost) for vhost in "abc" for i in range(2)]

    depths = discovery.measure_depths(parse_config(TWO_CLUSTER_CONFIG, {"P": "p"}), transfers)

    assert len(threads) == 6
    assert {t.source_vhost + t.source_queue: depths[t] for t in transfers} == {
        f"{vhost}q{i}": (100 + i + ord(vhost), i + ord(vhost)) for vhost in "abc" for i in range(2)
    }


def test_destination_depths_count_only_the_destinations(monkeypatch: pytest.MonkeyPatch) -> None:
    """After creating destinations, discovery counts them again, not their sources (the
    pre-flight's probe counted those a moment ago)."""
    asked: list[tuple[str, str, list[str]]] = []

    def queue_depths(
        cluster: str, _config: ClusterConfig, vhost: str, queues: Iterable[str]
    ) -> dict[str, int]:
        asked.append((cluster, vhost, list(queues)))
        return {name: 10 + int(name[1:]) for name in queues}

    monkeypatch.setattr(discovery, "queue_depths", queue_depths)
    transfers = [transfer(f"q{i}", 1, vhost=vhost) for vhost in "ab" for i in range(2)]

    depths = discovery.measure_destination_depths(
        parse_config(TWO_CLUSTER_CONFIG, {"P": "p"}), transfers
    )

    destination = transfers[0].destination_cluster
    assert sorted(asked) == [(destination, "a", ["q0", "q1"]), (destination, "b", ["q0", "q1"])]
    assert {t.source_vhost + t.destination_queue: depths[t] for t in transfers} == {
        "aq0": 10,
        "aq1": 11,
        "bq0": 10,
        "bq1": 11,
    }
