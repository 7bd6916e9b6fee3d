"""Queue arguments and policies translated for the destination's RabbitMQ (pure).

The version facts behind each case were measured on RabbitMQ 3.10.8 and 4.3.6 (the
declares in tests/integration/test_blue_green.py) unless a comment says otherwise.
"""

from __future__ import annotations

from typing import Any

import pytest

from rmq_spark.errors import RmqSparkError
from rmq_spark.model import TransferKey
from rmq_spark.planning.topology import CopyRequest, TopologyCopy
from rmq_spark.planning.topology_rules import (
    ExchangeSpec,
    PolicySpec,
    exchange_differences,
    policy_differences,
    translate_policy,
    translate_queue_arguments,
)


def actions(arguments: dict[str, Any], destination_type: str, version: str) -> dict[str, str]:
    _, decisions = translate_queue_arguments(
        arguments, destination_type=destination_type, destination_version=version
    )
    return {d.key: d.action for d in decisions}


def test_a_3_10_classic_queue_becomes_a_4_3_quorum_queue_without_its_classic_arguments() -> None:
    arguments = {
        "x-queue-mode": "lazy",
        "x-queue-version": 1,
        "x-queue-master-locator": "min-masters",
        "x-message-ttl": 60_000,
        "x-max-length": 5_000,
        "x-dead-letter-exchange": "dlx",
        "app-owner": "billing",
    }

    translated, decisions = translate_queue_arguments(
        arguments, destination_type="quorum", destination_version="4.3.6"
    )

    assert translated == {
        "x-queue-type": "quorum",
        "x-queue-leader-locator": "balanced",
        "x-message-ttl": 60_000,
        "x-max-length": 5_000,
        "x-dead-letter-exchange": "dlx",
        "app-owner": "billing",
    }
    by_key = {d.key: d for d in decisions}
    assert by_key["x-queue-mode"].action == "dropped"
    assert "quorum queues refuse it" in by_key["x-queue-version"].reason
    assert by_key["x-queue-master-locator"].becomes == "x-queue-leader-locator=balanced"


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        # 3.10 takes all three as they are.
        ("3.10.8", {"x-queue-mode": "kept", "x-queue-version": "kept",
                    "x-queue-master-locator": "kept"}),
        # 4.0: mode ignored from 3.12, the master locator deprecated; version 1 still there.
        ("4.0.5", {"x-queue-mode": "dropped", "x-queue-version": "kept",
                   "x-queue-master-locator": "translated"}),
        # 4.3 refuses version 1 (406) and the master locator (541, the connection closes).
        ("4.3.6", {"x-queue-mode": "dropped", "x-queue-version": "dropped",
                   "x-queue-master-locator": "translated"}),
    ],
)  # fmt: skip
def test_classic_arguments_follow_the_destination_version(
    version: str, expected: dict[str, str]
) -> None:
    arguments = {"x-queue-mode": "lazy", "x-queue-version": 1, "x-queue-master-locator": "random"}

    assert actions(arguments, "classic", version) == expected


def test_queue_version_2_stays_on_4_3() -> None:
    assert actions({"x-queue-version": 2}, "classic", "4.3.6") == {"x-queue-version": "kept"}


def test_an_explicit_leader_locator_wins_over_the_translated_master_locator() -> None:
    translated, _ = translate_queue_arguments(
        {"x-queue-master-locator": "min-masters", "x-queue-leader-locator": "client-local"},
        destination_type="quorum",
        destination_version="4.3.6",
    )

    assert translated["x-queue-leader-locator"] == "client-local"
    assert "x-queue-master-locator" not in translated


def test_a_4_3_quorum_queue_rolls_back_into_a_3_10_classic_queue_without_quorum_arguments() -> None:
    arguments = {
        "x-queue-type": "quorum",
        "x-queue-leader-locator": "balanced",
        "x-delivery-limit": 50,
        "x-dead-letter-strategy": "at-least-once",
        "x-max-in-memory-length": 10,
        "x-quorum-initial-group-size": 3,
        "x-message-ttl": 1_000,
    }

    translated, _ = translate_queue_arguments(
        arguments, destination_type="classic", destination_version="3.10.8"
    )

    assert translated == {"x-queue-type": "classic", "x-message-ttl": 1_000}


