"""Pre-flight's AMQP probe: open each vhost and passive-declare its queues (driver side).

The management API says what exists; only AMQP says whether the run's user can log
in and open a queue, and a passive declare answers a queue's exact depth. Problems
go to pre-flight's one error (`preflight._Preflight`); what opened goes to its facts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from rmq_spark.broker.counts import VhostProbe, probe_vhost
from rmq_spark.config import JobConfig
from rmq_spark.errors import BrokerUnreachableError, RmqSparkError
from rmq_spark.planning import rules

if TYPE_CHECKING:
    from rmq_spark.planning.preflight import BrokerFacts

# At most this many vhosts are probed at once over AMQP (a connection each).
PARALLEL_PROBES = 8


def probe_vhosts(
    config: JobConfig,
    by_vhost: Mapping[tuple[str, str], Iterable[str]],
    *,
    role: str,
    facts: BrokerFacts,
    problem: Callable[[RmqSparkError], None],
) -> None:
    """Open each vhost over AMQP and passive-declare its queues (login, exact depth).

    A passive declare per queue is a round trip (10,000 queues: ~4 s one vhost
    after another), so vhosts are probed side by side, each on its own connection;
    what they found is then taken in order, as if probed one by one.
    """
    sites = [
        (site, sorted(set(names)))
        for site, names in by_vhost.items()
        if site[0] not in facts.unreachable
    ]

    def attempt(item: tuple[tuple[str, str], list[str]]) -> VhostProbe | RmqSparkError:
        (cluster, vhost), wanted = item
        try:
            return probe_vhost(cluster, config.clusters[cluster], vhost, wanted)
        except RmqSparkError as exc:
            return exc

    workers = max(1, min(PARALLEL_PROBES, len(sites)))
    with ThreadPoolExecutor(workers, thread_name_prefix="rmq-spark-probe") as pool:
        outcomes = list(pool.map(attempt, sites))
    unreachable_now: set[str] = set()
    for ((cluster, vhost), _wanted), probe in zip(sites, outcomes, strict=True):
        if cluster in unreachable_now:
            continue  # reported once per cluster, not once per vhost
        if isinstance(probe, BrokerUnreachableError):
            problem(probe)
            facts.unreachable.add(cluster)
            unreachable_now.add(cluster)
            continue
        if isinstance(probe, RmqSparkError):
            problem(probe)
            continue
        known = facts.opened.setdefault((cluster, vhost), {})
        known.update(probe.depths)
        for error in rules.refused_passive_declares(cluster, vhost, probe.refused, role=role):
            problem(error)
