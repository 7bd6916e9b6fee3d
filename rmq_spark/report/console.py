"""What a run tells the person who ran it: a per-queue table and one RESULT line.

The RESULT line is the machine-readable summary (`RESULT {json}`), the last line the
job prints; scripts and CI parse it. A migration prints its queues and one
`MIGRATION {json}` line the same way. Nothing here holds a secret: it is built from
the plan, the outcomes and the verification, none of which carry credentials.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.table import Table

from rmq_spark.broker.federation_plan import Override
from rmq_spark.config import JobConfig
from rmq_spark.model import QueueTransfer
from rmq_spark.planning.queue_arguments import delivers_by_priority
from rmq_spark.planning.rate_limits import describe_limits
from rmq_spark.transfer.window import prefetch_for

if TYPE_CHECKING:  # results only: `plan` prints with this module and runs without Spark
    from rmq_spark.pipeline import RunResult

RESULT_PREFIX = "RESULT "
MIGRATION_PREFIX = "MIGRATION "

# The console's queue table shows at most this many rows (failed queues first).
QUEUE_TABLE_ROWS = 50


def result_summary(result: RunResult, ledger_path: str) -> dict[str, Any]:
    verification = result.verification
    return {
        "run_id": result.run_id,
        "queues": len(result.transfers),
        "failed_queues": sum(1 for o in result.outcomes if o.status != "moved"),
        "messages": verification.messages,
        # A selective move's messages published back to their source (routes[].select).
        "kept": verification.kept,
        "bytes": verification.bytes,
        "lost": verification.lost,
        "duplicates": verification.duplicates,
        # Redeliveries after a lost session that an earlier session had moved: acked
        # without a publish, so they made no duplicate (transfer/recognition.py).
        "recognised": verification.recognised,
        "unexpected": verification.unexpected,
        "verified": verification.verified,
        # Sources that received messages meanwhile, with no consumer counters to prove
        # that no other consumer took some: verified on their depth drop alone.
        "sources_unproven": verification.sources_unproven,
        "seconds": round(result.seconds, 2),
        "ledger": ledger_path,
        "verification": verification.results_path,
        "data_docs": verification.data_docs_path,
        "rabbitmq_versions": dict(result.rabbitmq_versions),
    }


def result_line(summary: dict[str, Any]) -> str:
    return RESULT_PREFIX + json.dumps(summary, sort_keys=True)


def print_queue_table(
    result: RunResult, file: IO[str] | None = None, *, limit: int = QUEUE_TABLE_ROWS
) -> None:
    """A short table: one row per queue with its counts and verdict.

    Every queue that failed, then passed ones up to `limit` rows in all; one line
    counts the rest (the HTML report lists them all). Rendering a rich table costs
    ~2 ms a row: 1,000 queues took the driver 1.8 s to print.
    """
    table = Table(title=f"run {result.run_id}", show_lines=False)
    for header in ("source", "destination", "part", "moved", "dups", "lost", "unexp.", "verdict"):
        table.add_column(
            header,
            justify="right" if header in {"part", "moved", "dups", "lost", "unexp."} else "left",
        )
    partition_of = {t.key: p for t, p in zip(result.transfers, result.partitions, strict=True)}
    queues = result.verification.queues
    failed = [verdict for verdict in queues if not verdict.passed]
    shown = (
        failed + [verdict for verdict in queues if verdict.passed][: max(0, limit - len(failed))]
    )
    for verdict in shown:
        key = verdict.key
        source = f"{key.source_cluster}/{key.source_vhost}/{key.source_queue}"
        destination = f"{key.destination_cluster}/{key.destination_vhost}/{key.destination_queue}"
        partition = partition_of.get(verdict.key, "")
        outcome = "ok" if verdict.passed else (verdict.error or "FAILED")
        table.add_row(
            source,
            destination,
            str(partition),
            str(verdict.distinct_messages),
            str(verdict.duplicates),
            str(verdict.lost),
            str(verdict.unexpected),
            outcome,
        )
    Console(file=file, width=160).print(table)
    if len(shown) < len(queues):
        Console(file=file, width=160).print(
            f"... and {len(queues) - len(shown)} more queues, all verified (the report lists them)"
        )
    if result.verification.kept:
        Console(file=file, width=160).print(
            f"decisions: moved {result.verification.messages:,}, kept in the source "
            f"{result.verification.kept:,}",
            markup=False,
            highlight=False,
        )
    for line in [*brake_lines(result), *priority_lines(result)]:
        Console(file=file, width=160).print(line, markup=False, highlight=False)
    for failure in result.verification.failed_expectations:
        Console(file=file, width=160).print(f"[red]failed:[/red] {failure}")


# Lines of their own for at most this many rate-limited transfers; a sum for more.
MAX_BRAKE_LINES = 10


def brake_lines(result: RunResult) -> list[str]:
    """The rate limit each limited transfer kept to and how long it was held back."""
    limited = [o for o in result.outcomes if o.rate_limits is not None]
    if not limited:
        return []
    if len(limited) > MAX_BRAKE_LINES:
        most = max(limited, key=lambda o: o.rate_held_seconds + o.depth_held_seconds)
        return [
            f"limits: {len(limited)} transfers limited, held back "
            f"{sum(o.rate_held_seconds + o.depth_held_seconds for o in limited):,.1f} s in "
            f"all, the most {most.rate_held_seconds + most.depth_held_seconds:,.1f} s "
            f"({most.key.label()})"
        ]
    return [
        f"limits {describe_limits(o.rate_limits)}: held back {o.rate_held_seconds:,.1f} s by "
        f"the rate, {o.depth_held_seconds:,.1f} s by the depth ({o.key.label()})"
        for o in limited
    ]


def priority_lines(result: RunResult) -> list[str]:
    """Transfers whose destination delivers by the priority property (a quorum queue on
    RabbitMQ 4.x) and that moved messages setting it: consumers see those in a new order."""
    by_key = {t.key: t for t in result.transfers}
    reordered = []
    for outcome in result.outcomes:
        transfer = by_key.get(outcome.key)
        if transfer is None or not outcome.priority_messages:
            continue
        version = result.rabbitmq_versions.get(transfer.destination_cluster, "")
        if delivers_by_priority(transfer.destination_type, version):
            reordered.append((outcome, transfer, version))
    if len(reordered) > MAX_BRAKE_LINES:
        total = sum(outcome.priority_messages for outcome, _t, _v in reordered)
        return [
            f"priority order: {total:,} moved messages of {len(reordered)} transfers set a "
            "priority and went into quorum queues on RabbitMQ 4.x, which deliver by it, not "
            "in source order (the queues table's reordered_by_priority names them)"
        ]
    return [
        f"priority order: {outcome.priority_messages:,} of {outcome.messages:,} moved messages "
        f"set a priority; the quorum queue {transfer.destination_cluster}/"
        f"{transfer.destination_vhost}/{transfer.destination_queue} (RabbitMQ {version}) "
        "delivers them by it, not in source order"
        for outcome, transfer, version in reordered
    ]


def plan_document(
    config: JobConfig,
    transfers: Sequence[QueueTransfer],
    partitions: Sequence[int],
    paused: Mapping[tuple[str, str, str], Override] | None = None,
) -> dict[str, Any]:
    """The dry-run plan as plain data (what `rmq-spark plan --json` prints).

    `paused`: (cluster, vhost, queue) -> the override that pauses its federation
    while moving (`federation.pause_preview`).
    """
    queues = []
    for transfer, partition in zip(transfers, partitions, strict=True):
        override = (paused or {}).get(
            (transfer.source_cluster, transfer.source_vhost, transfer.source_queue)
        )
        queues.append(
            {
                "route": transfer.route,
                # "source"/"destination" are for reading (names may hold "/"); match
                # queues on the separate fields.
                "source": transfer.source_label,
                "source_cluster": transfer.source_cluster,
                "source_vhost": transfer.source_vhost,
                "source_queue": transfer.source_queue,
                "source_type": transfer.source_type,
                "messages": transfer.messages,
                "bytes": transfer.message_bytes if transfer.bytes_known else None,
                "destination": transfer.destination_label,
                "destination_cluster": transfer.destination_cluster,
                "destination_vhost": transfer.destination_vhost,
                "destination_queue": transfer.destination_queue,
                "destination_messages": transfer.destination_messages,
                "destination_created": transfer.destination_created,
                "partition": partition,
                # What the mover's first prefetch is for the queue's average size;
                # it follows the sizes it receives (byte_window.py), so unknown bytes
                # only mean no forecast.
                "prefetch": prefetch_for(
                    config.window.first_messages,
                    config.window.bytes,
                    transfer.average_message_bytes,
                )
                if transfer.bytes_known
                else None,
                "federation": override.as_plan_entry() if override else None,
            }
        )
    known = [q["bytes"] for q in queues if q["bytes"] is not None]
    return {
        "queues": queues,
        "partitions": len(set(partitions)),
        "messages": sum(q["messages"] for q in queues),
        "bytes": sum(known) if len(known) == len(queues) else None,
        "federation": config.federation,
        "problems": [],
    }


def federation_cell(entry: Mapping[str, Any] | None) -> str:
    """The plan table's federation column."""
    if entry is None:
        return "not federated"
    dropped = ", ".join(entry["dropped"])
    return (
        f"paused by {entry['paused_by']} (priority {entry['priority']}, no {dropped}); "
        f"after: {entry['restored']} again"
    )


