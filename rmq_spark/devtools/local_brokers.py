"""Start and stop throw-away local RabbitMQ nodes for the demo and the tests.

Why this exists: the demo (`make demo`) and the integration tests need two (or more)
independent RabbitMQ "clusters" (e.g. a "dr" and a "main" one) with the management,
shovel and federation plugins, without Docker and without touching a RabbitMQ that
may already run on the machine (on Debian, `rabbit@localhost` on 5672/15672/25672).

How it works, and the traps it avoids:

* Every node gets free loopback ports (AMQP, management HTTP, Erlang distribution)
  found by binding port 0 on 127.0.0.1; default ports are never assumed free.
* Every node lives in its own directory ``<base_dir>/<label>-<suffix>/`` holding
  ``rabbitmq.conf``, ``enabled_plugins``, an (empty) ``rabbitmq-env.conf``, ``mnesia/``,
  ``log/`` and ``home/.erlang.cookie``. The environment passed to the RabbitMQ scripts
  is built from scratch (nothing is inherited from the caller's environment except
  ``PATH``) and ``RABBITMQ_CONF_ENV_FILE`` points at the node's own empty env file, so
  Debian's ``/etc/rabbitmq/rabbitmq-env.conf`` (``NODENAME=rabbit@localhost``,
  ``ERL_FLAGS``) is never sourced.
* When run as root, the scripts in ``/usr/lib/rabbitmq/bin`` are executed directly as
  the ``rabbitmq`` user (``subprocess`` ``user=``/``group=``), not through Debian's
  ``/usr/sbin`` wrappers: those re-quote the arguments through ``su -c`` and, for
  ``rabbitmq-server``, overwrite the *system* node's
  ``/var/log/rabbitmq/startup_log``. Node directories are ``chown -R`` to ``rabbitmq``.
  If ``rabbitmq`` cannot traverse the caller's base dir (pytest's
  ``/tmp/pytest-of-root`` is mode 0700), the node directory is created in a fresh
  ``mkdtemp`` directory under the system temp dir instead and a symlink to it is left
  in the base dir; no permission of the caller's directories is changed.
* The Erlang cookie is a copy of the system cookie
  (``/var/lib/rabbitmq/.erlang.cookie``) when it is readable, else a random one, and
  is placed in the node's own ``HOME``. The harness runs ``rabbitmqctl`` with that
  ``HOME``, so no cookie appears on a command line; with the copied system cookie,
  Debian's ``rabbitmqctl -n <node>`` run by root works too, which helps debugging.
* Nodes are started with ``rabbitmq-server -detached`` all at once, then awaited in
  parallel (boot takes several seconds each on a 2-core box). A node that dies
  during boot is noticed at once and reported with the tail of its log.
* Stopping uses ``rabbitmqctl stop``; any process left over (found in ``/proc`` by a
  marker environment variable only this harness sets) is sent SIGTERM, then SIGKILL.
  ``epmd`` is never killed: other nodes, including the system one, rely on it.
  ``python -m rmq_spark.devtools.local_brokers cleanup`` kills every harness node on the
  machine, for when the process that started them was itself killed.

Nothing is started, registered or read at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from rmq_spark.devtools import rabbitmq_roots
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION, NODE_MOUNT_POINT, RabbitMQRoot
from rmq_spark.errors import RmqSparkError

logger = logging.getLogger(__name__)

#: Environment variable that overrides where the RabbitMQ scripts are looked up.
RABBITMQ_BIN_DIR_ENV = "RMQ_SPARK_RABBITMQ_BIN_DIR"
#: Debian's real scripts (``/usr/sbin/rabbitmq-*`` are ``su`` wrappers around these).
DEFAULT_RABBITMQ_BIN_DIR = Path("/usr/lib/rabbitmq/bin")
#: The system node's cookie; copied (never modified) so root's CLI works too.
SYSTEM_COOKIE_FILE = Path("/var/lib/rabbitmq/.erlang.cookie")
#: OS user the nodes run as when the harness runs as root.
RABBITMQ_OS_USER = "rabbitmq"
#: File written by ``main start`` and read by ``load_nodes`` / ``main stop``.
NODES_FILE_NAME = "nodes.json"

ENABLED_PLUGINS: tuple[str, ...] = (
    "rabbitmq_management",
    "rabbitmq_shovel",
    "rabbitmq_shovel_management",
    "rabbitmq_federation",
    "rabbitmq_federation_management",
)
#: Per node; the box (24 GiB, 2 cores) also runs Spark and maybe the system node.
MEMORY_HIGH_WATERMARK = "2GiB"
#: Well above the 50 MB default so a filling disk blocks publishers before it is full,
#: small enough not to trip on a modest CI disk.
DISK_FREE_LIMIT = "512MiB"

#: Marker put in every node's server environment; identifies its processes in /proc.
_MARKER_ENV = "RMQ_SPARK_LOCAL_NODE"
#: Marker (value: the port) in the environment of nodes run from a root, which start
#: an epmd of their own on that port; it identifies that epmd so stop can end it.
_EPMD_MARKER_ENV = "RMQ_SPARK_LOCAL_EPMD"
#: Run as root, in a mount namespace of its own (``unshare``): bind /dev, /proc and
#: the node's directory into the root, then chroot as the root's rabbitmq user. The
#: mounts exist only in that namespace, so they vanish with its last process (the
#: node's VM and epmd, or one rabbitmqctl), however it ends: nothing is ever mounted
#: in the host's namespace, and nodes of one root never share (or unmount) a mount.
_CHROOT_SCRIPT = """set -e
root=$1 node_dir=$2 uid=$3 gid=$4
shift 4
mount --rbind /dev "$root/dev"
mount --rbind /proc "$root/proc"
mount --bind "$node_dir" "$root{mount_point}"
exec chroot --userspec="$uid:$gid" --groups="$gid" "$root" "$@"
""".replace("{mount_point}", NODE_MOUNT_POINT)
#: rabbitmqctl's own distribution ports (rabbitmq-env default); never hand them out.
_CLI_DIST_PORTS = range(35672, 35683)
_RESERVED_PORTS = frozenset({4369, 5671, 5672, 15672, 25672})
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_USERNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_LOOPBACK_ERL_ARGS = "-kernel inet_dist_use_interface {127,0,0,1}"
_LOG_TAIL_LINES = 30
_CTL_STOP_TIMEOUT = 60.0
_KILL_GRACE = 10.0
_HTTP_TIMEOUT = 10.0


class LocalBrokerError(RmqSparkError):
    """A local test/demo RabbitMQ node could not be started, configured or stopped."""


@dataclass(frozen=True)
class LocalNode:
    """One running local RabbitMQ node (a single-node "cluster") and its credentials.

    ``base_dir`` is the node's *own* directory (``mnesia/``, ``log/``, config files);
    it may lie outside the directory given to :func:`start_nodes` when that one is not
    traversable by the ``rabbitmq`` user (a symlink in it then points here).
    """

    label: str
    node_name: str
    amqp_port: int
    management_port: int
    dist_port: int
    base_dir: Path
    username: str
    password: str = field(repr=False)
    #: "3.10" (the host's Debian package) or a version from ``rabbitmq_roots.ROOT_SPECS``.
    version: str = HOST_VERSION
    #: The Debian root the node runs in under chroot; None for the host's package.
    root: Path | None = None
    #: The node's own epmd port (nodes from a root); None: the host's epmd on 4369.
    epmd_port: int | None = None

    @property
    def amqp_uri(self) -> str:
        """AMQP URI without credentials, so it can be logged and shown freely."""
        return f"amqp://127.0.0.1:{self.amqp_port}"

    @property
    def management_url(self) -> str:
        """Base URL of the management HTTP API (no trailing slash)."""
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def log_file(self) -> Path:
        """The node's main log file, for diagnosing test failures."""
        return self.base_dir / "log" / f"{self.node_name}.log"

    def add_vhost(self, vhost: str) -> None:
        """Create ``vhost`` (if missing) and grant the admin user full permissions on it.

        Uses the management API rather than rabbitmqctl: it is much cheaper than
        booting the Erlang CLI, and PUT is idempotent (201 created, 204 existed).
        """
        vq = quote(vhost, safe="")
        uq = quote(self.username, safe="")
        self._management_put(f"/api/vhosts/{vq}", {}, what=f"create vhost {vhost!r}")
        self._management_put(
            f"/api/permissions/{vq}/{uq}",
            {"configure": ".*", "write": ".*", "read": ".*"},
            what=f"grant {self.username!r} permissions on vhost {vhost!r}",
        )
        logger.info("node %s: vhost %r ready for user %r", self.label, vhost, self.username)

    def rabbitmqctl(self, *args: str, timeout: float = 60) -> str:
        """Run ``rabbitmqctl -n <node> <args>`` against this node and return its stdout.

        Runs as the node's OS user with the node's HOME (hence its cookie) and env file,
        so it never reaches the system node by accident.
        """
        return _ctl(self, list(args), timeout=timeout)

    def _management_put(self, path: str, body: dict[str, Any], *, what: str) -> None:
        """PUT ``body`` to the management API; raise LocalBrokerError unless 2xx."""
        url = f"{self.management_url}{path}"
        try:
            resp = requests.put(
                url,
                json=body,
                auth=(self.username, self.password),
                timeout=_HTTP_TIMEOUT,
            )
        except requests.RequestException as exc:
            raise LocalBrokerError(
                f"node {self.label} ({self.management_url}): could not {what}: {exc}"
            ) from exc
        if not 200 <= resp.status_code < 300:
            raise LocalBrokerError(
                f"node {self.label} ({self.management_url}): could not {what}: "
                f"expected HTTP 2xx, got {resp.status_code}: {resp.text[:500]}"
            )


