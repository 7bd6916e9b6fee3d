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
the one wanted. `rmq_spark.planning.topology.TopologyCopy` and pre-flight read the
brokers, call them, and write only when nothing was refused. Federation keys are
never copied: upstreams hold credentials and name the old cluster's peers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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
