"""What a destination queue needs besides its messages, translated for its RabbitMQ.

A blue-green move (a 3.x cluster drained into a new 4.x one, or back) leaves the new
cluster usable only if the moved queues arrive with what made them work on the old
one: their arguments, the exchanges they are bound from, their bindings and the
policies that applied to them. A queue's arguments are translated by the one table in
`rmq_spark.planning.queue_arguments` (which `rmq-spark migrate` reads too); policies
here, measured on RabbitMQ 3.10.8 and 4.3.6 (`tests/integration/test_blue_green.py`):

* 4.3 refuses the policy keys `queue-version: 1` and `queue-master-locator` (the
  deprecated feature `queue_master_locator` is denied by default);
* 4.0 removed classic mirroring: a policy with `ha-*` keys is refused;
* 3.12 and later ignore `queue-mode`.

The functions here are pure: `translate_policy` (and the table's
`translate_queue_arguments`) decide per key (kept, translated, dropped or refused,
each with its reason), and `exchange_differences` / `policy_differences` say why
an existing definition is not the one wanted. `rmq_spark.planning.topology.TopologyCopy`
and pre-flight read the brokers, call them, and write only when nothing was refused.
Federation keys are never copied: upstreams hold credentials and name the old
cluster's peers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.planning.queue_arguments import (
    CQV1_REMOVED_IN,
    LEADER_LOCATOR,
    MASTER_LOCATOR_DEPRECATED_IN,
    QUEUE_MODE_IGNORED_FROM,
    Action,
    Decision,
    at_least,
    parse_version,
    translate_queue_arguments,
)

__all__ = ["Action", "Decision", "parse_version", "translate_queue_arguments"]

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
_MIRRORING_REMOVED_IN = (4, 0)


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
        elif key in MIRRORING_POLICY_KEYS and at_least(version, _MIRRORING_REMOVED_IN):
            drop(
                key,
                value,
                f"RabbitMQ {destination_version} refuses it (classic mirroring was removed "
                "in 4.0; quorum queues replicate by themselves)",
            )
        elif key == "queue-mode" and at_least(version, QUEUE_MODE_IGNORED_FROM):
            drop(key, value, f"RabbitMQ {destination_version} ignores it (from 3.12)")
        elif key == "queue-version" and value != 2 and at_least(version, CQV1_REMOVED_IN):
            drop(key, value, f"RabbitMQ {destination_version} has classic queue version 2 only")
        elif key == "queue-master-locator" and at_least(version, MASTER_LOCATOR_DEPRECATED_IN):
            if "queue-leader-locator" in definition:
                drop(key, value, "deprecated from 4.0, refused by 4.3; queue-leader-locator kept")
                continue
            locator = LEADER_LOCATOR.get(str(value), "balanced")
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