def test_priorities_into_a_quorum_queue_are_refused_unless_dropped() -> None:
    _, kept = translate_queue_arguments(
        {"x-max-priority": 5}, destination_type="quorum", destination_version="4.3.6"
    )
    dropped, _ = translate_queue_arguments(
        {"x-max-priority": 5},
        destination_type="quorum",
        destination_version="4.3.6",
        priorities="drop",
    )

    assert [d.action for d in kept] == ["refused"]
    assert dropped == {"x-queue-type": "quorum"}


def test_an_unknown_destination_version_keeps_the_classic_arguments() -> None:
    assert actions({"x-queue-mode": "lazy"}, "classic", "unknown") == {"x-queue-mode": "kept"}


def test_a_mirrored_federated_policy_keeps_only_its_limits_on_4_3() -> None:
    definition = {
        "ha-mode": "exactly",
        "ha-params": 2,
        "ha-sync-mode": "automatic",
        "queue-mode": "lazy",
        "federation-upstream": "blue-peer",
        "message-ttl": 3_600_000,
        "max-length": 10_000,
    }

    translated, decisions = translate_policy(definition, destination_version="4.3.6")

    assert translated == {"message-ttl": 3_600_000, "max-length": 10_000}
    reasons = {d.key: d.reason for d in decisions}
    assert "classic mirroring was removed in 4.0" in reasons["ha-mode"]
    assert "federation is not copied" in reasons["federation-upstream"]


def test_a_policy_keeps_its_mirroring_on_a_3_x_destination() -> None:
    translated, _ = translate_policy(
        {"ha-mode": "all", "federation-upstream-set": "peers"}, destination_version="3.10.8"
    )

    assert translated == {"ha-mode": "all"}


def test_a_mirroring_only_policy_translates_to_nothing_on_4_x() -> None:
    translated, decisions = translate_policy(
        {"ha-mode": "all", "ha-sync-mode": "automatic"}, destination_version="4.0.5"
    )

    assert translated == {}
    assert {d.action for d in decisions} == {"dropped"}


def test_the_policy_master_locator_becomes_a_leader_locator_on_4_x() -> None:
    translated, _ = translate_policy(
        {"queue-master-locator": "client-local"}, destination_version="4.3.6"
    )

    assert translated == {"queue-leader-locator": "client-local"}


def test_exchange_differences_name_each_attribute() -> None:
    wanted = ExchangeSpec("v", "orders", "topic", True, False, False, {})
    found = ExchangeSpec("v", "orders", "fanout", False, False, False, {})

    assert exchange_differences(wanted, found) == [
        "type 'fanout', expected 'topic'",
        "durable False, expected True",
    ]
    assert exchange_differences(wanted, wanted) == []


def test_policy_differences_name_each_attribute() -> None:
    wanted = PolicySpec("v", "orders", "^orders", "queues", 1, {"max-length": 10})
    found = PolicySpec("v", "orders", "^orders", "all", 1, {"max-length": 20})

    assert policy_differences(wanted, found) == [
        "apply-to 'all', expected 'queues'",
        "definition {'max-length': 20}, expected {'max-length': 10}",
    ]


