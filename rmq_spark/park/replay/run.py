"""A replay: one parked run's rows back into queues, from the driver.

The stages: the parked run's rows (delta-rs and pyarrow, no Spark), its schema version
checked first (`refusals.py`); with `--where`, the keys Spark SQL selects
(`selected_keys`, the only Spark step); each row's destination and property bytes
(`targets.py`: a template, `source` or `origin`); the checks before anything is
published (rows exist, bodies kept, every row has a destination, every destination queue
exists and would take its rows: `refusals.py`); the ledger's confirmed replays of the
same parked run (`plan.py` says how a replay names what it did), whose rows are
skipped; then each source queue's rows in position order, each published and confirmed
(`broker/confirmed_publisher.py`), their `messages` rows appended every `LEDGER_BATCH`
confirms and at the end; the ledger read back (every selected row confirmed once); the
run's `runs` row.

**On the driver, not in a Spark task.** A replay is one confirm stream per queue in
position order; the rows are read where they are already (the driver's Arrow reader),
so no body is shipped to an executor and back. The price: the run's selected rows are
held in the driver's memory, and one blocking channel confirms one message at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow.compute as pc
import pyarrow.dataset as ds

from rmq_spark.broker.confirmed_publisher import ConfirmedPublisher
from rmq_spark.config import JobConfig, MoverConfig
from rmq_spark.errors import BrokerUnreachableError, ConfigError
from rmq_spark.ledger import store, tables
from rmq_spark.park.replay.journal import Journal, read_attempts
from rmq_spark.park.replay.plan import (
    ParkedKey,
    ReplayKey,
    check_replayable,
    ledger_replay_key,
    ledger_row,
    parked_key,
    plan_replay,
    possibly_twice,
    replay_counts,
    replay_key,
)
from rmq_spark.park.replay.refusals import (
    FactsReader,
    check_schema_versions,
    check_targets,
    demand_of,
    management_reader,
    read_targets,
)
from rmq_spark.park.replay.targets import Queue, Target, route_rows
from rmq_spark.park.table import read_parked_spark
from rmq_spark.selection.expression import Selection
from rmq_spark.transfer.decisions import REPLAYED
from rmq_spark.transfer.outbound import backoff_seconds
from rmq_spark.transfer.parked_rows import SCHEMA
from rmq_spark.transfer.parked_table import read_parked
from rmq_spark.transfer.rate_limit import bucket_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Confirmed publishes per ledger append (one Delta commit each). A driver that dies
# between a confirm and its append leaves up to this many rows that a re-run publishes
# again: the ledger never showed them confirmed.
LEDGER_BATCH = 500
WHERE = "--where"
_LEDGER_COLUMNS = [
    "run_id",
    "source_cluster",
    "source_vhost",
    "source_queue",
    "position",
    "destination_cluster",
    "destination_vhost",
    "destination_queue",
]


class Publisher(Protocol):
    def require_queue(self, queue: str) -> int: ...
    def publish(self, queue: str, property_bytes: bytes, body: bytes) -> None: ...
    def close(self) -> None: ...


# (cluster name, vhost) -> a publisher for that vhost (ConfirmedPublisher by default).
PublisherFactory = Callable[[str, str], Publisher]


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did (`command.py` prints it)."""

    run_id: str
    parked_run_id: str
    target: str
    selected: int
    skipped: int
    published: int
    bytes: int
    missing: int
    duplicates: int
    by_queue: tuple[tuple[Queue, int], ...]
    seconds: float
    # Earlier replays of these rows that recorded no end (killed), and the rows published
    # now that they may have published already (`plan.possibly_twice`): their keys only,
    # so no body is held in (or printed with) a result.
    interrupted: tuple[str, ...] = ()
    possibly_twice: tuple[ReplayKey, ...] = ()
    # Rows this replay sent again after a lost connection, confirmed then: the send that
    # the lost connection cut off may have reached the queue too.
    reconnected: tuple[ReplayKey, ...] = ()

    @property
    def verified(self) -> bool:
        """Every selected row is confirmed in its destination by a replay, once."""
        return self.missing == 0 and self.duplicates == 0


