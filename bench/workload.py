"""The brokers and the messages every throughput contender is measured on.

Local nodes from `rmq_spark.devtools.local_brokers` in one of two layouts:

* ``two_nodes``: two independent nodes (``src`` and ``dst``, two clusters); a queue
  moves to the same vhost and name on the other node.
* ``one_node``: a single node; a queue moves to the same name in a sibling vhost
  (``<vhost>-moved``), the "queues moving between vhosts" case. The only layout here
  a local shovel (RabbitMQ 4.2+) can serve: it consumes and publishes inside one
  cluster.

One vhost per scenario family, and identical, freshly seeded queues: same count,
same size, same bytes (a seeded random generator), persistent, with the few
properties a real message carries. Depths are read with AMQP passive declares
(exact, unlike the management API's sampled counters). Broker CPU is read from each
node's Erlang VM in /proc, so a contender's cost includes the work it makes the
brokers do.
"""

from __future__ import annotations

import logging
import os
import platform
import random
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika

from rmq_spark.devtools.demo import wait_for_depth
from rmq_spark.devtools.local_brokers import LocalNode, start_nodes, stop_nodes
from rmq_spark.devtools.rabbitmq_roots import HOST_VERSION

_REPO = Path(__file__).resolve().parents[1]

log = logging.getLogger(__name__)

SOURCE, DESTINATION = "src", "dst"
TWO_NODES, ONE_NODE = "two_nodes", "one_node"
LAYOUTS = (TWO_NODES, ONE_NODE)
# On one node a queue moves into a sibling vhost (the same vhost would be itself).
MOVED_VHOST_SUFFIX = "-moved"
# The CPU key when source and destination are one Erlang VM (not to be summed twice).
ONE_VM = "src_and_dst"
# Seeding publishes without confirms, then waits for the exact depth; a backlog of
# 50k persistent messages per queue takes a while on a busy 2-core box.
SEED_TIMEOUT_SECONDS = 600.0
# Clock ticks per second for the utime/stime fields of /proc/<pid>/stat.
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_HTTP_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Brokers:
    """The source and destination nodes (one node twice in ``one_node``) and the OS
    pids of their Erlang VMs (for CPU accounting)."""

    src: LocalNode
    dst: LocalNode
    src_pid: int
    dst_pid: int
    layout: str = TWO_NODES
    # Where contenders reach the destination's AMQP port (a delay proxy in front of
    # it, `bench.delay_proxy`); None: the node's own port. Checks and seeding always
    # use the node's own port.
    dst_amqp_port: int | None = None

    def contender_dst(self) -> LocalNode:
        """The destination node as the contenders see it (through the proxy, if any)."""
        if self.dst_amqp_port is None:
            return self.dst
        return replace(self.dst, amqp_port=self.dst_amqp_port)

    def broker_pids(self) -> list[int]:
        """The OS pids of the distinct Erlang VMs (one in ``one_node``)."""
        return sorted({self.src_pid, self.dst_pid})

    def destination_vhost(self, vhost: str) -> str:
        """Where a queue of source ``vhost`` goes (its name stays the same)."""
        return destination_vhost(self.layout, vhost)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each node's VM has used so far."""
        if self.layout == ONE_NODE:
            return {ONE_VM: process_cpu_seconds(self.src_pid)}
        return {
            SOURCE: process_cpu_seconds(self.src_pid),
            DESTINATION: process_cpu_seconds(self.dst_pid),
        }

    def rabbitmq_version(self) -> str:
        return str(
            self.src.management("GET", "/api/overview", timeout=_HTTP_TIMEOUT_SECONDS)[
                "rabbitmq_version"
            ]
        )

    def erlang_version(self) -> str:
        return str(
            self.src.management("GET", "/api/overview", timeout=_HTTP_TIMEOUT_SECONDS)[
                "erlang_version"
            ]
        )


def destination_vhost(layout: str, vhost: str) -> str:
    """Where a queue of source ``vhost`` goes in ``layout`` (its name stays the same)."""
    if layout == TWO_NODES:
        return vhost
    if layout == ONE_NODE:
        return f"{vhost}{MOVED_VHOST_SUFFIX}"
    raise ValueError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")


