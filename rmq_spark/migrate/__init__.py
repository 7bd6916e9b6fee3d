"""Classic → quorum queue migration in place, each hop a ledgered, verified transfer.

A queue cannot change its type, so a classic queue `Q` becomes a quorum queue of the
same name by moving its messages out and back:

    prepare   declare the temporary quorum queue T = `rmq-spark-migrating--Q`, whose
              `x-rmq-spark-migration` argument is the saved state (migration id, Q's
              durability, arguments, translated arguments and bindings), and the holding
              quorum queue H = `rmq-spark-holding--Q`
    hold      bind H with Q's bindings, then unbind Q: publishes through Q's exchanges
              land in H from now on, and Q only drains
    move-out  Q → T, a run_transfer run `<id>-out` (ledgered, verified)
    recreate  delete Q (only when empty), declare Q as a quorum queue with the
              translated arguments, unbound
    move-back T → Q, run `<id>-back`
    rebind    bind Q with the saved bindings, then unbind H: publishes reach Q again
    drain-holding  H → Q, run `<id>-held` (what was published during the swap)
    cleanup   delete H and T, each only when empty (T last: it holds the state)

State lives in RabbitMQ (T's marker argument, which queues exist and of which type)
and in the ledger (a hop whose run is recorded verified is not run again), so a re-run
after a crash in any phase finishes the migration: each phase checks what is already
done. Queues selected together share one migration id and run each hop as one Spark
job. `translate_arguments` and the selection are pure; the rest calls the management
API and `pipeline.run_transfer`.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pyspark.sql import SparkSession

from rmq_spark.broker.counts import queue_depths, queue_is_empty
from rmq_spark.broker.management import ManagementClient, management_clients
from rmq_spark.config import (
    DestinationSpec,
    JobConfig,
    RouteConfig,
    SourceSelector,
    validate_run_id,
)
from rmq_spark.errors import ConfigError, MigrationError, RmqSparkError
from rmq_spark.ledger import tables
from rmq_spark.pipeline import RunResult, rabbitmq_versions, run_transfer

log = logging.getLogger(__name__)

TEMP_PREFIX = "rmq-spark-migrating--"
HOLD_PREFIX = "rmq-spark-holding--"
MARKER_ARGUMENT = "x-rmq-spark-migration"
PHASES = (
    "prepare",
    "hold",
    "move-out",
    "recreate",
    "move-back",
    "rebind",
    "drain-holding",
    "cleanup",
)
# The run id suffix of each hop's transfer run.
HOP_OUT, HOP_BACK, HOP_HELD = "out", "back", "held"
MAX_QUEUE_NAME_BYTES = 255
# Kept unchanged on the quorum queue (RabbitMQ 3.10 quorum queues support them; message
# TTL since 3.10.0, checked on this project's 3.10.8 brokers).
_KEPT = (
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-max-length-bytes",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-single-active-consumer",
    # RabbitMQ 4.x classic queues take the leader locator too (it replaces the master
    # locator, whose declare 4.3 refuses); quorum queues take the same values.
    "x-queue-leader-locator",
)
# Quorum queues refuse these on declare (406 PRECONDITION_FAILED, 3.10 to 4.3).
_DROPPED = {
    "x-queue-mode": "quorum queues refuse it; they keep every message on disk, so lazy mode "
    "does not apply",
    "x-queue-version": "quorum queues refuse it; it is a classic queue storage version and "
    "quorum queues have their own log",
}
_QUORUM_OVERFLOW = ("drop-head", "reject-publish")
# Classic master locators and the quorum leader locator that does the same job.
_LEADER_LOCATOR = {"client-local": "client-local", "min-masters": "balanced", "random": "balanced"}
# Policy keys that would make a temporary or holding queue drop or dead-letter messages.
_HARMFUL_POLICY_KEYS = (
    "max-length",
    "max-length-bytes",
    "message-ttl",
    "expires",
    "dead-letter-exchange",
    "overflow",
)
# How much free disk each node needs above its limit, per byte to migrate: the
# temporary copy and the final copy both live in quorum logs on every member.
DISK_HEADROOM_FACTOR = 2
_CONSUMER_POLL_SECONDS = 1.0

Action = Literal["kept", "translated", "dropped", "refused", "added"]
PhaseHook = Callable[[str], None]


@dataclass(frozen=True)
class MigrationOptions:
    """What to do with the cases that have no single right answer."""

    # refuse: a queue with consumers is not migrated; wait: wait for them to go.
    consumers: Literal["refuse", "wait"] = "refuse"
    consumer_wait_seconds: float = 300.0
    # refuse: x-max-priority stops the migration; drop: migrate, priorities are ignored.
    priorities: Literal["refuse", "drop"] = "refuse"
    # x-quorum-initial-group-size of the new queues (default: RabbitMQ's, all nodes).
    replicas: int | None = None


@dataclass(frozen=True)
class ArgumentDecision:
    """What happens to one queue argument in the quorum queue."""

    argument: str
    value: Any
    action: Action
    becomes: str | None  # "x-queue-leader-locator=balanced" for translations
    reason: str

    def describe(self) -> str:
        target = f" -> {self.becomes}" if self.becomes else ""
        return f"{self.argument}={self.value!r}: {self.action}{target} ({self.reason})"


def translate_arguments(
    arguments: Mapping[str, Any], options: MigrationOptions
) -> tuple[dict[str, Any], list[ArgumentDecision]]:
    """The quorum queue's arguments for a classic queue's, and a decision per argument.

    >>> translate_arguments({"x-queue-mode": "lazy"}, MigrationOptions())[0]
    {'x-queue-type': 'quorum'}
    """
    quorum: dict[str, Any] = {"x-queue-type": "quorum"}
    decisions: list[ArgumentDecision] = []

    def decide(
        key: str, value: Any, action: Action, reason: str, becomes: str | None = None
    ) -> None:
        decisions.append(ArgumentDecision(key, value, action, becomes, reason))

    for key, value in sorted(arguments.items()):
        if key == "x-queue-type":
            continue
        if key in _KEPT:
            quorum[key] = value
            decide(key, value, "kept", "quorum queues support it")
        elif key in _DROPPED:
            decide(key, value, "dropped", _DROPPED[key])
        elif key == "x-max-priority":
            if options.priorities == "drop":
                decide(
                    key,
                    value,
                    "dropped",
                    "quorum queues have no priorities; messages keep their priority "
                    "property, the queue delivers in arrival order",
                )
            else:
                decide(
                    key,
                    value,
                    "refused",
                    "quorum queues have no priorities; migrate anyway with --drop-priorities",
                )
        elif key == "x-queue-master-locator":
            locator = _LEADER_LOCATOR.get(str(value), "balanced")
            quorum["x-queue-leader-locator"] = locator
            decide(
                key,
                value,
                "translated",
                "quorum queues place leaders instead of masters",
                becomes=f"x-queue-leader-locator={locator}",
            )
        elif key == "x-overflow":
            if value in _QUORUM_OVERFLOW:
                quorum[key] = value
                decide(key, value, "kept", "quorum queues support it")
            else:
                # RabbitMQ 4.x accepts reject-publish-dlx on a quorum declare and then
                # ignores it (drop-head, with a warning in its log): refused here.
                decide(
                    key,
                    value,
                    "refused",
                    f"quorum queues support x-overflow {' and '.join(_QUORUM_OVERFLOW)} only",
                )
        elif key.startswith("x-"):
            decide(key, value, "refused", "unknown to rmq-spark, so its quorum meaning is unknown")
        else:
            quorum[key] = value
            decide(key, value, "kept", "not a RabbitMQ argument; passed on unchanged")
    if options.replicas is not None:
        quorum["x-quorum-initial-group-size"] = options.replicas
        decide(
            "x-quorum-initial-group-size",
            options.replicas,
            "added",
            "--replicas: the number of quorum members",
        )
    return quorum, decisions


@dataclass
class QueueMigration:
    """One queue to migrate: what the broker showed, the decisions, and any problem."""

    vhost: str
    queue: str
    migration_id: str
    state: Literal["new", "in progress"]
    durable: bool
    arguments: dict[str, Any]
    quorum_arguments: dict[str, Any]
    bindings: list[dict[str, Any]]  # source, routing_key, arguments
    decisions: list[ArgumentDecision] = field(default_factory=list)
    messages: int = 0
    message_bytes: int = 0
    consumers: int = 0
    publish_rate: float | None = None
    policy: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"vhost {self.vhost!r} queue {self.queue!r}"

    @property
    def temp(self) -> str:
        return TEMP_PREFIX + self.queue

    @property
    def holding(self) -> str:
        return HOLD_PREFIX + self.queue

    def marker(self) -> str:
        """The saved state, as T's marker argument (JSON)."""
        return json.dumps(
            {
                "id": self.migration_id,
                "vhost": self.vhost,
                "queue": self.queue,
                "durable": self.durable,
                "arguments": self.arguments,
                "quorum_arguments": self.quorum_arguments,
                "bindings": self.bindings,
                "policy": self.policy,
            },
            sort_keys=True,
        )

    @classmethod
    def from_marker(cls, text: str) -> QueueMigration:
        state = json.loads(text)
        return cls(
            vhost=state["vhost"],
            queue=state["queue"],
            migration_id=state["id"],
            state="in progress",
            durable=bool(state["durable"]),
            arguments=dict(state["arguments"]),
            quorum_arguments=dict(state["quorum_arguments"]),
            bindings=list(state["bindings"]),
            policy=state.get("policy"),
        )

    def as_dict(self) -> dict[str, Any]:
        """The dry-run report row."""
        return {
            "vhost": self.vhost,
            "queue": self.queue,
            "migration_id": self.migration_id,
            "state": self.state,
            "messages": self.messages,
            "consumers": self.consumers,
            "publish_rate": self.publish_rate,
            "policy": self.policy,
            "bindings": len(self.bindings),
            "quorum_arguments": self.quorum_arguments,
            "decisions": [d.describe() for d in self.decisions],
            "problems": self.problems,
        }


