"""park/replay/refusals: what a replay refuses before publishing, judged without a broker.

The queue rows and policies are shaped as the management API returns them
(`/api/queues/VHOST/NAME`, `/api/policies/VHOST`, `/api/operator-policies/VHOST`).
"""

from __future__ import annotations

from typing import Any

import pytest

from rmq_spark.errors import ConfigError, DestinationIncompatibleError
from rmq_spark.park.replay.refusals import (
    TargetFacts,
    check_schema_versions,
    check_targets,
    demand_of,
    queue_refusals,
)
from rmq_spark.planning.queue_room import applying_policy
from rmq_spark.transfer.parked_rows import SCHEMA_VERSION


def queue(
    name: str = "orders", kind: str = "classic", arguments: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"name": name, "type": kind, "exclusive": False, "arguments": arguments or {}}


def policy(
    pattern: str, definition: dict[str, Any], priority: int = 0, apply_to: str = "queues"
) -> dict[str, Any]:
    return {
        "pattern": pattern,
        "priority": priority,
        "apply-to": apply_to,
        "definition": definition,
    }


def test_a_run_of_another_schema_version_is_refused_naming_both() -> None:
    check_schema_versions("park-1", [SCHEMA_VERSION])
    with pytest.raises(ConfigError) as raised:
        check_schema_versions("park-1", [SCHEMA_VERSION, SCHEMA_VERSION + 1])
    assert str(raised.value) == (
        f"--parked 'park-1': its rows are of parked-table schema version {SCHEMA_VERSION + 1}, "
        f"this rmq-spark reads version {SCHEMA_VERSION}; replay it with the rmq-spark "
        "version that parked it; nothing was published"
    )
    with pytest.raises(ConfigError, match="schema version none, this rmq-spark reads"):
        check_schema_versions("park-1", [None])


def test_a_plain_classic_or_quorum_queue_takes_any_number_of_rows() -> None:
    for kind in ("classic", "quorum"):
        assert (
            queue_refusals(queue(kind=kind), TargetFacts({}), depth=5, rows=10**6, body_bytes=1)
            == []
        )


def test_a_stream_and_an_exclusive_queue_are_refused() -> None:
    [stream] = queue_refusals(queue(kind="stream"), TargetFacts({}), depth=0, rows=1, body_bytes=1)
    assert stream.startswith("is a stream, expected a classic or quorum queue")
    exclusive = {**queue(), "exclusive": True}
    assert queue_refusals(exclusive, TargetFacts({}), depth=0, rows=1, body_bytes=1) == [
        "exclusive to another connection, cannot publish reliably"
    ]


def test_a_max_length_argument_without_room_for_the_rows_is_refused() -> None:
    full = queue(arguments={"x-max-length": 10, "x-overflow": "reject-publish"})
    assert queue_refusals(full, TargetFacts({}), depth=4, rows=6, body_bytes=60) == []
    [problem] = queue_refusals(full, TargetFacts({}), depth=4, rows=7, body_bytes=70)
    assert problem == (
        "holds at most 10 messages (max-length, overflow reject-publish) and has 4; expected "
        "room for the 7 rows replayed to it (the broker would refuse the rest and the replay "
        "would stop part way)"
    )


def test_a_policy_limit_counts_and_drop_head_is_named_a_loss() -> None:
    facts = TargetFacts({}, [policy("^ord", {"max-length-bytes": 100})])
    [problem] = queue_refusals(queue(), facts, depth=0, rows=3, body_bytes=101)
    assert problem.startswith("holds at most 100 bytes (max-length-bytes, overflow drop-head)")
    assert problem.endswith("(the oldest would be dropped and lost)")
    assert queue_refusals(queue(), facts, depth=0, rows=3, body_bytes=100) == []
    # The policy does not match another name.
    assert queue_refusals(queue("refunds"), facts, depth=0, rows=3, body_bytes=101) == []


def test_the_highest_priority_policy_applies_and_an_operator_policy_lowers_the_limit() -> None:
    user = [policy(".*", {"max-length": 1}, 0), policy("^orders$", {"max-length": 50}, 5)]
    assert applying_policy("orders", "classic", user) == {"max-length": 50}
    operator = [policy(".*", {"max-length": 20})]
    assert applying_policy("orders", "classic", user, operator) == {"max-length": 20}
    # 4.x's per-type apply-to: a quorum-queues policy does not reach a classic queue.
    typed = [policy(".*", {"max-length": 1}, 9, "quorum_queues")]
    assert applying_policy("orders", "classic", typed) == {}
    assert applying_policy("orders", "quorum", typed) == {"max-length": 1}
    # The lower of argument and policy applies.
    facts = TargetFacts({}, user, operator)
    limited = queue(arguments={"x-max-length": 15})
    assert queue_refusals(limited, facts, depth=0, rows=15, body_bytes=1) == []
    [problem] = queue_refusals(limited, facts, depth=0, rows=16, body_bytes=1)
    assert problem.startswith("holds at most 15 messages")


def test_every_problem_of_every_target_is_one_error() -> None:
    rows = [
        {"_to": ("dr", "v", "a"), "body": b"12345"},
        {"_to": ("dr", "v", "a"), "body": b"123"},
        {"_to": ("dr", "v", "s"), "body": b""},
    ]
    demand = demand_of(rows)
    assert demand == {("dr", "v", "a"): (2, 8), ("dr", "v", "s"): (1, 0)}
    facts = {
        ("dr", "v"): TargetFacts(
            {"a": queue("a", arguments={"x-max-length": 1}), "s": queue("s", "stream")}
        )
    }
    with pytest.raises(DestinationIncompatibleError) as raised:
        check_targets("dr:v:{queue}", demand, {("dr", "v", "a"): 0, ("dr", "v", "s"): 0}, facts)
    lines = str(raised.value).splitlines()
    assert lines[0] == (
        "--to dr:v:{queue}: the target queues would refuse the rows, 2 problems; nothing "
        "was published:"
    )
    assert lines[1].startswith("  cluster dr vhost 'v' queue 'a': holds at most 1 messages")
    assert lines[2].startswith("  cluster dr vhost 'v' queue 's': is a stream")
    check_targets(
        "x",
        demand,
        {("dr", "v", "a"): 0, ("dr", "v", "s"): 0},
        {("dr", "v"): TargetFacts({"a": queue("a"), "s": queue("s")})},
    )
