"""Whether an existing queue will take what is about to be published to it. Pure.

Shared by a move's pre-flight (`rules.check_destination`, the destination against its
source's depth) and a replay's (`park/replay/refusals.py`, each target queue against the
rows replayed to it). What refuses messages here:

- **exclusive**: owned by another connection; publishes cannot be relied on;
- **a length limit** (`x-max-length` / `x-max-length-bytes` by argument or policy, the
  lower one applying, as RabbitMQ does) with less room than the messages: past it the
  queue's overflow acts: `reject-publish` / `reject-publish-dlx` refuse the rest (nack),
  `drop-head` (the default) drops the oldest, which is a loss.

A move reads a queue's policy from the management API's `effective_policy_definition`,
which lags behind a policy set a moment ago (`broker/policy_match.py`); a caller that has
read the vhost's policies themselves passes the one that applies (`applying_policy`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rmq_spark.broker.policy_match import policy_applies

REFUSING_OVERFLOW = ("reject-publish", "reject-publish-dlx")
DEFAULT_OVERFLOW = "drop-head"
EXCLUSIVE = "exclusive to another connection, cannot publish reliably"
# Policy keys of the length limits, and their queue arguments.
LIMITS = (("max-length", "x-max-length"), ("max-length-bytes", "x-max-length-bytes"))
# 4.x's per-type `apply-to` values: a policy of one type does not reach another's queues.
_TYPED_TARGETS = {"classic_queues": "classic", "quorum_queues": "quorum"}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _policy_of(queue: Mapping[str, Any], policy: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return queue.get("effective_policy_definition") or {} if policy is None else policy


def limit(
    queue: Mapping[str, Any],
    argument: str,
    policy_key: str,
    policy: Mapping[str, Any] | None = None,
) -> int | None:
    """A length limit from the queue's argument or its policy: the lower one applies.

    `policy` is the applying policy's definition (None: the queue row's effective one).

    >>> limit({"arguments": {"x-max-length": 9}}, "x-max-length", "max-length", {"max-length": 5})
    5
    """
    values = [
        v
        for v in (
            _int((queue.get("arguments") or {}).get(argument)),
            _int(_policy_of(queue, policy).get(policy_key)),
        )
        if v is not None
    ]
    return min(values) if values else None


def overflow(queue: Mapping[str, Any], policy: Mapping[str, Any] | None = None) -> str:
    """What the queue does past its limit: the argument's, else the policy's, else drop-head."""
    return str(
        (queue.get("arguments") or {}).get("x-overflow")
        or _policy_of(queue, policy).get("overflow")
        or DEFAULT_OVERFLOW
    )


def room_problems(
    queue: Mapping[str, Any],
    *,
    depth: int,
    messages: int,
    message_bytes: int,
    wanted_messages: str,
    wanted_bytes: str,
    refused: str,
    policy: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why the queue would not hold `messages` (`message_bytes`) more beside its `depth`.

    `wanted_messages` / `wanted_bytes` say what is coming ("the source's 40"), `refused`
    what happens when a refusing overflow refuses the rest.
    """
    found = overflow(queue, policy)
    consequence = refused if found in REFUSING_OVERFLOW else "the oldest would be dropped and lost"
    problems = []
    max_length = limit(queue, "x-max-length", "max-length", policy)
    if max_length is not None and max_length - depth < messages:
        problems.append(
            f"holds at most {max_length} messages (max-length, overflow {found}) and has "
            f"{depth}; expected room for {wanted_messages} ({consequence})"
        )
    max_bytes = limit(queue, "x-max-length-bytes", "max-length-bytes", policy)
    held = int(queue.get("message_bytes_ready") or 0)
    if max_bytes is not None and max_bytes - held < message_bytes:
        problems.append(
            f"holds at most {max_bytes} bytes (max-length-bytes, overflow {found}) and has "
            f"about {held}; expected room for {wanted_bytes} ({consequence})"
        )
    return problems


def applying_policy(
    queue: str,
    queue_type: str,
    policies: Iterable[Mapping[str, Any]],
    operator_policies: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The length keys that apply to a queue, from the vhost's policies read exactly.

    RabbitMQ applies the matching user policy of the highest priority and the matching
    operator policy of the highest priority; of their length limits the lower one wins.
    Policies tied at the top priority all count, their lower limit applying (which one
    the broker picks among them is not specified).

    >>> applying_policy("orders", "classic", [
    ...     {"pattern": "^orders$", "priority": 1, "definition": {"max-length": 5}},
    ...     {"pattern": ".*", "priority": 0, "definition": {"max-length": 1}}])
    {'max-length': 5}
    """
    definition: dict[str, Any] = {}
    for kind in (policies, operator_policies):
        matching = [
            p
            for p in kind
            if policy_applies(p, queue)
            and _TYPED_TARGETS.get(str(p.get("apply-to")), queue_type) == queue_type
        ]
        if not matching:
            continue
        top = max(int(p.get("priority") or 0) for p in matching)
        for p in matching:
            if int(p.get("priority") or 0) != top:
                continue
            found = p.get("definition") or {}
            for key, _ in LIMITS:
                value = _int(found.get(key))
                if value is not None:
                    held = _int(definition.get(key))
                    definition[key] = value if held is None else min(held, value)
            if found.get("overflow") and "overflow" not in definition:
                definition["overflow"] = found["overflow"]  # operator policies set none
    return definition
