"""The brake for live destinations on real brokers: the rates the ledger's confirm
times show, over sliding windows, never pass the limits by more than 5% once running
(and the median window falls no more than 20% under them); and the depth bound keeps
a destination nobody consumes at its bound until it is drained.

Each test moves a backlog through the whole job (Spark, Delta) with a limit well
below what the brokers can take here, then reads every message's confirm time
from the committed ledger. The first second is left out (the movers start one after
the other, and the first batch spends the brake's small burst); every window of
`WINDOW_SECONDS` that starts after it and ends by the last confirm is counted.
"""

from __future__ import annotations

import statistics
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from contextlib import closing
from datetime import datetime
from pathlib import Path

from pyspark.sql import SparkSession

from rmq_spark.config import Limits, load_config
from rmq_spark.ledger import tables
from rmq_spark.pipeline import run_transfer
from rmq_spark.transfer.executor import ExecutorSettings
from tests.support.brokers import (
    Brokers,
    MoverThread,
    declare,
    depth,
    fresh_vhost,
    queue_depth,
    seed,
    write_config,
)

WINDOW_SECONDS = 3.0
STEP_SECONDS = 0.1
# Over the limit: what the brake promises it never does, beyond the timer's jitter.
OVER = 0.05
# Under it: a loaded machine's pauses are not made up afterwards with a burst (that would
# pass the limit), so a busy CI machine runs below it: 521-586/s for 600 in one
# rehearsal, beside the suite's other worker and the fast lane; 598-602 when quiet. One
# rehearsal on a slower box stalled ~2 s once (one window at 163/s, the others 558-576):
# so the median window is held to this, not every window; a brake that held the rate
# low would still fail it.
UNDER = 0.20


def confirm_seconds(ledger: Path, run_id: str, queue: str | None = None) -> list[float]:
    """Every moved message's confirm time, in seconds after the run's first confirm."""
    rows = tables.read_arrow(str(ledger), "messages", run_id=run_id).to_pylist()
    times: list[datetime] = sorted(
        row["confirmed_at"]
        for row in rows
        if row["confirmed_at"] is not None and queue in (None, row["source_queue"])
    )
    return [(at - times[0]).total_seconds() for at in times]


def window_rates(times: list[float], *, start: float) -> list[float]:
    """Messages per second in every WINDOW_SECONDS window from `start` (and every
    STEP_SECONDS after it) that ends by the last confirm."""
    rates = []
    begin = start
    while begin + WINDOW_SECONDS <= times[-1]:
        count = bisect_left(times, begin + WINDOW_SECONDS) - bisect_left(times, begin)
        rates.append(count / WINDOW_SECONDS)
        begin += STEP_SECONDS
    return rates


def assert_held(rates: list[float], limit: float) -> None:
    assert len(rates) >= 10, f"too few windows to judge: {rates}"
    worst = max(abs(rate - limit) / limit for rate in rates)
    # Shown with -s: the figures docs/rate-limits.md quotes.
    print(
        f"limit {limit:g}/s: {len(rates)} windows of {WINDOW_SECONDS:g} s, "
        f"{min(rates):.1f} to {max(rates):.1f}/s, worst {worst:.2%} off"
    )
    found = f"limit {limit}/s: windows from {min(rates):.1f} to {max(rates):.1f}/s"
    assert max(rates) <= limit * (1 + OVER), f"{found}: over by more than {OVER:.0%}"
    median = statistics.median(rates)
    assert median >= limit * (1 - UNDER), (
        f"{found}, median {median:.1f}/s: under by more than {UNDER:.0%}"
    )


def test_a_route_limit_holds_the_confirm_rate_in_every_window(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_vhost(brokers, "rate-route")
    seed(brokers.dr, vhost, "orders", 3000)
    path = write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "l")
    config = load_config(path)
    # The route's 500/s is smaller than the job's 2000/s: the route's wins.
    route = config.routes[0].model_copy(update={"limits": Limits(messages_per_second=500.0)})
    config = config.model_copy(
        update={"routes": [route], "limits": Limits(messages_per_second=2000.0)}
    )

    result = run_transfer(spark, config, run_id="rate-route")

    assert result.verification.verified, result.verification
    (outcome,) = result.outcomes
    assert outcome.messages == 3000
    assert outcome.rate_limits == Limits(messages_per_second=500.0)
    assert outcome.rate_held_seconds > 3.0  # held back most of the ~6 s it ran
    times = confirm_seconds(tmp_path / "l", "rate-route")
    assert len(times) == 3000
    assert_held(window_rates(times, start=1.0), 500.0)


