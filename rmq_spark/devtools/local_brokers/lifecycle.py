"""The harness's public API: start and stop nodes, and join nodes into one cluster."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from rmq_spark.devtools import rabbitmq_roots
from rmq_spark.devtools.local_brokers.layout import _cookie, _pick_free_ports, _prepare_node
from rmq_spark.devtools.local_brokers.node import (
    _HTTP_TIMEOUT,
    _LABEL_RE,
    _USERNAME_RE,
    LocalBrokerError,
    LocalNode,
    _bin_dir,
    _ctl,
    _run_as,
)
from rmq_spark.devtools.local_brokers.processes import (
    _await_node,
    _end_epmds,
    _launch,
    _poll,
    _stop_one,
)
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION, RabbitMQRoot

logger = logging.getLogger(__name__)


def start_nodes(
    labels: Sequence[str],
    base_dir: Path,
    *,
    username: str = "rmqspark",
    password: str | None = None,
    timeout: float = 180,
    settings: Mapping[str, str] | None = None,
    version: str = HOST_VERSION,
    shared_epmd: bool = False,
) -> list[LocalNode]:
    """Start one independent RabbitMQ node per label and return them, ready for use.

    `settings` are extra rabbitmq.conf lines for every node (key -> value).

    All nodes boot concurrently; the call returns once each answers
    ``GET /api/overview`` as ``username`` with its label as cluster name. All nodes
    share ``username``/``password`` (generated unless given). On any failure every node
    started by this call is stopped before the error is raised, so nothing is leaked.

    ``version`` "3.10" runs the host's Debian package; "4.0" and "4.3" run the package
    of a Debian root (``rabbitmq_roots``, built first when missing) under chroot, each
    node with its own epmd port, or one for all of them with ``shared_epmd`` (a
    cluster's members must find each other through one epmd).

    Example: ``dr, main = start_nodes(["dr", "main"], tmp, version="4.3")``.
    """
    labels = list(labels)
    if not labels:
        return []
    if len(set(labels)) != len(labels):
        raise LocalBrokerError(f"node labels must be unique, got {labels}")
    for label in labels:
        if not _LABEL_RE.match(label):
            raise LocalBrokerError(
                f"node label {label!r} is not usable in an Erlang node name "
                "(expected letters, digits, '_' or '-', at most 32 characters)"
            )
    if not _USERNAME_RE.match(username):
        raise LocalBrokerError(f"unusable admin username {username!r}")
    if password is not None and not password:
        raise LocalBrokerError("the admin password must not be empty")
    secret = password if password is not None else secrets.token_urlsafe(16)
    base_dir = Path(base_dir).absolute()
    run_as = _run_as()
    root = _root_for(version)
    t0 = time.monotonic()
    deadline = t0 + timeout
    cookie = _cookie()
    nodes: list[LocalNode] = []
    try:
        # All ports in one go, so no two nodes can be handed the same one; nodes from a
        # root get an epmd port each (or one shared) besides AMQP, management and dist.
        epmd_count = 0 if root is None else (1 if shared_epmd else len(labels))
        ports = _pick_free_ports(3 * len(labels) + epmd_count)
        epmd_ports = ports[3 * len(labels) :]
        for i, label in enumerate(labels):
            node = _prepare_node(
                label,
                ports[3 * i : 3 * i + 3],
                base_dir=base_dir,
                username=username,
                password=secret,
                cookie=cookie,
                run_as=run_as,
                settings=settings,
                root=root,
                epmd_port=None if root is None else epmd_ports[min(i, epmd_count - 1)],
            )
            nodes.append(node)
            _launch(node)
        cancel = threading.Event()
        pool = ThreadPoolExecutor(max_workers=min(4, len(nodes)))
        try:
            futures = [pool.submit(_await_node, node, deadline, cancel) for node in nodes]
            errors = [f.exception() for f in futures]
        except BaseException:
            cancel.set()  # e.g. Ctrl-C: make the waiting threads give up promptly
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        failures = [e for e in errors if e is not None]
        if failures:
            if len(failures) == 1 and isinstance(failures[0], LocalBrokerError):
                raise failures[0]
            first = failures[0]
            raise LocalBrokerError("\n\n".join(str(e) for e in failures)) from first
    except BaseException:
        if nodes:
            logger.error("starting nodes failed; stopping the %d started node(s)", len(nodes))
            with contextlib.suppress(Exception):
                stop_nodes(nodes)
        raise
    logger.info(
        "started %d RabbitMQ %s node(s) %s in %.1f s",
        len(nodes),
        version,
        ", ".join(n.label for n in nodes),
        time.monotonic() - t0,
    )
    return nodes


def _root_for(version: str) -> RabbitMQRoot | None:
    """The root to run ``version`` from (built when missing); None for the host's package."""
    if version == HOST_VERSION:
        _bin_dir()
        return None
    if os.geteuid() != 0:
        raise LocalBrokerError(
            f"RabbitMQ {version} runs from a Debian root under chroot, which needs root "
            f"(mount and chroot); only {HOST_VERSION} (the host's package) runs as another user"
        )
    root = rabbitmq_roots.ensure_root(version)
    for tool in ("unshare", "mount", "chroot"):
        if shutil.which(tool) is None:
            raise LocalBrokerError(f"RabbitMQ {version}: {tool} is not installed (util-linux)")
    # The root is shared by every node started from it; the copy is atomic.
    rabbitmq_roots.refresh_hosts(root.path)
    return root


def stop_nodes(nodes: Iterable[LocalNode], *, remove_data: bool = False) -> None:
    """Stop the given nodes (in parallel) and make sure none of their processes remain.

    Already-stopped nodes are fine. Raises LocalBrokerError only if some process of a
    node survived SIGKILL; data is kept unless ``remove_data``.
    """
    nodes = list(nodes)
    if not nodes:
        return
    with ThreadPoolExecutor(max_workers=min(4, len(nodes))) as pool:
        results = list(pool.map(lambda n: _stop_one(n, remove_data), nodes))
    problems = [r for r in results if r]
    problems += _end_epmds(n.epmd_port for n in nodes if n.epmd_port is not None)
    if problems:
        raise LocalBrokerError("; ".join(problems))


@contextlib.contextmanager
def running_nodes(
    labels: Sequence[str],
    base_dir: Path,
    *,
    remove_data: bool = False,
    **kw: Any,
) -> Iterator[list[LocalNode]]:
    """Start nodes (``kw`` as for :func:`start_nodes`), yield them, always stop them."""
    nodes = start_nodes(labels, base_dir, **kw)
    try:
        yield nodes
    finally:
        stop_nodes(nodes, remove_data=remove_data)


@dataclass(frozen=True)
class LocalCluster:
    """Local nodes joined into one RabbitMQ cluster (for quorum queues and mirroring).

    Every node answers AMQP and the management API on its own ports; they share one
    Erlang cookie, one user database and the cluster name ``label``.
    """

    label: str
    nodes: tuple[LocalNode, ...]

    @property
    def first(self) -> LocalNode:
        """The node the others joined (any node would do for API calls)."""
        return self.nodes[0]

    @property
    def amqp_uris(self) -> list[str]:
        return [node.amqp_uri for node in self.nodes]

    @property
    def node_names(self) -> list[str]:
        return [node.node_name for node in self.nodes]


def start_cluster(
    label: str,
    base_dir: Path,
    *,
    count: int = 3,
    timeout: float = 240,
    version: str = HOST_VERSION,
    **kw: Any,
) -> LocalCluster:
    """Start ``count`` nodes (``<label>-1`` ...) and join them into one cluster.

    The nodes boot as independent nodes (:func:`start_nodes`, same cookie and admin
    user), then every node but the first runs ``stop_app``, ``join_cluster <first>``,
    ``start_app``; joining resets a node, so the cluster keeps the first node's users
    (the same user and password). The cluster is named ``label``. On any failure every
    node is stopped before the error is raised. Members of a 4.x cluster (``version``)
    share one epmd port of their own.
    """
    if count < 1:
        raise LocalBrokerError(f"a cluster needs at least one node, got count={count}")
    t0 = time.monotonic()
    nodes = start_nodes(
        [f"{label}-{i + 1}" for i in range(count)],
        base_dir,
        timeout=timeout,
        version=version,
        shared_epmd=True,
        **kw,
    )
    try:
        first = nodes[0]
        for node in nodes[1:]:
            _ctl(node, ["stop_app"], timeout=timeout)
            _ctl(node, ["join_cluster", first.node_name], timeout=timeout)
            _ctl(node, ["start_app"], timeout=timeout)
        _ctl(first, ["set_cluster_name", label], timeout=timeout)
        deadline = time.monotonic() + timeout
        for node in nodes:
            _await_cluster_member(node, label, {n.node_name for n in nodes}, deadline)
    except BaseException:
        with contextlib.suppress(Exception):
            stop_nodes(nodes)
        raise
    logger.info("cluster %s of %d node(s) ready in %.1f s", label, count, time.monotonic() - t0)
    return LocalCluster(label=label, nodes=tuple(nodes))


def _await_cluster_member(
    node: LocalNode, cluster_name: str, members: set[str], deadline: float
) -> None:
    """Poll the node's management API until it names the cluster and sees every member
    running."""
    auth = (node.username, node.password)

    def is_member() -> str | None:
        try:
            overview = requests.get(
                f"{node.management_url}/api/overview", auth=auth, timeout=_HTTP_TIMEOUT
            )
            running = requests.get(
                f"{node.management_url}/api/nodes?columns=name,running",
                auth=auth,
                timeout=_HTTP_TIMEOUT,
            )
            if overview.status_code != 200 or running.status_code != 200:
                return f"HTTP {overview.status_code}/{running.status_code}"
            name = overview.json().get("cluster_name")
            up = {row["name"] for row in running.json() if row.get("running")}
        except (requests.RequestException, ValueError, KeyError) as exc:
            return str(exc)
        if name == cluster_name and up == members:
            return None
        return f"cluster_name {name!r}, running nodes {sorted(up)}"

    _poll(
        node,
        deadline,
        is_member,
        f"node {node.label}: not a running member of cluster {cluster_name!r} with "
        f"{sorted(members)} in time",
    )


def stop_cluster(cluster: LocalCluster, *, remove_data: bool = False) -> None:
    """Stop every node of the cluster (see :func:`stop_nodes`)."""
    stop_nodes(cluster.nodes, remove_data=remove_data)