# --------------------------------------------------------------------------- helpers


def _bin_dir() -> Path:
    """Where the real (non-wrapper) RabbitMQ scripts are; overridable for odd installs."""
    override = os.environ.get(RABBITMQ_BIN_DIR_ENV)
    bin_dir = Path(override) if override else DEFAULT_RABBITMQ_BIN_DIR
    if not (bin_dir / "rabbitmq-server").exists():
        raise LocalBrokerError(
            f"rabbitmq-server not found in {bin_dir} (set {RABBITMQ_BIN_DIR_ENV} to the "
            "directory holding rabbitmq-server and rabbitmqctl)"
        )
    return bin_dir


def _run_as() -> str | None:
    """The OS user to run RabbitMQ as: ``rabbitmq`` when we are root, else ourselves.

    RabbitMQ (and Debian's packaging) expect to run as ``rabbitmq``; a non-root caller
    cannot switch users, so then the nodes simply run as the caller.
    """
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(RABBITMQ_OS_USER)
    except KeyError:
        return None
    return RABBITMQ_OS_USER


def _user_kwargs(run_as: str | None) -> dict[str, Any]:
    """``subprocess`` keyword arguments that drop to ``run_as`` (no extra groups)."""
    if run_as is None:
        return {}
    pw = pwd.getpwnam(run_as)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def _node_paths(node_dir: Path) -> dict[str, Path]:
    """All paths derived from a node directory, in one place so they cannot drift."""
    return {
        "home": node_dir / "home",
        "mnesia": node_dir / "mnesia",
        "log": node_dir / "log",
        "config": node_dir / "rabbitmq.conf",
        "advanced": node_dir / "advanced.config",  # deliberately never created
        "env_file": node_dir / "rabbitmq-env.conf",
        "plugins": node_dir / "enabled_plugins",
        "pid": node_dir / "rabbitmq.pid",
        "startup_out": node_dir / "log" / "startup.out",
        "link": node_dir / ".symlinked-from",
    }


