"""Driver side: find the queues each route moves, and check the whole plan first.

Queue lists come from the management API; the depths a transfer is proven against
come from AMQP (exact, not sampled). Pre-flight runs before anything moves:

1. every cluster of the plan answers its management API and accepts the login;
2. every source vhost exists, every queue named in `source.queues` exists and can
   be consumed, and each source vhost opens over AMQP (exact depths);
3. the plan is consistent: no queue onto itself, no queue selected twice, no two
   sources into one destination, no destination that is also a source;
4. every destination vhost exists and opens over AMQP; every destination queue
   exists or may be created (its source's arguments translated for the destination's
   type and RabbitMQ version, rmq_spark.planning.topology_rules), and one that exists fits its
   source (type, priorities, durability, room under a length limit); with
   `destination.topology: copy`, the exchanges, bindings and policy each destination
   needs can be created or exist identically;
5. where the API shows them (administrators), the user's permissions allow reading
   each source queue, publishing through the default exchange, and declaring each
   destination to be created.

Every problem is collected and raised as one error, one line each, naming the
cluster, vhost and queue. Only when there is none are missing destinations created
(and, with topology: copy, their policies, exchanges and bindings).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rmq_spark.broker.counts import queue_depths
from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import JobConfig
from rmq_spark.model import QueueTransfer
from rmq_spark.planning.creation import route_named
from rmq_spark.planning.preflight import _Preflight
from rmq_spark.planning.rules import destination_type, hosting_node
from rmq_spark.planning.selections import route_selections

log = logging.getLogger(__name__)

# At most this many vhosts' depths are counted at once (a connection each).
MAX_PARALLEL_VHOSTS = 8


def discover(
    config: JobConfig, clients: Mapping[str, ManagementClient], *, dry_run: bool = False
) -> list[QueueTransfer]:
    """Every queue transfer of every route, pre-flight checked, with exact depths.

    Raises one RmqSparkError listing every problem (see the module docstring) before
    anything is created or moved. With `dry_run`, missing destinations are not created:
    their transfers come back with `destination_created` set and a destination depth of 0.
    """
    route_selections(config)  # a bad select is a config error: before any broker call
    preflight = _Preflight(config, clients)
    preflight.check_clusters()
    candidates = preflight.source_candidates()
    selected = preflight.with_delivery_limits(preflight.select(candidates))
    preflight.check_plan(selected)
    destinations = preflight.check_destinations(selected)
    preflight.check_permissions(selected, destinations)
    preflight.creation.check_topology(destinations)
    preflight.raise_problems()
    to_create = {d.candidate.transfer for d in destinations if d.create}
    nodes = {d.candidate.transfer: hosting_node(d.existing or {}) for d in destinations}
    types = {d.candidate.transfer: destination_type(d.existing, d.arguments) for d in destinations}
    if not dry_run:
        # Policies first: the broker validates them, so a refusal stops the job before
        # any queue exists. Every step skips what exists already: a re-run writes nothing.
        preflight.creation.declare_topology()
        preflight.creation.create_missing(destinations)
        preflight.creation.bind_topology()
    transfers = [
        replace(
            c.transfer,
            destination_created=c.transfer in to_create,
            destination_node=nodes.get(c.transfer, ""),
            destination_type=types.get(c.transfer, ""),
        )
        for c in selected
    ]
    # The pre-flight's passive declares, a moment ago, are the exact depths (10,000
    # queues: 20,000 round trips fewer than counting again).
    transfers = _with_probed_depths(preflight.facts.opened, transfers)
    if not dry_run:
        # Except where this run just created a destination or may have bound it like
        # its source (live publishers may route into it since): that destination is
        # measured again, after. Its source's depth is the probe's, as every other's.
        changed = [t for t in transfers if t.destination_created or _copies_topology(config, t)]
        if changed:
            again = measure_destination_depths(config, changed)
            transfers = [
                replace(t, destination_messages=again[t]) if t in again else t for t in transfers
            ]
    log.info("discovered %d queue transfers (%d selected)", len(candidates), len(transfers))
    return transfers


def discover_parked(
    config: JobConfig, clients: Mapping[str, ManagementClient]
) -> list[QueueTransfer]:
    """Every source queue of a park's routes (`table: parked`), pre-flight checked, with
    exact depths (the source vhosts' AMQP probes).

    The source half of `discover`: clusters answer and accept the login, source vhosts
    and named queues exist and open, each queue is selected once, min_messages and
    quorum delivery limits as for a move, a bad select is a config error. There is no
    destination queue to check or create: the destination is the ledger's table.
    """
    route_selections(config)
    preflight = _Preflight(config, clients)
    preflight.check_clusters()
    candidates = preflight.source_candidates()
    selected = preflight.with_delivery_limits(preflight.select(candidates))
    preflight.check_plan(selected)
    preflight.raise_problems()
    transfers = [c.transfer for c in selected]
    log.info("discovered %d queues to park (%d selected)", len(candidates), len(transfers))
    return transfers


def _copies_topology(config: JobConfig, transfer: QueueTransfer) -> bool:
    """Whether the transfer's route binds its destination like its source."""
    return route_named(config, transfer.route).queue_destination.topology == "copy"


def _with_probed_depths(
    opened: Mapping[tuple[str, str], Mapping[str, int]], transfers: list[QueueTransfer]
) -> list[QueueTransfer]:
    """Depths from the pre-flight's probes; a destination it did not find counts as 0."""
    return [
        replace(
            t,
            messages=opened[(t.source_cluster, t.source_vhost)][t.source_queue],
            destination_messages=opened.get((t.destination_cluster, t.destination_vhost), {}).get(
                t.destination_queue, 0
            ),
        )
        for t in transfers
    ]


def measure_depths(
    config: JobConfig, transfers: list[QueueTransfer]
) -> dict[QueueTransfer, tuple[int, int]]:
    """Exact (source, destination) ready counts per transfer, one connection per vhost."""
    by_vhost: dict[tuple[str, str], set[str]] = defaultdict(set)
    for t in transfers:
        by_vhost[(t.source_cluster, t.source_vhost)].add(t.source_queue)
        by_vhost[(t.destination_cluster, t.destination_vhost)].add(t.destination_queue)
    depths = _count(config, by_vhost)
    return {
        t: (
            depths[(t.source_cluster, t.source_vhost, t.source_queue)],
            depths[(t.destination_cluster, t.destination_vhost, t.destination_queue)],
        )
        for t in transfers
    }


def measure_destination_depths(
    config: JobConfig, transfers: list[QueueTransfer]
) -> dict[QueueTransfer, int]:
    """Exact ready counts of each transfer's destination, one connection per vhost."""
    by_vhost: dict[tuple[str, str], set[str]] = defaultdict(set)
    for t in transfers:
        by_vhost[(t.destination_cluster, t.destination_vhost)].add(t.destination_queue)
    depths = _count(config, by_vhost)
    return {
        t: depths[(t.destination_cluster, t.destination_vhost, t.destination_queue)]
        for t in transfers
    }


def _count(
    config: JobConfig, by_vhost: Mapping[tuple[str, str], set[str]]
) -> dict[tuple[str, str, str], int]:
    """(cluster, vhost, queue) -> exact ready count, by passive declares.

    A passive declare per queue is a round trip: vhosts are counted side by side, each
    on its own connection (made, used and closed by one thread).
    """
    depths: dict[tuple[str, str, str], int] = {}
    sites = list(by_vhost.items())
    started = time.monotonic()
    with ThreadPoolExecutor(
        max_workers=max(1, min(MAX_PARALLEL_VHOSTS, len(sites))),
        thread_name_prefix="rmq-spark-depths",
    ) as pool:
        counts = pool.map(
            lambda site: queue_depths(
                site[0][0], config.clusters[site[0][0]], site[0][1], sorted(site[1])
            ),
            sites,
        )
        for ((cluster, vhost), _names), counted in zip(sites, counts, strict=True):
            depths.update({(cluster, vhost, name): depth for name, depth in counted.items()})
    log.info(
        "counted the depths of %d queues in %d vhosts in %.1f s",
        len(depths),
        len(sites),
        time.monotonic() - started,
    )
    return depths
