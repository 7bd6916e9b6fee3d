"""What a replay publishes where, and what it skips: pure, no broker, no Spark.

**How a replay names what it did.** Each published row gets one row in the ledger's
`messages` table under the replay's own run id: the parked row's source cluster, vhost,
queue and position, the queue it was published to as destination, decision
`replayed`, and `reason` the parked run id. A replay of parked run P to target T first
reads the confirmed `replayed` rows whose reason is P, across every run, and skips each
parked row whose (source, position, destination) is among them. So a re-run, with any
run id, publishes only what no earlier replay of P to the same queues confirmed; a
replay to another queue is another replay. Where each row goes, and with which
property bytes, is `targets.py`'s.

**What an interrupted replay may have left twice.** A replay appends its confirmed rows
to the ledger a batch at a time and writes its `runs` row when it ends; one killed
between a confirm and its append, or stopped by a failed publish, may have published
rows the ledger never showed confirmed. Each attempt records what it is about to
publish and the row in flight when it stopped (`journal.py`), so a re-run names exactly
those of its rows (`possibly_twice`): the row in flight of an attempt that stopped on an
error, or the rows a killed attempt intended (at most its last batch), also when it was
killed before its first append.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rmq_spark.errors import ConfigError
from rmq_spark.park.replay.targets import Queue
from rmq_spark.transfer.decisions import REPLAYED

# (source cluster, vhost, queue, position) of a parked row.
ParkedKey = tuple[str, str, str, int]
# A parked key and where it went: what the ledger says a replay did.
ReplayKey = tuple[str, str, str, int, str, str, str]


def parked_key(row: Mapping[str, Any]) -> ParkedKey:
    return (row["source_cluster"], row["source_vhost"], row["source_queue"], row["position"])


def replay_key(row: Mapping[str, Any], destination: Queue) -> ReplayKey:
    return (*parked_key(row), *destination)


def ledger_replay_key(row: Mapping[str, Any]) -> ReplayKey:
    """The replay key a ledger `messages` row of a replay records."""
    return (
        row["source_cluster"],
        row["source_vhost"],
        row["source_queue"],
        row["position"],
        row["destination_cluster"],
        row["destination_vhost"],
        row["destination_queue"],
    )


def in_replay_order(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Each source queue's rows in position order (queues one after another)."""
    return sorted(rows, key=parked_key)


def check_replayable(run_id: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """One error when a selected row was parked without its body."""
    excluded = sum(1 for row in rows if row["body_excluded"])
    if excluded:
        raise ConfigError(
            f"parked run {run_id!r}: {excluded} of the {len(rows)} selected rows were parked "
            "with park.exclude_body (no body kept): such rows cannot be replayed; nothing "
            "was published"
        )


@dataclass(frozen=True)
class ReplayPlan:
    """The selected rows in replay order: those to publish, and those an earlier replay
    of the same parked run to the same queue already confirmed."""

    publish: tuple[Mapping[str, Any], ...]
    skipped: int

    @property
    def destinations(self) -> list[Queue]:
        return sorted({(r["_to"][0], r["_to"][1], r["_to"][2]) for r in self.publish})


def plan_replay(routed: Iterable[Mapping[str, Any]], confirmed: set[ReplayKey]) -> ReplayPlan:
    """What to publish: the routed rows (`targets.route_rows`: each with its destination
    `_to` and the bytes to send `_sent`) in replay order, less what was confirmed."""
    publish, skipped = [], 0
    for row in in_replay_order(routed):
        if replay_key(row, row["_to"]) in confirmed:
            skipped += 1
            continue
        publish.append(row)
    return ReplayPlan(tuple(publish), skipped)


def ledger_row(
    row: Mapping[str, Any],
    *,
    run_id: str,
    parked_run_id: str,
    publish_seq: int,
    message_id: str | None,
    publish_attempts: int = 1,
    read_at: datetime,
    confirmed_at: datetime,
) -> dict[str, Any]:
    """The `messages` row of one confirmed replayed publish: its checksums are of the bytes
    sent (`_sent`: the parked property bytes, or for `--to origin` the header policy's
    rewrite of them; the parked row keeps the digest of the bytes as parked)."""
    cluster, vhost, queue = row["_to"]
    body: bytes = row["body"]
    return {
        "run_id": run_id,
        "source_cluster": row["source_cluster"],
        "source_vhost": row["source_vhost"],
        "source_queue": row["source_queue"],
        "destination_cluster": cluster,
        "destination_vhost": vhost,
        "destination_queue": queue,
        "position": row["position"],
        "publish_seq": publish_seq,
        "publish_attempts": publish_attempts,
        "redelivered": bool(row["redelivered"]),
        "body_size": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "properties_sha256": hashlib.sha256(row["_sent"]).hexdigest(),
        "message_id": message_id,
        "consumed_at": read_at,
        "confirmed_at": confirmed_at,
        "task_attempt": "driver",
        "session": 0,
        "decision": REPLAYED,
        "publish_exchange": "",
        "publish_routing_key": queue,
        "reason": parked_run_id,
    }


def replay_counts(
    routed: Iterable[Mapping[str, Any]], ledger_keys: Iterable[ReplayKey]
) -> tuple[int, int]:
    """(selected rows no replay confirmed, selected rows confirmed more than once), from
    the ledger's confirmed replayed rows of this parked run read back after the replay."""
    seen: dict[ReplayKey, int] = {}
    for key in ledger_keys:
        seen[key] = seen.get(key, 0) + 1
    missing = duplicates = 0
    for row in routed:
        count = seen.get(replay_key(row, row["_to"]), 0)
        missing += count == 0
        duplicates += max(count - 1, 0)
    return missing, duplicates


def possibly_twice(
    publish: Sequence[Mapping[str, Any]], earlier: Iterable[tuple[str, Set[ReplayKey]]]
) -> tuple[tuple[str, ...], tuple[Mapping[str, Any], ...]]:
    """(interrupted replays, rows of `publish` they may have published already); a
    replay is named only with rows.

    `earlier` is (run id, replay keys it may have published unrecorded) of each earlier
    attempt that recorded no end (`journal.Attempt.uncertain`). `publish` holds the rows
    no replay confirmed to the same queue, so a key of theirs the ledger shows confirmed
    is never named.
    """
    named: dict[ParkedKey, Mapping[str, Any]] = {}
    runs: set[str] = set()
    for run_id, keys in earlier:
        rows = [row for row in publish if replay_key(row, row["_to"]) in keys]
        if rows:
            runs.add(run_id)
            named.update((parked_key(row), row) for row in rows)
    return tuple(sorted(runs)), tuple(in_replay_order(named.values()))


def position_ranges(positions: Iterable[int]) -> str:
    """'0-4, 7, 9-10' for 0, 1, 2, 3, 4, 7, 9, 10."""
    spans: list[list[int]] = []
    for position in sorted(set(positions)):
        if spans and position == spans[-1][1] + 1:
            spans[-1][1] = position
        else:
            spans.append([position, position])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