def _visible_dir(node: LocalNode) -> Path:
    """The node's directory as the node sees it: bind-mounted at a fixed path in a root."""
    return Path(NODE_MOUNT_POINT) if node.root is not None else node.base_dir


def _base_env(node: LocalNode) -> dict[str, str]:
    """Environment shared by the server and the CLI, built from scratch.

    Not inheriting the caller's environment keeps stray ``ERL_FLAGS``/``RABBITMQ_*``
    variables out; the node's own env file keeps Debian's rabbitmq-env.conf out. Inside
    a root the caller's PATH means nothing, so only the standard one is given.
    """
    paths = _node_paths(_visible_dir(node))
    std_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    caller_path = os.environ.get("PATH", "") if node.root is None else ""
    env = {
        "PATH": f"{caller_path}:{std_path}" if caller_path else std_path,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(paths["home"]),
        "RABBITMQ_CONF_ENV_FILE": str(paths["env_file"]),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_CTL_ERL_ARGS": _LOOPBACK_ERL_ARGS,
    }
    if node.epmd_port is not None:
        # Server, CLI and every member of a cluster must agree on it; the marker lets
        # stop find the epmd these nodes started (the host's epmd never has it).
        env["ERL_EPMD_PORT"] = str(node.epmd_port)
        env[_EPMD_MARKER_ENV] = str(node.epmd_port)
    return env


def _server_env(node: LocalNode) -> dict[str, str]:
    """Environment for ``rabbitmq-server``: everything that makes the node independent."""
    paths = _node_paths(_visible_dir(node))
    env = _base_env(node)
    env.update(
        {
            _MARKER_ENV: node.node_name,
            "RABBITMQ_NODENAME": node.node_name,
            "RABBITMQ_CONFIG_FILE": str(paths["config"]),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(paths["advanced"]),
            "RABBITMQ_MNESIA_BASE": str(paths["mnesia"]),
            "RABBITMQ_LOG_BASE": str(paths["log"]),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(paths["plugins"]),
            "RABBITMQ_PID_FILE": str(paths["pid"]),
            "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": _LOOPBACK_ERL_ARGS,
        }
    )
    return env