class ApiRows:
    """What one cluster's management API answers, for TopologyCopy's planning."""

    def __init__(
        self,
        *,
        bindings: dict[tuple[str, str], list[dict[str, Any]]] | None = None,
        exchanges: dict[tuple[str, str], dict[str, Any]] | None = None,
        policies: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self._bindings = bindings or {}
        self._exchanges = exchanges or {}
        self._policies = policies or {}
        self.policies_put: list[tuple[str, dict[str, Any]]] = []

    def queue_bindings(self, vhost: str, name: str) -> list[dict[str, Any]]:
        return self._bindings.get((vhost, name), [])

    def exchange(self, vhost: str, name: str) -> dict[str, Any] | None:
        return self._exchanges.get((vhost, name))

    def exchange_bindings_in(self, vhost: str, name: str) -> list[dict[str, Any]]:
        return []

    def vhost_policies(self, vhost: str) -> list[dict[str, Any]]:
        return self._policies.get(vhost, [])

    def exchange_types(self) -> list[str]:
        return ["direct", "fanout", "headers", "topic"]

    def put_policy(self, vhost: str, name: str, **policy: Any) -> None:
        self.policies_put.append((name, policy["definition"]))


def request(vhost: str, queue: str, policy: str | None, **overrides: Any) -> CopyRequest:
    """A queue of `vhost` on blue moving into green's vhost "green-v"."""
    return CopyRequest(
        **{
            "route": "upgrade",
            "key": TransferKey("blue", vhost, queue, "green", "green-v", queue),
            "source_policy": policy,
            "destination_exists": False,
            "messages_after": 10,
            "bytes_after": 1_000,
            **overrides,
        }
    )


def plan(
    blue: ApiRows, green: ApiRows, requests: list[CopyRequest]
) -> tuple[TopologyCopy, list[str]]:
    problems: list[RmqSparkError] = []
    copy = TopologyCopy(
        {"blue": blue, "green": green},  # type: ignore[dict-item]
        version_of=lambda cluster: "4.3.6" if cluster == "green" else "3.10.8",
        problem=problems.append,
    )
    copy.plan(requests)
    return copy, [str(p) for p in problems]


def policy(name: str, definition: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "pattern": ".*", "apply-to": "queues", "priority": 0,
            "definition": definition}  # fmt: skip


def test_a_mirroring_only_policy_does_not_hide_a_same_named_policy_of_another_vhost() -> None:
    blue = ApiRows(
        policies={
            "a": [policy("limits", {"ha-mode": "all"})],
            "b": [policy("limits", {"ha-mode": "all", "max-length": 100})],
        }
    )
    green = ApiRows()

    copy, problems = plan(blue, green, [request("a", "q1", "limits"), request("b", "q2", "limits")])
    copy.declare()

    assert problems == []
    assert green.policies_put == [("limits", {"max-length": 100})]


def test_two_source_exchanges_of_one_name_with_different_types_are_a_problem() -> None:
    topic = {"name": "orders", "type": "topic", "durable": True, "arguments": {}}
    blue = ApiRows(
        bindings={
            ("a", "q1"): [{"source": "orders", "routing_key": "#", "arguments": {}}],
            ("b", "q2"): [{"source": "orders", "routing_key": "#", "arguments": {}}],
        },
        exchanges={("a", "orders"): topic, ("b", "orders"): {**topic, "type": "fanout"}},
    )

    _, problems = plan(blue, ApiRows(), [request("a", "q1", None), request("b", "q2", None)])

    assert len(problems) == 1
    assert "cluster green vhost 'green-v' exchange 'orders': two source exchanges" in problems[0]
    assert "type 'topic', expected 'fanout'" in problems[0]


def test_a_copied_length_limit_without_room_is_a_problem_naming_the_queue() -> None:
    blue = ApiRows(policies={"a": [policy("short", {"max-length": 5})]})

    _, problems = plan(blue, ApiRows(), [request("a", "q1", "short", messages_after=6)])

    assert problems == [
        "cluster green vhost 'green-v' policy 'short': max-length 5 (overflow drop-head) "
        "would apply to cluster green vhost 'green-v' queue 'q1', which will hold 6 messages "
        "after the move of route 'upgrade'; expected room for them"
    ]


def test_an_exchange_type_the_destination_lacks_is_a_problem() -> None:
    blue = ApiRows(
        bindings={("a", "q1"): [{"source": "delayed", "routing_key": "k", "arguments": {}}]},
        exchanges={("a", "delayed"): {"name": "delayed", "type": "x-delayed-message"}},
    )

    _, problems = plan(blue, ApiRows(), [request("a", "q1", None)])

    assert len(problems) == 1
    assert "type 'x-delayed-message' is not offered by the destination" in problems[0]