def print_plan_table(document: dict[str, Any], file: IO[str] | None = None) -> None:
    table = Table(
        title=f"plan: {len(document['queues'])} queues in {document['partitions']} partitions"
    )
    pausing = document.get("federation") == "pause"
    headers = ["source", "type", "messages", "bytes", "destination", "part", "prefetch"]
    for header in [*headers, "federation"] if pausing else headers:
        table.add_column(header, justify="right" if header in _NUMERIC_PLAN else "left")
    for queue in document["queues"]:
        destination = queue["destination"] + (" (new)" if queue["destination_created"] else "")
        cells = [
            queue["source"],
            queue["source_type"],
            str(queue["messages"]),
            _or_unknown(queue["bytes"]),
            destination,
            str(queue["partition"]),
            _or_unknown(queue["prefetch"]),
        ]
        table.add_row(*cells, *([federation_cell(queue["federation"])] if pausing else []))
    console = Console(file=file, width=200 if pausing else 160)
    console.print(table)
    console.print(
        f"total: {document['messages']} messages, {_or_unknown(document['bytes'])} bytes; "
        "nothing moved"
    )


def _or_unknown(value: int | None) -> str:
    """Bytes the management API did not report are unknown, never 0."""
    return "?" if value is None else str(value)


_NUMERIC_PLAN = {"messages", "bytes", "part", "prefetch"}


