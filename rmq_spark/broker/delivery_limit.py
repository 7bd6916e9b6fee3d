"""Quorum queues' delivery limit: how many returns a source message can take.

Pure logic, no pika and no Spark. A quorum queue counts the returns of each message
and, once a return takes the count past the queue's delivery limit, drops the
message (or dead-letters it, when a dead-letter exchange is set). What RabbitMQ does
(read in rabbit_fifo.erl and rabbit_quorum_queue.erl of each release):

- the limit is the lower of the `x-delivery-limit` argument and the `delivery-limit`
  policy key (a policy and an operator policy are merged the same way first); when
  either is negative the higher one applies, so -1 disables the limit only where the
  other side is negative or unset;
- with neither set, 3.x quorum queues have no limit and 4.0 onwards use 20;
- 3.10 counts every return (`delivery_count`); 4.0 counts every return too
  (`acquired_count`), a basic.nack/reject with requeue included; 4.3 counts only the
  returns of a consumer that went away (channel or connection closed, its node
  down: `delivery_count`), not explicit requeues and not a consumer timeout;
- on every version the count the limit applies to reaches an AMQP 0-9-1 consumer as
  the `x-delivery-count` header (4.3 also sends `x-acquired-count`, which counts
  every return and is not limited);
- a return that makes the count exceed the limit drops the message: with limit L a
  message survives L returns.

The mover returns a message only when a session ends while it holds it (it moves
whatever reaches it after its own basic.cancel instead of rejecting it), so each
session, and each Spark task attempt, can add one to a held message's count.
The driver reads each source's limit here (`source_delivery_limit`) and refuses a plan
whose limit the retries could pass (`budget_problem`); on the executors
`transfer.return_guard.ReturnGuard` stops a transfer before a lost session could take
a message past it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# RabbitMQ 4.0 gave quorum queues a default delivery limit; 3.x had none.
DEFAULT_LIMIT = 20
DEFAULT_LIMIT_FROM = (4, 0)
_LOCAL_MASTER = re.compile(r"^local(?:\[(?P<threads>[^,\]]+)(?:,\s*(?P<failures>\d+))?\])?$")


@dataclass(frozen=True)
class SourceDeliveryLimit:
    """A source queue's effective delivery limit, and what happens past it."""

    limit: int | None  # None: unlimited (classic queues, 3.x without one, a negative limit)
    origin: str  # where the limit comes from, for messages
    past_limit: str  # "dropped" or "dead-lettered to exchange 'x'"

    def describe(self) -> str:
        if self.limit is None:
            return f"no delivery limit ({self.origin})"
        return (
            f"delivery limit {self.limit} ({self.origin}; past it a message is {self.past_limit})"
        )


UNLIMITED = SourceDeliveryLimit(None, "not a quorum queue", "kept")


def source_delivery_limit(queue: Mapping[str, Any], rabbitmq_version: str) -> SourceDeliveryLimit:
    """The limit RabbitMQ applies to `queue` (a management API queue object).

    >>> source_delivery_limit({"type": "quorum", "arguments": {}}, "4.3.6").limit
    20
    >>> source_delivery_limit({"type": "quorum", "arguments": {"x-delivery-limit": 3}},
    ...                       "3.10.8").limit
    3
    """
    if str(queue.get("type") or "classic") != "quorum":
        return UNLIMITED
    arguments = queue.get("arguments") or {}
    policy = queue.get("effective_policy_definition") or {}
    if not isinstance(policy, Mapping):
        policy = {}  # 4.x sends [] for "no policy"
    past_limit = _past_limit(arguments, policy)
    argument = _integer(arguments.get("x-delivery-limit"))
    policy_value = _integer(policy.get("delivery-limit"))
    if argument is not None and policy_value is not None:
        value: int | None = (
            max(argument, policy_value)
            if argument < 0 or policy_value < 0
            else min(argument, policy_value)
        )
        origin = "the lower of the x-delivery-limit argument and the delivery-limit policy"
    elif argument is not None:
        value, origin = argument, "x-delivery-limit argument"
    elif policy_value is not None:
        value, origin = policy_value, "delivery-limit policy"
    elif version_at_least(rabbitmq_version, DEFAULT_LIMIT_FROM):
        value, origin = DEFAULT_LIMIT, f"RabbitMQ {rabbitmq_version}'s default"
    else:
        return SourceDeliveryLimit(None, f"RabbitMQ {rabbitmq_version} sets none", past_limit)
    # 4.2.5 onwards report the limit they apply; believe the broker over the sum above.
    reported = _integer(queue.get("delivery_limit"))
    if reported is not None:
        value, origin = reported, f"{origin}, as the broker reports it"
    if value is None or value < 0:
        return SourceDeliveryLimit(None, f"{origin} is {value}: unlimited", past_limit)
    return SourceDeliveryLimit(value, origin, past_limit)


def _past_limit(arguments: Mapping[str, Any], policy: Mapping[str, Any]) -> str:
    """Dead-lettering of a quorum queue: the argument has precedence over the policy."""
    exchange = arguments.get("x-dead-letter-exchange", policy.get("dead-letter-exchange"))
    if exchange is None:
        return "dropped"
    return f"dead-lettered to exchange {exchange!r}"


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def version_at_least(rabbitmq_version: str, wanted: tuple[int, int]) -> bool:
    """Whether "major.minor..." is at least `wanted`; an unreadable version is not."""
    try:
        major, minor = (int(part) for part in rabbitmq_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= wanted


def task_attempts(master: str | None, max_failures: str | int | None) -> int:
    """How many times Spark may run one task: `local[N,F]` says F (plain `local[N]`
    runs a task once, whatever spark.task.maxFailures says); other masters use
    spark.task.maxFailures (default 4).

    >>> task_attempts("local[2,4]", "4"), task_attempts("local[*]", "4")
    (4, 1)
    >>> task_attempts("yarn", None)
    4
    """
    local = _LOCAL_MASTER.match((master or "").strip())
    if local is not None:
        return int(local.group("failures") or 1)
    return max(1, int(max_failures or 4))


def budget_problem(limit: int | None, *, reconnect_attempts: int, task_attempts: int) -> str | None:
    """Why a limit is too small for the configured reconnect budget, or None.

    A fresh message held through `reconnect_attempts` lost sessions of the first task
    attempt has been returned that often; `ReturnGuard` keeps one more return per
    later task attempt and one for the session that sees it, so the first attempt
    honours its budget only when `limit >= reconnect_attempts + task_attempts + 1`.
    """
    if limit is None:
        return None
    needed = reconnect_attempts + task_attempts + 1
    if limit >= needed:
        return None
    fewer = limit - task_attempts - 1
    lower = (
        f"set mover.reconnect_attempts to {fewer} or less"
        if fewer >= 0
        else f"run with fewer task attempts than {task_attempts}"
    )
    return (
        f"its delivery limit {limit} is below {needed} = mover.reconnect_attempts "
        f"{reconnect_attempts} + {task_attempts} Spark task attempt(s) + 1, so lost sessions "
        f"could take a message past it; raise the limit (policy key delivery-limit) or {lower}"
    )
