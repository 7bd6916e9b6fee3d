"""`--to`: where each parked row goes, and the property bytes it goes with. Pure.

Three kinds of target:

- **A queue template**, `CLUSTER:VHOST:QUEUE`, where any part may use the row's source
  as `{cluster}`, `{vhost}` and `{queue}`: `dr:/:{queue}` puts each row into the queue
  of its name on cluster `dr`, vhost `/`; `main:{vhost}:{queue}.replayed` beside its
  source queue. A template without placeholders is one queue for every row. `{{` and
  `}}` are a literal brace (queue names may hold braces). The cluster part is before
  the first `:`, the queue part after the last one, so the vhost part may hold `:`.
- **`source`**: the template `{cluster}:{vhost}:{queue}`, each row back where it was
  parked from.
- **`origin`**: the queue the row's `x-death` names, decided as the redrive decides
  (`redrive/origin.py`: the newest entry naming a queue other than the one the row was
  parked from), on the row's source cluster and vhost. Its property block is rewritten
  by the redrive's header policy (`redrive/headers.py`; default: the broker-owned
  headers moved under `rmq-spark-death`, no TTL). A row whose `x-death` names no such
  queue is never guessed: `route_rows` refuses the replay, counting them.

The other targets publish the parked property bytes exactly as parked.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rmq_spark.config import JobConfig
from rmq_spark.errors import ConfigError
from rmq_spark.redrive.headers import HeaderPolicy, rewrite
from rmq_spark.redrive.origin import origin
from rmq_spark.selection.fields import FieldDecodeError, read_properties

SOURCE = "source"
ORIGIN = "origin"
PLACEHOLDERS = ("cluster", "vhost", "queue")
SOURCE_TEMPLATE = "{cluster}:{vhost}:{queue}"
# (cluster, vhost, queue) a row is replayed to.
Queue = tuple[str, str, str]
# A template part: literal text and placeholder names, in order (a name is ("", name)).
Piece = tuple[str, str | None]


@dataclass(frozen=True)
class Route:
    """Where one parked row goes, and the property bytes it is published with."""

    queue: Queue
    properties: bytes


def _source(row: Mapping[str, Any]) -> dict[str, str]:
    return {
        "cluster": row["source_cluster"],
        "vhost": row["source_vhost"],
        "queue": row["source_queue"],
    }


@dataclass(frozen=True)
class QueueTemplate:
    """`source`, one queue or a template: the row's queue, its bytes as parked.

    >>> t = parse_template("main:{vhost}:{queue}.replayed")
    >>> row = {"source_cluster": "dr", "source_vhost": "shop", "source_queue": "orders"}
    >>> t.destination(row)
    ('main', 'shop', 'orders.replayed')
    """

    label: str
    parts: tuple[tuple[Piece, ...], tuple[Piece, ...], tuple[Piece, ...]]

    @property
    def queue(self) -> Queue | None:
        """The one queue of a template without placeholders, else None."""
        if any(name is not None for part in self.parts for _, name in part):
            return None
        cluster, vhost, queue = ("".join(text for text, _ in part) for part in self.parts)
        return (cluster, vhost, queue)

    def destination(self, row: Mapping[str, Any]) -> Queue:
        values = _source(row)
        cluster, vhost, queue = (
            "".join(text if name is None else values[name] for text, name in part)
            for part in self.parts
        )
        return (cluster, vhost, queue)

    def route(self, row: Mapping[str, Any]) -> Route | None:
        return Route(self.destination(row), row["properties"])


@dataclass(frozen=True)
class OriginTarget:
    """`origin`: the queue the row's `x-death` names, its bytes under the header policy.

    >>> OriginTarget().route({"properties": b"\\x00\\x00", "source_queue": "dlq"}) is None
    True
    """

    policy: HeaderPolicy = field(default_factory=HeaderPolicy)
    label: str = ORIGIN
    queue: None = None

    def route(self, row: Mapping[str, Any]) -> Route | None:
        """None when no `x-death` entry names a queue other than the parked one; raises
        FieldDecodeError for a property block that does not follow the grammar."""
        death = origin(read_properties(row["properties"]), row["source_queue"])
        if death is None:
            return None
        rewritten = rewrite(row["properties"], self.policy, death.original_expiration)
        sent = row["properties"] if rewritten is None else rewritten
        return Route((row["source_cluster"], row["source_vhost"], death.queue), sent)


Target = QueueTemplate | OriginTarget


def parse_target(text: str, config: JobConfig, policy: HeaderPolicy | None = None) -> Target:
    """`source`, `origin` (with the header `policy`) or a template; a template's literal
    cluster must be in the config (a `{cluster}` one is checked per row: `route_rows`)."""
    if text == ORIGIN:
        return OriginTarget(policy or HeaderPolicy())
    target = parse_template(text)
    cluster = "".join(text for text, _ in target.parts[0])
    if all(name is None for _, name in target.parts[0]) and cluster not in config.clusters:
        known = ", ".join(sorted(config.clusters))
        raise ConfigError(f"--to {text!r}: no cluster {cluster!r} in the config (it has {known})")
    return target


def parse_template(text: str) -> QueueTemplate:
    """A `CLUSTER:VHOST:QUEUE` template (or `source`); one error naming it when malformed.

    >>> parse_template("dr:/:{queue}").queue is None
    True
    >>> parse_template("dr:a:b:orders").queue
    ('dr', 'a:b', 'orders')
    """
    if text == SOURCE:
        return QueueTemplate(SOURCE, parse_template(SOURCE_TEMPLATE).parts)
    _check_braces(text)
    cluster, _, rest = text.partition(":")
    vhost, _, queue = rest.rpartition(":")
    if not cluster or not vhost or not queue:
        raise ConfigError(
            f"--to {text!r}: expected 'source', 'origin' or CLUSTER:VHOST:QUEUE, where any "
            "part may use {cluster}, {vhost} and {queue} of the row's source, e.g. "
            "main:/:orders or dr:/:{queue}.replayed"
        )
    return QueueTemplate(text, (_pieces(cluster), _pieces(vhost), _pieces(queue)))


def _check_braces(text: str) -> None:
    """Every placeholder of the whole text is a known one, without a format or conversion."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ConfigError(
            f"--to {text!r}: malformed template ({exc}); placeholders are "
            "{cluster}, {vhost} and {queue}, and {{ and }} are a literal brace"
        ) from exc
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conversion:
            shown = "{" + name + ("!" + conversion if conversion else "")
            shown += (":" + spec if spec else "") + "}"
            raise ConfigError(
                f"--to {text!r}: unknown placeholder {shown}; the template may use "
                "{cluster}, {vhost} and {queue} (the row's source), and {{ and }} for a "
                "literal brace"
            )