# -- migration (rmq-spark migrate) -------------------------------------------------------
# `migrate` sits above `report` in the layers, so its results are read through these
# Protocols (migrate.QueueOutcome and migrate.MigrationResult fit them).


class MigratedQueue(Protocol):
    @property
    def vhost(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def moved_out(self) -> int: ...
    @property
    def moved_back(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def missing(self) -> int: ...
    @property
    def duplicates(self) -> int: ...
    @property
    def bindings(self) -> int: ...
    @property
    def verified(self) -> bool: ...


class Migration(Protocol):
    @property
    def queues(self) -> Sequence[MigratedQueue]: ...
    @property
    def runs(self) -> Sequence[RunResult]: ...
    @property
    def seconds(self) -> float: ...
    @property
    def verified(self) -> bool: ...
    @property
    def live_publishes(self) -> Mapping[str, int]: ...
    @property
    def rabbitmq_versions(self) -> Mapping[str, str]: ...


def print_migration_plan(document: Sequence[Mapping[str, Any]], cluster: str) -> None:
    """The dry run's rows (`QueueMigration.as_dict`), one line each and its decisions."""
    for row in document:
        print(
            f"{row['vhost']}/{row['queue']}: {row['state']}, {row['messages']} "
            f"message(s), {row['consumers']} consumer(s), {row['bindings']} "
            f"binding(s), policy {row['policy']}, quorum arguments "
            f"{row['quorum_arguments']}"
        )
        for line in row["decisions"]:
            print(f"    {line}")
    if not document:
        print(f"nothing to migrate on cluster {cluster}")


def print_migrated_queues(result: Migration) -> None:
    for queue in result.queues:
        print(
            f"vhost {queue.vhost!r} queue {queue.queue!r}: moved out {queue.moved_out}, "
            f"back {queue.moved_back}, "
            f"held {queue.held}, missing {queue.missing}, duplicates {queue.duplicates}, "
            f"bindings {queue.bindings}, {'verified' if queue.verified else 'NOT VERIFIED'}"
        )


def migration_summary(result: Migration) -> dict[str, Any]:
    return {
        "queues": len(result.queues),
        "messages": sum(q.moved_back + q.held for q in result.queues),
        "missing": sum(q.missing for q in result.queues),
        "runs": [r.run_id for r in result.runs],
        "seconds": round(result.seconds, 2),
        "verified": result.verified,
        # publishers' messages that reached the final queues during the last hop
        "live_arrivals": sum(result.live_publishes.values()),
        "rabbitmq_versions": dict(result.rabbitmq_versions),
    }


def migration_line(summary: dict[str, Any]) -> str:
    return MIGRATION_PREFIX + json.dumps(summary, sort_keys=True)
