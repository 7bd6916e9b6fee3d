"""Integration tests for the local RabbitMQ harness, on every RabbitMQ version it runs.

Two real nodes are started once per version in pytest's tmp dir: 3.10 is the host's
Debian package, 4.0 and 4.3 run from their Debian roots under chroot (built first
when missing). On most systems that dir (``/tmp/pytest-of-<user>``, mode 0700) is not
traversable by the ``rabbitmq`` user, so the host nodes exercise the temp-dir
fallback, and the root nodes the bind mount that makes it irrelevant. The last test
of each version stops its nodes and checks that none of their processes keeps
listening or running (nor a mount namespace holding the root); the fixture's own
stop is then a no-op.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

import pika
import pika.exceptions
import pytest
import requests

from rmq_spark.devtools import local_brokers
from rmq_spark.devtools.local_brokers import (
    LocalNode,
    load_nodes,
    save_nodes,
    start_nodes,
    stop_nodes,
)
from rmq_spark.devtools.local_brokers.node import _EPMD_MARKER_ENV, _MARKER_ENV
from rmq_spark.devtools.local_brokers.processes import _marked_processes
from rmq_spark.devtools.rabbitmq_roots import VERSIONS

_BIN_DIR = Path(
    os.environ.get(local_brokers.RABBITMQ_BIN_DIR_ENV, local_brokers.DEFAULT_RABBITMQ_BIN_DIR)
)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (_BIN_DIR / "rabbitmq-server").exists(), reason="rabbitmq-server is not installed"
    ),
]


@pytest.fixture(scope="module", params=VERSIONS)
def nodes_and_base(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[LocalNode], Path]]:
    """Two nodes of one version, "dr" and "main", stopped and deleted after its tests."""
    base = tmp_path_factory.mktemp("brokers")
    nodes = start_nodes(["dr", "main"], base, timeout=180, version=request.param)
    try:
        yield nodes, base
    finally:
        stop_nodes(nodes, remove_data=True)


@pytest.fixture
def nodes(nodes_and_base: tuple[list[LocalNode], Path]) -> list[LocalNode]:
    return nodes_and_base[0]


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _amqp_params(
    node: LocalNode, *, vhost: str = "/", password: str | None = None
) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host="127.0.0.1",
        port=node.amqp_port,
        virtual_host=vhost,
        credentials=pika.PlainCredentials(node.username, password or node.password),
        connection_attempts=1,
        socket_timeout=10,
    )


def test_nodes_are_distinct_and_avoid_default_ports(nodes: list[LocalNode]) -> None:
    dr, main = nodes
    assert (dr.label, main.label) == ("dr", "main")
    assert dr.node_name != main.node_name
    ports = [
        p
        for n in nodes
        for p in (n.amqp_port, n.management_port, n.dist_port, n.epmd_port)
        if p is not None
    ]
    assert len(set(ports)) == len(ports)
    assert not {4369, 5672, 15672, 25672} & set(ports)
    if dr.version == "3.10":
        assert (dr.root, dr.epmd_port) == (None, None)
    else:
        # each node from a root has an epmd of its own, so no node shares the host's
        assert dr.root is not None
        assert dr.epmd_port is not None
    assert "password" not in repr(dr)
    assert dr.password not in repr(dr)
    assert dr.amqp_uri == f"amqp://127.0.0.1:{dr.amqp_port}"


def test_management_api_shows_cluster_names_and_plugins(nodes: list[LocalNode]) -> None:
    names = []
    for node in nodes:
        overview = node.management("GET", "/api/overview", timeout=10)
        assert overview["node"] == node.node_name
        assert overview["rabbitmq_version"].startswith(f"{node.version}.")
        names.append(overview["cluster_name"])
        # shovel and federation management extensions are loaded
        ext = node.management("GET", "/api/extensions", timeout=10)
        # one file per extension up to 4.0, a list of files from 4.3 on
        js: set[str] = set()
        for e in ext:
            files = e.get("javascript")
            js.update([files] if isinstance(files, str) else files or [])
        assert {"shovel.js", "federation.js"} <= js
        # wrong password is refused: the admin user is real, not a default
        bad = requests.get(
            f"{node.management_url}/api/overview",
            auth=(node.username, "nope"),
            timeout=10,
        )
        assert bad.status_code == 401
        # the helper raises on an error status, and returns None for a 404 only when asked
        missing = "/api/queues/%2F/no-such-queue"
        with pytest.raises(requests.HTTPError, match="404"):
            node.management("DELETE", missing)
        assert node.management("DELETE", missing, missing_ok=True) is None
    assert names == ["dr", "main"]


def test_amqp_round_trip_with_admin_user(nodes: list[LocalNode]) -> None:
    for node in nodes:
        conn = pika.BlockingConnection(_amqp_params(node))
        try:
            ch = conn.channel()
            ch.queue_declare(queue="harness-test", durable=False, auto_delete=False)
            ch.basic_publish(exchange="", routing_key="harness-test", body=node.label.encode())
            method, _props, body = None, None, None
            for _ in range(20):
                method, _props, body = ch.basic_get("harness-test", auto_ack=True)
                if method is not None:
                    break
            assert body == node.label.encode()
            ch.queue_delete("harness-test")
        finally:
            conn.close()
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(_amqp_params(nodes[0], password="wrong"))


def test_add_vhost_is_idempotent_and_usable(nodes: list[LocalNode]) -> None:
    node = nodes[1]
    node.add_vhost("team/a")
    node.add_vhost("team/a")
    assert "team/a" in node.rabbitmqctl("list_vhosts", "--silent").split()
    conn = node.connect("team/a")
    try:
        declared = conn.channel().queue_declare(queue="in-vhost", auto_delete=True)
        assert declared.method.queue == "in-vhost"
    finally:
        conn.close()
    # the other cluster is independent
    assert "team/a" not in nodes[0].rabbitmqctl("list_vhosts", "--silent").split()


def test_rabbitmqctl_errors_are_reported(nodes: list[LocalNode]) -> None:
    with pytest.raises(local_brokers.LocalBrokerError, match="delete_vhost"):
        nodes[0].rabbitmqctl("delete_vhost", "does-not-exist")


def test_nodes_json_round_trip_is_private(nodes: list[LocalNode], tmp_path: Path) -> None:
    path = save_nodes(nodes, tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_nodes(tmp_path) == nodes


def test_stop_nodes_closes_ports_and_leaves_no_process(
    nodes_and_base: tuple[list[LocalNode], Path],
) -> None:
    """Runs last in this module: stops the shared nodes."""
    nodes, base = nodes_and_base
    ports = [
        p
        for n in nodes
        for p in (n.amqp_port, n.management_port, n.dist_port, n.epmd_port)
        if p is not None
    ]
    assert all(_listening(p) for p in ports)
    stop_nodes(nodes, remove_data=True)
    # The ports were the kernel's free ephemeral ones: once closed, another process
    # (the other xdist worker's Spark opens listeners all the time) may take one, so
    # the check is that no process of these nodes listens on them, not that none does.
    assert _node_listeners(nodes, ports) == {}
    for node in nodes:
        assert local_brokers._node_pids(node.node_name) == []
        assert not node.base_dir.exists()
        if node.root is not None:
            # The mounts lived in the nodes' own mount namespaces: with none of their
            # processes (epmd included) left in the root, none is left; the host's
            # namespace never had one. Other nodes may run from the same root (the
            # session's brokers_of_version pair), so only these nodes' count.
            marker = f"'RMQ_SPARK_LOCAL_EPMD={node.epmd_port}'"
            left = [p for p in _processes_rooted_in(node.root) if marker in _describe([p])]
            assert left == [], _describe(left)
            assert not _mounted_under(node.root)
    assert not [p for p in base.iterdir() if p.is_symlink()]
    stop_nodes(nodes)  # stopping again is harmless


def _processes_rooted_in(root: Path) -> list[int]:
    """Pids whose root directory is ``root`` (chrooted there)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/root") == str(root):
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _mounted_under(root: Path) -> list[str]:
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return [line.split()[1] for line in fh if line.split()[1].startswith(f"{root}/")]