def _pieces(part: str) -> tuple[Piece, ...]:
    pieces: list[Piece] = []
    for literal, name, _, _ in string.Formatter().parse(part):
        if literal:
            pieces.append((literal, None))
        if name is not None:
            pieces.append(("", name))
    return tuple(pieces)


def route_rows(
    target: Target,
    rows: Sequence[Mapping[str, Any]],
    *,
    parked_run_id: str,
    clusters: Iterable[str],
) -> list[dict[str, Any]]:
    """Each row with its destination (`_to`) and the property bytes to send (`_sent`).

    Raises ConfigError, before anything is published, when a row has no origin (`--to
    origin`: no `x-death` naming another queue, or an unreadable property block) or its
    destination's cluster is not in the config.
    """
    routed: list[dict[str, Any]] = []
    without = unreadable = 0
    for row in rows:
        try:
            route = target.route(row)
        except FieldDecodeError:
            unreadable += 1
            continue
        if route is None:
            without += 1
            continue
        routed.append({**row, "_to": route.queue, "_sent": route.properties})
    if without or unreadable:
        raise ConfigError(_unroutable(target, len(rows), without, unreadable, parked_run_id))
    known = set(clusters)
    unknown = sorted({row["_to"][0] for row in routed} - known)
    if unknown:
        raise ConfigError(
            f"--to {target.label!r}: rows of parked run {parked_run_id!r} would go to "
            f"cluster {unknown[0]!r}, which is not in the config (it has "
            f"{', '.join(sorted(known))}); nothing was published"
        )
    return routed


def _unroutable(
    target: Target, selected: int, without: int, unreadable: int, parked_run_id: str
) -> str:
    found = []
    if without:
        found.append(
            f"{without} of the {selected} selected rows of parked run {parked_run_id!r} have "
            "no x-death naming a queue other than the one they were parked from, so none "
            "says where it goes (not guessed)"
        )
    if unreadable:
        found.append(
            f"{unreadable} of the {selected} selected rows of parked run {parked_run_id!r} "
            "have a property block that does not follow the AMQP grammar (their x-death "
            "cannot be read)"
        )
    return (
        f"--to {target.label}: {'; '.join(found)}; replay them with --to source or a queue, "
        'or leave them out with --where (e.g. "last_death IS NOT NULL"); nothing was '
        "published"
    )