def compile_where(where: str | None) -> Selection | None:
    """`--where`, checked; a column the parked table does not hold is refused."""
    if where is None:
        return None
    selection = Selection.compile(where, where=WHERE)
    absent = sorted(set(selection.columns) - set(SCHEMA.names))
    if absent:
        raise ConfigError(
            f"{WHERE} {where!r}: column {absent[0]!r} is not in the parked table "
            "(body_text is not stored: CAST(body AS STRING) gives it)"
        )
    return selection


def selected_keys(
    spark: SparkSession, ledger_path: str, parked_run_id: str, selection: Selection
) -> set[ParkedKey]:
    """The (source, position) of each row of the run that Spark SQL selects."""
    from pyspark.sql import functions as F

    from rmq_spark.selection.spark import where

    frame = read_parked_spark(spark, ledger_path).where(F.col("run_id") == parked_run_id)
    picked = where(frame, selection).select(
        "source_cluster", "source_vhost", "source_queue", "position"
    )
    return {(r[0], r[1], r[2], int(r[3])) for r in picked.toLocalIterator()}


def parked_rows(ledger_path: str, parked_run_id: str) -> list[dict[str, Any]]:
    """The run's rows; one error naming the runs there when it has none, or naming its
    schema version when this rmq-spark reads another (read from that column first)."""
    versions = read_parked(ledger_path, parked_run_id, ["schema_version"]).column(0)
    if len(versions) == 0:
        runs = pc.unique(read_parked(ledger_path, None, ["run_id"]).column("run_id"))
        shown = ", ".join(sorted(runs.to_pylist())[:10]) or "none"
        raise ConfigError(
            f"--parked {parked_run_id!r}: no such parked run in the ledger's parked table "
            f"(its runs: {shown}); nothing was published"
        )
    check_schema_versions(parked_run_id, pc.unique(versions).to_pylist())
    rows: list[dict[str, Any]] = read_parked(ledger_path, parked_run_id).to_pylist()
    return rows


def finished_runs(ledger_path: str) -> set[str]:
    """The run ids with a `runs` row: runs that recorded their end."""
    runs = tables.read_arrow(ledger_path, "runs", columns=["run_id"]).column("run_id")
    return set(runs.to_pylist())


def _confirmed_rows(ledger_path: str, parked_run_id: str) -> list[dict[str, Any]]:
    dataset = tables.arrow_dataset(ledger_path, "messages")
    rows: list[dict[str, Any]] = dataset.to_table(
        columns=_LEDGER_COLUMNS,
        filter=(
            (ds.field("decision") == REPLAYED)
            & (ds.field("reason") == parked_run_id)
            & ds.field("confirmed_at").is_valid()
        ),
    ).to_pylist()
    return rows


