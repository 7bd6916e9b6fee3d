"""Live progress on the driver while the executors move messages.

The driver cannot see inside the mover tasks (and correctness never depends on
what it sees), so it samples what the brokers say: each source queue's exact ready
count (AMQP passive declare; for vhosts of many queues, the management API's paged
listing, `depth_sampler`), every `interval` seconds, or less often where a sample
costs the brokers much (`pause_between_samples`). Moved = depth at plan time
minus depth now. On a terminal that drives rich progress bars; elsewhere (YARN,
Kubernetes, Databricks logs) one structured log line per interval.

Under spark-submit the driver never sees the terminal: its output reaches it through
the JVM (a pipe). spark-submit.sh and `rmq-spark demo` therefore look at the terminal
themselves and say what they found in RMQ_SPARK_TERMINAL (1: draw bars, 0: log lines)
and COLUMNS (its width); `progress_console` turns that into the console to draw on.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from rmq_spark.broker.counts import queue_depths
from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import JobConfig
from rmq_spark.errors import RmqSparkError
from rmq_spark.model import QueueTransfer, TransferKey

log = logging.getLogger(__name__)

TERMINAL_INTERVAL_SECONDS = 1.0
LOG_INTERVAL_SECONDS = 10.0
# The depth samples take at most this share of the time: a sample that took long waits
# longer than the interval before the next (`pause_between_samples`). A management
# listing costs the broker about what it takes: 2,000 queues 0.51 CPU-s in 0.55 s on a
# 2-core box, so 10,000 queues sampled every 10 s took a fifth of its core, and every
# second on a terminal all of it, for the whole move.
SAMPLE_SHARE = 0.05
# ...but a sample at least this often, whatever it costs: a run that logs nothing for
# minutes looks hung (a busy broker answered one 10,000-queue listing in ~15 s).
MAX_PAUSE_SECONDS = 60.0
# Redraws per second: the elapsed/ETA columns move between samples, and through
# spark-submit every redraw crosses the JVM, so no more often than this.
BAR_REFRESH_PER_SECOND = 4
# Bars of their own for at most this many queues (the moving ones first); one more
# bar sums up the others.
MAX_QUEUE_BARS = 10
TOTAL = "total"
# Up to this many queues of a vhost are sampled exactly over AMQP; more, from one
# paged management API listing (`depth_sampler`).
AMQP_SAMPLE_MAX_QUEUES = 50
SAMPLE_COLUMNS = "name,messages_ready"
# Set by spark-submit.sh and `rmq-spark demo`: "1" the user's terminal is at the end of
# the driver's output pipe, "0" it is not; unset, the stream itself is asked (isatty).
TERMINAL_ENV = "RMQ_SPARK_TERMINAL"

DepthSampler = Callable[[], dict[TransferKey, int]]  # transfer -> its source's ready messages now
# Whatever names a queue's count: a TransferKey in the reporter (never a label, which
# "/" inside names makes ambiguous).
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Snapshot(Generic[K]):
    """Progress at one moment, derived from two depth samples."""

    moved: int
    total: int
    seconds: float
    per_queue: dict[K, tuple[int, int]]  # queue -> (moved, total)

    @property
    def rate(self) -> float:
        return self.moved / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        if self.rate <= 0:
            return None
        return max(self.total - self.moved, 0) / self.rate

    def log_line(self, bytes_per_message: float | None) -> str:
        eta = "?" if self.eta_seconds is None else f"{self.eta_seconds:.0f}s"
        done = sum(1 for moved, total in self.per_queue.values() if moved >= total)
        bytes_rate = (
            "unknown" if bytes_per_message is None else f"{self.rate * bytes_per_message:.0f}B/s"
        )
        return (
            f"progress moved={self.moved}/{self.total} queues_done={done}/{len(self.per_queue)} "
            f"rate={self.rate:.0f}msg/s bytes_rate={bytes_rate} eta={eta}"
        )


def human_bytes(count: float) -> str:
    """1536 -> '1.5 KiB' (binary units; the next unit from 1000 on, so at most 4 digits)."""
    value, unit = float(count), "B"
    for larger in ("KiB", "MiB", "GiB"):
        if value < 1000:
            break
        value, unit = value / 1024, larger
    return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"


def rate_text(rate: float, bytes_per_message: float | None) -> str:
    """What a bar shows after its count: messages and bytes per second."""
    if bytes_per_message is None:
        return f"{rate:,.0f} msg/s ? B/s"  # the management API gave no byte counts
    return f"{rate:,.0f} msg/s {human_bytes(rate * bytes_per_message)}/s"


class MovingRates:
    """Rates over the time each count was moving, from samples of the counts.

    A queue waiting for its turn (its partition busy with another queue) and a queue
    long finished would both show a falling average if divided by the run's time;
    here a count's rate is what it gained between the last sample before it first
    moved and the sample that saw its last gain.
    """

    def __init__(self, keys: Sequence[Hashable], started_at: float = 0.0) -> None:
        self._still_at = dict.fromkeys(keys, started_at)  # last seen not yet moving
        self._first: dict[Hashable, float] = {}
        self._last: dict[Hashable, tuple[int, float]] = {}  # key -> (count, when it got there)

    def observe(self, key: Hashable, count: int, at: float) -> None:
        if count <= 0:
            if key not in self._first:
                self._still_at[key] = at
            return
        self._first.setdefault(key, self._still_at[key])
        if key not in self._last or self._last[key][0] != count:
            self._last[key] = (count, at)

    def rate(self, key: Hashable) -> float:
        if key not in self._last:
            return 0.0
        count, at = self._last[key]
        seconds = at - self._first[key]
        return count / seconds if seconds > 0 else 0.0


def queues_to_show(per_queue: Mapping[K, tuple[int, int]], limit: int) -> list[K]:
    """The queues that get a bar of their own, at most `limit`: the moving ones first,
    then those waiting for their turn, then the finished ones; plan order within each."""

    def stage(queue: K) -> int:
        moved, total = per_queue[queue]
        if 0 < moved < total:
            return 0
        return 1 if moved < total else 2

    return sorted(per_queue, key=stage)[:limit]


def progress_console(environ: Mapping[str, str] | None = None) -> Console:
    """The console progress is shown on (stderr), as RMQ_SPARK_TERMINAL says.

    "1": a terminal is at the end of the pipe: ANSI output forced, COLUMNS wide.
    "0": never bars. Unset (or anything else): rich asks the stream itself, so a
    `rmq-spark transfer` run straight from a terminal gets bars too.
    """
    environ = os.environ if environ is None else environ
    flag = environ.get(TERMINAL_ENV, "").strip()
    if flag == "1":
        columns = environ.get("COLUMNS", "").strip()
        width = int(columns) if columns.isdigit() and int(columns) > 0 else None
        return Console(stderr=True, force_terminal=True, width=width)
    if flag == "0":
        return Console(stderr=True, force_terminal=False)
    return Console(stderr=True)


def snapshot(before: Mapping[K, int], now: Mapping[K, int], seconds: float) -> Snapshot[K]:
    """Moved per queue is the drop in its ready count, never below 0 or above its start.

    A producer publishing into a source during the run can make the drop look smaller;
    the bar then lags, and the ledger still counts exactly.
    """
    per_queue = {
        queue: (min(max(total - now.get(queue, total), 0), total), total)
        for queue, total in before.items()
    }
    return Snapshot(
        moved=sum(moved for moved, _ in per_queue.values()),
        total=sum(before.values()),
        seconds=seconds,
        per_queue=per_queue,
    )


def depth_sampler(config: JobConfig, transfers: Sequence[QueueTransfer]) -> DepthSampler:
    """Source depths per tick, at a cost that does not grow with each queue.

    A vhost of at most AMQP_SAMPLE_MAX_QUEUES moving queues is counted exactly (AMQP
    passive declares on one short connection); a larger one from one paged
    management API listing (`ManagementClient.queues`: a request per 500 queues,
    counts the broker samples every few seconds), where a passive declare per queue
    per tick would be a round trip per queue: 1,000 queues, 1,000 per tick.
    """
    by_vhost: dict[tuple[str, str], list[QueueTransfer]] = defaultdict(list)
    for transfer in transfers:
        by_vhost[(transfer.source_cluster, transfer.source_vhost)].append(transfer)
    # Its own clients: the sampler runs on the progress thread.
    clients = {
        name: ManagementClient(name, cluster, timeout=config.management_timeout_seconds)
        for name, cluster in config.clusters.items()
        if any(cluster_name == name for cluster_name, _ in by_vhost)
    }

    def sample() -> dict[TransferKey, int]:
        depths = {}
        for (cluster, vhost), group in by_vhost.items():
            if len(group) <= AMQP_SAMPLE_MAX_QUEUES:
                counted = queue_depths(
                    cluster, config.clusters[cluster], vhost, [t.source_queue for t in group]
                )
            else:
                rows = clients[cluster].queues(vhost, columns=SAMPLE_COLUMNS)
                # A queue without stats yet has no count: missing, so "not moved".
                counted = {
                    row["name"]: int(row["messages_ready"])
                    for row in rows
                    if row.get("messages_ready") is not None
                }
            depths.update(
                {t.key: counted[t.source_queue] for t in group if t.source_queue in counted}
            )
        return depths

    return sample


def pause_between_samples(interval: float, last_sample_seconds: float) -> float:
    """Seconds to wait before the next depth sample: `interval`, or longer when the last
    sample took so long that the samples would take more than SAMPLE_SHARE of the time,
    up to MAX_PAUSE_SECONDS (never less than `interval`)."""
    costly = min(last_sample_seconds * (1 / SAMPLE_SHARE - 1), MAX_PAUSE_SECONDS)
    return max(interval, costly)


class ProgressReporter:
    """A daemon thread showing progress until `stop`; use as a context manager."""

    def __init__(
        self,
        transfers: Sequence[QueueTransfer],
        sampler: DepthSampler,
        *,
        console: Console | None = None,
        interval: float | None = None,
        limits: str = "",
    ) -> None:
        # The rate limits in force (planning.rate_limits.limits_in_force), shown beside the rate.
        self._limits = limits
        self._before = {t.key: t.messages for t in transfers}
        self._names = {t.key: t.source_label for t in transfers}  # what a bar says
        # Bytes come from the management API's statistics, which may be missing:
        # then a rate in bytes is unknown, not 0 B/s.
        total_bytes = sum(t.message_bytes for t in transfers)
        self._bytes_per_message: float | None = (
            total_bytes / max(sum(self._before.values()), 1)
            if all(t.bytes_known for t in transfers)
            else None
        )
        self._queue_bytes_per_message: dict[TransferKey, float | None] = {
            t.key: t.average_message_bytes if t.bytes_known else None for t in transfers
        }
        self._sampler = sampler
        self._console = console or progress_console()
        # Bars need cursor movement, not only colour: a dumb terminal gets log lines.
        self._terminal = self._console.is_interactive
        self._interval = interval or (
            TERMINAL_INTERVAL_SECONDS if self._terminal else LOG_INTERVAL_SECONDS
        )
        self._last_sample_seconds = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rmq-spark-progress", daemon=True)
        self.last: Snapshot[TransferKey] | None = None

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        started = time.monotonic()
        if self._terminal:
            self._run_bars(started)  # its last sample is taken after the stop
            return
        while True:
            stopping = self._stopped.wait(self._pause())
            if self._sample(started):
                assert self.last is not None
                line = self.last.log_line(self._bytes_per_message)
                limits = f' limits="{self._limits}"' if self._limits else ""
                log.info("%s%s", line, limits)
            if stopping:
                return

    @property
    def shows_bars(self) -> bool:
        """True: rich bars on the console; False: one structured log line per interval."""
        return self._terminal

    def _run_bars(self, started: float) -> None:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
        )
        progress = Progress(
            *columns,
            console=self._console,
            transient=False,
            refresh_per_second=BAR_REFRESH_PER_SECOND,
        )
        queues = list(self._before)  # plan order
        rates = MovingRates([TOTAL, *queues])
        with progress as bars, _logging_above_bars():
            total = bars.add_task(TOTAL, total=sum(self._before.values()), rate="")
            queue_bars = {
                queue: bars.add_task(
                    self._names[queue], total=self._before[queue], rate="", visible=False
                )
                for queue in queues
            }
            rest = bars.add_task("", total=0, rate="", visible=False)
            self._show_queues(
                bars, queue_bars, rest, {queue: (0, n) for queue, n in self._before.items()}
            )
            bars.refresh()  # every bar at 0 at once, not at the next redraw
            while True:
                stopping = self._stopped.wait(self._pause())
                if self._sample(started):
                    now = self.last
                    assert now is not None
                    rates.observe(TOTAL, now.moved, now.seconds)
                    bars.update(
                        total,
                        completed=now.moved,
                        rate=rate_text(rates.rate(TOTAL), self._bytes_per_message)
                        + (f" (limits: {self._limits})" if self._limits else ""),
                    )
                    for queue, task in queue_bars.items():
                        moved = now.per_queue[queue][0]
                        rates.observe(queue, moved, now.seconds)
                        bars.update(
                            task,
                            completed=moved,
                            rate=rate_text(rates.rate(queue), self._queue_bytes_per_message[queue]),
                        )
                    self._show_queues(bars, queue_bars, rest, now.per_queue)
                if stopping:
                    return

    @staticmethod
    def _show_queues(
        bars: Progress,
        queue_bars: Mapping[TransferKey, TaskID],
        rest: TaskID,
        per_queue: Mapping[TransferKey, tuple[int, int]],
    ) -> None:
        """Bars for MAX_QUEUE_BARS queues (see queues_to_show); one bar sums up the rest."""
        shown = set(queues_to_show(per_queue, MAX_QUEUE_BARS))
        for queue, task in queue_bars.items():
            bars.update(task, visible=queue in shown)
        hidden = [per_queue[queue] for queue in queue_bars if queue not in shown]
        done = sum(1 for moved, total in hidden if moved >= total)
        bars.update(
            rest,
            visible=bool(hidden),
            description=f"{len(hidden)} more queues",
            completed=sum(moved for moved, _ in hidden),
            total=sum(total for _, total in hidden),
            rate=f"{done} done",
        )

    def _pause(self) -> float:
        return pause_between_samples(self._interval, self._last_sample_seconds)

    def _sample(self, started: float) -> bool:
        sampling = time.monotonic()
        try:
            now = self._sampler()
        except RmqSparkError as exc:
            log.warning("progress: could not read source depths (%s)", exc)
            return False
        finally:
            self._last_sample_seconds = time.monotonic() - sampling
        self.last = snapshot(self._before, now, time.monotonic() - started)
        return True


@contextmanager
def _logging_above_bars() -> Iterator[None]:
    """Log lines printed above the bars instead of through them.

    While the bars are live, rich swaps sys.stderr for a proxy that prints above them;
    logging's handlers still hold the real stream, so they are pointed at the proxy
    until the bars end.
    """
    proxy = sys.stderr
    real = getattr(proxy, "rich_proxied_file", None)
    swapped: list[logging.StreamHandler[Any]] = [
        handler
        for handler in logging.getLogger().handlers
        if real is not None
        and isinstance(handler, logging.StreamHandler)
        and handler.stream is real
    ]
    for handler in swapped:
        handler.setStream(proxy)
    try:
        yield
    finally:
        for handler in swapped:
            handler.setStream(real)