@dataclass(frozen=True)
class QueueOutcome:
    """One migrated queue, as the ledger proves it."""

    vhost: str
    queue: str
    migration_id: str
    moved_out: int  # distinct messages moved Q -> T
    moved_back: int  # distinct messages moved T -> Q
    held: int  # distinct messages published during the swap, moved H -> Q
    missing: int  # moved out but not moved back (must be 0)
    duplicates: int  # extra copies named by the ledger across the hops
    bindings: int

    @property
    def verified(self) -> bool:
        return self.missing == 0 and self.moved_back >= self.moved_out


@dataclass(frozen=True)
class MigrationResult:
    queues: tuple[QueueOutcome, ...]
    runs: tuple[RunResult, ...]
    seconds: float
    # drain-holding runs into the final queues while publishers use them: how many of
    # the publishers' messages arrived during the hop (run id -> live arrivals)
    live_publishes: dict[str, int] = field(default_factory=dict)
    #: cluster name -> the RabbitMQ version its management API reports (as for a
    #: transfer run); a re-run that runs no hop still names it.
    rabbitmq_versions: dict[str, str] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        return all(q.verified for q in self.queues) and all(
            r.verification.verified for r in self.runs
        )


# -- selection and pre-flight ------------------------------------------------------------


def migration_cluster(config: JobConfig) -> str:
    """The one cluster the config's routes select queues on (migration is in place)."""
    clusters = set()
    for index, route in enumerate(config.routes):
        if route.destination.cluster != route.source.cluster:
            raise ConfigError(
                f"routes[{index}] ({route.name}): a migration is in place; expected "
                f"destination.cluster {route.source.cluster!r} like source.cluster, found "
                f"{route.destination.cluster!r}"
            )
        if route.destination.queue != "{queue}" or route.destination.vhost != "{vhost}":
            raise ConfigError(
                f"routes[{index}] ({route.name}): a migration keeps each queue's vhost and "
                "name; remove destination.vhost and destination.queue"
            )
        clusters.add(route.source.cluster)
    if len(clusters) != 1:
        raise ConfigError(
            f"a migration runs on one cluster; the routes name {sorted(clusters)}: "
            "migrate each cluster with its own config"
        )
    return clusters.pop()


