"""Real RabbitMQ nodes for the integration tests, started once per test session."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence

import pytest

from rmq_spark.devtools import azurite_server, s3_server
from rmq_spark.devtools.local_brokers import (
    LocalBrokerError,
    LocalCluster,
    LocalNode,
    kill_vm,
    start_cluster,
    start_nodes,
    stop_nodes,
)
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION, VERSIONS
from tests.support.brokers import PASSWORD_ENV, Brokers
from tests.support.wheel_env import WheelEnv, build_wheel_env

# `make test` runs this suite on two pytest-xdist workers with --dist loadgroup: a group
# runs whole on one worker, so what a group shares is started once, not once per worker.
# The 4.x node pairs and the two 3-node clusters each take a group of their own; so do
# the modules that build from the checkout (`make wheel`, `make executor-archive`: both
# rebuild its build/ directory, so they must not run at once); every other test stays
# with its module (its module-scoped fixtures). The 3.10 pair (`brokers`) is on every
# worker: it starts in seconds.
CHECKOUT_BUILDS = "checkout-builds"
_CHECKOUT_BUILD_FIXTURES = {"wheel_env", "env_archive"}
_CLUSTER_FIXTURES = {"quorum_cluster", "quorum_cluster_4_3"}


def _node_group(item: pytest.Item) -> str | None:
    """The group of a test that needs nodes a worker would otherwise start again."""
    if set(getattr(item, "fixturenames", ())) & _CLUSTER_FIXTURES:
        return "clusters"
    callspec = getattr(item, "callspec", None)
    version = callspec.params.get("brokers_of_version") if callspec else None
    if version is not None and version != HOST_VERSION:
        return f"rabbitmq-{version}"
    return None


def worker_groups(items: list[pytest.Item]) -> dict[str, str]:
    """Each test's xdist group, by node id (see above)."""
    builds_in = {
        item.path
        for item in items
        if set(getattr(item, "fixturenames", ())) & _CHECKOUT_BUILD_FIXTURES
    }
    groups: dict[str, str] = {}
    for item in items:
        module_group = CHECKOUT_BUILDS if item.path in builds_in else item.nodeid.split("::")[0]
        groups[item.nodeid] = _node_group(item) or module_group
    return groups


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its worker group, before xdist reads the marks; the groups
    that hold nodes of their own (the longest) first, so that neither worker is left
    with a long group at the end while the other idles."""
    groups = worker_groups(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    items.sort(key=lambda item: _node_group(item) is None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker under --dist loadgroup, stop at once if xdist ignored the groups
    (it did, silently, under pytest 9.2: pytest-dev/pytest-xdist#1386): every worker
    would then start every node pair and cluster again."""
    if getattr(session.config.option, "loadgroup", False):
        ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
        if ungrouped:
            raise pytest.UsageError(
                f"pytest-xdist did not group {len(ungrouped)} tests (first: {ungrouped[0]}); "
                "see pyproject.toml's pytest pin"
            )


def end_nodes(nodes: Sequence[LocalNode]) -> None:
    """End the session's nodes as a crash would, then remove them and their data.

    Their data goes with them, so a graceful stop (a rabbitmqctl VM per node: tens of
    seconds at the end of each worker) would prove nothing here; test_local_brokers.py
    proves the graceful stop, and `stop_nodes` still makes sure no process is left.
    """
    for node in nodes:
        with contextlib.suppress(LocalBrokerError):  # a node a test left stopped
            kill_vm(node)
    stop_nodes(nodes, remove_data=True)


@pytest.fixture(scope="session")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    base = tmp_path_factory.mktemp("brokers")
    nodes = start_nodes(["dr", "main"], base, password=secrets.token_urlsafe(16))
    try:
        yield Brokers(dr=nodes[0], main=nodes[1])
    finally:
        end_nodes(nodes)


@pytest.fixture(scope="session", params=VERSIONS)
def brokers_of_version(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Brokers]:
    """A "dr" and a "main" node of each RabbitMQ version in turn, each pair started once.

    3.10 is the session's `brokers` (the host's package); 4.0 and 4.3 run from their
    Debian roots (built first when missing). A test takes a subset of the versions with
    ``@pytest.mark.parametrize("brokers_of_version", [...], indirect=True)``.
    """
    version: str = request.param
    if version == HOST_VERSION:
        host: Brokers = request.getfixturevalue("brokers")
        yield host
        return
    base = tmp_path_factory.mktemp(f"brokers-{version}")
    nodes: list[LocalNode] = start_nodes(
        ["dr", "main"], base, password=secrets.token_urlsafe(16), version=version
    )
    try:
        yield Brokers(dr=nodes[0], main=nodes[1])
    finally:
        end_nodes(nodes)


@pytest.fixture
def version_password_env(brokers_of_version: Brokers, monkeypatch: pytest.MonkeyPatch) -> str:
    """The admin password of `brokers_of_version`, in the variable the test configs name."""
    monkeypatch.setenv(PASSWORD_ENV, brokers_of_version.dr.password)
    return brokers_of_version.dr.password


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
        end_nodes(cluster.nodes)


@pytest.fixture(scope="session")
def quorum_cluster_4_3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real 3-node RabbitMQ 4.3 cluster (quorum queues; no classic mirroring), started once.

    Shared by the 4.x migrate tests and the 3.10 → 4.3 blue-green tests, which each take
    a vhost of their own.
    """
    cluster = start_cluster(
        "qq43",
        tmp_path_factory.mktemp("cluster-4.3"),
        count=3,
        password=secrets.token_urlsafe(16),
        version="4.3",
    )
    try:
        yield cluster
    finally:
        end_nodes(cluster.nodes)


@pytest.fixture
def cluster_password_env(quorum_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """The cluster's admin password, in the variable the test configs name."""
    monkeypatch.setenv(PASSWORD_ENV, quorum_cluster.first.password)
    return quorum_cluster.first.password


@pytest.fixture(scope="session")
def wheel_env(tmp_path_factory: pytest.TempPathFactory) -> WheelEnv:
    """A venv with the built wheel, its runtime lock and its [notebook] extra, no pyspark
    (tests/support/wheel_env.py), built once."""
    return build_wheel_env(tmp_path_factory.mktemp("wheel-env"))


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3_server.S3Server]:
    """An S3 API server (moto, `devtools.s3_server`) on a free port, with one bucket
    and one IAM key it checks every request against; started once."""
    server = s3_server.start(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        s3_server.stop(server)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[azurite_server.AzuriteServer]:
    """Azure Blob Storage's emulator (Azurite, `devtools.azurite_server`) on a free port,
    with an account of its own, its random key and one container; started once."""
    server = azurite_server.start(tmp_path_factory.mktemp("azurite"))
    try:
        yield server
    finally:
        azurite_server.stop(server)


S3_KEY_ID_ENV, S3_SECRET_ENV = "TEST_LEDGER_S3_KEY_ID", "TEST_LEDGER_S3_SECRET"


@pytest.fixture
def s3_ledger(s3: s3_server.S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A ledger block on a fresh prefix of the S3 server's bucket, its keys in the
    variables the block names."""
    monkeypatch.setenv(S3_KEY_ID_ENV, s3.access_key_id)
    monkeypatch.setenv(S3_SECRET_ENV, s3.secret_access_key)
    return {
        "path": f"s3://{s3.bucket}/ledger-{secrets.token_hex(4)}",
        "storage_options": {
            "endpoint": s3.endpoint,
            "region": s3_server.REGION,
            "access_key_id_env": S3_KEY_ID_ENV,
            "secret_access_key_env": S3_SECRET_ENV,
        },
    }
