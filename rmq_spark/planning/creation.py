"""Pre-flight's last steps: what a run creates on the destinations (driver side).

Checked with everything else (`check_topology`, step 4b: the exchanges, bindings and
policy each copied destination needs), created only once pre-flight found no problem
(step 5): the copied policies and exchanges (`declare_topology`), the missing
destination queues (`create_missing`, over AMQP), then their bindings
(`bind_topology`). Every step skips what exists, so a re-run writes nothing.
`discovery.discover` runs them in that order; problems go to pre-flight's one error.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from rmq_spark.broker import declare
from rmq_spark.config import JobConfig, RouteConfig
from rmq_spark.errors import RmqSparkError
from rmq_spark.planning import rules
from rmq_spark.planning.topology import CopyRequest, TopologyCopy
from rmq_spark.planning.topology_rules import BindingSpec

if TYPE_CHECKING:
    from rmq_spark.planning.preflight import BrokerFacts, _Destination

# At most this many destination vhosts are declared into at once (a connection each).
PARALLEL_DECLARES = 8

log = logging.getLogger(__name__)


class DestinationCreation:
    """Creates what the destinations need, for one pre-flight (`preflight._Preflight`)."""

    def __init__(
        self,
        config: JobConfig,
        topology: TopologyCopy,
        *,
        facts: BrokerFacts,
        problem: Callable[[RmqSparkError], None],
        raise_problems: Callable[[], None],
    ) -> None:
        self._config = config
        self._topology = topology
        self.facts = facts
        self.problem = problem
        self.raise_problems = raise_problems

    # -- 4b. topology (destination.topology: copy) ----------------------------------

    def check_topology(self, destinations: list[_Destination]) -> None:
        """The exchanges, bindings and policy each copied destination needs, checked."""
        requests = []
        for d in destinations:
            t = d.candidate.transfer
            site = (t.destination_cluster, t.destination_vhost)
            copy = route_named(self._config, t.route).queue_destination.topology == "copy"
            if not copy or site not in self.facts.opened:
                continue
            existing = d.existing or {}
            held = self.facts.opened[site].get(t.destination_queue) or 0
            requests.append(
                CopyRequest(
                    route=t.route,
                    key=t.key,
                    source_policy=d.candidate.source.get("policy") or None,
                    destination_exists=d.existing is not None,
                    messages_after=t.messages + held,
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
        """Bind the destinations like their sources (once they exist), over AMQP."""

        def bind_queues(cluster: str, vhost: str, bindings: list[BindingSpec]) -> None:
            declare.bind_queues(
                cluster,
                self._config.clusters[cluster],
                vhost,
                [
                    declare.QueueBinding(b.exchange, b.queue, b.routing_key, b.arguments)
                    for b in bindings
                ],
            )

        try:
            self._topology.bind(bind_queues)
        except RmqSparkError as exc:
            self.problem(exc)
        self.raise_problems()

    # -- creating -------------------------------------------------------------------

    def create_missing(self, destinations: list[_Destination]) -> None:
        """Declare every missing destination like its source (after all checks passed).

        Over AMQP, one connection per destination vhost (rmq_spark.broker.declare: the
        management API cannot name a queue `.` or `..`). A quorum destination is
        durable whatever its source (quorum queues are).
        """
        by_vhost: dict[tuple[str, str], list[declare.QueueDeclaration]] = defaultdict(list)
        for d in destinations:
            if d.create:
                t = d.candidate.transfer
                by_vhost[(t.destination_cluster, t.destination_vhost)].append(
                    declare.QueueDeclaration(
                        t.destination_queue,
                        durable=rules.destination_durable(d.arguments, d.candidate.source),
                        arguments=d.arguments,
                    )
                )
        sites = list(by_vhost.items())

        def declare_site(
            site: tuple[tuple[str, str], list[declare.QueueDeclaration]],
        ) -> dict[str, RmqSparkError] | RmqSparkError:
            (cluster, vhost), queues = site
            try:
                return declare.declare_queues(
                    cluster, self._config.clusters[cluster], vhost, queues
                )
            except RmqSparkError as exc:
                return exc

        # A declare is a round trip the broker spends a queue's set-up on (10,000 queues
        # over 5 vhosts: seconds each): vhosts side by side, each on its own connection;
        # what each refused is then taken in order, as if declared one by one.
        workers = max(1, min(PARALLEL_DECLARES, len(sites)))
        with ThreadPoolExecutor(workers, thread_name_prefix="rmq-spark-declare") as pool:
            outcomes = list(pool.map(declare_site, sites))
        for ((cluster, vhost), queues), refused in zip(sites, outcomes, strict=True):
            if isinstance(refused, RmqSparkError):
                self.problem(refused)
                continue
            for queue in queues:
                if queue.name in refused:
                    self.problem(refused[queue.name])
                else:
                    log.info(
                        "cluster %s vhost %r queue %r: created (%s)",
                        cluster,
                        vhost,
                        queue.name,
                        dict(queue.arguments),
                    )
        self.raise_problems()


def route_named(config: JobConfig, name: str) -> RouteConfig:
    return next(route for route in config.routes if route.name == name)