def new_migration_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"migrate-{stamp}-{secrets.token_hex(3)}"


def plan_migration(
    config: JobConfig,
    client: ManagementClient,
    options: MigrationOptions,
    migration_id: str,
) -> list[QueueMigration]:
    """The selected queues, new and in progress, each with its problems (not raised).

    New: a classic queue the routes select. In progress: a temporary queue with a
    marker whose original the routes select by name or pattern (the original may be
    gone, or already a quorum queue); it keeps its own migration id.
    """
    plans: list[QueueMigration] = []
    vhosts_visible = client.vhosts()
    for route in config.routes:
        selector = route.source
        vhosts = vhosts_visible if "*" in selector.vhosts else list(selector.vhosts)
        for vhost in vhosts:
            if vhost not in vhosts_visible:
                raise MigrationError(
                    f"cluster {client.cluster_name} vhost {vhost!r}: not found (route "
                    f"{route.name!r} names it)"
                )
            plans.extend(
                _route_plans(client, route, vhost, options=options, migration_id=migration_id)
            )
    seen: set[tuple[str, str]] = set()
    unique = []
    for plan in plans:
        if (plan.vhost, plan.queue) not in seen:
            seen.add((plan.vhost, plan.queue))
            unique.append(plan)
    _check_cluster(client, unique, options)
    return unique