@contextmanager
def local_brokers(
    base_dir: Path, vhosts: Sequence[str], *, version: str = HOST_VERSION, layout: str = TWO_NODES
) -> Iterator[Brokers]:
    """Start the layout's nodes of RabbitMQ ``version``, create the source vhosts and
    their destination vhosts, stop and remove the nodes after."""
    labels = [SOURCE, DESTINATION] if layout == TWO_NODES else [SOURCE]
    nodes = start_nodes(labels, base_dir, version=version)
    try:
        src, dst = (nodes[0], nodes[-1])
        for vhost in vhosts:
            src.add_vhost(vhost)
            dst.add_vhost(destination_vhost(layout, vhost))
        yield Brokers(src, dst, vm_pid(src), vm_pid(dst), layout)
    finally:
        stop_nodes(nodes, remove_data=True)


def vm_pid(node: LocalNode) -> int:
    """The OS pid of a node's Erlang VM (its CPU time is read from /proc)."""
    return int(node.rabbitmqctl("eval", "list_to_integer(os:getpid()).").strip())


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (works for the rabbitmq user's VMs)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@dataclass(frozen=True)
class Workload:
    """What one queue holds before a contender moves it."""

    messages: int
    size: int  # body bytes per message

    @property
    def bytes(self) -> int:
        return self.messages * self.size


def bench_messages(workload: Workload, seed: str) -> Iterator[tuple[bytes, pika.BasicProperties]]:
    """Same seed, same bodies and properties: every contender gets the same queue."""
    rng = random.Random(seed)
    for index in range(workload.messages):
        yield (
            rng.randbytes(workload.size),
            pika.BasicProperties(
                content_type="application/octet-stream",
                delivery_mode=pika.DeliveryMode.Persistent,
                message_id=f"{seed}/{index}",
                timestamp=1_790_000_000 + index,
                headers={"sequence": index, "tenant": f"tenant-{index % 50:02d}"},
            ),
        )


def seed_queue(brokers: Brokers, vhost: str, queue: str, workload: Workload, seed: str) -> None:
    """Declare a durable classic queue on ``src`` and fill it with the workload."""
    connection = brokers.src.connect(vhost)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_purge(queue)
        for body, properties in bench_messages(workload, seed):
            channel.basic_publish("", queue, body, properties)
        wait_for_depth(channel, queue, workload.messages, timeout=SEED_TIMEOUT_SECONDS)
    finally:
        connection.close()


def declare_destination(brokers: Brokers, vhost: str, queue: str, queue_type: str) -> None:
    """An empty durable destination of the given type, as a user would prepare it
    (``vhost`` is the source's; the layout says which vhost the destination is in)."""
    connection = brokers.dst.connect(brokers.destination_vhost(vhost))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
        channel.queue_purge(queue)
    finally:
        connection.close()


def delete_queues(brokers: Brokers, vhost: str, queues: Sequence[str]) -> None:
    """Remove a run's queues on both sides, so the next run meets idle brokers."""
    for node, node_vhost in ((brokers.src, vhost), (brokers.dst, brokers.destination_vhost(vhost))):
        for queue in queues:
            path = f"/api/queues/{quote(node_vhost, safe='')}/{quote(queue, safe='')}"
            node.management("DELETE", path, timeout=_HTTP_TIMEOUT_SECONDS, missing_ok=True)


def depth(channel: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).method.message_count)


def depths_after(brokers: Brokers, vhost: str, queues: Sequence[str]) -> dict[str, int]:
    """What a finished contender left: messages still in the sources, and delivered.

    Counted independently of every contender's own report (passive declares).
    """
    counts = {}
    for side, node, node_vhost in (
        ("left_in_source", brokers.src, vhost),
        ("at_destination", brokers.dst, brokers.destination_vhost(vhost)),
    ):
        connection = node.connect(node_vhost)
        try:
            channel = connection.channel()
            counts[side] = sum(depth(channel, queue) for queue in queues)
        finally:
            connection.close()
    return counts


def wait_until_depth(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    queue: str,
    expected: int,
    *,
    poll_seconds: float,
    timeout: float,
) -> float:
    """Poll until ``queue`` holds ``expected`` messages; returns the monotonic time seen."""
    deadline = time.monotonic() + timeout
    while True:
        if depth(channel, queue) >= expected:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{queue}: fewer than {expected} messages after {timeout:.0f}s")
        time.sleep(poll_seconds)


def machine() -> dict[str, Any]:
    """Where the figures come from (they only compare within one run and one box)."""
    model = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def code_state() -> dict[str, str]:
    """The checkout a bench ran from: its commit, and whether it had changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=_REPO, capture_output=True, text=True, check=False
        ).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": str(bool(git("status", "--porcelain")))}
