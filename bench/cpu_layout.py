"""Where the brokers and the client run: the two CPU layouts of the throughput benchmark.

* ``shared``: nothing pinned; both brokers' Erlang VMs, the client (mover, Spark,
  the benchmark itself) and everything else on the box share every core.
* ``separated``: the brokers' VMs (every thread) pinned to the first half of the
  cores, the benchmark process and everything it starts from then on (the mover's
  interpreter, ``spark-submit`` and its JVM and Python workers, the delay proxy) to
  the other half; on 2 cores, brokers on CPU 0 and client on CPU 1. This is how the
  product is deployed: Spark executors run on other hosts than the brokers, while a
  Shovel runs inside the source broker and spends the broker's CPU. With the
  brokers on their own cores, broker CPU is the limit, and a contender's broker CPU
  per 100k messages sets its *broker-bound limit*: 100k / (CPU-s per 100k) msg/s per
  broker core.

`separated` pins with ``sched_setaffinity`` on every thread in ``/proc/<pid>/task``
(what ``taskset -a -cp`` does) and restores every affinity it changed on the way out.
Threads a VM starts later inherit the pinned thread's mask.

Broker CPU is read per run from ``/proc/<pid>/stat`` (utime + stime, every thread of the
VM); `idle_cpu_per_second` measures what the idle VMs spend (timers, metrics,
management stats), which the report subtracts from each run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.workload import process_cpu_seconds

SHARED, SEPARATED = "shared", "separated"
CPU_LAYOUTS = (SHARED, SEPARATED)
IDLE_SAMPLE_SECONDS = 5.0


@dataclass(frozen=True)
class Placement:
    """The CPUs the brokers and the client may use in one layout (None: unpinned)."""

    layout: str
    broker_cpus: frozenset[int] | None
    client_cpus: frozenset[int] | None

    def broker_cores(self) -> int:
        """How many cores bound the brokers (the limit's multiplier)."""
        return len(self.broker_cpus) if self.broker_cpus is not None else os.cpu_count() or 1

    def to_json(self) -> dict[str, object]:
        def listed(cpus: frozenset[int] | None) -> list[int] | str:
            return sorted(cpus) if cpus is not None else "all"

        return {
            "layout": self.layout,
            "broker_cpus": listed(self.broker_cpus),
            "client_cpus": listed(self.client_cpus),
        }


def placement(layout: str, cpus: Sequence[int] | None = None) -> Placement:
    """The layout's CPUs, from the CPUs this process may use (`cpus`, default: its own).

    ``separated`` gives the brokers the first half (rounded down, at least one) and the
    client the rest; it needs at least two CPUs.
    """
    if layout == SHARED:
        return Placement(SHARED, None, None)
    if layout != SEPARATED:
        raise ValueError(f"unknown CPU layout {layout!r}: expected one of {', '.join(CPU_LAYOUTS)}")
    available = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(available) < 2:
        raise ValueError(
            f"the {SEPARATED} layout needs at least 2 CPUs; this process may use {available}"
        )
    half = len(available) // 2
    return Placement(SEPARATED, frozenset(available[:half]), frozenset(available[half:]))


def threads(pid: int) -> list[int]:
    """Every thread id of process `pid` now."""
    return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]


def _pin_all_threads(pid: int, cpus: frozenset[int], saved: dict[int, set[int]]) -> None:
    for tid in threads(pid):
        try:
            saved.setdefault(tid, os.sched_getaffinity(tid))
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue  # the thread ended between the listing and the call


@contextmanager
def applied(layout: Placement, broker_pids: Sequence[int]) -> Iterator[Placement]:
    """Pin the brokers' VMs and this process as `layout` says; restore on the way out.

    On the client side, this process's threads and what it starts afterwards (a
    child inherits its parent's mask at fork).
    """
    saved: dict[int, set[int]] = {}
    try:
        if layout.broker_cpus is not None and layout.client_cpus is not None:
            for pid in broker_pids:
                _pin_all_threads(pid, layout.broker_cpus, saved)
            _pin_all_threads(os.getpid(), layout.client_cpus, saved)
        yield layout
    finally:
        for tid, cpus in saved.items():
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                continue  # a VM thread that has ended, or a VM already stopped


def idle_cpu_per_second(pids: Sequence[int], seconds: float = IDLE_SAMPLE_SECONDS) -> float:
    """CPU-s per second the processes `pids` spend together while nothing is moved."""
    before = sum(process_cpu_seconds(pid) for pid in pids)
    started = time.monotonic()
    time.sleep(seconds)  # sampling idle spending over a fixed interval, not waiting on a state
    spent = sum(process_cpu_seconds(pid) for pid in pids) - before
    return round(spent / (time.monotonic() - started), 4)


def broker_cost(
    broker_cpu_seconds: float, seconds: float, messages: int, idle_per_second: float
) -> float:
    """Broker CPU-s per 100k messages of one run, the idle VMs' spending taken out."""
    if messages <= 0:
        raise ValueError(f"a run moved {messages} messages: no cost per message")
    net = max(0.0, broker_cpu_seconds - idle_per_second * seconds)
    return net * 100_000 / messages


def broker_bound_limit(cost_per_100k: float, broker_cores: int) -> float | None:
    """msg/s the broker cores could sustain at this cost, if they did nothing else."""
    if cost_per_100k <= 0:
        return None
    return broker_cores * 100_000 / cost_per_100k
