"""The movers' Spark task: run the mover for each plan row of a partition.

Thin on purpose: it builds the mover's collaborators from the settings and the
task's identity, and returns one MoveOutcome row per queue. It runs as a
`partition_tasks.run_tasks` task (an RDD task on classic Spark, `mapInArrow` over
Spark Connect); the settings and the plan's groups travel in its closure (no
broadcast: Spark Connect has none). A lost connection raises, so Spark retries the
task; the retried attempt numbers its deliveries after the highest ledger position
already durable for the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa

from rmq_spark.broker.colocation import preferred_uri
from rmq_spark.broker.connection import connection_parameters
from rmq_spark.config import PARKED, ClusterConfig, Limits, MoverConfig
from rmq_spark.errors import LedgerError
from rmq_spark.ledger import store
from rmq_spark.ledger.fences import record_fence
from rmq_spark.ledger.resume import EarlierFiles
from rmq_spark.ledger.store import StoreOptions
from rmq_spark.ledger.writer import IntentLog, MessageLedgerWriter
from rmq_spark.model import MoveOutcome, TransferKey, queues_at_once
from rmq_spark.transfer.amqp091.links import Amqp091Connector, Endpoint, event_loop
from rmq_spark.transfer.amqp091.pool import ConnectionPool
from rmq_spark.transfer.byte_window import first_estimate
from rmq_spark.transfer.decisions import BatchDecider, DeciderFactory, SelectDecider
from rmq_spark.transfer.lanes import Lanes, run_movers
from rmq_spark.transfer.mover import QueueMover
from rmq_spark.transfer.outcomes import outcome_row
from rmq_spark.transfer.ports import Connector
from rmq_spark.transfer.recognition import Recognition, earlier_rows, recognition_for
from rmq_spark.transfer.return_guard import ReturnGuard, attempt_number
from rmq_spark.transfer.selective import fence_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExecutorSettings:
    """What every mover task needs. In the task's closure, so passwords stay out of
    Spark's conf.

    Cluster passwords are pydantic SecretStr: they print as '**********'.
    """

    run_id: str
    ledger_path: str
    clusters: dict[str, ClusterConfig]
    window_messages: int  # the upper bound; the window starts at window_start_messages
    window_bytes: int
    mover: MoverConfig = field(default_factory=MoverConfig)
    # The job's cap on queues moving at once; a task moves up to
    # min(mover.queues_per_task, max_active) of its queues at once.
    max_active: int = 1
    # The window a transfer starts with (`WindowConfig.first_messages`); None: fixed.
    window_start_messages: int | None = None
    # cluster -> node name -> AMQP URI (rmq_spark.broker.colocation); empty: cluster URIs only.
    node_uris: dict[str, dict[str, str]] = field(default_factory=dict)
    # How many times Spark may run a task: each attempt may return what it holds to a
    # quorum source, which counts against the source's delivery limit.
    task_attempts: int = 1
    # route -> the rate limits each of its transfers keeps to (resolved by the driver,
    # `planning.rate_limits.transfer_limits`); a route not named here is unlimited.
    rate_limits: dict[str, Limits] = field(default_factory=dict)
    # An object-store ledger's options (credentials included; its repr masks them).
    ledger_store: StoreOptions | None = None
    # route -> its `select` expression, checked by the driver (planning/selections.py);
    # a route not named here moves every message.
    selections: dict[str, str] = field(default_factory=dict)
    # route -> what builds its transfers' decider on the executor (a redrive's
    # `redrive.decider.RedriveSpec`, given by the layer above); before `selections`.
    deciders: dict[str, DeciderFactory] = field(default_factory=dict)
    # A park (`rmq-spark park`): transfers whose destination cluster is `PARKED` write
    # the parked table instead of publishing.
    park: ParkSettings | None = None


@dataclass(frozen=True)
class ParkSettings:
    """What a park's movers need beyond a move's (config `park`)."""

    exclude_body: bool = False


def move_partition(
    indices: Sequence[int],
    *,
    groups: Sequence[Sequence[dict[str, object]]],
    settings: ExecutorSettings,
) -> list[dict[str, Any]]:
    """Spark task (`partition_tasks.run_tasks`): move the queues of plan group(s)
    `indices` (the task's partition), several at once; OUTCOME_SCHEMA rows."""
    rows = [row for index in indices for row in groups[index]]
    return [outcome_row(outcome) for outcome in move_queues(rows, settings, task_attempt())]


def move_queues(
    rows: Sequence[dict[str, object]], settings: ExecutorSettings, attempt: str
) -> list[MoveOutcome]:
    """Move the plan rows' queues on one I/O loop, up to queues_per_task at once.

    Usable without Spark (tests, benchmarks). Each mover is built when its turn
    comes, so it numbers its deliveries after what earlier attempts made durable.
    """
    at_once = queues_at_once(settings.max_active, settings.mover.queues_per_task)
    if settings.ledger_store is not None:
        store.configure(settings.ledger_path, settings.ledger_store)
    # The task's transfers of one vhost share a connection per side (a channel each).
    connections = ConnectionPool()
    # Earlier attempts' files, listed once for the task (not once per queue).
    earlier = EarlierFiles(settings.ledger_path, settings.run_id)
    endpoints = Endpoints(settings)
    return run_movers(
        [
            partial(
                queue_mover,
                row,
                settings,
                attempt,
                connections=connections,
                earlier=earlier,
                endpoints=endpoints,
            )
            for row in rows
        ],
        ioloop=event_loop(),
        concurrent=at_once,
        connections=connections,
        lanes=Lanes.for_ledger(store.is_object_store(settings.ledger_path)),
    )


def move_queue(row: dict[str, object], settings: ExecutorSettings, attempt: str) -> MoveOutcome:
    """Move one plan row's queue; usable without Spark (tests, benchmarks)."""
    return move_queues([row], settings, attempt)[0]


def queue_mover(
    row: dict[str, object],
    settings: ExecutorSettings,
    attempt: str,
    *,
    connections: ConnectionPool | None = None,
    earlier: EarlierFiles | None = None,
    endpoints: Endpoints | None = None,
) -> QueueMover:
    """The mover for one plan row, with its ledger writer and intent log; its links
    open channels on `connections` (the task's), or on connections of its own, and it
    numbers on after the files `earlier` lists (listed now when not given). `endpoints`:
    the task's connection parameters (made now when not given)."""
    key = TransferKey(
        source_cluster=str(row["source_cluster"]),
        source_vhost=str(row["source_vhost"]),
        source_queue=str(row["source_queue"]),
        destination_cluster=str(row["destination_cluster"]),
        destination_vhost=str(row["destination_vhost"]),
        destination_queue=str(row["destination_queue"]),
    )
    endpoints = endpoints or Endpoints(settings)
    source = endpoints.of(
        key.source_cluster,
        key.source_vhost,
        key.source_queue,
        node=str(row.get("source_node") or ""),
        role="consumer",
    )
    connector: Connector
    if settings.park is not None and key.destination_cluster == PARKED:
        # Imported here, so a move's task never loads the selection language's columns.
        from rmq_spark.transfer.parked import ParkedConnector
        from rmq_spark.transfer.parked_rows import ParkedRowsWriter

        writer = ParkedRowsWriter(
            settings.ledger_path,
            settings.run_id,
            key,
            attempt,
            exclude_body=settings.park.exclude_body,
        )
        connector = ParkedConnector(source, writer, connections)
    else:
        destination = endpoints.of(
            key.destination_cluster,
            key.destination_vhost,
            key.destination_queue,
            node=str(row.get("destination_node") or ""),
            role="publisher",
        )
        connector = Amqp091Connector(source, destination, connections)
    limit = row.get("source_delivery_limit")
    guard = ReturnGuard(
        limit if isinstance(limit, int) else None,
        later_attempts=max(0, settings.task_attempts - 1 - attempt_number(attempt)),
        past_limit=str(row.get("source_past_limit") or "dropped"),
    )
    earlier = earlier or EarlierFiles(settings.ledger_path, settings.run_id)
    fence = fence_id(settings.run_id, key)
    return QueueMover(
        key,
        connector,
        MessageLedgerWriter(settings.ledger_path, settings.run_id, key, attempt),
        # The mover closes it: kept on disk if the mover dies, so a retry names
        # every copy that may have arrived.
        IntentLog(settings.ledger_path, settings.run_id, key, attempt),
        window_messages=settings.window_messages,
        window_bytes=settings.window_bytes,
        start_messages=settings.window_start_messages,
        # The first prefetch: the whole queue where the plan's sample says it fits.
        largest_message=first_estimate(row.get("messages"), row.get("message_bytes")),
        first_position=earlier.next_position(key),
        limits=settings.mover,
        delivery_guard=guard,
        rate_limits=settings.rate_limits.get(str(row.get("route") or "")),
        decider=route_decider(settings, str(row.get("route") or "")),
        fence_id=fence,
        examine_limit=examine_limit(row, settings.window_messages),
        fence_recorded=earlier.fence_recorded(key),
        record_fence=partial(record_fence, settings.ledger_path, settings.run_id, key, fence),
        recognise=(
            partial(read_recognition, settings, key, earlier)
            if settings.mover.recognise_redeliveries and key.destination_cluster != PARKED
            else None
        ),
    )


# What recognition reads of the earlier rows and intents (`recognition.earlier_rows`).
RECOGNITION_COLUMNS = (
    "position",
    "body_sha256",
    "properties_sha256",
    "confirmed_at",
    "task_attempt",
    "session",
    "publish_attempts",
    "decision",
)


def read_recognition(
    settings: ExecutorSettings, key: TransferKey, earlier: EarlierFiles, relist: bool
) -> Recognition | None:
    """What a resumed session may recognise (`recognition.py`), from the transfer's rows
    and intents in the ledger: those `earlier` lists, or (`relist`, after a session of
    this task was lost) those there now. Unreadable, they prove nothing: every
    redelivery is moved again, as a named duplicate."""
    files = EarlierFiles(settings.ledger_path, settings.run_id) if relist else earlier
    if not files.has_intents(key):
        return None  # every earlier attempt finished: nothing of it comes back
    try:
        table = files.transfer_rows(key, RECOGNITION_COLUMNS)
    except (OSError, LedgerError, pa.ArrowInvalid, KeyError) as exc:
        log.warning(
            "%s: the earlier rows could not be read (%s): redeliveries are moved again",
            key.label(),
            exc,
        )
        return None
    return recognition_for(earlier_rows(table.to_pydict()))


def examine_limit(row: dict[str, object], window_messages: int) -> int | None:
    """A selective move's safety net (`selective.FenceState.examine_limit`): twice the
    planned depth and two windows; None when the plan row has no depth."""
    depth = row.get("messages")
    return 2 * depth + 2 * window_messages if isinstance(depth, int) else None


def route_decider(settings: ExecutorSettings, route: str) -> BatchDecider | None:
    """The route's decider: its factory's (a redrive), or its `select` as a
    `SelectDecider`; None (a plain move) without either.

    Imported here, so a plain move's task never loads sqlglot and DuckDB.
    """
    factory = settings.deciders.get(route)
    if factory is not None:
        return factory()
    expression = settings.selections.get(route)
    if expression is None:
        return None
    from rmq_spark.selection import Selection

    return SelectDecider(Selection.compile(expression, where=f"route {route}"))


class Endpoints:
    """Where a task's links connect: the node hosting the queue first, when its address
    is known.

    pika's connection parameters cost ~0.4 CPU-ms a set (two a transfer) and are the
    same for every queue of a vhost, side and preferred node, so the task makes each
    set once.
    """

    def __init__(self, settings: ExecutorSettings) -> None:
        self._settings = settings
        self._made: dict[tuple[str, str, str, str | None], tuple[Any, ...]] = {}

    def of(self, cluster: str, vhost: str, queue: str, *, node: str, role: str) -> Endpoint:
        settings = self._settings
        prefer = preferred_uri(settings.node_uris, cluster, node)
        key = (cluster, vhost, role, prefer)
        params = self._made.get(key)
        if params is None:
            params = self._made[key] = tuple(
                connection_parameters(
                    cluster,
                    settings.clusters[cluster],
                    vhost,
                    # Named for what it carries: the task's queues of one vhost (pool.py).
                    purpose=f"{settings.run_id} {role} vhost {vhost}",
                    blocked_timeout=settings.mover.blocked_timeout_seconds,
                    prefer=prefer,
                )
            )
        return Endpoint(cluster, vhost, queue, params)


def task_attempt() -> str:
    """'stage.partition.attempt' of the running Spark task, 'local' outside Spark."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return "local"
    return f"{context.stageId()}.{context.partitionId()}.{context.attemptNumber()}"
