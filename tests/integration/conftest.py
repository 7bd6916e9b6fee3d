"""Real RabbitMQ nodes for the integration tests, started once per test session."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from rmq_spark.local_brokers import (
    LocalCluster,
    start_cluster,
    start_nodes,
    stop_cluster,
    stop_nodes,
)
from tests.integration.support import PASSWORD_ENV, Brokers


@pytest.fixture(scope="session")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    base = tmp_path_factory.mktemp("brokers")
    nodes = start_nodes(["dr", "main"], base, password=secrets.token_urlsafe(16))
    try:
        yield Brokers(dr=nodes[0], main=nodes[1])
    finally:
        stop_nodes(nodes, remove_data=True)


@pytest.fixture
def password_env(brokers: Brokers, monkeypatch: pytest.MonkeyPatch) -> str:
    """The admin password, in the environment variable the test configs name."""
    monkeypatch.setenv(PASSWORD_ENV, brokers.dr.password)
    return brokers.dr.password


@pytest.fixture(scope="session")
def quorum_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real 3-node RabbitMQ cluster (quorum queues, classic mirroring), started once."""
    cluster = start_cluster(
        "qq", tmp_path_factory.mktemp("cluster"), count=3, password=secrets.token_urlsafe(16)
    )
    try:
        yield cluster
    finally:
        stop_cluster(cluster, remove_data=True)


@pytest.fixture
def cluster_password_env(quorum_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """The cluster's admin password, in the variable the test configs name."""
    monkeypatch.setenv(PASSWORD_ENV, quorum_cluster.first.password)
    return quorum_cluster.first.password
