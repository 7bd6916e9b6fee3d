"""Peak memory of a running job's process tree, by role (Linux /proc; no library).

`bench.contenders.run_job` runs ``./spark-submit.sh`` as a child; this samples that
child's descendants while it runs and says, per role, how large the largest process
grew and how large the role was at once:

- ``jvm``: Spark's JVM. In local mode (the benches) the driver and the executors are
  one JVM, so this is both.
- ``driver_python``: the job script's interpreter (`jobs/transfer.py`), which plans,
  commits and verifies.
- ``executor_python``: PySpark's worker daemon and the workers it forks, where the
  movers run.

A process's own peak is its kernel high-water mark (``VmHWM``), exact for every process
seen alive at least once; a worker that starts and ends between two samples is missed,
which PySpark's reused workers make rare. The role's total (``VmRSS`` summed at one
sample) is as fine as the sampling interval.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")
SAMPLE_SECONDS = 0.25
ROLES = ("jvm", "driver_python", "executor_python")


@dataclass
class RolePeak:
    """What one role reached: the largest process and the largest sum at one sample."""

    largest_process_kib: int = 0
    largest_total_kib: int = 0
    processes: set[int] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {
            "largest_process_mib": round(self.largest_process_kib / 1024, 1),
            "largest_total_mib": round(self.largest_total_kib / 1024, 1),
            "processes_seen": len(self.processes),
        }


def role_of(cmdline: list[str]) -> str | None:
    """Which role a process plays, from its command line (None: not one we report,
    e.g. the shell of spark-submit.sh)."""
    if not cmdline:
        return None
    program = os.path.basename(cmdline[0])
    if program == "java":
        return "jvm"
    if program.startswith("python"):
        if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
            return "executor_python"
        return "driver_python"
    return None


def _children_of() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # ended while we looked
        # The command name in parentheses may hold spaces: the fields follow its ")".
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    return children


def descendants(root: int) -> list[int]:
    children = _children_of()
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _memory_kib(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of a process, or None once it has ended."""
    try:
        status = (PROC / str(pid) / "status").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    values = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    if len(values) < 2:
        return None  # a zombie has no memory lines
    return values["VmRSS"], values["VmHWM"]


def _cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


class TreeMemory:
    """Samples a process's descendants on a thread until `stop`: ``with TreeMemory(pid)``."""

    def __init__(self, root: int, interval: float = SAMPLE_SECONDS) -> None:
        self._root = root
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)
        self.peaks = {role: RolePeak() for role in ROLES}

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join()

    def sample(self) -> None:
        """One look at every descendant."""
        totals = dict.fromkeys(ROLES, 0)
        for pid in descendants(self._root):
            role = role_of(_cmdline(pid))
            memory = _memory_kib(pid) if role else None
            if role is None or memory is None:
                continue
            rss, high_water = memory
            peak = self.peaks[role]
            peak.processes.add(pid)
            peak.largest_process_kib = max(peak.largest_process_kib, high_water)
            totals[role] += rss
        for role, total in totals.items():
            peak = self.peaks[role]
            peak.largest_total_kib = max(peak.largest_total_kib, total)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            self.sample()

    def to_json(self) -> dict[str, Any]:
        return {role: peak.to_json() for role, peak in self.peaks.items()}
