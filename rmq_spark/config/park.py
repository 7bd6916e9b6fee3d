"""A park's part of the config: routes whose destination is the `parked` table, and
what `rmq-spark park` keeps of each message (docs/parking.md)."""

from __future__ import annotations

from typing import Any, Literal

from rmq_spark.config.strict import Strict

# A park's ledger rows name the parked table as their destination cluster (the table,
# with the source's vhost and queue), so no cluster of a park's config may be named so.
PARKED = "parked"
# How a route's destination is told apart (`destination_kind`): a queue, or the table.
QUEUE_TAG, TABLE_TAG = "queue", "table"


class ParkedDestination(Strict):
    """A park's destination: the ledger's `parked` Delta table (`rmq-spark park`,
    docs/parking.md) instead of a queue. Each message becomes a row there (its property
    bytes, body, source and position) before its source ack."""

    table: Literal["parked"]
    """The table the route parks into: `parked`, the one table of parked messages, in
    the ledger (partitioned by run)."""


def destination_kind(value: Any) -> str:
    """Which destination a route names: the table (`table:` given) or a queue."""
    if isinstance(value, dict):
        return TABLE_TAG if "table" in value else QUEUE_TAG
    return TABLE_TAG if isinstance(value, ParkedDestination) else QUEUE_TAG


def without_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An error's key path without the union's tag after `destination`, so a bad
    destination key reads `routes.0.destination.topology`, as the file spells it."""
    parts = list(loc)
    for index in range(len(parts) - 1):
        if parts[index] == "destination" and parts[index + 1] in {QUEUE_TAG, TABLE_TAG}:
            del parts[index + 1]
            break
    return tuple(parts)


class ParkConfig(Strict):
    """What `rmq-spark park` keeps of each message (routes whose destination is
    `table: parked`)."""

    exclude_body: bool = False
    """Keep only metadata and checksums, no body (to inspect a queue without copying its
    payloads); each row says so (`body_excluded`), and such a park cannot be replayed."""


def check_parks_or_moves(config: Any) -> None:
    """A config parks (every route into the table) or moves (every route into
    queues); a park's limits bound rates, not a queue's depth."""
    first = config.routes[0]
    for index, route in enumerate(config.routes):
        if route.parks != first.parks:
            raise ValueError(
                f"routes[{index}] ({route.name}): destination is "
                f"{'the parked table' if route.parks else 'a queue'}, but routes[0] "
                f"({first.name}) {'parks' if first.parks else 'moves into a queue'}; a "
                "config either parks every route (rmq-spark park) or moves every route "
                "(rmq-spark transfer)"
            )
        if route.parks and route.limits.destination_max_depth is not None:
            raise ValueError(
                f"routes[{index}] ({route.name}): limits.destination_max_depth bounds a "
                "destination queue's depth; a route parking into the table has none"
            )
    if first.parks:
        if config.limits.destination_max_depth is not None:
            raise ValueError(
                "limits.destination_max_depth bounds a destination queue's depth; a "
                "config that parks has none"
            )
        if PARKED in config.clusters:
            raise ValueError(
                f"clusters: {PARKED!r} names the parked table in a park's ledger rows "
                "(its destination cluster); rename that cluster"
            )
