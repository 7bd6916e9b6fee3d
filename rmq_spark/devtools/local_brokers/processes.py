"""A node's processes: launch, find (by marker in /proc), await boot, diagnose, stop."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from rmq_spark.devtools.local_brokers.node import (
    _CTL_STOP_TIMEOUT,
    _EPMD_MARKER_ENV,
    _HTTP_TIMEOUT,
    _KILL_GRACE,
    _LOG_TAIL_LINES,
    _MARKER_ENV,
    LocalBrokerError,
    LocalNode,
    _ctl,
    _node_paths,
    _script_command,
    _script_user,
    _server_env,
)

logger = logging.getLogger(__name__)


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
    """Wait for boot, create the admin user, name the cluster, wait for management."""
    _await_boot(node, deadline, cancel)
    _set_up_node(node, deadline, cancel)


def _await_boot(node: LocalNode, deadline: float, cancel: threading.Event) -> None:
    """Wait for the node's boot (``rabbitmqctl await_startup``).

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


def _set_up_node(node: LocalNode, deadline: float, cancel: threading.Event) -> None:
    """A first boot: the admin user, its permissions and the cluster name; management."""
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
        _poll(
            node,
            deadline,
            functools.partial(_put_as_guest, f"{node.management_url}{path}", body),
            f"node {node.label} ({node.management_url}): could not {what} as guest in time",
            cancel,
        )


def _put_as_guest(url: str, body: dict[str, Any]) -> str | None:
    """PUT ``body`` as ``guest``: None when done, else why not (for :func:`_poll`)."""
    try:
        resp = requests.put(url, json=body, auth=("guest", "guest"), timeout=_HTTP_TIMEOUT)
    except requests.RequestException as exc:
        return str(exc)
    if 200 <= resp.status_code < 300:
        return None
    return f"HTTP {resp.status_code}: {resp.text[:200]}"


def _await_management(node: LocalNode, deadline: float, cancel: threading.Event) -> None:
    """Poll GET /api/overview as the admin user until it shows the node's cluster name."""
    url = f"{node.management_url}/api/overview"

    def names_the_cluster() -> str | None:
        try:
            resp = requests.get(url, auth=(node.username, node.password), timeout=_HTTP_TIMEOUT)
            if resp.status_code != 200:
                return f"HTTP {resp.status_code}: {resp.text[:200]}"
            name = resp.json().get("cluster_name")
        except (requests.RequestException, ValueError) as exc:
            return str(exc)
        return None if name == node.label else f"cluster_name is {name!r}, expected {node.label!r}"

    _poll(
        node,
        deadline,
        names_the_cluster,
        f"node {node.label}: management API {url} not ready in time",
        cancel,
    )


def _poll(
    node: LocalNode,
    deadline: float,
    attempt: Callable[[], str | None],
    failure: str,
    cancel: threading.Event | None = None,
) -> None:
    """Call ``attempt`` every 0.5 s until it returns None (done), then return.

    ``attempt`` returns why it is not done yet; past ``deadline`` the error is
    ``failure``, that last reason and the node's diagnostics. A set ``cancel`` (Ctrl-C
    in :func:`start_nodes`) ends the wait at once.
    """
    while True:
        last = attempt()
        if last is None:
            return
        if cancel is not None and cancel.is_set():
            raise LocalBrokerError(f"node {node.label}: start cancelled")
        if time.monotonic() >= deadline:
            raise LocalBrokerError(f"{failure}: {last}\n{_diagnostics(node)}")
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


def kill_vm(node: LocalNode, *, timeout: float = 15.0) -> int:
    """SIGKILL the node's Erlang VM (``beam.smp``), as a host crash or the OOM killer
    would: no shutdown, no connection.close, queues left as the disk has them. Returns
    the VM's pid once every process of the node is gone (its helpers end with it;
    epmd, never the node's, stays)."""
    vms = [
        pid
        for pid, comm in _marked_processes(f"{_MARKER_ENV}={node.node_name}")
        if comm.startswith(b"beam")
    ]
    if len(vms) != 1:
        raise LocalBrokerError(f"node {node.label}: expected one Erlang VM, found pids {vms}")
    _signal_all(vms, signal.SIGKILL)
    left = _wait_gone(node.node_name, timeout)
    if left:
        raise LocalBrokerError(f"node {node.label}: processes {left} outlived its VM")
    return vms[0]


def restart_node(node: LocalNode, *, timeout: float = 180.0) -> None:
    """Start a stopped (or killed) node again on its directory, ports and data, and
    wait until it boots and its management API answers (its user and cluster name
    are in its data already)."""
    deadline = time.monotonic() + timeout
    cancel = threading.Event()
    _launch(node)
    _await_boot(node, deadline, cancel)
    _await_management(node, deadline, cancel)
