"""Real RabbitMQ nodes for the integration tests, started once per test session."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from rmq_spark.local_brokers import start_nodes, stop_nodes
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
