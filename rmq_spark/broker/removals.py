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

When the depths alone settle it: a transfer whose source's exact depth fell by just
what its mover moved, with nothing else of it in the ledger (`proven_by_depth`), passes
or fails the same whatever its counters say (verification's `lost` only takes the
counters' excess where the depth drop differs from what was moved; with it equal they
change the witness's name, never the verdict). `settle` stops waiting for such a
transfer once the depths after the move are in, as it would at the deadline: a quiet
source no longer waits its statistics interval (up to 5 s on every job by default,
~17 s with 10,000 queues on a busy node) for counters that could not change its verdict.
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
from rmq_spark.model import MoveOutcome, QueueTransfer, TransferKey

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
# Readings take at most this share of the wait (`pause_after`): each is a listing of
# every vhost with a lagging source, which costs the broker about the time it takes
# (10,000 queues: ~2.6 CPU-s), while the depths after the move are being counted on the
# same node.
READ_SHARE = 0.2

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
    proven: Callable[[], Collection[TransferKey]] = frozenset,
    woken: threading.Event | None = None,
) -> Readings:
    """What consumers removed from each source during the run (`removed_during`).

    Reads again, for up to `deadline_seconds`, the transfers whose counters have not
    yet reached what the movers moved (`moved`): they lag by a statistics interval.
    One still below it then is unknown (None): lagging or reset, it proves nothing.
    Between readings it waits `pause_after` the last one (POLL_SECONDS, or longer
    after a slow listing), never past the deadline.
    With `deadline_seconds` 0 each is read once. `cancelled` set ends the waiting at
    once, as the deadline would (`settling`: the run failed meanwhile). `proven` names
    the transfers whose depths already settle their verdict (`proven_by_depth`; empty
    until the depths are in): a lagging one of those is unknown at once, as at the
    deadline, without waiting. `woken` set (the depths are in) cuts a wait between
    readings short; without it, `cancelled` is what the wait waits on.
    """
    end = monotonic() + deadline_seconds
    waiting = set(before)
    removed: Readings = {}
    by_depth: set[TransferKey] = set()

    def settle_by_depth() -> None:
        """The waiting transfers the depths settle: unknown now, not read again."""
        settled = waiting & set(proven())
        for key in settled:
            removed[key] = None  # short of what moved: proves nothing; the depths do
        by_depth.update(settled)
        waiting.difference_update(settled)

    while True:
        reading_started = monotonic()
        for key, after in read(waiting).items():
            removed[key] = removed_during(before.get(key), after)
        now = monotonic()
        pause = min(pause_after(now - reading_started), max(end - now, 0.0))
        waiting = {
            key
            for key in waiting
            if removed.get(key) is not None and removed[key] < moved.get(key, 0)  # type: ignore[operator]
        }
        settle_by_depth()
        if not waiting or monotonic() >= end:
            break
        if woken is not None:
            woken.wait(pause)
            woken.clear()
        elif cancelled is None:
            sleep(pause)
        else:
            cancelled.wait(pause)
        if cancelled is not None and cancelled.is_set():
            break
        # Woken by the depths: what they settle needs no further reading (a listing
        # of thousands of queues is seconds on the driver's critical path).
        settle_by_depth()
        if not waiting:
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
    if by_depth:
        log.info(
            "%d sources' consumer counters had not caught up with their movers; their "
            "exact depths fell by just what was moved, which settles them without waiting",
            len(by_depth),
        )
    return removed


def pause_after(reading_seconds: float) -> float:
    """Seconds to wait after a reading that took `reading_seconds`: POLL_SECONDS, or
    long enough that readings take at most READ_SHARE of the time (a listing of
    thousands of queues); `settle`'s deadline and its `woken` still cut it short."""
    return max(POLL_SECONDS, reading_seconds * (1 / READ_SHARE - 1))


