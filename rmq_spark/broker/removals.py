"""What consumers removed from a source queue during a run, by the broker's own counters:
the witness that a live source (other publishers still sending to it) lost nothing.

A depth drop is what left a queue minus what arrived meanwhile, so on a source that
keeps receiving it cannot say what left. The management API's per-queue
`message_stats` count, cumulatively, the deliveries consumers acked (`ack`) and those
they took without acks (`deliver_no_ack`, `get_no_ack`): what consumers removed.
Read when the movers start and after they end, the difference is what every consumer
removed during the run; the movers' share is what they moved (each moved message is
acked once, a duplicate's redelivery included), so anything above it was taken by
another consumer. Publishers do not touch these counters.

What they are: cumulative counts that each channel reports to the management database
on its statistics timer (`collect_statistics_interval`, 5 s by default), so a reading
lags by up to that much, and more on a busy node. (A listing asked with a sample range
skips the management plugin's listing cache but reports the counters as of the last
5 s sample, which on 3.10.8 and 4.3.6 lagged more than the plain listing did.)
On 3.10.8 and 4.3.6 (tests/integration/test_live_source.py, 1 s interval) they
usually caught up with exactly what the movers moved, the movers' closed channels
included, and counted another consumer's acks; 4.0.5 was not tested. Not always: on
nodes that had served the rest of a full test run on two busy cores, some or all
sources' counters stayed short of the moved acks for good (from 39 to about 2,300 of
some 9,000 moved; once all of them), so those transfers end unproven (None), never
failed. Why is not known; another consumer is caught only when it took more than such a
shortfall.
Before the run the movers have not consumed yet, so only another consumer could move
the counter; after it, `settle` reads again until the counters have caught up with what
the movers acked. The reading before can lag too. On an idle 3.10.8 node
(1 s interval) a queue's row showed no `message_stats` for 3.5 s after 100 publishes,
and its acks appeared 3.5 s after the consumer closed. In CI a run moved 100 messages
seeded a moment before, read no statistics at its end (None: `settle` waits only for
counters it can see), and the next run on that queue, a few seconds later, read none
at its start either (0), then 100 more removed than it moved. Verification leaves such
an excess unproven, not lost, when the exact depths say only what was moved left
(verify/columns.py). They restart from 0 when the queue's node restarts, and are absent
where the broker keeps no message statistics (the metrics collector disabled): then
the run's witness is unknown (None) and verification falls back to the depths.

What they do not see: messages that left without a consumer (expired by a TTL,
dropped by a length limit, purged). The depth check still counts those as lost when
they outnumber what arrived.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from rmq_spark.broker.management import ManagementClient, management_clients
from rmq_spark.config import JobConfig
from rmq_spark.errors import RmqSparkError
from rmq_spark.model import MoveOutcome, TransferKey

log = logging.getLogger(__name__)

# The message_stats counters of deliveries that left the queue through a consumer.
REMOVAL_COUNTERS = ("ack", "deliver_no_ack", "get_no_ack")
# How long `settle` waits for the counters to catch up. On an idle node they caught up
# within 2-5 s of the movers' last ack (3.10.8 and 4.3.6, a 1 s statistics interval); on
# a node sharing two busy cores with the rest of the test suite (3.10.8, CI) two of four
# were still 650-1,350 acks behind after 12 s. Only a transfer still below what it moved
# waits, so a generous bound costs nothing on a run whose counters are on time.
SETTLE_SECONDS = 30.0
POLL_SECONDS = 0.5

Readings = dict[TransferKey, int | None]


def removed_of(row: Mapping[str, Any] | None) -> int | None:
    """What consumers removed from the queue of a management API row; None when the
    row has no message statistics (none collected, or none yet)."""
    stats = (row or {}).get("message_stats")
    if not isinstance(stats, Mapping):
        return None
    return sum(int(stats.get(name) or 0) for name in REMOVAL_COUNTERS)


def read_removed(clients: Mapping[str, ManagementClient], keys: Iterable[TransferKey]) -> Readings:
    """The counters of each transfer's source queue now (one listing per vhost)."""
    by_vhost: dict[tuple[str, str], list[TransferKey]] = defaultdict(list)
    for key in keys:
        by_vhost[(key.source_cluster, key.source_vhost)].append(key)
    readings: Readings = {}
    for (cluster, vhost), wanted in by_vhost.items():
        try:
            rows = clients[cluster].queues(vhost, columns="name,message_stats")
        except RmqSparkError as exc:
            log.warning("cluster %s vhost %r: no consumer counters (%s)", cluster, vhost, exc)
            rows = []
        by_name = {row.get("name"): row for row in rows}
        for key in wanted:
            readings[key] = removed_of(by_name.get(key.source_queue))
    return readings


