"""Live progress on the driver while the executors move messages.

The driver cannot see inside the mover tasks (and correctness never depends on
what it sees), so it samples what the brokers say: each source queue's exact ready
count (AMQP passive declare), every `interval` seconds. Moved = depth at plan time
minus depth now. On a terminal that drives rich progress bars; elsewhere (YARN,
Kubernetes, Databricks logs) one structured log line per interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rmq_spark.amqp import queue_depths
from rmq_spark.config import JobConfig
from rmq_spark.discovery import QueueTransfer
from rmq_spark.errors import RmqSparkError

log = logging.getLogger(__name__)

TERMINAL_INTERVAL_SECONDS = 1.0
LOG_INTERVAL_SECONDS = 10.0
# Bars for the busiest queues; the total bar covers the rest.
MAX_QUEUE_BARS = 10

DepthSampler = Callable[[], dict[str, int]]  # source label -> ready messages now


@dataclass(frozen=True)
class Snapshot:
    """Progress at one moment, derived from two depth samples."""

    moved: int
    total: int
    seconds: float
    per_queue: dict[str, tuple[int, int]]  # label -> (moved, total)

    @property
    def rate(self) -> float:
        return self.moved / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        if self.rate <= 0:
            return None
        return max(self.total - self.moved, 0) / self.rate

    def log_line(self, bytes_per_message: float) -> str:
        eta = "?" if self.eta_seconds is None else f"{self.eta_seconds:.0f}s"
        done = sum(1 for moved, total in self.per_queue.values() if moved >= total)
        return (
            f"progress moved={self.moved}/{self.total} queues_done={done}/{len(self.per_queue)} "
            f"rate={self.rate:.0f}msg/s bytes_rate={self.rate * bytes_per_message:.0f}B/s "
            f"eta={eta}"
        )


def snapshot(before: dict[str, int], now: dict[str, int], seconds: float) -> Snapshot:
    """Moved per queue is the drop in its ready count, never below 0 or above its start.

    A producer publishing into a source during the run can make the drop look smaller;
    the bar then lags, and the ledger still counts exactly.
    """
    per_queue = {
        label: (min(max(total - now.get(label, total), 0), total), total)
        for label, total in before.items()
    }
    return Snapshot(
        moved=sum(moved for moved, _ in per_queue.values()),
        total=sum(before.values()),
        seconds=seconds,
        per_queue=per_queue,
    )


def amqp_sampler(config: JobConfig, transfers: Sequence[QueueTransfer]) -> DepthSampler:
    """Exact source depths, one short connection per source vhost."""
    by_vhost: dict[tuple[str, str], list[QueueTransfer]] = defaultdict(list)
    for transfer in transfers:
        by_vhost[(transfer.source_cluster, transfer.source_vhost)].append(transfer)

    def sample() -> dict[str, int]:
        depths = {}
        for (cluster, vhost), group in by_vhost.items():
            counted = queue_depths(
                cluster, config.clusters[cluster], vhost, [t.source_queue for t in group]
            )
            depths.update({t.source_label: counted[t.source_queue] for t in group})
        return depths

    return sample


class ProgressReporter:
    """A daemon thread showing progress until `stop`; use as a context manager."""

    def __init__(
        self,
        transfers: Sequence[QueueTransfer],
        sampler: DepthSampler,
        *,
        console: Console | None = None,
        interval: float | None = None,
    ) -> None:
        self._before = {t.source_label: t.messages for t in transfers}
        total_bytes = sum(t.message_bytes for t in transfers)
        self._bytes_per_message = total_bytes / max(sum(self._before.values()), 1)
        self._sampler = sampler
        self._console = console or Console(stderr=True)
        self._terminal = self._console.is_terminal
        self._interval = interval or (
            TERMINAL_INTERVAL_SECONDS if self._terminal else LOG_INTERVAL_SECONDS
        )
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rmq-spark-progress", daemon=True)
        self.last: Snapshot | None = None

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        started = time.monotonic()
        if self._terminal:
            self._run_bars(started)
        else:
            while not self._stopped.wait(self._interval):
                if self._sample(started):
                    assert self.last is not None
                    log.info("%s", self.last.log_line(self._bytes_per_message))
        if self._sample(started) and not self._terminal:
            assert self.last is not None
            log.info("%s", self.last.log_line(self._bytes_per_message))

    def _run_bars(self, started: float) -> None:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=self._console, transient=False) as bars:
            total = bars.add_task("total", total=sum(self._before.values()), rate="")
            busiest = sorted(self._before, key=lambda label: -self._before[label])
            queue_bars = {
                label: bars.add_task(label, total=self._before[label], rate="")
                for label in busiest[:MAX_QUEUE_BARS]
            }
            while True:
                stopping = self._stopped.wait(self._interval)
                if self._sample(started):
                    assert self.last is not None
                    bars.update(
                        total, completed=self.last.moved, rate=f"{self.last.rate:.0f} msg/s"
                    )
                    for label, task in queue_bars.items():
                        bars.update(task, completed=self.last.per_queue[label][0])
                if stopping:
                    return

    def _sample(self, started: float) -> bool:
        try:
            now = self._sampler()
        except RmqSparkError as exc:
            log.warning("progress: could not read source depths (%s)", exc)
            return False
        self.last = snapshot(self._before, now, time.monotonic() - started)
        return True
