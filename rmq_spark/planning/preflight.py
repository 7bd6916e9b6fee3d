"""Pre-flight: gather the brokers' facts, collect every problem, then create.

The steps, and what each problem says, are described in rmq_spark.planning.discovery.
Every problem is collected and raised as one error, one line each, naming the
cluster, vhost and queue. Only when there is none are missing destinations created
(and, with topology: copy, their policies, exchanges and bindings).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rmq_spark.broker.connection import amqp_username
from rmq_spark.broker.counts import probe_vhost
from rmq_spark.broker.delivery_limit import source_delivery_limit
from rmq_spark.broker.management import ManagementClient, Permissions
from rmq_spark.config import JobConfig, RouteConfig
from rmq_spark.errors import (
    AccessRefusedError,
    BrokerUnreachableError,
    DestinationIncompatibleError,
    DiscoveryError,
    PreflightError,
    RmqSparkError,
)
from rmq_spark.model import QueueTransfer
from rmq_spark.planning.rules import (
    _allows,
    _incompatibilities,
    _matching_queues,
    _queue_type,
    _transfer,
)
from rmq_spark.planning.topology import CopyRequest, TopologyCopy
from rmq_spark.planning.topology_rules import translate_queue_arguments

log = logging.getLogger(__name__)

# Queue arguments a destination created by rmq-spark inherits from its source
# (all of them with destination.topology: copy), translated for the destination's
# type and RabbitMQ version by topology.translate_queue_arguments.
_INHERITED_ARGUMENTS = ("x-queue-type", "x-max-priority", "x-queue-mode", "x-message-ttl")
# Publishing to a queue goes through the default exchange, which permissions call this.
_DEFAULT_EXCHANGE = "amq.default"


@dataclass
class _Candidate:
    """A selected source queue, with what the management API said about it."""

    transfer: QueueTransfer
    source: dict[str, Any]


@dataclass
class _Destination:
    """A destination queue: what exists, and how to declare it when it does not."""

    candidate: _Candidate
    existing: dict[str, Any] | None
    arguments: dict[str, Any] = field(default_factory=dict)
    create: bool = False


class _Preflight:
    """Collects every problem of the plan; `raise_problems` raises them as one error."""

    def __init__(self, config: JobConfig, clients: Mapping[str, ManagementClient]) -> None:
        self._config = config
        self._clients = clients
        self._problems: list[RmqSparkError] = []
        self._vhosts: dict[str, list[str] | None] = {}
        self._administrator: dict[str, bool] = {}
        # (cluster, vhost) -> exact depths, for the vhosts that opened over AMQP.
        self._opened: dict[tuple[str, str], dict[str, int]] = {}
        self._unreachable: set[str] = set()
        self._permission_cache: dict[tuple[str, str], Permissions | None] = {}
        self._versions: dict[str, str] = {}
        self._topology = TopologyCopy(
            clients, version_of=self._rabbitmq_version, problem=self.problem
        )

    # -- collecting -----------------------------------------------------------------

    def problem(self, error: RmqSparkError) -> None:
        log.debug("pre-flight problem: %s", error)
        self._problems.append(error)

    def raise_problems(self) -> None:
        """One error for everything found so far: its kind, or PreflightError if mixed."""
        if not self._problems:
            return
        problems = tuple(self._problems)
        kinds = {type(p) for p in problems}
        kind = kinds.pop() if len(kinds) == 1 else PreflightError
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        lines = "\n  ".join(str(p) for p in problems)
        error = kind(f"pre-flight found {count}; nothing was moved:\n  {lines}")
        error.problems = problems
        raise error from problems[0]

    def _rabbitmq_version(self, cluster: str) -> str:
        """The cluster's RabbitMQ version (management API overview), asked once."""
        if cluster not in self._versions:
            overview = self._clients[cluster].overview()
            self._versions[cluster] = str(overview.get("rabbitmq_version") or "unknown")
        return self._versions[cluster]

    # -- 1. clusters ----------------------------------------------------------------

    def check_clusters(self) -> None:
        """Each cluster of the plan answers and accepts the login; stops here if not."""
        for name in self._clusters_in_plan():
            client = self._clients[name]
            try:
                self._administrator[name] = client.whoami().is_administrator
            except RmqSparkError as exc:
                self.problem(exc)
                continue
            if not self._administrator[name]:
                log.info(
                    "cluster %s: user %r is not an administrator, so the API does not show "
                    "permissions; a missing one stops its queue when the job runs",
                    name,
                    client.username,
                )
        self.raise_problems()  # without the management API there is nothing to plan

    def _clusters_in_plan(self) -> list[str]:
        names: dict[str, None] = {}
        for route in self._config.routes:
            names[route.source.cluster] = None
            names[route.destination.cluster] = None
        return list(names)

    def _visible_vhosts(self, cluster: str) -> list[str] | None:
        if cluster not in self._vhosts:
            try:
                self._vhosts[cluster] = self._clients[cluster].vhosts()
            except RmqSparkError as exc:
                self.problem(exc)
                self._vhosts[cluster] = None
        return self._vhosts[cluster]

    # -- 2. sources -----------------------------------------------------------------

    def source_candidates(self) -> list[_Candidate]:
        """The queues each route selects, with exact depths where the vhost opened."""
        candidates: list[_Candidate] = []
        for route in self._config.routes:
            candidates.extend(self._route_candidates(route))
        by_vhost: dict[tuple[str, str], list[str]] = defaultdict(list)
        for c in candidates:
            by_vhost[(c.transfer.source_cluster, c.transfer.source_vhost)].append(
                c.transfer.source_queue
            )
        self._probe(by_vhost, role="source")
        result = []
        for c in candidates:
            t = c.transfer
            depths = self._opened.get((t.source_cluster, t.source_vhost))
            if depths is None:
                result.append(c)  # the vhost did not open (reported): sampled depth
            elif t.source_queue in depths:
                result.append(_Candidate(replace(t, messages=depths[t.source_queue]), c.source))
            # else: reported by the probe (gone since the API listed it)
        return result

    def _route_candidates(self, route: RouteConfig) -> list[_Candidate]:
        selector = route.source
        client = self._clients[selector.cluster]
        visible = self._visible_vhosts(selector.cluster)
        if visible is None:
            return []
        if "*" in selector.vhosts:
            vhosts = visible
        else:
            vhosts = []
            for vhost in selector.vhosts:
                if vhost in visible:
                    vhosts.append(vhost)
                else:
                    self.problem(
                        DiscoveryError(
                            f"cluster {selector.cluster} vhost {vhost!r}: source vhost not "
                            f"found (it does not exist or user {client.username!r} cannot "
                            f"see it); route {route.name!r} source.vhosts names it"
                        )
                    )
        result: list[_Candidate] = []
        for vhost in vhosts:
            try:
                queues = client.queues(vhost)
            except RmqSparkError as exc:
                self.problem(exc)
                continue
            chosen = (
                self._named_queues(route, vhost, queues)
                if selector.queues is not None
                else _matching_queues(route, queues)
            )
            result.extend(_Candidate(_transfer(route, vhost, q), q) for q in chosen)
        return result

    def _named_queues(
        self, route: RouteConfig, vhost: str, queues: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """source.queues: each named queue must exist and be one the mover can consume."""
        selector = route.source
        by_name = {q["name"]: q for q in queues}
        chosen = []
        for name in selector.queues or []:
            where = f"cluster {selector.cluster} vhost {vhost!r} queue {name!r}"
            queue = by_name.get(name)
            if queue is None:
                self.problem(
                    DiscoveryError(
                        f"{where}: source queue not found; route {route.name!r} "
                        "source.queues names it"
                    )
                )
            elif _queue_type(queue) not in selector.queue_types:
                self.problem(
                    DiscoveryError(
                        f"{where}: is a {_queue_type(queue)} queue; route {route.name!r} "
                        f"source.queue_types allows {list(selector.queue_types)}"
                    )
                )
            elif queue.get("exclusive"):
                self.problem(
                    DiscoveryError(
                        f"{where}: exclusive to another connection, so it cannot be consumed"
                    )
                )
            else:
                chosen.append(queue)
        return chosen

    def _probe(self, by_vhost: Mapping[tuple[str, str], Iterable[str]], *, role: str) -> None:
        """Open each vhost over AMQP and passive-declare its queues (login, exact depth)."""
        for (cluster, vhost), names in by_vhost.items():
            if cluster in self._unreachable:
                continue
            wanted = sorted(set(names))
            try:
                probe = probe_vhost(cluster, self._config.clusters[cluster], vhost, wanted)
            except BrokerUnreachableError as exc:
                self.problem(exc)
                self._unreachable.add(cluster)  # once per cluster, not once per vhost
                continue
            except RmqSparkError as exc:
                self.problem(exc)
                continue
            known = self._opened.setdefault((cluster, vhost), {})
            known.update(probe.depths)
            for queue, reason in sorted(probe.refused.items()):
                self.problem(
                    DiscoveryError(
                        f"cluster {cluster} vhost {vhost!r} queue {queue!r}: the {role} queue "
                        f"did not answer a passive declare ({reason})"
                    )
                )

    def select(self, candidates: list[_Candidate]) -> list[_Candidate]:
        """Drop queues below their route's min_messages (exact depth where known)."""
        selected = []
        for c in candidates:
            route = self._route(c.transfer.route)
            if c.transfer.messages >= route.source.min_messages:
                selected.append(c)
            elif route.source.queues is not None:
                log.info(
                    "%s: %d ready message(s), below min_messages %d; skipped",
                    c.transfer.describe(),
                    c.transfer.messages,
                    route.source.min_messages,
                )
        return selected

    def with_delivery_limits(self, selected: list[_Candidate]) -> list[_Candidate]:
        """Each quorum source with the delivery limit its broker applies (argument,
        policy and operator policy, or the version's default), for the movers."""
        result = []
        for c in selected:
            if _queue_type(c.source) != "quorum":
                result.append(c)
                continue
            found = source_delivery_limit(
                c.source, self._rabbitmq_version(c.transfer.source_cluster)
            )
            log.info("%s: %s", c.transfer.source_label, found.describe())
            transfer = replace(
                c.transfer, source_delivery_limit=found.limit, source_past_limit=found.past_limit
            )
            result.append(_Candidate(transfer, c.source))
        return result

    # -- 3. the plan as a whole -----------------------------------------------------

    def check_plan(self, selected: list[_Candidate]) -> None:
        """No loops, no queue selected twice, one source per destination, no chains."""
        sources: dict[tuple[str, str, str], str] = {}
        destinations: dict[tuple[str, str, str], QueueTransfer] = {}
        for t in (c.transfer for c in selected):
            source = (t.source_cluster, t.source_vhost, t.source_queue)
            destination = (t.destination_cluster, t.destination_vhost, t.destination_queue)
            if source == destination:
                self.problem(
                    DiscoveryError(
                        f"cluster {t.source_cluster} vhost {t.source_vhost!r} queue "
                        f"{t.source_queue!r}: route {t.route!r} moves it onto itself; expected a "
                        "destination other than the source"
                    )
                )
            if source in sources:
                self.problem(
                    DiscoveryError(
                        f"cluster {t.source_cluster} vhost {t.source_vhost!r} queue "
                        f"{t.source_queue!r}: selected by both route {sources[source]!r} and "
                        f"route {t.route!r}; expected one route per source queue"
                    )
                )
            sources[source] = t.route
            if destination in destinations:
                other = destinations[destination]
                self.problem(
                    DiscoveryError(
                        f"cluster {t.destination_cluster} vhost {t.destination_vhost!r} queue "
                        f"{t.destination_queue!r}: destination of both {other.describe()} and "
                        f"{t.describe()}; expected one source per destination (verification "
                        "counts each destination's rise against one source)"
                    )
                )
            destinations[destination] = t
        for destination, t in destinations.items():
            if destination in sources and destination != (
                t.source_cluster,
                t.source_vhost,
                t.source_queue,
            ):
                self.problem(
                    DiscoveryError(
                        f"cluster {t.destination_cluster} vhost {t.destination_vhost!r} queue "
                        f"{t.destination_queue!r}: destination of {t.describe()} is also a "
                        f"source (route {sources[destination]!r}); its messages would move twice"
                    )
                )

    # -- 4. destinations ------------------------------------------------------------

    def check_destinations(self, selected: list[_Candidate]) -> list[_Destination]:
        """Each destination exists and fits its source, or may be created like it."""
        destinations: list[_Destination] = []
        missing_vhosts: dict[tuple[str, str], list[str]] = defaultdict(list)
        # One listing per destination vhost, however many queues go there.
        listed: dict[tuple[str, str], dict[str, dict[str, Any]] | None] = {}
        for c in selected:
            t = c.transfer
            site = (t.destination_cluster, t.destination_vhost)
            visible = self._visible_vhosts(t.destination_cluster)
            if visible is None:
                continue
            if t.destination_vhost not in visible:
                missing_vhosts[site].append(t.route)
                continue
            if site not in listed:
                try:
                    queues = self._clients[t.destination_cluster].queues(t.destination_vhost)
                    listed[site] = {q["name"]: q for q in queues}
                except RmqSparkError as exc:
                    self.problem(exc)
                    listed[site] = None
            existing = listed[site]
            if existing is not None:
                destinations.append(_Destination(c, existing.get(t.destination_queue)))
        for (cluster, vhost), routes in missing_vhosts.items():
            route_names = ", ".join(repr(r) for r in sorted(set(routes)))
            self.problem(
                DestinationIncompatibleError(
                    f"cluster {cluster} vhost {vhost!r}: the destination vhost does not exist "
                    f"(or user {self._clients[cluster].username!r} cannot see it); "
                    f"{len(routes)} queue(s) of route(s) {route_names} go there"
                )
            )
        by_vhost: dict[tuple[str, str], list[str]] = defaultdict(list)
        for d in destinations:
            t = d.candidate.transfer
            names = by_vhost[(t.destination_cluster, t.destination_vhost)]
            if d.existing is not None:
                names.append(t.destination_queue)
        self._probe(by_vhost, role="destination")
        for d in destinations:
            self._check_destination(d)
        return destinations

    def _check_destination(self, d: _Destination) -> None:
        t = d.candidate.transfer
        route = self._route(t.route)
        site = (t.destination_cluster, t.destination_vhost)
        if site not in self._opened:
            return  # the vhost did not open; that problem is already reported
        where = (
            f"cluster {t.destination_cluster} vhost {t.destination_vhost!r} "
            f"queue {t.destination_queue!r}"
        )
        expected_type = route.destination.queue_type or t.source_type
        type_origin = (
            "destination.queue_type"
            if route.destination.queue_type
            else "the source's type; set destination.queue_type to move into another type"
        )
        source = d.candidate.source
        if d.existing is None:
            if not route.destination.create_missing:
                self.problem(
                    DestinationIncompatibleError(
                        f"{where}: missing, and create_missing is false for route {t.route!r}"
                    )
                )
                return
            source_arguments = source.get("arguments") or {}
            # topology: copy declares the destination like its source, every argument
            # translated; otherwise only the ones a transfer needs to keep its meaning.
            inherited = (
                dict(source_arguments)
                if route.destination.topology == "copy"
                else {k: v for k, v in source_arguments.items() if k in _INHERITED_ARGUMENTS}
            )
            version = self._rabbitmq_version(t.destination_cluster)
            arguments, decisions = translate_queue_arguments(
                inherited,
                destination_type=expected_type,
                destination_version=version,
                priorities=route.destination.priorities,
            )
            refused = [decision for decision in decisions if decision.action == "refused"]
            for decision in refused:
                self.problem(
                    DestinationIncompatibleError(
                        f"{where}: cannot be created as a {expected_type} queue ({type_origin}) "
                        f"like its source {t.source_label} (route {t.route!r}): argument "
                        f"{decision.key}={decision.value!r}: {decision.reason}"
                    )
                )
            if refused:
                return
            for decision in decisions:
                if decision.action in ("dropped", "translated"):
                    log.info(
                        "%s (route %r, RabbitMQ %s): source argument %s",
                        where,
                        t.route,
                        version,
                        decision.describe(),
                    )
            d.arguments, d.create = arguments, True
            return
        for reason in _incompatibilities(
            t,
            source,
            d.existing,
            destination_depth=self._opened[site].get(t.destination_queue),
            expected_type=expected_type,
            type_origin=type_origin,
            keep_priorities=route.destination.priorities == "keep",
        ):
            self.problem(DestinationIncompatibleError(f"{where}: {reason}"))

    # -- 5. permissions -------------------------------------------------------------

    def check_permissions(
        self, selected: list[_Candidate], destinations: list[_Destination]
    ) -> None:
        """Read on sources, write on the default exchange, configure where we create.

        Only where the API shows permissions (administrators) and the vhost opened; a
        user without permission entries there is authorised some other way (LDAP...).
        """
        reads: dict[tuple[str, str], list[str]] = defaultdict(list)
        for c in selected:
            t = c.transfer
            reads[(t.source_cluster, t.source_vhost)].append(t.source_queue)
        writes: dict[tuple[str, str], list[_Destination]] = defaultdict(list)
        for d in destinations:
            t = d.candidate.transfer
            writes[(t.destination_cluster, t.destination_vhost)].append(d)
        for (cluster, vhost), queues in reads.items():
            permissions = self._permissions(cluster, vhost)
            if permissions is None:
                continue
            user = amqp_username(self._config.clusters[cluster])
            for queue in sorted(set(queues)):
                if not _allows(permissions.read, queue):
                    self.problem(
                        AccessRefusedError(
                            f"cluster {cluster} vhost {vhost!r} queue {queue!r}: user {user!r} "
                            f"may not consume it; expected a read permission matching it, "
                            f"found {permissions.read!r}"
                        )
                    )
        for (cluster, vhost), group in writes.items():
            permissions = self._permissions(cluster, vhost)
            if permissions is None:
                continue
            user = amqp_username(self._config.clusters[cluster])
            if not _allows(permissions.write, _DEFAULT_EXCHANGE):
                names = sorted(d.candidate.transfer.destination_queue for d in group)
                self.problem(
                    AccessRefusedError(
                        f"cluster {cluster} vhost {vhost!r}: user {user!r} may not publish to "
                        f"queue(s) {', '.join(repr(n) for n in names[:5])}"
                        f"{' ...' if len(names) > 5 else ''}; expected a write permission "
                        f"matching {_DEFAULT_EXCHANGE!r}, found {permissions.write!r}"
                    )
                )
            for d in group:
                queue = d.candidate.transfer.destination_queue
                if d.create and not _allows(permissions.configure, queue):
                    self.problem(
                        AccessRefusedError(
                            f"cluster {cluster} vhost {vhost!r} queue {queue!r}: missing, and "
                            f"user {user!r} may not declare it; expected a configure "
                            f"permission matching it, found {permissions.configure!r}"
                        )
                    )

    def _permissions(self, cluster: str, vhost: str) -> Permissions | None:
        if not self._administrator.get(cluster) or (cluster, vhost) not in self._opened:
            return None
        if (cluster, vhost) not in self._permission_cache:
            user = amqp_username(self._config.clusters[cluster])
            try:
                found = self._clients[cluster].permissions(vhost, user)
            except RmqSparkError as exc:
                self.problem(exc)
                found = None
            self._permission_cache[(cluster, vhost)] = found
        return self._permission_cache[(cluster, vhost)]

    # -- 4b. topology (destination.topology: copy) ----------------------------------

    def check_topology(self, destinations: list[_Destination]) -> None:
        """The exchanges, bindings and policy each copied destination needs, checked."""
        requests = []
        for d in destinations:
            t = d.candidate.transfer
            site = (t.destination_cluster, t.destination_vhost)
            if self._route(t.route).destination.topology != "copy" or site not in self._opened:
                continue
            existing = d.existing or {}
            requests.append(
                CopyRequest(
                    route=t.route,
                    source_cluster=t.source_cluster,
                    source_vhost=t.source_vhost,
                    source_queue=t.source_queue,
                    source_policy=d.candidate.source.get("policy") or None,
                    destination_cluster=t.destination_cluster,
                    destination_vhost=t.destination_vhost,
                    destination_queue=t.destination_queue,
                    destination_exists=d.existing is not None,
                    messages_after=t.messages + (self._opened[site].get(t.destination_queue) or 0),
                    bytes_after=t.message_bytes + int(existing.get("message_bytes_ready") or 0),
                )
            )
        if requests:
            self._topology.plan(requests)

    def declare_topology(self) -> None:
        """Create the copied policies and exchanges (after all checks passed)."""
        try:
            self._topology.declare()
        except RmqSparkError as exc:
            self.problem(exc)
        self.raise_problems()

    def bind_topology(self) -> None:
        """Bind the destinations like their sources (once they exist)."""
        try:
            self._topology.bind()
        except RmqSparkError as exc:
            self.problem(exc)
        self.raise_problems()

    # -- creating -------------------------------------------------------------------

    def create_missing(self, destinations: list[_Destination]) -> None:
        """Declare every missing destination like its source (after all checks passed).

        A quorum destination is durable whatever its source (quorum queues are).
        """
        for d in destinations:
            if not d.create:
                continue
            t, source = d.candidate.transfer, d.candidate.source
            durable = d.arguments.get("x-queue-type") == "quorum" or bool(
                source.get("durable", True)
            )
            try:
                self._clients[t.destination_cluster].declare_queue(
                    t.destination_vhost,
                    t.destination_queue,
                    durable=durable,
                    arguments=d.arguments,
                )
            except RmqSparkError as exc:
                self.problem(exc)
                continue
            log.info(
                "cluster %s vhost %r queue %r: created (%s)",
                t.destination_cluster,
                t.destination_vhost,
                t.destination_queue,
                d.arguments,
            )
        self.raise_problems()

    def _route(self, name: str) -> RouteConfig:
        return next(route for route in self._config.routes if route.name == name)