def proven_by_depth(transfer: QueueTransfer, outcome: MoveOutcome, source_after: int) -> bool:
    """The source's exact depth fell by just what its mover moved, and the outcome is
    all the ledger holds of the transfer (one session from position 0, every position
    moved, nothing kept, recognised or fenced): its distinct moved messages are
    `outcome.messages`, so verification's verdict on it cannot depend on the consumer
    counters (`verify/summary_arrow.py`: they add to `lost` only where the depth drop
    and the moved messages differ)."""
    return (
        outcome.status == "moved"
        and outcome.sessions == 1
        and outcome.first_position == 0
        and outcome.next_position == outcome.messages
        and not (outcome.kept or outcome.recognised or outcome.fences)
        and transfer.messages - source_after == outcome.messages
    )


def depth_proven(
    transfers: Sequence[QueueTransfer],
    outcomes: Sequence[MoveOutcome],
    depths: Future[dict[QueueTransfer, tuple[int, int]]],
) -> Callable[[], frozenset[TransferKey]]:
    """`settle`'s `proven`: the transfers `proven_by_depth` names, once `depths` (the
    count after the move, on its own thread) is in; none before, or if it failed."""
    by_key = {outcome.key: outcome for outcome in outcomes}
    found: list[frozenset[TransferKey]] = []

    def proven() -> frozenset[TransferKey]:
        if found:
            return found[0]
        if not depths.done() or depths.exception() is not None:
            return frozenset()
        after = depths.result()
        found.append(
            frozenset(
                transfer.key
                for transfer in transfers
                if transfer.key in by_key
                and transfer in after
                and proven_by_depth(transfer, by_key[transfer.key], after[transfer][0])
            )
        )
        return found[0]

    return proven


def source_removals(
    config: JobConfig,
    before: Mapping[TransferKey, int | None],
    outcomes: Sequence[MoveOutcome],
    *,
    cancelled: threading.Event | None = None,
    proven: Callable[[], Collection[TransferKey]] = frozenset,
    woken: threading.Event | None = None,
) -> dict[TransferKey, int | None]:
    """What consumers removed from each fresh transfer's source during the run, once
    the counters caught up with what its mover moved or its depths settled it
    (`settle`)."""
    if not before:
        return {}
    moved = {outcome.key: outcome.messages for outcome in outcomes}
    started = time.monotonic()
    with management_clients(config) as clients:
        removed = settle(
            lambda keys: read_removed(clients, keys),
            before,
            moved,
            cancelled=cancelled,
            proven=proven,
            woken=woken,
        )
    log.info(
        "read the consumer counters of %d sources in %.1f s",
        len(removed),
        time.monotonic() - started,
    )
    return removed


@contextmanager
def settling(
    config: JobConfig,
    before: Mapping[TransferKey, int | None],
    outcomes: Sequence[MoveOutcome],
    transfers: Sequence[QueueTransfer],
    depths: Future[dict[QueueTransfer, tuple[int, int]]],
) -> Iterator[Future[dict[TransferKey, int | None]]]:
    """`source_removals` on a thread of its own, started as the movers end, so that its
    wait for lagging counters (up to `SETTLE_SECONDS`) runs beside the
    ledger's commit and the depth count rather than after them: on a 2-core box
    10,000 queues' counters lagged the full 30 s, of which the commit took 15
    (bench.many_queues). `depths`, the count after the move running meanwhile, ends
    the wait for the transfers it settles (`proven_by_depth`). Leaving the block early
    (the commit failed) ends the wait at once, so a failed run does not linger for the
    deadline."""
    cancelled, woken = threading.Event(), threading.Event()
    proven = depth_proven(transfers, outcomes, depths)
    depths.add_done_callback(lambda _depths: woken.set())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmq-spark-removals") as pool:
        settled = pool.submit(
            source_removals,
            config,
            before,
            outcomes,
            cancelled=cancelled,
            proven=proven,
            woken=woken,
        )
        try:
            yield settled
        finally:
            cancelled.set()
            woken.set()
