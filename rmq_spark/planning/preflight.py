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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from rmq_spark.broker.connection import amqp_username
from rmq_spark.broker.delivery_limit import source_delivery_limit
from rmq_spark.broker.management import ManagementClient, Permissions
from rmq_spark.config import JobConfig, RouteConfig
from rmq_spark.errors import (
    RmqSparkError,
)
from rmq_spark.model import QueueTransfer
from rmq_spark.planning import rules
from rmq_spark.planning.creation import DestinationCreation, route_named
from rmq_spark.planning.listings import QueueListings
from rmq_spark.planning.probes import probe_vhosts
from rmq_spark.planning.topology import TopologyCopy

log = logging.getLogger(__name__)


@dataclass
class BrokerFacts:
    """What pre-flight learned from the brokers, each asked once.

    The rules (rmq_spark.planning.rules) judge these; nothing here is a judgement.
    """

    #: cluster -> whether the user is an administrator (the API then shows permissions).
    administrator: dict[str, bool] = field(default_factory=dict)
    #: cluster -> the vhosts the user can see (None: the listing failed, reported).
    vhosts: dict[str, list[str] | None] = field(default_factory=dict)
    #: (cluster, vhost) -> the management API's queue rows, by name (None: the listing
    #: failed, reported).
    queues: dict[tuple[str, str], dict[str, dict[str, Any]] | None] = field(default_factory=dict)
    #: cluster -> RabbitMQ version (management API overview).
    versions: dict[str, str] = field(default_factory=dict)
    #: (cluster, vhost) -> exact depths, for the vhosts that opened over AMQP.
    opened: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    #: clusters whose AMQP did not answer (reported once).
    unreachable: set[str] = field(default_factory=set)
    #: (cluster, vhost) -> the user's permissions (None: none shown, or not asked).
    permissions: dict[tuple[str, str], Permissions | None] = field(default_factory=dict)


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
        self.facts = BrokerFacts()
        # One listing per vhost: pre-flight's steps 2 and 4 read them.
        self._listings = QueueListings(clients, self.facts, self.problem)
        # Steps 4b and 5: what the run creates, once every check has passed.
        self.creation = DestinationCreation(
            config,
            TopologyCopy(clients, version_of=self._rabbitmq_version, problem=self.problem),
            facts=self.facts,
            problem=self.problem,
            raise_problems=self.raise_problems,
        )

    # -- collecting -----------------------------------------------------------------

    def problem(self, error: RmqSparkError) -> None:
        log.debug("pre-flight problem: %s", error)
        self._problems.append(error)

    def raise_problems(self) -> None:
        """One error for everything found so far: its kind, or PreflightError if mixed."""
        error = rules.one_error(self._problems)
        if error is not None:
            raise error from self._problems[0]

    def problems(self, errors: Iterable[RmqSparkError]) -> None:
        for error in errors:
            self.problem(error)

    def _rabbitmq_version(self, cluster: str) -> str:
        """The cluster's RabbitMQ version (management API overview), asked once."""
        if cluster not in self.facts.versions:
            overview = self._clients[cluster].overview()
            self.facts.versions[cluster] = str(overview.get("rabbitmq_version") or "unknown")
        return self.facts.versions[cluster]

    # -- 1. clusters ----------------------------------------------------------------

    def check_clusters(self) -> None:
        """Each cluster of the plan answers and accepts the login; stops here if not."""
        for name in self._clusters_in_plan():
            client = self._clients[name]
            try:
                self.facts.administrator[name] = client.whoami().is_administrator
            except RmqSparkError as exc:
                self.problem(exc)
                continue
            if not self.facts.administrator[name]:
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
            if not route.parks:  # a park's destination is the ledger's table
                names[route.queue_destination.cluster] = None
        return list(names)

    def _visible_vhosts(self, cluster: str) -> list[str] | None:
        if cluster not in self.facts.vhosts:
            try:
                self.facts.vhosts[cluster] = self._clients[cluster].vhosts()
            except RmqSparkError as exc:
                self.problem(exc)
                self.facts.vhosts[cluster] = None
        return self.facts.vhosts[cluster]

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
        # The destinations' listings (step 4) meanwhile, on a thread of their own: with
        # thousands of queues each side takes seconds, usually of another cluster.
        destinations = [
            (c.transfer.destination_cluster, c.transfer.destination_vhost)
            for c in candidates
            if c.transfer.destination_cluster in self._clients  # not a park's table
        ]
        with ThreadPoolExecutor(1, thread_name_prefix="rmq-spark-listing") as pool:
            listed = pool.submit(self._listings.list_ahead, destinations)
            probe_vhosts(
                self._config, by_vhost, role="source", facts=self.facts, problem=self.problem
            )
            listed.result()
        result = []
        for c in candidates:
            t = c.transfer
            depths = self.facts.opened.get((t.source_cluster, t.source_vhost))
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
                    self.problem(rules.missing_source_vhost(route, vhost, client.username))
        result: list[_Candidate] = []
        for vhost in vhosts:
            rows = self._listings.rows(selector.cluster, vhost)
            if rows is None:
                continue
            queues = list(rows.values())
            if selector.queues is not None:
                chosen, problems = rules.named_queues(route, vhost, queues)
                self.problems(problems)
            else:
                chosen = rules.matching_queues(route, queues)
            result.extend(_Candidate(rules.queue_transfer(route, vhost, q), q) for q in chosen)
        return result

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
            if rules.queue_type(c.source) != "quorum":
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
        self.problems(rules.check_plan(c.transfer for c in selected))

    # -- 4. destinations ------------------------------------------------------------

    def check_destinations(self, selected: list[_Candidate]) -> list[_Destination]:
        """Each destination exists and fits its source, or may be created like it."""
        destinations: list[_Destination] = []
        missing_vhosts: dict[tuple[str, str], list[str]] = defaultdict(list)
        for c in selected:
            t = c.transfer
            site = (t.destination_cluster, t.destination_vhost)
            visible = self._visible_vhosts(t.destination_cluster)
            if visible is None:
                continue
            if t.destination_vhost not in visible:
                missing_vhosts[site].append(t.route)
                continue
            existing = self._listings.rows(*site)
            if existing is not None:
                destinations.append(_Destination(c, existing.get(t.destination_queue)))
        for (cluster, vhost), routes in missing_vhosts.items():
            username = self._clients[cluster].username
            self.problem(rules.missing_destination_vhost(cluster, vhost, username, routes))
        by_vhost: dict[tuple[str, str], list[str]] = defaultdict(list)
        for d in destinations:
            t = d.candidate.transfer
            names = by_vhost[(t.destination_cluster, t.destination_vhost)]
            if d.existing is not None:
                names.append(t.destination_queue)
        probe_vhosts(
            self._config, by_vhost, role="destination", facts=self.facts, problem=self.problem
        )
        for d in destinations:
            self._check_destination(d)
        return destinations

    def _check_destination(self, d: _Destination) -> None:
        t = d.candidate.transfer
        site = (t.destination_cluster, t.destination_vhost)
        if site not in self.facts.opened:
            return  # the vhost did not open; that problem is already reported
        version = self._rabbitmq_version(t.destination_cluster)
        check = rules.check_destination(
            t,
            self._route(t.route),
            d.candidate.source,
            d.existing,
            destination_depth=self.facts.opened[site].get(t.destination_queue),
            destination_version=version,
        )
        self.problems(check.problems)
        if check.problems:
            return
        for decision in check.decisions:
            if decision.action in ("dropped", "translated"):
                log.info(
                    "cluster %s vhost %r queue %r (route %r, RabbitMQ %s): source argument %s",
                    t.destination_cluster,
                    t.destination_vhost,
                    t.destination_queue,
                    t.route,
                    version,
                    decision.describe(),
                )
        d.arguments, d.create = check.arguments, check.create

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
            if permissions is not None:
                user = amqp_username(self._config.clusters[cluster])
                self.problems(rules.read_problems(cluster, vhost, user, permissions, queues))
        for (cluster, vhost), group in writes.items():
            permissions = self._permissions(cluster, vhost)
            if permissions is not None:
                user = amqp_username(self._config.clusters[cluster])
                wanted = [(d.candidate.transfer.destination_queue, d.create) for d in group]
                self.problems(rules.write_problems(cluster, vhost, user, permissions, wanted))

    def _permissions(self, cluster: str, vhost: str) -> Permissions | None:
        if not self.facts.administrator.get(cluster) or (cluster, vhost) not in self.facts.opened:
            return None
        if (cluster, vhost) not in self.facts.permissions:
            user = amqp_username(self._config.clusters[cluster])
            try:
                found = self._clients[cluster].permissions(vhost, user)
            except RmqSparkError as exc:
                self.problem(exc)
                found = None
            self.facts.permissions[(cluster, vhost)] = found
        return self.facts.permissions[(cluster, vhost)]

    def _route(self, name: str) -> RouteConfig:
        return route_named(self._config, name)