def _script_command(node: LocalNode, script: str, args: Sequence[str]) -> list[str]:
    """The command running RabbitMQ's ``script`` for ``node``: on the host or in its root."""
    if node.root is None:
        return [str(_bin_dir() / script), *args]
    uid, gid = _root_ids(node)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        _CHROOT_SCRIPT,
        "rmq-spark-chroot",
        str(node.root),
        str(node.base_dir),
        str(uid),
        str(gid),
        f"/usr/lib/rabbitmq/bin/{script}",
        *args,
    ]


def _script_user(node: LocalNode) -> dict[str, Any]:
    """``subprocess`` user arguments: root stays root for a chroot node (chroot drops)."""
    return {} if node.root is not None else _user_kwargs(_run_as())


def _root_ids(node: LocalNode) -> tuple[int, int]:
    """uid and gid of the rabbitmq user of the node's root (they differ from the host's)."""
    assert node.root is not None
    return rabbitmq_roots.rabbitmq_ids(node.root, node.version)


def _run(
    cmd: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Path,
    timeout: float,
    input_text: str | None = None,
    user: dict[str, Any] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a RabbitMQ script (as the node user), killing its whole group on timeout."""
    proc = subprocess.Popen(
        list(cmd),
        env=env,
        cwd=cwd,
        stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **(_user_kwargs(_run_as()) if user is None else user),
    )
    try:
        out, err = proc.communicate(input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def _ctl(node: LocalNode, args: list[str], *, timeout: float, input_text: str | None = None) -> str:
    """rabbitmqctl against ``node``; errors name only the subcommand (args may be secret)."""
    sub = args[0] if args else "(none)"
    cmd = _script_command(node, "rabbitmqctl", ["-n", node.node_name, *args])
    logger.debug("node %s: rabbitmqctl %s", node.label, sub)
    try:
        res = _run(
            cmd,
            env=_base_env(node),
            cwd=node.base_dir,
            timeout=timeout,
            input_text=input_text,
            user=_script_user(node),
        )
    except subprocess.TimeoutExpired as exc:
        raise LocalBrokerError(
            f"node {node.label} ({node.node_name}): rabbitmqctl {sub} did not finish "
            f"within {timeout:.0f} s"
        ) from exc
    if res.returncode != 0:
        detail = (res.stderr.strip() or res.stdout.strip())[-2000:]
        raise LocalBrokerError(
            f"node {node.label} ({node.node_name}): rabbitmqctl {sub} failed "
            f"(exit {res.returncode}): {detail}"
        )
    return res.stdout


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


def _launch(node: LocalNode) -> None:
    """``rabbitmq-server -detached``; returns as soon as the VM has daemonised.

    Output goes to ``log/startup.out`` (a file, not a pipe: the detached VM must not
    hold one of our pipes open).
    """
    paths = _node_paths(node.base_dir)
    logger.info(
        "starting node %s (%s): amqp %d, management %d, dist %d, dir %s",
        node.label,
        node.node_name,
        node.amqp_port,
        node.management_port,
        node.dist_port,
        node.base_dir,
    )
    with open(paths["startup_out"], "ab") as out:
        proc = subprocess.Popen(
            _script_command(node, "rabbitmq-server", ["-detached"]),
            env=_server_env(node),
            cwd=node.base_dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **_script_user(node),
        )
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    if rc != 0:
        raise LocalBrokerError(
            f"node {node.label} ({node.node_name}): rabbitmq-server -detached "
            f"{'timed out' if rc is None else f'exited {rc}'}\n{_diagnostics(node)}"
        )


def _node_pids(node_name: str) -> list[int]:
    """Live processes started for ``node_name`` (by marker env var), excluding epmd.

    The VM's command line does not name the node, but the marker variable in its
    environment does; ``epmd`` inherits it when a node had to start one, and killing
    it would orphan every other node's registration, so it is left alone (a node
    from a root has an epmd of its own, which :func:`_end_epmds` ends).
    """
    return [pid for pid, comm in _marked_processes(f"{_MARKER_ENV}={node_name}") if comm != b"epmd"]


def _environments() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, NAME=VALUE entries) of every live process whose environment we may read."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                yield int(entry), fh.read().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read


def _marker_values(name: str) -> set[str]:
    """Every value of the marker variable ``name`` among the live processes."""
    prefix = f"{name}=".encode()
    return {
        value[len(prefix) :].decode(errors="replace")
        for _pid, environ in _environments()
        for value in environ
        if value.startswith(prefix)
    }


def _marked_processes(marker: str, *, also: str | None = None) -> list[tuple[int, bytes]]:
    """(pid, comm) of every live process whose environment holds ``marker`` (NAME=VALUE)
    and, with ``also``, a variable of that name too."""
    wanted = marker.encode()
    also_prefix = f"{also}=".encode() if also else None
    found: list[tuple[int, bytes]] = []
    for pid, environ in _environments():
        if wanted not in environ:
            continue
        if also_prefix and not any(v.startswith(also_prefix) for v in environ):
            continue
        try:
            with open(f"/proc/{pid}/comm", "rb") as fh:
                found.append((pid, fh.read().strip()))
        except OSError:
            continue
    return found


def _end_epmds(ports: Iterable[int]) -> list[str]:
    """End the epmd of each port that no node of this harness uses any more.

    Only nodes run from a root have such an epmd (the host's nodes share the system's
    on 4369, which is never touched). rabbitmqctl runs carry the port's marker too,
    and their helper processes can outlive them briefly; once no *node* is left on
    the port, they go with the epmd. Returns what survived SIGKILL.
    """
    problems: list[str] = []
    for port in sorted(set(ports)):
        marker = f"{_EPMD_MARKER_ENV}={port}"
        # epmd itself carries the node marker of the node that started it
        if any(comm != b"epmd" for _, comm in _marked_processes(marker, also=_MARKER_ENV)):
            continue  # another member of the cluster still runs on it
        pids = [pid for pid, _ in _marked_processes(marker)]
        for sig, grace in ((signal.SIGTERM, _KILL_GRACE), (signal.SIGKILL, 5.0)):
            if not pids:
                break
            _signal_all(pids, sig)
            end = time.monotonic() + grace
            while pids and time.monotonic() < end:
                time.sleep(0.1)
                pids = [pid for pid, _ in _marked_processes(marker)]
        if pids:
            problems.append(f"epmd on port {port}: processes {pids} survived SIGKILL")
    return problems


def _harness_epmd_ports() -> set[int]:
    """Ports of every epmd started by a node of this harness run from a root."""
    return {int(value) for value in _marker_values(_EPMD_MARKER_ENV) if value.isdigit()}


def _tail(path: Path, lines: int) -> list[str]:
    """Last ``lines`` lines of a (possibly large, possibly missing) text file."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 200_000))
            data = fh.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-lines:]