def _route_plans(
    client: ManagementClient,
    route: RouteConfig,
    vhost: str,
    *,
    options: MigrationOptions,
    migration_id: str,
) -> list[QueueMigration]:
    selector = route.source
    queues = client.queues(vhost)
    by_name = {q["name"]: q for q in queues}
    pattern = re.compile(selector.queue_pattern)
    policy_pattern = re.compile(selector.policy_pattern) if selector.policy_pattern else None

    def named(name: str) -> bool:
        if selector.queues is not None:
            return name in selector.queues
        return pattern.fullmatch(name) is not None

    plans: list[QueueMigration] = []
    in_progress: set[str] = set()
    for queue in queues:
        marker = (queue.get("arguments") or {}).get(MARKER_ARGUMENT)
        if not queue["name"].startswith(TEMP_PREFIX) or not isinstance(marker, str):
            continue
        plan = QueueMigration.from_marker(marker)
        if plan.vhost == vhost and named(plan.queue):
            original = by_name.get(plan.queue)
            plan.messages = int((original or {}).get("messages") or 0)
            plans.append(plan)
            in_progress.add(plan.queue)
    if selector.queues is not None:
        for name in selector.queues:
            if name not in by_name and name not in in_progress:
                raise MigrationError(
                    f"cluster {client.cluster_name} vhost {vhost!r} queue {name!r}: not found "
                    f"(route {route.name!r} source.queues names it)"
                )
    policies = [p for p in client.policies() if p.get("vhost") == vhost]
    for queue in queues:
        name = queue["name"]
        if name in in_progress or name.startswith((TEMP_PREFIX, HOLD_PREFIX)) or not named(name):
            continue
        if policy_pattern and not policy_pattern.fullmatch(queue.get("policy") or ""):
            continue
        queue_type = str(queue.get("type") or "classic")
        if queue_type != "classic":
            log.info(
                "cluster %s vhost %r queue %r: a %s queue; nothing to migrate",
                client.cluster_name,
                vhost,
                name,
                queue_type,
            )
            continue
        plans.append(
            _new_plan(
                client,
                vhost,
                queue,
                options=options,
                migration_id=migration_id,
                policies=policies,
                by_name=by_name,
            )
        )
    return plans


def _new_plan(
    client: ManagementClient,
    vhost: str,
    queue: Mapping[str, Any],
    *,
    options: MigrationOptions,
    migration_id: str,
    policies: Sequence[Mapping[str, Any]],
    by_name: Mapping[str, Mapping[str, Any]],
) -> QueueMigration:
    name = str(queue["name"])
    arguments = dict(queue.get("arguments") or {})
    quorum, decisions = translate_arguments(arguments, options)
    bindings = [
        {
            "source": b["source"],
            "routing_key": b.get("routing_key", ""),
            "arguments": b.get("arguments") or {},
        }
        for b in client.queue_bindings(vhost, name)
    ]
    details = client.queue_details(vhost, name) or {}
    rate = ((details.get("message_stats") or {}).get("publish_details") or {}).get("rate")
    plan = QueueMigration(
        vhost=vhost,
        queue=name,
        migration_id=migration_id,
        state="new",
        durable=bool(queue.get("durable", True)),
        arguments=arguments,
        quorum_arguments=quorum,
        bindings=bindings,
        decisions=decisions,
        messages=int(queue.get("messages") or 0),
        message_bytes=int(queue.get("message_bytes") or 0),
        consumers=int(queue.get("consumers") or 0),
        publish_rate=float(rate) if rate is not None else None,
        policy=queue.get("policy") or None,
    )
    where = f"cluster {client.cluster_name} {plan.where}"
    if not plan.durable:
        plan.problems.append(f"{where}: not durable; quorum queues are always durable (refused)")
    if queue.get("exclusive"):
        plan.problems.append(f"{where}: exclusive to one connection; refused")
    if queue.get("auto_delete"):
        plan.problems.append(
            f"{where}: auto-delete; it would vanish with its last consumer, refused"
        )
    for decision in decisions:
        if decision.action == "refused":
            plan.problems.append(f"{where}: argument {decision.describe()}")
    if plan.consumers and options.consumers == "refuse":
        plan.problems.append(
            f"{where}: {plan.consumers} consumer(s) attached; stop them first, or pass "
            "--consumers wait"
        )
    for helper in (plan.temp, plan.holding):
        if len(helper.encode()) > MAX_QUEUE_NAME_BYTES:
            plan.problems.append(
                f"{where}: the name is too long for the helper queue {helper[:40]!r}...; "
                f"expected at most {MAX_QUEUE_NAME_BYTES - len(TEMP_PREFIX)} bytes"
            )
        existing = by_name.get(helper)
        if existing is not None and helper == plan.holding:
            continue  # a holding queue left by an earlier attempt is reused
        if existing is not None:
            plan.problems.append(
                f"{where}: queue {helper!r} exists without a migration marker; delete it or "
                "rename it"
            )
        for policy in policies:
            harmful = sorted(set(policy.get("definition") or {}) & set(_HARMFUL_POLICY_KEYS))
            if harmful and _policy_applies(policy, helper):
                plan.problems.append(
                    f"{where}: policy {policy.get('name')!r} ({', '.join(harmful)}) would apply "
                    f"to the helper queue {helper!r} and could drop its messages; narrow its "
                    "pattern"
                )
    return plan


