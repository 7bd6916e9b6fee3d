"""What a destination queue needs besides its messages, translated for its RabbitMQ.

A blue-green move (a 3.x cluster drained into a new 4.x one, or back) leaves the new
cluster usable only if the moved queues arrive with what made them work on the old
one: their arguments, the exchanges they are bound from, their bindings and the
policies that applied to them. Versions disagree about some of it, measured on
RabbitMQ 3.10.8 and 4.3.6 (`tests/integration/test_blue_green.py`) and read in the
4.3 source (`rabbit_classic_queue:capabilities/0`, `rabbit_amqqueue:declare_args/0`):

* 4.3 refuses `x-queue-version: 1` (CQv1 is gone) and `x-queue-master-locator`
  (the deprecated feature `queue_master_locator` is denied by default; the broker
  closes the whole connection), on declare and as policy keys;
* quorum queues refuse `x-queue-mode`, `x-queue-version`, `x-queue-master-locator`
  and `x-max-priority`; classic queues refuse the quorum-only arguments;
* 4.0 removed classic mirroring: a policy with `ha-*` keys is refused;
* 3.12 and later ignore `x-queue-mode` (4.3.6 accepts it on a classic queue,
  although 4.3's release notes announce its refusal).

The functions here are pure: `translate_queue_arguments` and `translate_policy`
decide per key (kept, translated, dropped or refused, each with its reason), and
`exchange_differences` / `policy_differences` say why an existing definition is not
the one wanted. `discovery` reads the brokers, calls them in pre-flight, and writes
only when nothing was refused. Federation keys are never copied: upstreams hold
credentials and name the old cluster's peers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rmq_spark.broker.management import ManagementClient
from rmq_spark.errors import DestinationIncompatibleError, RmqSparkError

log = logging.getLogger(__name__)

Action = Literal["kept", "translated", "dropped", "refused"]

# Classic mirroring was removed in 4.0; these policy keys are refused there.
MIRRORING_POLICY_KEYS = (
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
)
# Never copied: an upstream set or name refers to runtime parameters holding the
# upstream's URI (with its password) and naming the old cluster's peers.
FEDERATION_POLICY_KEYS = ("federation-upstream", "federation-upstream-set")
# Arguments only quorum queues take; a classic queue refuses them (or, for the
# delivery limit, has no such thing).
_QUORUM_ONLY_ARGUMENTS = {
    "x-dead-letter-strategy": "classic queues refuse it (at-least-once dead lettering is "
    "a quorum queue feature)",
    "x-max-in-memory-length": "classic queues refuse it (a quorum queue argument)",
    "x-max-in-memory-bytes": "classic queues refuse it (a quorum queue argument)",
    "x-quorum-initial-group-size": "classic queues refuse it (a quorum queue argument)",
    "x-delivery-limit": "classic queues have no delivery limit",
    "x-consumer-disconnected-timeout": "classic queues refuse it (a quorum queue argument)",
}
_STREAM_ONLY_ARGUMENTS = (
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-stream-filter-size-bytes",
    "x-initial-cluster-size",
)
# x-queue-master-locator's values, as leader locators (migrate.py translates alike).
_LEADER_LOCATOR = {"client-local": "client-local", "min-masters": "balanced", "random": "balanced"}

_QUEUE_MODE_IGNORED_FROM = (3, 12)
_MIRRORING_REMOVED_IN = (4, 0)
_MASTER_LOCATOR_DEPRECATED_IN = (4, 0)
_CLASSIC_LEADER_LOCATOR_FROM = (4, 0)
_CQV1_REMOVED_IN = (4, 3)
_CONSUMER_TIMEOUT_QUORUM_ONLY_FROM = (4, 3)


@dataclass(frozen=True)
class Decision:
    """What happens to one queue argument or policy key, and why."""

    key: str
    value: Any
    action: Action
    reason: str
    becomes: str | None = None

    def describe(self) -> str:
        change = f" -> {self.becomes}" if self.becomes else ""
        return f"{self.key}={self.value!r} {self.action}{change}: {self.reason}"


@dataclass(frozen=True)
class ExchangeSpec:
    """An exchange as the destination should have it (copied from the source)."""

    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_api(cls, vhost: str, row: Mapping[str, Any]) -> ExchangeSpec:
        return cls(
            vhost=vhost,
            name=str(row["name"]),
            type=str(row["type"]),
            durable=bool(row.get("durable", True)),
            auto_delete=bool(row.get("auto_delete", False)),
            internal=bool(row.get("internal", False)),
            arguments=dict(row.get("arguments") or {}),
        )

    def same_definition(self, other: ExchangeSpec) -> bool:
        return not exchange_differences(self, other)


@dataclass(frozen=True)
class BindingSpec:
    """A binding from an exchange to a destination queue."""

    vhost: str
    exchange: str
    queue: str
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple[str, str, str, str, str]:
        return (self.vhost, self.exchange, self.queue, self.routing_key, repr(self.arguments))


@dataclass(frozen=True)
class PolicySpec:
    """A policy as the destination should have it (translated from the source's)."""

    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: dict[str, Any]

    @classmethod
    def from_api(cls, vhost: str, row: Mapping[str, Any], definition: dict[str, Any]) -> PolicySpec:
        return cls(
            vhost=vhost,
            name=str(row["name"]),
            pattern=str(row.get("pattern", "")),
            apply_to=str(row.get("apply-to", "all")),
            priority=int(row.get("priority", 0)),
            definition=definition,
        )


def parse_version(rabbitmq_version: str) -> tuple[int, int] | None:
    """(major, minor) of a RabbitMQ version string; None when it is not one.

    >>> parse_version("4.3.6"), parse_version("unknown")
    ((4, 3), None)
    """
    try:
        major, minor = (int(part) for part in rabbitmq_version.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def _at_least(version: tuple[int, int] | None, release: tuple[int, int]) -> bool:
    """Whether a known version is `release` or later (unknown: no, keep what the source had)."""
    return version is not None and version >= release


def translate_queue_arguments(
    arguments: Mapping[str, Any],
    *,
    destination_type: str,
    destination_version: str,
    priorities: Literal["keep", "drop"] = "keep",
) -> tuple[dict[str, Any], list[Decision]]:
    """The arguments to declare a destination with, from its source's, and why.

    `x-queue-type` is the destination type. A "refused" decision means the queue
    cannot be created like its source: pre-flight reports it and nothing is declared.

    >>> args, decisions = translate_queue_arguments(
    ...     {"x-queue-version": 1, "x-message-ttl": 60000},
    ...     destination_type="classic", destination_version="4.3.6")
    >>> args
    {'x-message-ttl': 60000, 'x-queue-type': 'classic'}
    """
    version = parse_version(destination_version)
    quorum = destination_type == "quorum"
    result: dict[str, Any] = {}
    decisions: list[Decision] = []

    def drop(key: str, value: Any, reason: str) -> None:
        decisions.append(Decision(key, value, "dropped", reason))

    for key, value in sorted(arguments.items()):
        if key == "x-queue-type":
            continue
        if key == "x-queue-mode" and quorum:
            drop(key, value, "quorum queues refuse it (they keep every message on disk)")
        elif key == "x-queue-mode" and _at_least(version, _QUEUE_MODE_IGNORED_FROM):
            drop(
                key,
                value,
                f"RabbitMQ {destination_version} ignores it (from 3.12 every classic queue "
                "stores messages like a lazy one)",
            )
        elif key == "x-queue-version" and quorum:
            drop(key, value, "quorum queues refuse it")
        elif key == "x-queue-version" and value != 2 and _at_least(version, _CQV1_REMOVED_IN):
            drop(
                key,
                value,
                f"RabbitMQ {destination_version} refuses it (4.3 removed classic queue "
                "version 1; every classic queue is version 2)",
            )
        elif key == "x-queue-master-locator" and (
            quorum or _at_least(version, _MASTER_LOCATOR_DEPRECATED_IN)
        ):
            reason = (
                "quorum queues refuse it"
                if quorum
                else "deprecated from 4.0, and RabbitMQ 4.3 refuses it on declare"
            )
            if "x-queue-leader-locator" in arguments:
                drop(key, value, f"{reason}; the source's x-queue-leader-locator is kept")
                continue
            locator = _LEADER_LOCATOR.get(str(value), "balanced")
            result["x-queue-leader-locator"] = locator
            decisions.append(
                Decision(key, value, "translated", reason, f"x-queue-leader-locator={locator}")
            )
        elif (
            key == "x-queue-leader-locator"
            and not quorum
            and version is not None
            and not _at_least(version, _CLASSIC_LEADER_LOCATOR_FROM)
        ):
            drop(key, value, f"classic queues on RabbitMQ {destination_version} refuse it")
        elif key == "x-max-priority" and quorum:
            if priorities == "drop":
                drop(
                    key,
                    value,
                    "quorum queues refuse it (destination.priorities: drop; messages keep "
                    "their priority property)",
                )
            else:
                decisions.append(
                    Decision(
                        key,
                        value,
                        "refused",
                        "quorum queues refuse it; expected a destination that keeps "
                        "priorities, or destination.priorities: drop",
                    )
                )
        elif key in _QUORUM_ONLY_ARGUMENTS and not quorum:
            drop(key, value, _QUORUM_ONLY_ARGUMENTS[key])
        elif (
            key == "x-consumer-timeout"
            and not quorum
            and _at_least(version, _CONSUMER_TIMEOUT_QUORUM_ONLY_FROM)
        ):
            drop(key, value, f"classic queues on RabbitMQ {destination_version} refuse it")
        elif key in _STREAM_ONLY_ARGUMENTS:
            drop(key, value, f"a stream argument; {destination_type} queues refuse it")
        else:
            result[key] = value
            decisions.append(Decision(key, value, "kept", "the destination takes it"))
    result["x-queue-type"] = destination_type
    return result, decisions


def translate_policy(
    definition: Mapping[str, Any], *, destination_version: str
) -> tuple[dict[str, Any], list[Decision]]:
    """A source policy's definition as the destination's RabbitMQ takes it, and why.

    >>> translate_policy({"ha-mode": "all", "message-ttl": 1000}, destination_version="4.3.6")[0]
    {'message-ttl': 1000}
    """
    version = parse_version(destination_version)
    result: dict[str, Any] = {}
    decisions: list[Decision] = []

    def drop(key: str, value: Any, reason: str) -> None:
        decisions.append(Decision(key, value, "dropped", reason))

    for key, value in sorted(definition.items()):
        if key in FEDERATION_POLICY_KEYS:
            drop(
                key,
                value,
                "federation is not copied: upstreams hold credentials and name the source "
                "cluster's peers; define the destination's federation there",
            )
        elif key in MIRRORING_POLICY_KEYS and _at_least(version, _MIRRORING_REMOVED_IN):
            drop(
                key,
                value,
                f"RabbitMQ {destination_version} refuses it (classic mirroring was removed "
                "in 4.0; quorum queues replicate by themselves)",
            )
        elif key == "queue-mode" and _at_least(version, _QUEUE_MODE_IGNORED_FROM):
            drop(key, value, f"RabbitMQ {destination_version} ignores it (from 3.12)")
        elif key == "queue-version" and value != 2 and _at_least(version, _CQV1_REMOVED_IN):
            drop(key, value, f"RabbitMQ {destination_version} has classic queue version 2 only")
        elif key == "queue-master-locator" and _at_least(version, _MASTER_LOCATOR_DEPRECATED_IN):
            if "queue-leader-locator" in definition:
                drop(key, value, "deprecated from 4.0, refused by 4.3; queue-leader-locator kept")
                continue
            locator = _LEADER_LOCATOR.get(str(value), "balanced")
            result["queue-leader-locator"] = locator
            decisions.append(
                Decision(
                    key,
                    value,
                    "translated",
                    "deprecated from 4.0, refused by 4.3",
                    f"queue-leader-locator={locator}",
                )
            )
        else:
            result[key] = value
            decisions.append(Decision(key, value, "kept", "the destination takes it"))
    return result, decisions


def exchange_differences(wanted: ExchangeSpec, existing: ExchangeSpec) -> list[str]:
    """Why an existing exchange is not the one wanted (a redeclare would be refused)."""
    differences = []
    for attribute in ("type", "durable", "auto_delete", "internal", "arguments"):
        want, found = getattr(wanted, attribute), getattr(existing, attribute)
        if want != found:
            differences.append(f"{attribute} {found!r}, expected {want!r}")
    return differences


def policy_differences(wanted: PolicySpec, existing: PolicySpec) -> list[str]:
    """Why an existing policy of the same name is not the translated one."""
    differences = []
    for attribute in ("pattern", "apply_to", "priority", "definition"):
        want, found = getattr(wanted, attribute), getattr(existing, attribute)
        if want != found:
            label = attribute.replace("_", "-")
            differences.append(f"{label} {found!r}, expected {want!r}")
    return differences


# -- reading the brokers and copying (pre-flight plans, then writes) ----------------------


@dataclass(frozen=True)
class CopyRequest:
    """One moved queue whose topology goes with it (destination.topology: copy)."""

    route: str
    source_cluster: str
    source_vhost: str
    source_queue: str
    #: The user policy that applies to the source queue (management API `policy`).
    source_policy: str | None
    destination_cluster: str
    destination_vhost: str
    destination_queue: str
    destination_exists: bool
    #: Messages the destination will hold after the move (its own plus the source's).
    messages_after: int
    bytes_after: int

    @property
    def source_label(self) -> str:
        return (
            f"cluster {self.source_cluster} vhost {self.source_vhost!r} queue {self.source_queue!r}"
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
        source = self._clients[request.source_cluster]
        destination = self._clients[request.destination_cluster]
        existing: set[tuple[str, str, str, str, str]] = set()
        if request.destination_exists:
            for row in destination.queue_bindings(
                request.destination_vhost, request.destination_queue
            ):
                existing.add(_binding_from_api(request, row).key())
        for row in source.queue_bindings(request.source_vhost, request.source_queue):
            exchange = str(row["source"])
            if not exchange.startswith("amq."):  # every vhost has the amq.* exchanges
                self._plan_exchange(request, exchange)
            binding = _binding_from_api(request, row)
            key = (request.destination_cluster, binding.key())
            if key in self._bindings or binding.key() in existing:
                continue
            self._bindings[key] = binding
            self._bindings_to_add.append((request.destination_cluster, binding))

    def _plan_exchange(self, request: CopyRequest, name: str) -> None:
        source = self._clients[request.source_cluster]
        destination = self._clients[request.destination_cluster]
        source_key = (request.source_cluster, request.source_vhost, name)
        if source_key not in self._source_exchanges:
            self._source_exchanges[source_key] = source.exchange(request.source_vhost, name)
            into = source.exchange_bindings_in(request.source_vhost, name)
            if into:
                log.warning(
                    "cluster %s vhost %r exchange %r: %d exchange-to-exchange binding(s) "
                    "into it are not copied (only the moved queues' own bindings are)",
                    request.source_cluster,
                    request.source_vhost,
                    name,
                    len(into),
                )
        row = self._source_exchanges[source_key]
        if row is None:
            return  # deleted since the binding was listed: its bindings went with it
        wanted = ExchangeSpec.from_api(request.destination_vhost, row)
        where = (
            f"cluster {request.destination_cluster} vhost {request.destination_vhost!r} "
            f"exchange {name!r}"
        )
        origin = f"{request.source_label} of route {request.route!r} is bound from it"
        key = (request.destination_cluster, request.destination_vhost, name)
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
        if request.destination_cluster not in self._exchange_types:
            self._exchange_types[request.destination_cluster] = destination.exchange_types()
        offered = self._exchange_types[request.destination_cluster]
        if wanted.type not in offered:
            self._problem(
                _incompatible(
                    f"{where}: type {wanted.type!r} is not offered by the destination "
                    f"(it has {', '.join(offered)}; is its plugin enabled?); {origin}"
                )
            )
            return
        found = destination.exchange(request.destination_vhost, name)
        if found is None:
            self._exchanges_to_declare.append((request.destination_cluster, wanted))
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
        source = self._clients[request.source_cluster]
        destination = self._clients[request.destination_cluster]
        rows = self._policies_of(source, request.source_cluster, request.source_vhost)
        row = rows.get(request.source_policy)
        if row is None:
            return  # removed since the queue was listed: nothing applies any more
        version = self._version_of(request.destination_cluster)
        definition, decisions = translate_policy(
            row.get("definition") or {}, destination_version=version
        )
        name = request.source_policy
        where = (
            f"cluster {request.destination_cluster} vhost {request.destination_vhost!r} "
            f"policy {name!r}"
        )
        key = (request.destination_cluster, request.destination_vhost, name)
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
        wanted = PolicySpec.from_api(request.destination_vhost, row, definition)
        origin = f"it applies to {request.source_label} of route {request.route!r}"
        if not _pattern_matches(wanted.pattern, request.destination_queue):
            log.warning(
                "%s: its pattern %r does not match the destination queue %r, so it will not "
                "apply to it there",
                where,
                wanted.pattern,
                request.destination_queue,
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
            destination, request.destination_cluster, request.destination_vhost
        )
        found = existing_rows.get(name)
        if found is None:
            self._policies_to_put.append((request.destination_cluster, wanted))
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
                        f"cluster {request.destination_cluster} vhost "
                        f"{request.destination_vhost!r} queue {request.destination_queue!r}, "
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

    def bind(self) -> None:
        """Add the missing bindings (the destination queues exist by now)."""
        for cluster, binding in self._bindings_to_add:
            self._clients[cluster].bind_queue(
                binding.vhost,
                binding.exchange,
                binding.queue,
                binding.routing_key,
                binding.arguments,
            )
        if self._bindings_to_add:
            log.info("topology copy: %d binding(s) created", len(self._bindings_to_add))


def _binding_from_api(request: CopyRequest, row: Mapping[str, Any]) -> BindingSpec:
    return BindingSpec(
        vhost=request.destination_vhost,
        exchange=str(row["source"]),
        queue=request.destination_queue,
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