def removed_during(before: int | None, after: int | None) -> int | None:
    """What consumers removed between two readings; None when it cannot be told.

    A queue never consumed from has no statistics yet: before the run that is 0. None
    after the run (the movers consumed) means the broker keeps none; a fall means they
    were reset (the node restarted)."""
    if after is None:
        return None
    start = before or 0
    return after - start if after >= start else None


def settle(
    read: Callable[[Collection[TransferKey]], Readings],
    before: Mapping[TransferKey, int | None],
    moved: Mapping[TransferKey, int],
    *,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    deadline_seconds: float = SETTLE_SECONDS,
    cancelled: threading.Event | None = None,
) -> Readings:
    """What consumers removed from each source during the run (`removed_during`).

    Reads again, for up to `deadline_seconds`, the transfers whose counters have not
    yet reached what the movers moved (`moved`): they lag by a statistics interval.
    One still below it then is unknown (None): lagging or reset, it proves nothing.
    With `deadline_seconds` 0 each is read once. `cancelled` set ends the waiting at
    once, as the deadline would (`settling`: the run failed meanwhile).
    """
    end = monotonic() + deadline_seconds
    waiting = set(before)
    removed: Readings = {}
    while True:
        for key, after in read(waiting).items():
            removed[key] = removed_during(before.get(key), after)
        waiting = {
            key
            for key in waiting
            if removed.get(key) is not None and removed[key] < moved.get(key, 0)  # type: ignore[operator]
        }
        if not waiting or monotonic() >= end:
            break
        if cancelled is None:
            sleep(POLL_SECONDS)
        elif cancelled.wait(POLL_SECONDS):
            break
    for key in waiting:
        if deadline_seconds <= 0 or (cancelled is not None and cancelled.is_set()):
            removed[key] = None  # read once by request, or the run failed: no warning
            continue
        log.warning(
            "%s: the source's consumer counters (%s) did not reach the %d moved within %.0fs; "
            "what left it is proven by its depth only",
            key.label(),
            removed[key],
            moved.get(key, 0),
            deadline_seconds,
        )
        removed[key] = None
    return removed


def source_removals(
    config: JobConfig,
    before: Mapping[TransferKey, int | None],
    outcomes: Sequence[MoveOutcome],
    cancelled: threading.Event | None = None,
) -> dict[TransferKey, int | None]:
    """What consumers removed from each fresh transfer's source during the run, once
    the counters caught up with what its mover moved (`settle`)."""
    if not before:
        return {}
    moved = {outcome.key: outcome.messages for outcome in outcomes}
    with management_clients(config) as clients:
        return settle(lambda keys: read_removed(clients, keys), before, moved, cancelled=cancelled)


@contextmanager
def settling(
    config: JobConfig, before: Mapping[TransferKey, int | None], outcomes: Sequence[MoveOutcome]
) -> Iterator[Future[dict[TransferKey, int | None]]]:
    """`source_removals` on a thread of its own, started as the movers end, so that its
    wait for lagging counters (up to `SETTLE_SECONDS`) runs beside the
    ledger's commit and the depth count rather than after them: on a 2-core box
    10,000 queues' counters lagged the full 30 s, of which the commit took 15
    (bench.many_queues). Leaving the block early (the commit failed) ends the wait at
    once, so a failed run does not linger for the deadline."""
    cancelled = threading.Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmq-spark-removals") as pool:
        settled = pool.submit(source_removals, config, before, outcomes, cancelled)
        try:
            yield settled
        finally:
            cancelled.set()