def _diagnostics(node: LocalNode) -> str:
    """What to show when a node failed: crash slogan, first errors, log tail."""
    paths = _node_paths(node.base_dir)
    parts: list[str] = []
    crash = paths["log"] / "erl_crash.dump"
    with (
        contextlib.suppress(OSError),
        open(crash, encoding="utf-8", errors="replace") as fh,
    ):
        for line in fh.readlines(4096):
            if line.startswith("Slogan:"):
                parts.append(f"erl_crash.dump {line.strip()}")
                break
    out = _tail(paths["startup_out"], 10)
    if out:
        parts.append("startup output:\n  " + "\n  ".join(out))
    log_lines = _tail(node.log_file, 5000)
    errors = [ln for ln in log_lines if "[error]" in ln][:8]
    if errors:
        parts.append("first errors in log:\n  " + "\n  ".join(errors))
    tail = log_lines[-_LOG_TAIL_LINES:]
    if tail:
        parts.append(f"tail of {node.log_file}:\n  " + "\n  ".join(tail))
    else:
        parts.append(f"(no log at {node.log_file})")
    return "\n".join(parts)


def _node_alive(node: LocalNode, crash: Path) -> bool:
    """Whether the node has a process, asked again for up to 2 s before saying no.

    One scan of /proc once found none for a 4.3 cluster member whose log shows it
    booted fine right after (the cause was not pinned down), so a single empty scan
    is not taken for a death.
    """
    end = time.monotonic() + 2.0
    while True:
        if _node_pids(node.node_name):
            return True
        if crash.exists() or time.monotonic() >= end:
            return False
        time.sleep(0.2)


