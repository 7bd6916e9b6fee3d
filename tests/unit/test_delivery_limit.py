"""The delivery-limit arithmetic: which limit RabbitMQ applies, and when the mover stops."""

from __future__ import annotations

from typing import Any

import pika
import pytest

from rmq_spark.broker.delivery_limit import (
    budget_problem,
    source_delivery_limit,
    task_attempts,
)
from rmq_spark.transfer.amqp091 import wire
from rmq_spark.transfer.return_guard import ReturnGuard, attempt_number


def quorum(arguments: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {"type": "quorum", "arguments": arguments or {}, **fields}


@pytest.mark.parametrize(
    ("queue", "version", "limit"),
    [
        (quorum(), "3.10.8", None),  # 3.x: no default
        (quorum(), "4.0.5", 20),  # 4.0 onwards: 20
        (quorum(), "4.3.6", 20),
        (quorum({"x-delivery-limit": 3}), "3.10.8", 3),
        (quorum({"x-delivery-limit": 3}), "4.3.6", 3),
        (quorum(effective_policy_definition={"delivery-limit": 7}), "4.0.5", 7),
        # argument and policy: the lower one
        (
            quorum({"x-delivery-limit": 9}, effective_policy_definition={"delivery-limit": 4}),
            "4.0.5",
            4,
        ),
        (
            quorum({"x-delivery-limit": 2}, effective_policy_definition={"delivery-limit": 4}),
            "4.0.5",
            2,
        ),
        # a negative value on one side: the higher one (so -1 alone is unlimited)
        (
            quorum({"x-delivery-limit": -1}, effective_policy_definition={"delivery-limit": 5}),
            "4.0.5",
            5,
        ),
        (quorum({"x-delivery-limit": -1}), "4.3.6", None),
        (quorum(effective_policy_definition={"delivery-limit": -1}), "4.0.5", None),
        # 4.x sends [] for "no policy"
        (quorum(effective_policy_definition=[]), "4.0.5", 20),
        # the broker's own figure (4.2.5+) wins
        (quorum({"x-delivery-limit": 9}, delivery_limit=6), "4.3.6", 6),
        ({"type": "classic", "arguments": {"x-delivery-limit": 3}}, "4.3.6", None),
        ({"type": "stream", "arguments": {}}, "4.3.6", None),
    ],
)
def test_effective_limit_is_the_one_rabbitmq_applies(
    queue: dict[str, Any], version: str, limit: int | None
) -> None:
    assert source_delivery_limit(queue, version).limit == limit


def test_past_the_limit_names_dead_lettering_argument_first() -> None:
    assert source_delivery_limit(quorum(), "4.0.5").past_limit == "dropped"
    found = source_delivery_limit(
        quorum(
            {"x-dead-letter-exchange": "dlx"},
            effective_policy_definition={"dead-letter-exchange": "policy-dlx"},
        ),
        "4.3.6",
    )
    assert found.past_limit == "dead-lettered to exchange 'dlx'"
    assert "delivery limit 20" in found.describe()
    assert "dead-lettered to exchange 'dlx'" in found.describe()


def test_unreadable_version_has_no_default_limit() -> None:
    assert source_delivery_limit(quorum(), "unknown").limit is None


@pytest.mark.parametrize(
    ("master", "max_failures", "attempts"),
    [
        ("local[2,4]", "4", 4),
        ("local[*, 3]", None, 3),
        ("local[*]", "8", 1),  # local mode ignores spark.task.maxFailures
        ("local", None, 1),
        ("yarn", "6", 6),
        ("spark://host:7077", None, 4),
        (None, None, 4),
    ],
)
def test_task_attempts_follow_the_master(
    master: str | None, max_failures: str | None, attempts: int
) -> None:
    assert task_attempts(master, max_failures) == attempts


def test_attempt_number_of_an_executor_task() -> None:
    assert attempt_number("3.1.2") == 2
    assert attempt_number("local") == 0


def test_budget_refuses_a_limit_the_reconnects_could_exceed() -> None:
    # defaults: 5 reconnects, local[*,4]: 5 + 4 + 1 = 10 <= 20
    assert budget_problem(20, reconnect_attempts=5, task_attempts=4) is None
    assert budget_problem(None, reconnect_attempts=50, task_attempts=4) is None
    assert budget_problem(10, reconnect_attempts=5, task_attempts=4) is None
    problem = budget_problem(9, reconnect_attempts=5, task_attempts=4)
    assert problem is not None
    assert "delivery limit 9 is below 10" in problem
    assert "mover.reconnect_attempts to 4 or less" in problem
    tiny = budget_problem(3, reconnect_attempts=0, task_attempts=4)
    assert tiny is not None
    assert "fewer task attempts than 4" in tiny


def test_guard_is_inactive_without_a_limit() -> None:
    guard = ReturnGuard(None)
    assert not guard.active
    assert not guard.observe(10_000)
    assert not guard.tripped


def test_guard_trips_once_when_one_more_lost_session_could_pass_the_limit() -> None:
    guard = ReturnGuard(3)  # no later task attempts
    assert guard.stop_at == 2
    assert not guard.observe(0)
    assert not guard.observe(1)  # a loss makes it 2: it would trip then, and end at 3
    assert guard.observe(2)
    assert guard.tripped
    assert guard.highest_count == 2
    assert not guard.observe(3)  # trips only once
    assert guard.highest_count == 3


def test_guard_keeps_a_return_for_each_later_task_attempt() -> None:
    guard = ReturnGuard(20, later_attempts=3)
    assert guard.stop_at == 16
    assert not guard.observe(15)
    assert guard.observe(16)


@pytest.mark.parametrize(("limit", "attempts"), [(3, 1), (3, 2), (5, 4), (20, 4), (20, 1)])
def test_worst_case_never_passes_the_limit(limit: int, attempts: int) -> None:
    """Simulate the worst case: every session holding the message is lost, in every
    attempt, until the guard trips; then one return per session still holding it."""
    reconnects = limit - attempts - 1  # the most budget_problem accepts
    assert budget_problem(limit, reconnect_attempts=reconnects, task_attempts=attempts) is None
    count = 0
    for attempt in range(attempts):
        guard = ReturnGuard(limit, later_attempts=attempts - 1 - attempt)
        for _session in range(reconnects + 1):
            tripped = guard.observe(count)
            count += 1  # this session is lost while holding the message
            assert count <= limit
            if tripped:
                break  # no reconnect after a trip; the next attempt sees it again
    assert count <= limit


def test_delivery_count_is_read_from_the_property_bytes() -> None:
    def encoded(**properties: Any) -> bytes:
        return b"".join(pika.BasicProperties(**properties).encode())

    assert wire.delivery_count_of(encoded()) == 0
    assert wire.delivery_count_of(encoded(content_type="a", headers={"x": 1})) == 0
    assert (
        wire.delivery_count_of(
            encoded(content_type="t", content_encoding="e", headers={"x-delivery-count": 4})
        )
        == 4
    )
    # the name elsewhere than in the headers, or a value that is not a number
    assert wire.delivery_count_of(encoded(message_id="x-delivery-count")) == 0
    assert wire.delivery_count_of(encoded(headers={"x-delivery-count": "4"})) == 0
    # a truncated block is not a count
    assert wire.delivery_count_of(encoded(headers={"x-delivery-count": 4})[:-3]) == 0
