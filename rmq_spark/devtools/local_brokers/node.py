"""One local node: its settings, the `LocalNode` record, and how its RabbitMQ scripts run
(environment built from scratch, as the node's user, on the host or in a Debian root).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import requests

from rmq_spark.devtools import rabbitmq_roots
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION, NODE_MOUNT_POINT
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
#: Tests' and benches' management calls; generous, as a loaded node answers slowly.
_MANAGEMENT_TIMEOUT = 30.0


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

    def connect(self, vhost: str = "/") -> pika.BlockingConnection:
        """A blocking AMQP connection to ``vhost`` as the node's admin user (tests, benches)."""
        return pika.BlockingConnection(
            pika.ConnectionParameters(
                host="127.0.0.1",
                port=self.amqp_port,
                virtual_host=vhost,
                credentials=pika.PlainCredentials(self.username, self.password),
            )
        )

    def management(
        self,
        method: str,
        path: str,
        *,
        timeout: float = _MANAGEMENT_TIMEOUT,
        missing_ok: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Call the management API as the admin user; return the decoded JSON or None.

        Raises ``requests.HTTPError`` on a non-2xx answer, except a 404 when
        ``missing_ok`` (deleting what may not exist), which returns None. ``kwargs`` go
        to ``requests.request`` (``json=``, ``params=``, ``headers=``).
        """
        response = requests.request(
            method,
            f"{self.management_url}{path}",
            auth=(self.username, self.password),
            timeout=timeout,
            **kwargs,
        )
        if missing_ok and response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json() if response.content else None

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