def _policy_applies(policy: Mapping[str, Any], queue: str) -> bool:
    """RabbitMQ policies match queue names with an unanchored regex."""
    if policy.get("apply-to") not in ("queues", "all", "quorum_queues"):
        return False
    try:
        return re.search(str(policy.get("pattern") or ""), queue) is not None
    except re.error:
        return True


def _check_cluster(
    client: ManagementClient, plans: list[QueueMigration], options: MigrationOptions
) -> None:
    """Replica count vs running nodes, alarms, and disk headroom for the new copies."""
    nodes = client.nodes()
    running = [n for n in nodes if n.get("running")]
    cluster = f"cluster {client.cluster_name}"
    problems: list[str] = []
    if options.replicas is not None and options.replicas > len(running):
        problems.append(
            f"{cluster}: --replicas {options.replicas} but only {len(running)} node(s) run "
            f"({', '.join(str(n['name']) for n in running)})"
        )
    if options.replicas is not None and options.replicas < 1:
        problems.append(f"{cluster}: --replicas must be at least 1, got {options.replicas}")
    new_bytes = sum(p.message_bytes for p in plans if p.state == "new")
    for node in running:
        if node.get("mem_alarm") or node.get("disk_free_alarm"):
            problems.append(f"{cluster} node {node['name']}: a memory or disk alarm is raised")
        free, limit = node.get("disk_free"), node.get("disk_free_limit")
        if isinstance(free, int) and isinstance(limit, int):
            needed = DISK_HEADROOM_FACTOR * new_bytes
            if free - limit < needed:
                problems.append(
                    f"{cluster} node {node['name']}: {free - limit} bytes free above the disk "
                    f"limit; expected at least {needed} for the quorum copies"
                )
    if problems and plans:
        plans[0].problems.extend(problems)


def raise_problems(plans: Iterable[QueueMigration]) -> None:
    """One error for every problem of every queue, one line each."""
    problems = [problem for plan in plans for problem in plan.problems]
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        lines = "\n  ".join(problems)
        raise MigrationError(f"migration pre-flight found {count}; nothing was changed:\n  {lines}")


# -- running -----------------------------------------------------------------------------


def migrate(
    spark: SparkSession,
    config: JobConfig,
    *,
    options: MigrationOptions | None = None,
    migration_id: str | None = None,
    after_phase: PhaseHook | None = None,
) -> MigrationResult:
    """Migrate every selected classic queue in place and finish any migration in progress.

    `after_phase` is called with each phase's name once it is done (tests stop the
    procedure there to simulate a crash). Raises MigrationError (pre-flight, a failed
    phase) or another RmqSparkError.
    """
    options = options or MigrationOptions()
    started = time.monotonic()
    cluster = migration_cluster(config)
    mid = validate_run_id(migration_id or new_migration_id())
    tables.ensure_tables(config.ledger.path)
    with management_clients(config) as clients:
        client = clients[cluster]
        versions = rabbitmq_versions({cluster: client})
        plans = plan_migration(config, client, options, mid)
        raise_problems(plans)
        _join_check(config, plans, mid)
        log_decisions(client.cluster_name, versions[cluster], plans)
        if options.consumers == "wait":
            _wait_for_no_consumers(client, [p for p in plans if p.state == "new"], options)
        batches: dict[str, list[QueueMigration]] = defaultdict(list)
        for plan in plans:
            batches[plan.migration_id].append(plan)
        runs: list[RunResult] = []
        for batch_id, batch in sorted(batches.items()):
            batch.sort(key=lambda p: (p.vhost, p.queue))
            runs.extend(
                _run_batch(
                    spark,
                    config,
                    client,
                    cluster=cluster,
                    mid=batch_id,
                    batch=batch,
                    after_phase=after_phase,
                )
            )
    outcomes = prove(config.ledger.path, plans)
    live = {r.run_id: r.verification.live_arrivals for r in runs if r.verification.live_arrivals}
    result = MigrationResult(
        tuple(outcomes), tuple(runs), time.monotonic() - started, live, versions
    )
    log.info(
        "migration: %d queue(s) in %.1f s, verified %s",
        len(outcomes),
        result.seconds,
        result.verified,
    )
    return result