def run_replay(
    config: JobConfig,
    *,
    parked_run_id: str,
    target: Target,
    run_id: str,
    keys: set[ParkedKey] | None = None,
    messages_per_second: float | None = None,
    publisher_for: PublisherFactory | None = None,
    facts_reader: FactsReader | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ReplayResult:
    """Replay the parked run's rows (those in `keys`, when given) to `target`.

    Raises RmqSparkError subclasses before anything is published when the run has no
    rows or is of another schema version, a selected row has no body or (`origin`) no
    x-death, or a destination queue does not exist or would refuse its rows
    (`refusals.py`); a broker that returns or nacks a message stops the replay (the
    rows confirmed before it are in the ledger), and so does a connection that stays
    lost through `mover.reconnect_attempts` reconnects (`_Publishers`). `sleep` waits
    out the brake and the reconnect backoff. `publisher_for` and `facts_reader`
    stand in for the brokers' AMQP and management API in tests.
    """
    started, started_at = clock(), datetime.now(UTC)
    ledger_path = store.use_ledger(config.ledger)
    tables.ensure_tables(config.ledger.path)
    rows = parked_rows(ledger_path, parked_run_id)
    if keys is not None:
        rows = [row for row in rows if parked_key(row) in keys]
    check_replayable(parked_run_id, rows)
    routed = route_rows(target, rows, parked_run_id=parked_run_id, clusters=config.clusters)
    earlier = _confirmed_rows(ledger_path, parked_run_id)
    plan = plan_replay(routed, set(map(ledger_replay_key, earlier)))
    interrupted, again = possibly_twice(
        plan.publish,
        [
            (attempt.run_id, attempt.uncertain)
            for attempt in read_attempts(ledger_path, parked_run_id, finished_runs(ledger_path))
        ],
    )
    journal = Journal(ledger_path, run_id, parked_run_id)
    factory = publisher_for or (
        lambda cluster, vhost: ConfirmedPublisher(cluster, config.clusters[cluster], vhost)
    )
    by_queue: dict[Queue, int] = {}
    published_bytes = 0
    # Rows sent again after a lost connection: the first send may have reached the queue.
    republished: list[Mapping[str, Any]] = []
    publishers = _Publishers(factory, config.mover, sleep)
    with publishers:
        demand = demand_of(plan.publish)
        # A named target is checked even when nothing is left to publish to it.
        if target.queue is not None:
            demand.setdefault(target.queue, (0, 0))
        depths: dict[Queue, int] = {}
        for cluster, vhost, queue in sorted(demand):
            depths[(cluster, vhost, queue)] = publishers.of(cluster, vhost).require_queue(queue)
        reader = facts_reader or management_reader(config)
        check_targets(target.label, demand, depths, read_targets(reader, demand))
        log.info(
            "replay %s of parked run %s to %s: %d to publish, %d already replayed",
            run_id,
            parked_run_id,
            target.label,
            len(plan.publish),
            plan.skipped,
        )
        for batch in _batches(plan.publish, LEDGER_BATCH):
            # Durable before any row of the batch is sent (journal.py).
            journal.intend([replay_key(row, row["_to"]) for row in batch])
            done: list[dict[str, Any]] = []
            read_at = datetime.now(UTC)
            in_flight: Mapping[str, Any] | None = None
            try:
                for row in _braked(batch, messages_per_second, clock, sleep):
                    in_flight = row
                    sends = publishers.publish(row)
                    if sends > 1:
                        republished.append(row)
                    by_queue[row["_to"]] = by_queue.get(row["_to"], 0) + 1
                    published_bytes += len(row["body"])
                    done.append(
                        ledger_row(
                            row,
                            run_id=run_id,
                            parked_run_id=parked_run_id,
                            publish_seq=sum(by_queue.values()),
                            publish_attempts=sends,
                            message_id=row.get("message_id"),
                            read_at=read_at,
                            confirmed_at=datetime.now(UTC),
                        )
                    )
                    in_flight = None
            except BrokerUnreachableError as exc:
                raise BrokerUnreachableError(
                    _stopped(exc, run_id, parked_run_id, sum(by_queue.values()), row)
                ) from exc
            finally:
                tables.append_rows(ledger_path, "messages", done)
                # After the append: were it to fail, the batch's intent names them all.
                if in_flight is not None:
                    journal.stopped(replay_key(in_flight, in_flight["_to"]))
    missing, duplicates = replay_counts(
        routed, map(ledger_replay_key, _confirmed_rows(ledger_path, parked_run_id))
    )
    result = ReplayResult(
        run_id=run_id,
        parked_run_id=parked_run_id,
        target=target.label,
        selected=len(rows),
        skipped=plan.skipped,
        published=sum(by_queue.values()),
        bytes=published_bytes,
        missing=missing,
        duplicates=duplicates,
        by_queue=tuple(sorted(by_queue.items())),
        seconds=clock() - started,
        interrupted=interrupted,
        possibly_twice=tuple(replay_key(row, row["_to"]) for row in again),
        reconnected=tuple(replay_key(row, row["_to"]) for row in republished),
    )
    _record(ledger_path, result, config, started_at, rows)
    log.info("replay %s: published %d, skipped %d", run_id, result.published, result.skipped)
    return result


def _stopped(
    exc: BrokerUnreachableError,
    run_id: str,
    parked_run_id: str,
    confirmed: int,
    row: Mapping[str, Any],
) -> str:
    """The one error of a replay whose connection was lost: where, what is recorded, and
    what to do (run it again; the row in flight may then be in its queue twice)."""
    source = ":".join(parked_key(row)[:3])
    return (
        f"replay {run_id} of parked run {parked_run_id} stopped: {exc}. The {confirmed} "
        "row(s) it confirmed are in the ledger; run the same replay again when the broker "
        "is back: it skips them and publishes the rest (the row in flight, position "
        f"{row['position']} of {source}, was not confirmed and is published again, so its "
        "queue may hold it twice)"
    )


class _Publishers:
    """The replay's publishers, one per cluster and vhost, opened on first use; a lost
    connection is opened again and the row in flight sent again, as a mover's session
    is (`mover.reconnect_attempts` times in a row at most, after `mover.backoff_seconds`
    doubling up to `mover.max_backoff_seconds`).

    The row whose confirm the lost connection cut off may be in its queue already: the
    caller records how many times it was sent (`publish_attempts`) and names it.
    """

    def __init__(
        self, factory: PublisherFactory, limits: MoverConfig, sleep: Callable[[float], None]
    ) -> None:
        self._factory, self._limits, self._sleep = factory, limits, sleep
        self._open: dict[tuple[str, str], Publisher] = {}

    def of(self, cluster: str, vhost: str) -> Publisher:
        publisher = self._open.get((cluster, vhost))
        if publisher is None:
            publisher = self._open[(cluster, vhost)] = self._factory(cluster, vhost)
        return publisher

    def publish(self, row: Mapping[str, Any]) -> int:
        """Send the row until it is confirmed; how many times it was sent. Once the
        reconnects are spent, raises the first loss's BrokerUnreachableError (what
        happened to the row in flight) with the last reconnect's failure added."""
        cluster, vhost, queue = row["_to"]
        sends = 0
        first: BrokerUnreachableError | None = None
        last: BrokerUnreachableError | None = None
        for attempt in range(self._limits.reconnect_attempts + 1):
            if attempt:
                delay = backoff_seconds(attempt, self._limits)
                log.warning(
                    "%s; reconnecting in %.1fs to send position %d of %s again",
                    last,
                    delay,
                    row["position"],
                    ":".join(parked_key(row)[:3]),
                )
                self._sleep(delay)
            try:
                publisher = self.of(cluster, vhost)
                sends += 1
                publisher.publish(queue, row["_sent"], row["body"])
                return sends
            except BrokerUnreachableError as exc:
                self._forget(cluster, vhost)
                first, last = first or exc, exc
        assert first is not None
        assert last is not None
        if attempt == 0:
            raise first
        raise BrokerUnreachableError(
            f"{first}; {attempt} reconnect(s) failed, the last: {last}"
        ) from first

    def _forget(self, cluster: str, vhost: str) -> None:
        publisher = self._open.pop((cluster, vhost), None)
        if publisher is not None:
            publisher.close()

    def __enter__(self) -> _Publishers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for cluster, vhost in list(self._open):
            self._forget(cluster, vhost)


def _batches(rows: Sequence[Mapping[str, Any]], size: int) -> Iterator[Sequence[Mapping[str, Any]]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def _braked(
    rows: Iterable[Mapping[str, Any]],
    rate: float | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Iterator[Mapping[str, Any]]:
    """The rows, at most `rate` a second (the mover's token bucket), when asked."""
    bucket = bucket_for(rate, now=clock(), minimum_burst=1.0)
    for row in rows:
        if bucket is not None:
            while not bucket.fits(clock()):
                sleep(bucket.seconds_until_fits(clock()))
            bucket.spend(1.0, clock())
        yield row


def _record(
    ledger_path: str,
    result: ReplayResult,
    config: JobConfig,
    started_at: datetime,
    rows: Sequence[Mapping[str, Any]],
) -> None:
    """The replay's `runs` row: messages are this run's publishes."""
    tables.append_rows(
        ledger_path,
        "runs",
        [
            {
                "run_id": result.run_id,
                "started_at": started_at,
                "finished_at": datetime.now(UTC),
                "config_digest": config.digest(),
                "spark_app_id": "",
                "queues": len({parked_key(row)[:3] for row in rows}),
                "messages": result.published,
                "bytes": result.bytes,
                "lost": result.missing,
                "duplicates": result.duplicates,
                "unexpected": 0,
                "verified": result.verified,
                "seconds": result.seconds,
                "verification_path": "",
                "rabbitmq_versions": None,
            }
        ],
    )