@pytest.mark.parametrize("version", ["4.0", "4.3"])
def test_a_4x_cluster_shares_one_epmd_serves_quorum_queues_and_stops_clean(
    version: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cluster = local_brokers.start_cluster(
        f"c{version.replace('.', '')}", tmp_path_factory.mktemp("cluster"), count=3, version=version
    )
    try:
        first = cluster.first
        assert {n.epmd_port for n in cluster.nodes} == {first.epmd_port}
        running = first.management("GET", "/api/nodes", timeout=10)
        assert sorted(n["name"] for n in running if n["running"]) == sorted(cluster.node_names)
        flags = first.management("GET", "/api/feature-flags", timeout=10)
        states = {f["name"]: f["state"] for f in flags}
        # Fresh 4.x nodes enable every stable flag; 4.3 keeps its metadata in Khepri.
        assert states["khepri_db"] == ("enabled" if version == "4.3" else "disabled")
        conn = pika.BlockingConnection(_amqp_params(cluster.nodes[2]))
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
            ch.basic_publish("", "qq", b"x", pika.BasicProperties(headers={"b": 1, "a": 2}))
            method, properties, body = ch.basic_get("qq", auto_ack=True)
            assert method is not None
            assert body == b"x"
            assert list(properties.headers) == ["a", "b"]  # re-encoded, sorted by name
        finally:
            conn.close()
    finally:
        local_brokers.stop_cluster(cluster, remove_data=True)
    for node in cluster.nodes:
        assert local_brokers._node_pids(node.node_name) == []
    assert first.root is not None
    assert first.epmd_port is not None
    assert _node_listeners(cluster.nodes, [first.epmd_port]) == {}
    # Other nodes may run from the same root (this module's pair): only this
    # cluster's processes, epmd and rabbitmqctl leftovers included, must be gone.
    left = [
        pid
        for pid in _processes_rooted_in(first.root)
        if f"'RMQ_SPARK_LOCAL_EPMD={first.epmd_port}'" in _describe([pid])
    ]
    assert left == [], _describe(left)


def _node_listeners(nodes: Sequence[LocalNode], ports: list[int]) -> dict[int, str]:
    """Each of ``ports`` that a process of ``nodes`` (by the harness's own markers) still
    listens on, with a description of those processes."""
    markers = [f"{_MARKER_ENV}={n.node_name}" for n in nodes] + [
        f"{_EPMD_MARKER_ENV}={n.epmd_port}" for n in nodes if n.epmd_port
    ]
    theirs = {pid for marker in markers for pid, _comm in _marked_processes(marker)}
    held: dict[int, str] = {}
    for port in ports:
        listening = [pid for pid in _listener_pids(port) if pid in theirs]
        if listening:
            held[port] = _describe(listening)
    return held


def _listener_pids(port: int) -> list[int]:
    """Pids holding a listening TCP socket (IPv4 or IPv6) on ``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as fh:
            next(fh)  # the header
            for line in fh:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == _TCP_LISTEN:
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") in inodes for fd in fds):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


_TCP_LISTEN = "0A"  # the socket state's code in /proc/net/tcp


def _describe(pids: list[int]) -> str:
    """comm, parent and harness markers of each pid, for a failure message."""
    lines = []
    for pid in pids:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            stat_fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError as exc:
            lines.append(f"{pid}: {exc}")
            continue
        markers = [e.decode() for e in environ if e.startswith(b"RMQ_SPARK_LOCAL")]
        lines.append(f"{pid} {comm} ppid={stat_fields[1]} {markers}")
    return "\n".join(lines)
