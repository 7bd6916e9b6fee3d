"""Copying what a moved queue needs besides its messages: exchanges, bindings, policy.

`TopologyCopy` reads the source queue's bindings, the exchanges they come from and the
policy that applies to it, compares them with the destination (the pure translation
and comparisons are in rmq_spark.planning.topology_rules), reports every conflict as a
pre-flight problem, and writes only what is missing once pre-flight passed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rmq_spark.broker.management import ManagementClient
from rmq_spark.errors import DestinationIncompatibleError, RmqSparkError
from rmq_spark.model import TransferKey
from rmq_spark.planning.topology_rules import (
    BindingSpec,
    ExchangeSpec,
    PolicySpec,
    exchange_differences,
    policy_differences,
    translate_policy,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CopyRequest:
    """One moved queue whose topology goes with it (destination.topology: copy)."""

    route: str
    key: TransferKey
    #: The user policy that applies to the source queue (management API `policy`).
    source_policy: str | None
    destination_exists: bool
    #: Messages the destination will hold after the move (its own plus the source's).
    messages_after: int
    bytes_after: int

    @property
    def source_label(self) -> str:
        return (
            f"cluster {self.key.source_cluster} vhost {self.key.source_vhost!r} "
            f"queue {self.key.source_queue!r}"
        )


class TopologyCopy:
    """Plans the exchanges, bindings and policies the moved queues need, then writes them.

    `plan` reads both sides and reports every conflict through `problem` (an existing
    exchange or policy of the same name that differs, an exchange type the destination
    lacks, a copied length limit without room); nothing is written then. `declare`
    writes the missing policies and exchanges (before the queues are created, so a
    policy the broker refuses stops the job before any queue exists), `bind` the
    missing bindings. What exists already, identical, is left alone: a re-run writes
    nothing.
    """

    def __init__(
        self,
        clients: Mapping[str, ManagementClient],
        *,
        version_of: Callable[[str], str],
        problem: Callable[[RmqSparkError], None],
    ) -> None:
        self._clients = clients
        self._version_of = version_of
        self._problem = problem
        self._exchanges: dict[tuple[str, str, str], tuple[ExchangeSpec, str]] = {}
        self._exchanges_to_declare: list[tuple[str, ExchangeSpec]] = []
        self._bindings: dict[tuple[str, tuple[str, str, str, str, str]], BindingSpec] = {}
        self._bindings_to_add: list[tuple[str, BindingSpec]] = []
        self._policies: dict[tuple[str, str, str], tuple[PolicySpec, str]] = {}
        self._policies_to_put: list[tuple[str, PolicySpec]] = []
        # Policies with nothing left once translated (mirroring only, on 4.x).
        self._empty_policies: set[tuple[str, str, str]] = set()
        self._source_exchanges: dict[tuple[str, str, str], dict[str, Any] | None] = {}
        self._policy_rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._exchange_types: dict[str, list[str]] = {}

    # -- planning -------------------------------------------------------------------

    def plan(self, requests: list[CopyRequest]) -> None:
        """Read what each request needs and what the destination has; report conflicts."""
        for request in requests:
            try:
                self._plan_bindings(request)
                self._plan_policy(request)
            except RmqSparkError as exc:
                self._problem(exc)
        log.info(
            "topology copy: %d exchange(s), %d binding(s), %d polic(y/ies) to create; "
            "the rest exist already",
            len(self._exchanges_to_declare),
            len(self._bindings_to_add),
            len(self._policies_to_put),
        )

    def _plan_bindings(self, request: CopyRequest) -> None:
        source = self._clients[request.key.source_cluster]
        destination = self._clients[request.key.destination_cluster]
        existing: set[tuple[str, str, str, str, str]] = set()
        if request.destination_exists:
            for row in destination.queue_bindings(
                request.key.destination_vhost, request.key.destination_queue
            ):
                existing.add(_binding_from_api(request, row).key())
        for row in source.queue_bindings(request.key.source_vhost, request.key.source_queue):
            exchange = str(row["source"])
            if not exchange.startswith("amq."):  # every vhost has the amq.* exchanges
                self._plan_exchange(request, exchange)
            binding = _binding_from_api(request, row)
            key = (request.key.destination_cluster, binding.key())
            if key in self._bindings or binding.key() in existing:
                continue
            self._bindings[key] = binding
            self._bindings_to_add.append((request.key.destination_cluster, binding))

    def _plan_exchange(self, request: CopyRequest, name: str) -> None:
        source = self._clients[request.key.source_cluster]
        destination = self._clients[request.key.destination_cluster]
        source_key = (request.key.source_cluster, request.key.source_vhost, name)
        if source_key not in self._source_exchanges:
            self._source_exchanges[source_key] = source.exchange(request.key.source_vhost, name)
            into = source.exchange_bindings_in(request.key.source_vhost, name)
            if into:
                log.warning(
                    "cluster %s vhost %r exchange %r: %d exchange-to-exchange binding(s) "
                    "into it are not copied (only the moved queues' own bindings are)",
                    request.key.source_cluster,
                    request.key.source_vhost,
                    name,
                    len(into),
                )
        row = self._source_exchanges[source_key]
        if row is None:
            return  # deleted since the binding was listed: its bindings went with it
        wanted = ExchangeSpec.from_api(request.key.destination_vhost, row)
        where = (
            f"cluster {request.key.destination_cluster} vhost {request.key.destination_vhost!r} "
            f"exchange {name!r}"
        )
        origin = f"{request.source_label} of route {request.route!r} is bound from it"
        key = (request.key.destination_cluster, request.key.destination_vhost, name)
        if key in self._exchanges:
            earlier, earlier_origin = self._exchanges[key]
            if not earlier.same_definition(wanted):
                self._problem(
                    _incompatible(
                        f"{where}: two source exchanges of this name differ "
                        f"({'; '.join(exchange_differences(wanted, earlier))}): {origin}, "
                        f"and {earlier_origin}"
                    )
                )
            return
        self._exchanges[key] = (wanted, origin)
        if request.key.destination_cluster not in self._exchange_types:
            self._exchange_types[request.key.destination_cluster] = destination.exchange_types()
        offered = self._exchange_types[request.key.destination_cluster]
        if wanted.type not in offered:
            self._problem(
                _incompatible(
                    f"{where}: type {wanted.type!r} is not offered by the destination "
                    f"(it has {', '.join(offered)}; is its plugin enabled?); {origin}"
                )
            )
            return
        found = destination.exchange(request.key.destination_vhost, name)
        if found is None:
            self._exchanges_to_declare.append((request.key.destination_cluster, wanted))
            return
        differences = exchange_differences(wanted, ExchangeSpec.from_api(wanted.vhost, found))
        if differences:
            self._problem(
                _incompatible(
                    f"{where}: exists with {'; '.join(differences)} like the source's; {origin}"
                )
            )

    def _plan_policy(self, request: CopyRequest) -> None:
        if not request.source_policy:
            return
        source = self._clients[request.key.source_cluster]
        destination = self._clients[request.key.destination_cluster]
        rows = self._policies_of(source, request.key.source_cluster, request.key.source_vhost)
        row = rows.get(request.source_policy)
        if row is None:
            return  # removed since the queue was listed: nothing applies any more
        version = self._version_of(request.key.destination_cluster)
        definition, decisions = translate_policy(
            row.get("definition") or {}, destination_version=version
        )
        name = request.source_policy
        where = (
            f"cluster {request.key.destination_cluster} vhost {request.key.destination_vhost!r} "
            f"policy {name!r}"
        )
        key = (request.key.destination_cluster, request.key.destination_vhost, name)
        if key not in self._policies and key not in self._empty_policies:
            for decision in decisions:
                if decision.action in ("dropped", "translated"):
                    log.info(
                        "%s (route %r, RabbitMQ %s): %s", where, request.route, version,
                        decision.describe(),
                    )  # fmt: skip
        if not definition:
            if key not in self._empty_policies:
                log.info(
                    "%s: nothing left to copy once translated for RabbitMQ %s; not created",
                    where,
                    version,
                )
                self._empty_policies.add(key)
            return
        wanted = PolicySpec.from_api(request.key.destination_vhost, row, definition)
        origin = f"it applies to {request.source_label} of route {request.route!r}"
        if not _pattern_matches(wanted.pattern, request.key.destination_queue):
            log.warning(
                "%s: its pattern %r does not match the destination queue %r, so it will not "
                "apply to it there",
                where,
                wanted.pattern,
                request.key.destination_queue,
            )
        self._check_room(request, wanted, where)
        if key in self._policies:
            earlier, earlier_origin = self._policies[key]
            if policy_differences(wanted, earlier):
                self._problem(
                    _incompatible(
                        f"{where}: two source policies of this name differ "
                        f"({'; '.join(policy_differences(wanted, earlier))}): {origin}, "
                        f"and {earlier_origin}"
                    )
                )
            return
        self._policies[key] = (wanted, origin)
        existing_rows = self._policies_of(
            destination, request.key.destination_cluster, request.key.destination_vhost
        )
        found = existing_rows.get(name)
        if found is None:
            self._policies_to_put.append((request.key.destination_cluster, wanted))
            return
        existing = PolicySpec.from_api(wanted.vhost, found, dict(found.get("definition") or {}))
        differences = policy_differences(wanted, existing)
        if differences:
            self._problem(
                _incompatible(
                    f"{where}: exists with {'; '.join(differences)} (the source's, translated "
                    f"for RabbitMQ {version}); {origin}"
                )
            )

    def _check_room(self, request: CopyRequest, policy: PolicySpec, where: str) -> None:
        """A copied length limit must leave room for what the destination will hold."""
        overflow = str(policy.definition.get("overflow") or "drop-head")
        for key, held, unit in (
            ("max-length", request.messages_after, "messages"),
            ("max-length-bytes", request.bytes_after, "bytes"),
        ):
            limit = policy.definition.get(key)
            if isinstance(limit, int) and not isinstance(limit, bool) and limit < held:
                self._problem(
                    _incompatible(
                        f"{where}: {key} {limit} (overflow {overflow}) would apply to "
                        f"cluster {request.key.destination_cluster} vhost "
                        f"{request.key.destination_vhost!r} "
                        f"queue {request.key.destination_queue!r}, "
                        f"which will hold {held} {unit} after the move of route "
                        f"{request.route!r}; expected room for them"
                    )
                )

    def _policies_of(
        self, client: ManagementClient, cluster: str, vhost: str
    ) -> dict[str, dict[str, Any]]:
        if (cluster, vhost) not in self._policy_rows:
            self._policy_rows[(cluster, vhost)] = {
                str(row["name"]): row for row in client.vhost_policies(vhost)
            }
        return self._policy_rows[(cluster, vhost)]

    # -- writing --------------------------------------------------------------------

    def declare(self) -> None:
        """Create the missing policies, then the missing exchanges."""
        for cluster, policy in self._policies_to_put:
            self._clients[cluster].put_policy(
                policy.vhost,
                policy.name,
                pattern=policy.pattern,
                apply_to=policy.apply_to,
                priority=policy.priority,
                definition=policy.definition,
            )
            log.info(
                "cluster %s vhost %r policy %r: created (pattern %r, apply-to %s, %s)",
                cluster,
                policy.vhost,
                policy.name,
                policy.pattern,
                policy.apply_to,
                policy.definition,
            )
        for cluster, exchange in self._exchanges_to_declare:
            self._clients[cluster].declare_exchange(
                exchange.vhost,
                exchange.name,
                type=exchange.type,
                durable=exchange.durable,
                auto_delete=exchange.auto_delete,
                internal=exchange.internal,
                arguments=exchange.arguments,
            )
            log.info(
                "cluster %s vhost %r exchange %r: created (%s)",
                cluster,
                exchange.vhost,
                exchange.name,
                exchange.type,
            )

    def bind(self, bind_queues: Callable[[str, str, list[BindingSpec]], None]) -> None:
        """Add the missing bindings (the destination queues exist by now).

        `bind_queues(cluster, vhost, bindings)` writes one vhost's (pre-flight binds
        over AMQP, where any queue name can be named; see rmq_spark.broker.declare).
        """
        by_vhost: dict[tuple[str, str], list[BindingSpec]] = {}
        for cluster, binding in self._bindings_to_add:
            by_vhost.setdefault((cluster, binding.vhost), []).append(binding)
        for (cluster, vhost), bindings in by_vhost.items():
            bind_queues(cluster, vhost, bindings)
        if self._bindings_to_add:
            log.info("topology copy: %d binding(s) created", len(self._bindings_to_add))


def _binding_from_api(request: CopyRequest, row: Mapping[str, Any]) -> BindingSpec:
    return BindingSpec(
        vhost=request.key.destination_vhost,
        exchange=str(row["source"]),
        queue=request.key.destination_queue,
        routing_key=str(row.get("routing_key", "")),
        arguments=dict(row.get("arguments") or {}),
    )


def _pattern_matches(pattern: str, name: str) -> bool:
    """RabbitMQ matches policy patterns unanchored; Erlang-only syntax counts as a match."""
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return True


def _incompatible(message: str) -> RmqSparkError:
    return DestinationIncompatibleError(message)
