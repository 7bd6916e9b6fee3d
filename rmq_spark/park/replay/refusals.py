"""What a replay refuses before it publishes anything: the run's table, its target queues.

Each refusal is one error (exit 2) naming what was found and what was required, raised
before the first publish:

- **A parked run of another schema version.** Every parked row carries the version of
  the table's layout it was written with (`schema_version`, `transfer/parked_rows.py`);
  a run whose rows say another version than this rmq-spark writes is refused, naming
  both (its columns may mean something else: replay it with the rmq-spark that parked
  it). Read before the rows themselves, from that one column.
- **A target queue that would not take the rows** (the queues the rows go to, each
  already existing: replay declares nothing). As a move's pre-flight refuses a
  destination (`planning/queue_room.py`, shared): one exclusive to another connection,
  and one whose length limit (`x-max-length`, `x-max-length-bytes`, by argument or by
  a policy the vhost's policies say applies, read exactly: `broker/policy_match.py`)
  leaves less room than the rows replayed to it, whatever its overflow (reject-publish
  would stop the replay part way, drop-head would drop messages). And a queue of a type
  a replay does not publish to: a stream (an append-only log read by offset; nothing in
  it is consumed once, so a replay into it is not "back into a queue").

The judgement is pure (`queue_refusals`, `check_targets`); `read_targets` asks the
management API for each target's row and its vhost's policies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import JobConfig
from rmq_spark.errors import ConfigError, DestinationIncompatibleError
from rmq_spark.park.replay.targets import Queue
from rmq_spark.planning import queue_room
from rmq_spark.planning.rules import queue_type
from rmq_spark.transfer.parked_rows import SCHEMA_VERSION

REPLAY_TYPES = ("classic", "quorum")


def check_schema_versions(parked_run_id: str, versions: Iterable[int | None]) -> None:
    """One error when the run's rows are of another schema version than this rmq-spark's.

    >>> check_schema_versions("park-1", [1, 1])
    """
    other = sorted({v for v in versions if v != SCHEMA_VERSION}, key=str)
    if other:
        shown = ", ".join("none" if v is None else str(v) for v in other)
        raise ConfigError(
            f"--parked {parked_run_id!r}: its rows are of parked-table schema version "
            f"{shown}, this rmq-spark reads version {SCHEMA_VERSION}; replay it with the "
            "rmq-spark version that parked it; nothing was published"
        )


@dataclass(frozen=True)
class TargetFacts:
    """What the management API says of one target's vhost: its queues' rows (None:
    not listed) and its user and operator policies."""

    queues: Mapping[str, Mapping[str, Any] | None]
    policies: Sequence[Mapping[str, Any]] = ()
    operator_policies: Sequence[Mapping[str, Any]] = ()


# (cluster, vhost, queue names) -> the facts of those queues.
FactsReader = Callable[[str, str, Sequence[str]], TargetFacts]


def queue_refusals(
    row: Mapping[str, Any], facts: TargetFacts, *, depth: int, rows: int, body_bytes: int
) -> list[str]:
    """Why a target queue (its management row) would not take `rows` more (of
    `body_bytes` body bytes) beside its exact `depth`; [] when it would.

    >>> queue_refusals({"name": "q", "type": "stream"}, TargetFacts({}), depth=0,
    ...                rows=1, body_bytes=1)[0][:12]
    'is a stream,'
    """
    problems = []
    if row.get("exclusive"):
        problems.append(queue_room.EXCLUSIVE)
    kind = queue_type(row)
    if kind not in REPLAY_TYPES:
        problems.append(
            f"is a {kind}, expected a classic or quorum queue: a stream is an append-only "
            "log read by offset, where nothing is consumed once, so a replay does not "
            "publish into one"
        )
        return problems
    policy = queue_room.applying_policy(
        str(row.get("name")), kind, facts.policies, facts.operator_policies
    )
    problems += queue_room.room_problems(
        row,
        depth=depth,
        messages=rows,
        message_bytes=body_bytes,
        wanted_messages=f"the {rows} rows replayed to it",
        wanted_bytes=f"the {body_bytes} body bytes replayed to it",
        refused="the broker would refuse the rest and the replay would stop part way",
        policy=policy,
    )
    return problems


def check_targets(
    label: str,
    demand: Mapping[Queue, tuple[int, int]],
    depths: Mapping[Queue, int],
    facts: Mapping[tuple[str, str], TargetFacts],
) -> None:
    """Every target queue takes the rows replayed to it (`demand`: rows and body bytes),
    else one DestinationIncompatibleError with a line per problem."""
    problems = []
    for queue, (rows, body_bytes) in sorted(demand.items()):
        cluster, vhost, name = queue
        where = f"cluster {cluster} vhost {vhost!r} queue {name!r}"
        found = facts[(cluster, vhost)].queues.get(name)
        if found is None:
            problems.append(f"{where}: the management API does not list it (deleted meanwhile?)")
            continue
        for problem in queue_refusals(
            found, facts[(cluster, vhost)], depth=depths[queue], rows=rows, body_bytes=body_bytes
        ):
            problems.append(f"{where}: {problem}")
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        lines = "\n  ".join(problems)
        raise DestinationIncompatibleError(
            f"--to {label}: the target queues would refuse the rows, {count}; nothing was "
            f"published:\n  {lines}"
        )


def demand_of(routed: Iterable[Mapping[str, Any]]) -> dict[Queue, tuple[int, int]]:
    """Rows and body bytes per target queue."""
    demand: dict[Queue, tuple[int, int]] = {}
    for row in routed:
        rows, body_bytes = demand.get(row["_to"], (0, 0))
        demand[row["_to"]] = (rows + 1, body_bytes + len(row["body"]))
    return demand


def management_reader(config: JobConfig) -> FactsReader:
    """Reads target facts from each cluster's management API."""

    def read(cluster: str, vhost: str, queues: Sequence[str]) -> TargetFacts:
        client = ManagementClient(
            cluster, config.clusters[cluster], timeout=config.management_timeout_seconds
        )
        try:
            return TargetFacts(
                {queue: client.queue(vhost, queue) for queue in queues},
                client.vhost_policies(vhost),
                client.vhost_operator_policies(vhost),
            )
        finally:
            client.close()

    return read


def read_targets(
    reader: FactsReader, queues: Iterable[Queue]
) -> dict[tuple[str, str], TargetFacts]:
    """The facts of every target queue, one read per cluster and vhost."""
    by_vhost: dict[tuple[str, str], list[str]] = {}
    for cluster, vhost, queue in queues:
        by_vhost.setdefault((cluster, vhost), []).append(queue)
    return {
        (cluster, vhost): reader(cluster, vhost, sorted(set(names)))
        for (cluster, vhost), names in sorted(by_vhost.items())
    }