def log_decisions(cluster: str, version: str, plans: Iterable[QueueMigration]) -> None:
    """One line per argument the quorum queue will not carry as it is, saying why."""
    for plan in plans:
        for decision in plan.decisions:
            if decision.action in ("dropped", "translated", "added"):
                log.info(
                    "cluster %s (RabbitMQ %s) %s: argument %s",
                    cluster,
                    version,
                    plan.where,
                    decision.describe(),
                )


def _join_check(config: JobConfig, plans: list[QueueMigration], mid: str) -> None:
    """New queues may join a migration id in progress only before its first hop."""
    resumed_ids = {p.migration_id for p in plans if p.state == "in progress"}
    new = [p for p in plans if p.state == "new"]
    if mid in resumed_ids and new and tables.read_rows(config.ledger.path, "plans", f"{mid}-out"):
        names = ", ".join(f"{p.vhost}/{p.queue}" for p in new[:5])
        raise MigrationError(
            f"migration {mid} is already moving messages; queue(s) {names} cannot join it: "
            "re-run without these queues to finish it, then migrate them with another id"
        )


def _wait_for_no_consumers(
    client: ManagementClient, plans: list[QueueMigration], options: MigrationOptions
) -> None:
    deadline = time.monotonic() + options.consumer_wait_seconds
    for plan in plans:
        while True:
            queue = client.queue(plan.vhost, plan.queue) or {}
            consumers = int(queue.get("consumers") or 0)
            if not consumers:
                break
            if time.monotonic() > deadline:
                raise MigrationError(
                    f"cluster {client.cluster_name} {plan.where}: still {consumers} consumer(s) "
                    f"after {options.consumer_wait_seconds:.0f} s (--consumers wait)"
                )
            time.sleep(_CONSUMER_POLL_SECONDS)


def _run_batch(
    spark: SparkSession,
    config: JobConfig,
    client: ManagementClient,
    *,
    cluster: str,
    mid: str,
    batch: list[QueueMigration],
    after_phase: PhaseHook | None,
) -> list[RunResult]:
    log.info("migration %s: %d queue(s)", mid, len(batch))
    hook = after_phase or (lambda _phase: None)
    runs: list[RunResult] = []

    def hop(name: str, pairs: list[tuple[str, str, str]]) -> None:
        result = _hop(
            spark, config, cluster, f"{mid}-{name}", pairs, live_destination=name == HOP_HELD
        )
        if result is not None:
            runs.append(result)

    for plan in batch:
        _prepare(client, plan)
    hook("prepare")
    for plan in batch:
        _hold(client, plan)
    hook("hold")
    hop(HOP_OUT, [(p.vhost, p.queue, p.temp) for p in batch])
    hook("move-out")
    for plan in batch:
        _recreate(config, client, cluster, plan)
    hook("recreate")
    hop(HOP_BACK, [(p.vhost, p.temp, p.queue) for p in batch])
    hook("move-back")
    for plan in batch:
        _rebind(client, plan)
    hook("rebind")
    hop(HOP_HELD, [(p.vhost, p.holding, p.queue) for p in batch])
    hook("drain-holding")
    for plan in batch:
        _cleanup(config, client, cluster, plan)
    hook("cleanup")
    return runs


def _queue_type(queue: Mapping[str, Any] | None) -> str | None:
    return None if queue is None else str(queue.get("type") or "classic")


def _prepare(client: ManagementClient, plan: QueueMigration) -> None:
    """T with the saved state, and H, both quorum; idempotent (T's marker is kept)."""
    temp = client.queue(plan.vhost, plan.temp)
    if temp is None:
        if _queue_type(client.queue(plan.vhost, plan.queue)) != "classic":
            raise MigrationError(
                f"cluster {client.cluster_name} {plan.where}: expected the classic queue to "
                "start a migration; it is gone or changed type"
            )
        client.declare_queue(
            plan.vhost, plan.temp, durable=True, arguments=_helper_arguments(plan, marker=True)
        )
        log.info("%s: temporary queue %r declared", plan.where, plan.temp)
    if _queue_type(client.queue(plan.vhost, plan.queue)) == "classic":
        client.declare_queue(
            plan.vhost, plan.holding, durable=True, arguments=_helper_arguments(plan, marker=False)
        )


