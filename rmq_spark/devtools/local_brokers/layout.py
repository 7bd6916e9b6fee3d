"""What a node needs on disk before it starts: free ports, its directory, cookie and
config files, owned by the user it runs as.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import secrets
import socket
import string
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from rmq_spark.devtools.local_brokers.node import (
    _CLI_DIST_PORTS,
    _RESERVED_PORTS,
    DISK_FREE_LIMIT,
    ENABLED_PLUGINS,
    MEMORY_HIGH_WATERMARK,
    SYSTEM_COOKIE_FILE,
    LocalBrokerError,
    LocalNode,
    _node_paths,
    _user_kwargs,
)
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION, RabbitMQRoot

logger = logging.getLogger(__name__)


def _pick_free_ports(count: int) -> list[int]:
    """Distinct free loopback ports; all sockets stay bound until every port is chosen."""
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port in _CLI_DIST_PORTS or port in _RESERVED_PORTS:
                continue
            ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def _can_traverse(path: Path, run_as: str | None) -> bool:
    """Whether ``run_as`` can reach entries of ``path`` (x on it and all its parents).

    Asks the kernel as that user instead of reimplementing permission rules (ACLs).
    """
    if run_as is None:
        return os.access(path, os.X_OK)
    res = subprocess.run(
        ["/bin/sh", "-c", 'test -x "$1"', "sh", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=30,
        check=False,
        **_user_kwargs(run_as),
    )
    return res.returncode == 0


def _make_node_dir(base_dir: Path, name: str, run_as: str | None) -> Path:
    """Create the node's directory in ``base_dir``, or in a temp dir if unreachable."""
    base_dir.mkdir(parents=True, exist_ok=True)
    if _can_traverse(base_dir, run_as):
        node_dir = base_dir / name
        node_dir.mkdir()
        return node_dir
    for candidate in dict.fromkeys([tempfile.gettempdir(), "/tmp", "/var/tmp"]):
        cand = Path(candidate)
        if cand.is_dir() and _can_traverse(cand, run_as):
            node_dir = Path(tempfile.mkdtemp(prefix=f"rmq-spark-{name}-", dir=cand))
            link = base_dir / name
            link.symlink_to(node_dir, target_is_directory=True)
            _node_paths(node_dir)["link"].write_text(f"{link}\n", encoding="utf-8")
            logger.info(
                "base dir %s is not traversable by user %s; node dir is %s (symlink %s)",
                base_dir,
                run_as,
                node_dir,
                link,
            )
            return node_dir
    raise LocalBrokerError(
        f"neither {base_dir} nor any temp dir is traversable by user {run_as}; "
        "pass a base dir whose parents are world-executable (e.g. under /tmp)"
    )


def _cookie() -> str:
    """The system cookie if readable (so root's Debian CLI can reach the nodes), else random."""
    with contextlib.suppress(OSError):
        value = SYSTEM_COOKIE_FILE.read_text(encoding="ascii").strip()
        if value:
            return value
    return "".join(secrets.choice(string.ascii_uppercase) for _ in range(32))


def _config_text(
    amqp_port: int, management_port: int, settings: Mapping[str, str] | None = None
) -> str:
    """rabbitmq.conf for one node: loopback only, fresh stats, modest resource limits,
    then the caller's `settings` (e.g. a node with its metrics collector off)."""
    extra = "".join(f"{key} = {value}\n" for key, value in (settings or {}).items())
    return (
        "# Written by rmq_spark.devtools.local_brokers; a throw-away demo/test node.\n"
        f"listeners.tcp.default = 127.0.0.1:{amqp_port}\n"
        f"management.tcp.ip = 127.0.0.1\n"
        f"management.tcp.port = {management_port}\n"
        "# guest stays, usable from loopback only (the RabbitMQ default)\n"
        "loopback_users.guest = true\n"
        "# refresh management counters every second (default 5 s)\n"
        "collect_statistics_interval = 1000\n"
        f"vm_memory_high_watermark.absolute = {MEMORY_HIGH_WATERMARK}\n"
        f"disk_free_limit.absolute = {DISK_FREE_LIMIT}\n"
        "log.console = false\n"
        "log.file.level = info\n"
        f"{extra}"
    )


def _chown_tree(root: Path, ids: tuple[int, int] | None) -> None:
    """``chown -R`` ``root`` to ``ids`` (RabbitMQ drops to that user and must write)."""
    if ids is None:
        return
    uid, gid = ids
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _host_ids(run_as: str | None) -> tuple[int, int] | None:
    """uid and gid of the host user the host's nodes run as (None: the caller)."""
    if run_as is None:
        return None
    pw = pwd.getpwnam(run_as)
    return pw.pw_uid, pw.pw_gid


def _prepare_node(
    label: str,
    ports: Sequence[int],
    *,
    base_dir: Path,
    username: str,
    password: str,
    cookie: str,
    run_as: str | None,
    settings: Mapping[str, str] | None = None,
    root: RabbitMQRoot | None = None,
    epmd_port: int | None = None,
) -> LocalNode:
    """Name one node and write its directory (ports chosen by the caller); start nothing.

    A node from a root sees its directory bind-mounted inside the root, so the host's
    path to it need not be traversable by anyone; it belongs to the root's rabbitmq user.
    """
    suffix = secrets.token_hex(3)
    amqp_port, management_port, dist_port = ports
    if root is None:
        node_dir = _make_node_dir(base_dir, f"{label}-{suffix}", run_as)
        owner = _host_ids(run_as)
    else:
        base_dir.mkdir(parents=True, exist_ok=True)
        node_dir = base_dir / f"{label}-{suffix}"
        node_dir.mkdir()
        owner = root.rabbitmq_ids()
    node_dir.chmod(0o750)
    paths = _node_paths(node_dir)
    for key in ("home", "mnesia", "log"):
        paths[key].mkdir()
    paths["home"].chmod(0o700)
    cookie_file = paths["home"] / ".erlang.cookie"
    fd = os.open(cookie_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(cookie)
    paths["config"].write_text(_config_text(amqp_port, management_port, settings), encoding="utf-8")
    paths["plugins"].write_text(f"[{','.join(ENABLED_PLUGINS)}].\n", encoding="utf-8")
    paths["env_file"].write_text(
        "# Intentionally empty: the harness passes every setting in the environment.\n"
        "# Pointing RABBITMQ_CONF_ENV_FILE here keeps /etc/rabbitmq/rabbitmq-env.conf\n"
        "# (NODENAME=rabbit@localhost, ERL_FLAGS) from being sourced.\n",
        encoding="utf-8",
    )
    _chown_tree(node_dir, owner)
    return LocalNode(
        label=label,
        node_name=f"rmqspark-{label}-{suffix}@localhost",
        amqp_port=amqp_port,
        management_port=management_port,
        dist_port=dist_port,
        base_dir=node_dir,
        username=username,
        password=password,
        version=HOST_VERSION if root is None else root.version,
        root=None if root is None else root.path,
        epmd_port=epmd_port,
    )
