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

Modules: `node` (the `LocalNode` record, settings, how the scripts run), `layout` (what a
node needs on disk), `processes` (launch, find, await, stop), `lifecycle` (the API
below), `saved` (`nodes.json`), `commands` (the `python -m` CLI). The underscore helpers
are private to this package; the few the tests reach are re-exported here.
"""

from rmq_spark.devtools.local_brokers.commands import main
from rmq_spark.devtools.local_brokers.lifecycle import (
    LocalCluster,
    running_nodes,
    start_cluster,
    start_nodes,
    stop_cluster,
    stop_nodes,
)
from rmq_spark.devtools.local_brokers.node import (
    DEFAULT_RABBITMQ_BIN_DIR,
    DISK_FREE_LIMIT,
    ENABLED_PLUGINS,
    MEMORY_HIGH_WATERMARK,
    NODES_FILE_NAME,
    RABBITMQ_BIN_DIR_ENV,
    RABBITMQ_OS_USER,
    SYSTEM_COOKIE_FILE,
    LocalBrokerError,
    LocalNode,
    _base_env,
    _script_command,
    _server_env,
)
from rmq_spark.devtools.local_brokers.processes import _node_pids, kill_vm, restart_node
from rmq_spark.devtools.local_brokers.saved import load_nodes, node_to_dict, save_nodes

__all__ = [
    "DEFAULT_RABBITMQ_BIN_DIR",
    "DISK_FREE_LIMIT",
    "ENABLED_PLUGINS",
    "MEMORY_HIGH_WATERMARK",
    "NODES_FILE_NAME",
    "RABBITMQ_BIN_DIR_ENV",
    "RABBITMQ_OS_USER",
    "SYSTEM_COOKIE_FILE",
    "LocalBrokerError",
    "LocalCluster",
    "LocalNode",
    "_base_env",
    "_node_pids",
    "_script_command",
    "_server_env",
    "kill_vm",
    "load_nodes",
    "main",
    "node_to_dict",
    "restart_node",
    "running_nodes",
    "save_nodes",
    "start_cluster",
    "start_nodes",
    "stop_cluster",
    "stop_nodes",
]