def _helper_arguments(plan: QueueMigration, *, marker: bool) -> dict[str, Any]:
    """Quorum, with the replica count, and no limit, TTL or dead-lettering of its own."""
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    size = plan.quorum_arguments.get("x-quorum-initial-group-size")
    if size is not None:
        arguments["x-quorum-initial-group-size"] = size
    if marker:
        arguments[MARKER_ARGUMENT] = plan.marker()
    return arguments


def _hold(client: ManagementClient, plan: QueueMigration) -> None:
    """While Q is classic: H takes Q's bindings (bound first, so nothing is unroutable)."""
    if _queue_type(client.queue(plan.vhost, plan.queue)) != "classic":
        return
    saved = {_binding_key(b) for b in plan.bindings}
    added = [
        b for b in client.queue_bindings(plan.vhost, plan.queue) if _binding_key(b) not in saved
    ]
    if added:
        # Unbinding them would lose them: the saved state is what gets restored.
        names = ", ".join(f"{b['source']!r} key {b.get('routing_key', '')!r}" for b in added[:5])
        raise MigrationError(
            f"cluster {client.cluster_name} {plan.where}: bound since its migration "
            f"started (from {names}); remove the new binding(s), re-run, and add them to "
            "the quorum queue afterwards"
        )
    for binding in plan.bindings:
        client.bind_queue(
            plan.vhost,
            binding["source"],
            plan.holding,
            binding["routing_key"],
            binding["arguments"],
        )
    for binding in client.queue_bindings(plan.vhost, plan.queue):
        client.unbind_queue(plan.vhost, binding["source"], plan.queue, binding["properties_key"])


def _binding_key(binding: Mapping[str, Any]) -> tuple[str, str, str]:
    return (
        str(binding["source"]),
        str(binding.get("routing_key", "")),
        json.dumps(binding.get("arguments") or {}, sort_keys=True),
    )


def _recreate(
    config: JobConfig, client: ManagementClient, cluster: str, plan: QueueMigration
) -> None:
    """Delete the (drained) classic Q and declare it again as a quorum queue, unbound."""
    queue = client.queue(plan.vhost, plan.queue)
    if _queue_type(queue) == "classic":
        left = queue_depths(cluster, config.clusters[cluster], plan.vhost, [plan.queue])
        if left.get(plan.queue):
            raise MigrationError(
                f"cluster {cluster} {plan.where}: {left[plan.queue]} message(s) reached the "
                "classic queue after its move out (a publisher using the default exchange "
                "with the queue's name?); stop it, move them into "
                f"{plan.temp!r} (rmq-spark transfer), then re-run"
            )
        client.delete_queue(plan.vhost, plan.queue, if_empty=True)
        log.info("%s: classic queue deleted", plan.where)
        queue = None
    if queue is None:
        client.declare_queue(plan.vhost, plan.queue, durable=True, arguments=plan.quorum_arguments)
        log.info("%s: declared as a quorum queue %s", plan.where, plan.quorum_arguments)


def _rebind(client: ManagementClient, plan: QueueMigration) -> None:
    """Q takes the saved bindings back (bound first), then H lets go of them."""
    for binding in plan.bindings:
        client.bind_queue(
            plan.vhost, binding["source"], plan.queue, binding["routing_key"], binding["arguments"]
        )
    if client.queue(plan.vhost, plan.holding) is not None:
        for binding in client.queue_bindings(plan.vhost, plan.holding):
            client.unbind_queue(
                plan.vhost, binding["source"], plan.holding, binding["properties_key"]
            )


def _cleanup(
    config: JobConfig, client: ManagementClient, cluster: str, plan: QueueMigration
) -> None:
    """Delete H, then T (the saved state) last; each only when exactly empty and unbound."""
    for helper in (plan.holding, plan.temp):
        if client.queue(plan.vhost, helper) is None:
            continue
        left = queue_depths(cluster, config.clusters[cluster], plan.vhost, [helper]).get(helper)
        if client.queue_bindings(plan.vhost, helper):
            raise MigrationError(
                f"cluster {cluster} {plan.where}: helper queue {helper!r} is still bound; "
                "re-run to finish the rebind"
            )
        # The count alone is not proof: a busy quorum leader is counted as empty.
        if left or not queue_is_empty(cluster, config.clusters[cluster], plan.vhost, helper):
            raise MigrationError(
                f"cluster {cluster} {plan.where}: helper queue {helper!r} still holds "
                f"{left or 'at least 1'} message(s); re-run to move them"
            )
        # Quorum queues refuse queue.delete with if-empty, hence the get just before;
        # no binding routes to a helper queue any more, so it stays empty.
        client.delete_queue(plan.vhost, helper, if_empty=False)
    log.info("%s: migrated", plan.where)