def test_the_job_limit_is_shared_by_the_queues_moving_at_once(
    brokers: Brokers, password_env: str, tmp_path: Path, spark: SparkSession
) -> None:
    vhost = fresh_vhost(brokers, "rate-job")
    for queue in ("a", "b"):
        seed(brokers.dr, vhost, queue, 1800)
    path = write_config(
        tmp_path / "job.yaml",
        brokers,
        vhosts=[vhost],
        ledger=tmp_path / "l",
        limits={"messages_per_second": 600},
        max_active=2,
        mover={"queues_per_task": 2},
    )

    result = run_transfer(spark, load_config(path), run_id="rate-job")

    assert result.verification.verified, result.verification
    assert sorted(o.messages for o in result.outcomes) == [1800, 1800]
    assert {o.rate_limits for o in result.outcomes} == {Limits(messages_per_second=300.0)}
    # Both queues move on one task's loop, each at its half: 600/s together.
    assert_held(window_rates(confirm_seconds(tmp_path / "l", "rate-job"), start=1.0), 600.0)
    for queue in ("a", "b"):
        times = confirm_seconds(tmp_path / "l", "rate-job", queue)
        assert_held(window_rates(times, start=1.0), 300.0)


BOUND = 400
WINDOW = 100
HELD_OBSERVED_SECONDS = 2.5


class DepthWatch(threading.Thread):
    """Samples the destination queue's depth (passive declares) until stopped."""

    def __init__(self, brokers: Brokers, vhost: str, queue: str) -> None:
        super().__init__(name="depth-watch", daemon=True)
        self._connection = brokers.main.connect(vhost)
        self._queue = queue
        self._stop_event = threading.Event()
        self.samples: list[int] = []

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                self.samples.append(queue_depth(self._connection, self._queue))
        finally:
            self._connection.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    """Poll `condition` until it holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def take_without_returning(brokers: Brokers, vhost: str, queue: str) -> int:
    """Take what the queue holds, one basic.get (auto-ack) at a time; how many.

    Not `take_all`: its consumer is sent up to a window of messages beyond the count
    while the mover publishes, and its cancel requeues them, so the depth jumps by
    messages the mover saw consumed: a consumer that hands messages back, which the
    bound does not promise to cover (seen: 626 against a bound of 400).
    """
    taken = 0
    with closing(brokers.main.connect(vhost)) as connection:
        channel = connection.channel()
        while channel.basic_get(queue, auto_ack=True)[0] is not None:
            taken += 1
    return taken


def test_the_depth_bound_holds_a_destination_nobody_consumes_and_resumes_when_drained(
    brokers: Brokers, password_env: str, tmp_path: Path
) -> None:
    vhost = fresh_vhost(brokers, "depth-bound")
    seed(brokers.dr, vhost, "orders", 2000)
    declare(brokers.main, vhost, "orders")  # no consumer
    config = load_config(
        write_config(tmp_path / "job.yaml", brokers, vhosts=[vhost], ledger=tmp_path / "l")
    )
    tables.ensure_tables(config.ledger.path)
    settings = ExecutorSettings(
        run_id="depth-1",
        ledger_path=config.ledger.path,
        clusters=dict(config.clusters),
        window_messages=WINDOW,
        window_bytes=1 << 26,
        rate_limits={"test-route": Limits(destination_max_depth=BOUND)},
    )
    row = {
        "route": "test-route",
        "source_cluster": "dr",
        "source_vhost": vhost,
        "source_queue": "orders",
        "destination_cluster": "main",
        "destination_vhost": vhost,
        "destination_queue": "orders",
        "messages": 2000,
        "message_bytes": 2000 * 1024,
    }
    watch = DepthWatch(brokers, vhost, "orders")
    watch.start()
    mover = MoverThread(row, settings)
    mover.start()
    try:
        wait_until(
            lambda: depth(brokers.main, vhost, "orders") >= BOUND - WINDOW,
            timeout=60,
            what="the destination to fill up to its bound",
        )
        # An observation period, not a wait for a condition: the bound must hold through
        # it while the mover asks the depth again (once a second, POLL_SECONDS).
        time.sleep(HELD_OBSERVED_SECONDS)
        left = depth(brokers.dr, vhost, "orders")
        assert left >= 2000 - BOUND - WINDOW, (left, max(watch.samples))
        assert mover.is_alive()

        # A consumer drains the destination: the mover goes on and finishes.
        taken = take_without_returning(brokers, vhost, "orders")
        while mover.is_alive() or depth(brokers.main, vhost, "orders"):
            taken += take_without_returning(brokers, vhost, "orders")
            mover.join(timeout=0.2)
    finally:
        mover.join(timeout=120)
        watch.stop()

    assert mover.error is None, mover.error
    assert mover.outcome is not None
    assert mover.outcome.messages == 2000
    assert taken == 2000
    assert mover.outcome.depth_held_seconds > HELD_OBSERVED_SECONDS
    assert watch.samples, "the depth was never sampled"
    peak = max(watch.samples)
    print(f"depth bound {BOUND}, window {WINDOW}: peak sampled depth {peak}")
    assert BOUND - WINDOW <= peak <= BOUND + WINDOW, peak
