"""`python -m rmq_spark.devtools.local_brokers`: start, stop and cleanup from a shell."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from rmq_spark.devtools import rabbitmq_roots
from rmq_spark.devtools.local_brokers.lifecycle import start_nodes, stop_nodes
from rmq_spark.devtools.local_brokers.node import (
    _KILL_GRACE,
    _MARKER_ENV,
    NODES_FILE_NAME,
    LocalBrokerError,
)
from rmq_spark.devtools.local_brokers.processes import (
    _end_epmds,
    _harness_epmd_ports,
    _marker_values,
    _node_pids,
    _signal_all,
    _wait_gone,
)
from rmq_spark.devtools.local_brokers.saved import load_nodes, save_nodes
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION
from rmq_spark.errors import RmqSparkError

logger = logging.getLogger(__name__)


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
