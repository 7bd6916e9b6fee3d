"""How federation is paused for the queues being moved: override policies (pure planning).

A federated queue's link runs while the queue's effective policy carries a
federation key (`federation-upstream`, `federation-upstream-set` or, from 4.4,
`federation-upstream-pattern`): RabbitMQ's queue decorator
(`rabbit_federation_queue:policy_changed/2` → `shutdown(Q1), startup(Q2)`, with
`active_for/1` → `rabbit_federation_upstream:federate/1`) stops the link when the
queue's policy changes to one without such a key and starts it again when the
policy changes back. Only one user policy applies to a queue, the matching one of
highest priority, so a policy of higher priority, matching exactly the moved queues,
stops their links, whichever way the original selects its upstreams.

The override of policy P for some queues of its vhost:

* is named `rmq-spark-paused-<n>--<P>` (n = 1, 2...: a pattern holds at most
  `MAX_PATTERN_BYTES` bytes, RabbitMQ's limit from 4.4), a name a restore (or a
  re-run) finds again after a crash;
* matches exactly those queue names, escaped, anchored at both ends (`\\z`: `$`
  would also match before a final newline), `apply-to: queues`: exchanges P
  matches keep P, and their links;
* has P's priority + 1: P is the queue's highest-priority matching policy, so no
  other matching policy comes between;
* carries P's definition without its federation keys, so limits, dead lettering
  and the rest still apply. RabbitMQ refuses an empty definition ("no policy
  provided", `rabbit_policy:validation/3`), so a P holding only federation keys
  (`{"federation-upstream-set": "all"}`) gets `federation-upstream` naming an
  upstream that never exists (`PLACEHOLDER_UPSTREAM`): the decorator finds no
  upstream and starts no link (what deleting an upstream did before).

P itself is never changed, so a restore only deletes the overrides, and the
policies are then exactly what they were. Operator policies merge with whichever
user policy applies and cannot hold federation keys: they apply all along.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The federation keys a policy definition may hold (federation-upstream-pattern from 4.4).
FEDERATION_KEYS = frozenset(
    {"federation-upstream", "federation-upstream-set", "federation-upstream-pattern"}
)
OVERRIDE_PREFIX = "rmq-spark-paused-"
# An upstream no one defines: what an override holding nothing else federates with.
PLACEHOLDER_UPSTREAM = "rmq-spark-paused"
# RabbitMQ 4.4 refuses longer policy patterns (rabbit_re:max_pattern_length/0).
MAX_PATTERN_BYTES = 1024
_OVERRIDE_NAME = re.compile(r"rmq-spark-paused-([1-9][0-9]*)--(.+)", re.DOTALL)
_PATTERN_OPEN, _PATTERN_CLOSE = "^(?:", ")\\z"


@dataclass(frozen=True)
class Policy:
    """One user policy of a vhost, as GET /api/policies lists it."""

    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: dict[str, Any]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Policy:
        return cls(
            vhost=str(row["vhost"]),
            name=str(row["name"]),
            pattern=str(row.get("pattern") or ""),
            apply_to=str(row.get("apply-to") or "all"),
            priority=int(row.get("priority") or 0),
            definition=dict(row.get("definition") or {}),
        )

    @property
    def federates(self) -> bool:
        return bool(FEDERATION_KEYS & set(self.definition))

    @property
    def is_override(self) -> bool:
        return overridden_policy(self.name) is not None


@dataclass(frozen=True)
class Override:
    """A policy that pauses the federation of some queues: what to PUT, and why."""

    vhost: str
    name: str
    original: str  # the policy it overrides
    queues: tuple[str, ...]
    priority: int
    definition: dict[str, Any]
    dropped: tuple[str, ...]  # the original's federation keys

    @property
    def pattern(self) -> str:
        return queue_names_pattern(self.queues)

    def as_plan_entry(self) -> dict[str, Any]:
        """What the dry run shows for a queue it pauses (`rmq-spark plan --json`)."""
        return {
            "paused_by": self.name,
            "priority": self.priority,
            "definition": self.definition,
            "dropped": list(self.dropped),
            "restored": self.original,
        }

    def describe(self) -> str:
        keys = ", ".join(self.dropped)
        return (
            f"policy {self.name!r} (priority {self.priority}) overrides {self.original!r} "
            f"without {keys}"
        )


@dataclass(frozen=True)
class PausePlan:
    """The overrides to PUT, stale ones to DELETE (vhost, name), and what could not be."""

    overrides: tuple[Override, ...]
    stale: tuple[tuple[str, str], ...]
    problems: tuple[str, ...]

    def paused_queues(self) -> list[tuple[str, str]]:
        return sorted((o.vhost, q) for o in self.overrides for q in o.queues)


def override_name(policy: str, number: int) -> str:
    return f"{OVERRIDE_PREFIX}{number}--{policy}"


def overridden_policy(name: str) -> str | None:
    """The policy an override overrides; None for any other name."""
    match = _OVERRIDE_NAME.fullmatch(name)
    return match.group(2) if match else None


def listed_policy(name: str | None) -> str | None:
    """The policy a queue is under, as selectors see it: a queue paused by a crashed run
    lists the override, but stays under the policy it overrides."""
    if not name:
        return name
    return overridden_policy(name) or name


def escape(name: str) -> str:
    """A queue name as a literal inside a PCRE pattern: every ASCII character that is
    not a letter or digit is backslashed (a literal in PCRE); other bytes match as is."""
    return "".join("\\" + c if c.isascii() and not c.isalnum() else c for c in name)


def queue_names_pattern(names: Iterable[str]) -> str:
    """A pattern matching exactly these names and nothing else."""
    return _PATTERN_OPEN + "|".join(escape(n) for n in names) + _PATTERN_CLOSE


def pattern_queue_names(pattern: str) -> tuple[str, ...] | None:
    """The names an override's pattern matches (`queue_names_pattern` read back);
    None for a pattern it did not make."""
    if not (pattern.startswith(_PATTERN_OPEN) and pattern.endswith(_PATTERN_CLOSE)):
        return None
    inner = pattern[len(_PATTERN_OPEN) : -len(_PATTERN_CLOSE)]
    names: list[str] = []
    current: list[str] = []
    escaped = False
    for char in inner:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "|":
            names.append("".join(current))
            current = []
        elif char.isascii() and not char.isalnum():
            return None  # unescaped: not one of ours
        else:
            current.append(char)
    if escaped:
        return None
    names.append("".join(current))
    return tuple(names)


def _chunks(names: list[str]) -> list[tuple[str, ...]]:
    """The names in groups whose pattern fits MAX_PATTERN_BYTES (a queue name is at
    most 255 bytes, so one always fits)."""
    fixed = len((_PATTERN_OPEN + _PATTERN_CLOSE).encode())
    groups: list[tuple[str, ...]] = []
    current: list[str] = []
    size = fixed
    for name in names:
        piece = len(escape(name).encode())
        extra = piece + 1 if current else piece  # "|" between names
        if current and size + extra > MAX_PATTERN_BYTES:
            groups.append(tuple(current))
            current, size, extra = [], fixed, piece
        current.append(name)
        size += extra
    if current:
        groups.append(tuple(current))
    return groups


def pause_plan(
    queues: Mapping[tuple[str, str], str | None], policies: Iterable[Policy]
) -> PausePlan:
    """The overrides that pause the federation of these queues, and only theirs.

    `queues`: (vhost, queue) -> the policy the management API lists for it (an
    override's name when a crashed run left it paused). Queues under no policy, or
    under one without a federation key, need nothing. Overrides of the cluster that
    are not wanted any more (a crashed run paused other queues) are stale.
    """
    by_name = {(p.vhost, p.name): p for p in policies}
    wanted: dict[tuple[str, str], list[str]] = {}
    problems: list[str] = []
    for (vhost, queue), listed in sorted(queues.items(), key=lambda kv: kv[0]):
        original = listed_policy(listed)
        if original is None:
            continue
        policy = by_name.get((vhost, original))
        if policy is None:
            if listed != original:
                problems.append(
                    f"vhost {vhost!r} queue {queue!r}: paused by {listed!r}, but policy "
                    f"{original!r} is gone; run `rmq-spark restore-federation` first"
                )
            continue
        if policy.federates:
            wanted.setdefault((vhost, original), []).append(queue)
    overrides: list[Override] = []
    for (vhost, original), names in sorted(wanted.items()):
        policy = by_name[(vhost, original)]
        kept = {k: v for k, v in policy.definition.items() if k not in FEDERATION_KEYS}
        definition = kept or {"federation-upstream": PLACEHOLDER_UPSTREAM}
        dropped = tuple(sorted(FEDERATION_KEYS & set(policy.definition)))
        for number, chunk in enumerate(_chunks(sorted(names)), start=1):
            overrides.append(
                Override(
                    vhost=vhost,
                    name=override_name(original, number),
                    original=original,
                    queues=chunk,
                    priority=policy.priority + 1,
                    definition=definition,
                    dropped=dropped,
                )
            )
    put = {(o.vhost, o.name) for o in overrides}
    stale = sorted(
        (p.vhost, p.name)
        for p in by_name.values()
        if p.is_override and (p.vhost, p.name) not in put
    )
    return PausePlan(tuple(overrides), tuple(stale), tuple(problems))


def restore_plan(policies: Iterable[Policy]) -> list[Policy]:
    """The overrides to delete: every one of the cluster (nothing else was changed)."""
    return sorted((p for p in policies if p.is_override), key=lambda p: (p.vhost, p.name))