def _await_node(node: LocalNode, deadline: float, cancel: threading.Event) -> None:
    """Wait for boot, create the admin user, name the cluster, wait for management.

    ``await_startup`` fails fast while the node is not yet registered with epmd, so it
    is retried in short rounds (so ``cancel``, set on Ctrl-C, is honoured quickly);
    a node whose processes are gone fails immediately with its log.
    """
    t0 = time.monotonic()
    crash = _node_paths(node.base_dir)["log"] / "erl_crash.dump"
    last_error = ""
    while True:
        if cancel.is_set():
            raise LocalBrokerError(f"node {node.label}: start cancelled")
        if crash.exists() or not _node_alive(node, crash):
            time.sleep(0.5)  # let the log and crash dump be flushed
            raise LocalBrokerError(
                f"node {node.label} ({node.node_name}) died while booting\n{_diagnostics(node)}"
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LocalBrokerError(
                f"node {node.label} ({node.node_name}) did not finish booting in time "
                f"(last rabbitmqctl error: {last_error[-500:]})\n{_diagnostics(node)}"
            )
        wait_s = max(1, min(int(remaining), 10))
        try:
            _ctl(node, ["await_startup", "--timeout", str(wait_s)], timeout=wait_s + 15)
            break
        except LocalBrokerError as exc:
            last_error = str(exc)
            time.sleep(1.0)
    logger.info("node %s booted in %.1f s", node.label, time.monotonic() - t0)

    if node.root is not None:
        _set_up_admin_over_http(node, deadline, cancel)
        _await_management(node, deadline, cancel)
        return
    remaining = max(30.0, deadline - time.monotonic())
    _ctl(
        node,
        ["add_user", node.username],
        timeout=remaining,
        input_text=node.password + "\n",
    )
    _ctl(node, ["set_user_tags", node.username, "administrator"], timeout=remaining)
    _ctl(
        node,
        ["set_permissions", "-p", "/", node.username, ".*", ".*", ".*"],
        timeout=remaining,
    )
    _ctl(node, ["set_cluster_name", node.label], timeout=remaining)
    _await_management(node, deadline, cancel)


def _set_up_admin_over_http(node: LocalNode, deadline: float, cancel: threading.Event) -> None:
    """Create the admin user, its permissions and the cluster name as ``guest`` over HTTP.

    4.x's rabbitmqctl ``add_user`` without a password on the command line waits on
    its stdin forever when that is a pipe (seen with 4.0.5), and a password on the
    command line would show in ``ps``. ``guest`` may log in from loopback (the
    default, kept in rabbitmq.conf), which is where the harness is.
    """
    user = quote(node.username, safe="")
    steps: list[tuple[str, dict[str, Any], str]] = [
        (
            f"/api/users/{user}",
            {"password": node.password, "tags": "administrator"},
            f"create user {node.username!r}",
        ),
        (
            f"/api/permissions/%2F/{user}",
            {"configure": ".*", "write": ".*", "read": ".*"},
            f"grant {node.username!r} permissions on vhost '/'",
        ),
        ("/api/cluster-name", {"name": node.label}, f"name the cluster {node.label!r}"),
    ]
    for path, body, what in steps:
        last = ""
        while True:
            try:
                resp = requests.put(
                    f"{node.management_url}{path}",
                    json=body,
                    auth=("guest", "guest"),
                    timeout=_HTTP_TIMEOUT,
                )
                if 200 <= resp.status_code < 300:
                    break
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
            except requests.RequestException as exc:
                last = str(exc)
            if cancel.is_set():
                raise LocalBrokerError(f"node {node.label}: start cancelled")
            if time.monotonic() >= deadline:
                raise LocalBrokerError(
                    f"node {node.label} ({node.management_url}): could not {what} as guest "
                    f"in time: {last}\n{_diagnostics(node)}"
                )
            time.sleep(0.5)


def _await_management(node: LocalNode, deadline: float, cancel: threading.Event) -> None:
    """Poll GET /api/overview as the admin user until it shows the node's cluster name."""
    url = f"{node.management_url}/api/overview"
    last = ""
    while True:
        try:
            resp = requests.get(url, auth=(node.username, node.password), timeout=_HTTP_TIMEOUT)
            if resp.status_code == 200:
                name = resp.json().get("cluster_name")
                if name == node.label:
                    return
                last = f"cluster_name is {name!r}, expected {node.label!r}"
            else:
                last = f"HTTP {resp.status_code}: {resp.text[:200]}"
        except (requests.RequestException, ValueError) as exc:
            last = str(exc)
        if cancel.is_set():
            raise LocalBrokerError(f"node {node.label}: start cancelled")
        if time.monotonic() >= deadline:
            raise LocalBrokerError(
                f"node {node.label}: management API {url} not ready in time: {last}\n"
                f"{_diagnostics(node)}"
            )
        time.sleep(0.5)


def _wait_gone(node_name: str, timeout: float) -> list[int]:
    """Wait until no process of the node is left; return the survivors."""
    end = time.monotonic() + timeout
    while True:
        pids = _node_pids(node_name)
        if not pids or time.monotonic() >= end:
            return pids
        time.sleep(0.2)


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    """Send ``sig`` to each pid, ignoring ones that are already gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _remove_node_dir(node: LocalNode) -> None:
    """Delete the node directory and the symlink pointing to it, if any."""
    link_file = _node_paths(node.base_dir)["link"]
    with contextlib.suppress(OSError):
        link = Path(link_file.read_text(encoding="utf-8").strip())
        if link.is_symlink() and link.resolve() == node.base_dir.resolve():
            link.unlink()
    shutil.rmtree(node.base_dir, ignore_errors=True)


def _stop_one(node: LocalNode, remove_data: bool) -> str | None:
    """Stop one node reliably; return an error description or None on success."""
    t0 = time.monotonic()
    if _node_pids(node.node_name):
        # Without a pid-file argument: `stop <pidfile>` polls only once a second;
        # polling /proc ourselves is faster and also covers the VM's helpers.
        try:
            _ctl(node, ["stop"], timeout=_CTL_STOP_TIMEOUT)
        except (LocalBrokerError, OSError) as exc:
            logger.warning("node %s: graceful stop failed, killing it: %s", node.label, exc)
        pids = _wait_gone(node.node_name, 15.0)
        if pids:
            logger.warning("node %s: sending SIGTERM to leftover pids %s", node.label, pids)
            _signal_all(pids, signal.SIGTERM)
            pids = _wait_gone(node.node_name, _KILL_GRACE)
        if pids:
            logger.warning("node %s: sending SIGKILL to leftover pids %s", node.label, pids)
            _signal_all(pids, signal.SIGKILL)
            pids = _wait_gone(node.node_name, 5.0)
        if pids:
            return f"node {node.label} ({node.node_name}): processes {pids} survived SIGKILL"
        logger.info("node %s stopped in %.1f s", node.label, time.monotonic() - t0)
    else:
        logger.info("node %s (%s) was not running", node.label, node.node_name)
    if remove_data:
        _remove_node_dir(node)
    return None


# --------------------------------------------------------------------------- public API


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
    last = ""
    while True:
        try:
            auth = (node.username, node.password)
            overview = requests.get(
                f"{node.management_url}/api/overview", auth=auth, timeout=_HTTP_TIMEOUT
            )
            running = requests.get(
                f"{node.management_url}/api/nodes?columns=name,running",
                auth=auth,
                timeout=_HTTP_TIMEOUT,
            )
            if overview.status_code == 200 and running.status_code == 200:
                name = overview.json().get("cluster_name")
                up = {row["name"] for row in running.json() if row.get("running")}
                if name == cluster_name and up == members:
                    return
                last = f"cluster_name {name!r}, running nodes {sorted(up)}"
            else:
                last = f"HTTP {overview.status_code}/{running.status_code}"
        except (requests.RequestException, ValueError, KeyError) as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise LocalBrokerError(
                f"node {node.label}: not a running member of cluster {cluster_name!r} with "
                f"{sorted(members)} in time: {last}\n{_diagnostics(node)}"
            )
        time.sleep(0.5)


def stop_cluster(cluster: LocalCluster, *, remove_data: bool = False) -> None:
    """Stop every node of the cluster (see :func:`stop_nodes`)."""
    stop_nodes(cluster.nodes, remove_data=remove_data)


def node_to_dict(node: LocalNode) -> dict[str, Any]:
    """JSON-ready form of a node (includes the password: keep the file private)."""
    return {
        "node_name": node.node_name,
        "amqp_port": node.amqp_port,
        "management_port": node.management_port,
        "dist_port": node.dist_port,
        "base_dir": str(node.base_dir),
        "version": node.version,
        "root": None if node.root is None else str(node.root),
        "epmd_port": node.epmd_port,
        "username": node.username,
        "password": node.password,
        "amqp_uri": node.amqp_uri,
        "management_url": node.management_url,
    }


def save_nodes(nodes: Sequence[LocalNode], base_dir: Path) -> Path:
    """Write ``base_dir/nodes.json`` (label -> node details) atomically with mode 0600."""
    base_dir.mkdir(parents=True, exist_ok=True)
    target = base_dir / NODES_FILE_NAME
    tmp = base_dir / f".{NODES_FILE_NAME}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({n.label: node_to_dict(n) for n in nodes}, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return target


def load_nodes(base_dir: Path) -> list[LocalNode]:
    """Read the nodes listed in ``base_dir/nodes.json`` (written by ``main start``)."""
    path = Path(base_dir) / NODES_FILE_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise LocalBrokerError(f"cannot read {path}: {exc}") from exc
    try:
        return [
            LocalNode(
                label=label,
                node_name=str(d["node_name"]),
                amqp_port=int(d["amqp_port"]),
                management_port=int(d["management_port"]),
                dist_port=int(d["dist_port"]),
                base_dir=Path(d["base_dir"]),
                username=str(d["username"]),
                password=str(d["password"]),
                version=str(d.get("version", HOST_VERSION)),
                root=None if d.get("root") is None else Path(d["root"]),
                epmd_port=None if d.get("epmd_port") is None else int(d["epmd_port"]),
            )
            for label, d in data.items()
        ]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise LocalBrokerError(f"{path} is malformed: {exc!r}") from exc


def _cmd_start(args: argparse.Namespace) -> int:
    """``start``: refuse if the base dir still has live nodes, else start and save."""
    base_dir: Path = args.base_dir.absolute()
    with contextlib.suppress(FileNotFoundError, LocalBrokerError):
        live = [n.label for n in load_nodes(base_dir) if _node_pids(n.node_name)]
        if live:
            print(
                f"nodes {', '.join(live)} from {base_dir / NODES_FILE_NAME} are still "
                "running; run 'stop' first",
                file=sys.stderr,
            )
            return 1
    nodes = start_nodes(
        args.labels,
        base_dir,
        username=args.username,
        timeout=args.timeout,
        version=args.version,
    )
    try:
        path = save_nodes(nodes, base_dir)
    except BaseException:
        stop_nodes(nodes)
        raise
    for n in nodes:
        print(
            f"{n.label}: RabbitMQ {n.version}  {n.amqp_uri}  {n.management_url}  "
            f"node={n.node_name}  user={n.username}  log={n.log_file}"
        )
    print(f"credentials and ports: {path}")
    return 0


def _all_harness_nodes() -> list[str]:
    """Names of every node started by this harness that still has a process here."""
    return sorted(_marker_values(_MARKER_ENV))


def _cmd_cleanup(_args: argparse.Namespace) -> int:
    """``cleanup``: kill every harness node on the machine (e.g. after a killed CI run)."""
    problems = []
    for name in _all_harness_nodes():
        pids = _node_pids(name)
        logger.warning("killing stray harness node %s (pids %s)", name, pids)
        _signal_all(pids, signal.SIGTERM)
        pids = _wait_gone(name, _KILL_GRACE)
        _signal_all(pids, signal.SIGKILL)
        if _wait_gone(name, 5.0):
            problems.append(name)
    problems += _end_epmds(_harness_epmd_ports())
    if problems:
        print(f"could not kill: {', '.join(problems)}", file=sys.stderr)
        return 1
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    """``stop``: stop what nodes.json lists, then delete it (it is stale afterwards)."""
    base_dir: Path = args.base_dir.absolute()
    try:
        nodes = load_nodes(base_dir)
    except FileNotFoundError:
        print(f"no {base_dir / NODES_FILE_NAME}; nothing to stop")
        return 0
    stop_nodes(nodes, remove_data=args.remove_data)
    (base_dir / NODES_FILE_NAME).unlink(missing_ok=True)
    print(f"stopped {', '.join(n.label for n in nodes) or 'nothing'}")
    return 0


def _interrupt(signum: int, _frame: object) -> None:
    """Turn SIGTERM into KeyboardInterrupt so start_nodes' cleanup runs."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI for the demo: ``start --base-dir D LABEL...``, ``stop --base-dir D``, ``cleanup``."""
    parser = argparse.ArgumentParser(
        prog="python -m rmq_spark.devtools.local_brokers",
        description="Start/stop throw-away local RabbitMQ nodes (demo and tests).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="start nodes and write BASE_DIR/nodes.json")
    p_start.add_argument("--base-dir", type=Path, required=True)
    p_start.add_argument("--username", default="rmqspark")
    p_start.add_argument("--timeout", type=float, default=180.0)
    p_start.add_argument(
        "--version",
        default=HOST_VERSION,
        choices=list(rabbitmq_roots.VERSIONS),
        help=f"RabbitMQ to run: {HOST_VERSION} is the host's package, the others run "
        "from a Debian root (built on first use)",
    )
    p_start.add_argument("labels", nargs="+", help="one node per label, e.g. dr main")
    p_stop = sub.add_parser("stop", help="stop the nodes listed in BASE_DIR/nodes.json")
    p_stop.add_argument("--base-dir", type=Path, required=True)
    p_stop.add_argument("--remove-data", action="store_true", help="also delete node dirs")
    sub.add_parser(
        "cleanup",
        help="kill EVERY node this harness started on this machine (any base dir, any "
        "user session), e.g. after a CI job was killed; the system node is never touched",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # SIGTERM (e.g. a CI timeout) should clean up like Ctrl-C does; installed here,
    # never at import time, so library users keep their own handlers.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.command == "start":
            return _cmd_start(args)
        if args.command == "cleanup":
            return _cmd_cleanup(args)
        return _cmd_stop(args)
    except RmqSparkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