def _hop(
    spark: SparkSession,
    config: JobConfig,
    cluster: str,
    run_id: str,
    pairs: list[tuple[str, str, str]],
    *,
    live_destination: bool = False,
) -> RunResult | None:
    """One ledgered, verified transfer run for every (vhost, source, destination) pair.

    Skipped when the ledger records the run as verified; a crashed run is resumed by
    running the same run id again (the same routes, so the same config digest). A hop
    into the live queues (`live_destination`) declares them shared: publishers' messages
    arriving during the hop are counted as live arrivals, every other check holds.
    """
    done = [row for row in tables.read_rows(config.ledger.path, "runs", run_id) if row["verified"]]
    if done:
        log.info("run %s: already verified; not run again", run_id)
        return None
    routes = [
        RouteConfig(
            name=f"{run_id}-{index:05d}",
            source=SourceSelector(
                cluster=cluster,
                vhosts=[vhost],
                queues=[source],
                queue_types=["classic", "quorum"],
                min_messages=0,
            ),
            destination=DestinationSpec(
                cluster=cluster,
                queue=_literal(destination),
                create_missing=False,
                queue_type="quorum",
                priorities="drop",
                shared=live_destination,
            ),
        )
        for index, (vhost, source, destination) in enumerate(pairs)
    ]
    hop_config = config.model_copy(update={"routes": routes, "federation": "keep"})
    result = run_transfer(spark, hop_config, run_id=run_id)
    if result.verification.live_arrivals:
        log.info(
            "run %s: %d message(s) from live publishers reached the final queues during "
            "the hop (counted by verification as live arrivals)",
            run_id,
            result.verification.live_arrivals,
        )
    if not result.verification.verified:
        failed = "; ".join(result.verification.failed_expectations[:5])
        raise MigrationError(
            f"run {run_id}: verification failed ({failed}); nothing more was changed, see "
            f"{result.verification.results_path}"
        )
    return result


def _literal(name: str) -> str:
    """A queue name as a destination template (braces escaped)."""
    return name.replace("{", "{{").replace("}", "}}")


# -- proof -------------------------------------------------------------------------------


def prove(ledger_path: str, plans: Sequence[QueueMigration]) -> list[QueueOutcome]:
    """Per queue, from the ledger: every message moved out was moved back.

    Compares the multisets of (body, property bytes) checksums of the distinct confirmed
    rows of the out hop with the confirmed rows of the back hop.
    """
    outcomes = []
    by_run: dict[str, list[dict[str, Any]]] = {}

    def rows(run_id: str) -> list[dict[str, Any]]:
        if run_id not in by_run:
            try:
                table = tables.read_arrow(
                    ledger_path,
                    "messages",
                    run_id=run_id,
                    columns=[
                        "source_vhost",
                        "source_queue",
                        "position",
                        "redelivered",
                        "confirmed_at",
                        "body_sha256",
                        "properties_sha256",
                    ],
                )
                by_run[run_id] = table.to_pylist()
            except RmqSparkError:
                by_run[run_id] = []
        return by_run[run_id]

    for plan in plans:
        mid = plan.migration_id
        out, out_dups = _distinct(rows(f"{mid}-{HOP_OUT}"), plan.vhost, plan.queue)
        back, back_dups = _distinct(rows(f"{mid}-{HOP_BACK}"), plan.vhost, plan.temp)
        held, held_dups = _distinct(rows(f"{mid}-{HOP_HELD}"), plan.vhost, plan.holding)
        outcomes.append(
            QueueOutcome(
                vhost=plan.vhost,
                queue=plan.queue,
                migration_id=mid,
                moved_out=sum(out.values()),
                moved_back=sum(back.values()),
                held=sum(held.values()),
                missing=sum((out - back).values()),
                duplicates=out_dups + back_dups + held_dups,
                bindings=len(plan.bindings),
            )
        )
    return outcomes


def _distinct(
    rows: list[dict[str, Any]], vhost: str, source_queue: str
) -> tuple[Counter[tuple[str, str]], int]:
    """Confirmed rows of one source queue, without the redelivered repeats (counted)."""
    distinct: Counter[tuple[str, str]] = Counter()
    duplicates = 0
    mine = [r for r in rows if r["source_vhost"] == vhost and r["source_queue"] == source_queue]
    for row in sorted(mine, key=lambda r: r["position"]):
        if row["confirmed_at"] is None:
            continue
        fingerprint = (row["body_sha256"], row["properties_sha256"])
        if row["redelivered"] and distinct[fingerprint]:
            duplicates += 1
            continue
        distinct[fingerprint] += 1
    return distinct, duplicates
