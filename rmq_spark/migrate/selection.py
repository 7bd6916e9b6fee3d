"""Which queues a migration takes, new and in progress, and the pre-flight problems of each."""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from rmq_spark.broker.management import ManagementClient, addressable
from rmq_spark.broker.policy_match import policy_applies
from rmq_spark.config import (
    JobConfig,
    RouteConfig,
)
from rmq_spark.errors import ConfigError, MigrationError
from rmq_spark.ledger import tables
from rmq_spark.migrate.arguments import ArgumentDecision, MigrationOptions, translate_arguments

log = logging.getLogger(__name__)

TEMP_PREFIX = "rmq-spark-migrating--"
HOLD_PREFIX = "rmq-spark-holding--"
MARKER_ARGUMENT = "x-rmq-spark-migration"
MAX_QUEUE_NAME_BYTES = 255
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


def migration_cluster(config: JobConfig) -> str:
    """The one cluster the config's routes select queues on (migration is in place)."""
    clusters = set()
    for index, route in enumerate(config.routes):
        if route.queue_destination.cluster != route.source.cluster:
            raise ConfigError(
                f"routes[{index}] ({route.name}): a migration is in place; expected "
                f"destination.cluster {route.source.cluster!r} like source.cluster, found "
                f"{route.queue_destination.cluster!r}"
            )
        if route.queue_destination.queue != "{queue}" or route.queue_destination.vhost != "{vhost}":
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
    *,
    rabbitmq_version: str | None = None,
) -> list[QueueMigration]:
    """The selected queues, new and in progress, each with its problems (not raised).

    New: a classic queue the routes select. In progress: a temporary queue with a
    marker whose original the routes select by name or pattern (the original may be
    gone, or already a quorum queue); it keeps its own migration id.
    """
    if rabbitmq_version is None:
        rabbitmq_version = str(client.overview().get("rabbitmq_version", "unknown"))
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
                _route_plans(
                    client,
                    route,
                    vhost,
                    options=options,
                    migration_id=migration_id,
                    rabbitmq_version=rabbitmq_version,
                )
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
    rabbitmq_version: str,
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
                rabbitmq_version=rabbitmq_version,
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
    rabbitmq_version: str,
) -> QueueMigration:
    name = str(queue["name"])
    arguments = dict(queue.get("arguments") or {})
    quorum, decisions = translate_arguments(arguments, options, rabbitmq_version=rabbitmq_version)
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
    if not addressable(name):
        plan.problems.append(
            f"{where}: the management API cannot name a queue {name!r} in its URL paths, "
            "and a migration deletes and re-declares the queue through them; refused "
            "(move its messages with `rmq-spark transfer` instead)"
        )
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
            if harmful and policy_applies(policy, helper):
                plan.problems.append(
                    f"{where}: policy {policy.get('name')!r} ({', '.join(harmful)}) would apply "
                    f"to the helper queue {helper!r} and could drop its messages; narrow its "
                    "pattern"
                )
    return plan


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


def join_check(config: JobConfig, plans: list[QueueMigration], mid: str) -> None:
    """New queues may join a migration id in progress only before its first hop."""
    resumed_ids = {p.migration_id for p in plans if p.state == "in progress"}
    new = [p for p in plans if p.state == "new"]
    if mid in resumed_ids and new and tables.read_rows(config.ledger.path, "plans", f"{mid}-out"):
        names = ", ".join(f"{p.vhost}/{p.queue}" for p in new[:5])
        raise MigrationError(
            f"migration {mid} is already moving messages; queue(s) {names} cannot join it: "
            "re-run without these queues to finish it, then migrate them with another id"
        )
