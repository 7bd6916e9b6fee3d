"""Pre-flight's queue listings: one management API listing per vhost, asked once.

A listing of thousands of queues keeps its broker busy for seconds, one page after
another. The destinations' vhosts (usually on another cluster) can be listed ahead,
on a thread of their own, while the sources are probed over AMQP
(`preflight._Preflight.source_candidates`). A listing made ahead is taken when
pre-flight asks for it, in pre-flight's own order, and only then reports its failure:
a vhost pre-flight never asks about (one the user cannot see) reports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rmq_spark.broker.management import ManagementClient
from rmq_spark.errors import RmqSparkError

if TYPE_CHECKING:
    from rmq_spark.planning.preflight import BrokerFacts

Site = tuple[str, str]  # (cluster, vhost)
Rows = dict[str, dict[str, Any]]  # queue name -> its management API row


class QueueListings:
    """The vhosts' queue rows, into `facts.queues` (None where a listing failed)."""

    def __init__(
        self,
        clients: Mapping[str, ManagementClient],
        facts: BrokerFacts,
        problem: Callable[[RmqSparkError], None],
    ) -> None:
        self._clients = clients
        self._facts = facts
        self._problem = problem
        # Listings made ahead (`list_ahead`), not yet taken by `rows`.
        self._ahead: dict[Site, list[dict[str, Any]] | RmqSparkError] = {}

    def rows(self, cluster: str, vhost: str) -> Rows | None:
        """The vhost's queues by name, listed once however many of them move or
        arrive there; None (reported once) if the listing failed."""
        site = (cluster, vhost)
        if site not in self._facts.queues:
            try:
                listed = self._ahead.pop(site, None)
                if listed is None:
                    listed = self._clients[cluster].queues(vhost)
                elif isinstance(listed, RmqSparkError):
                    raise listed
                self._facts.queues[site] = {q["name"]: q for q in listed}
            except RmqSparkError as exc:
                self._problem(exc)
                self._facts.queues[site] = None
        return self._facts.queues[site]

    def list_ahead(self, sites: Iterable[Site]) -> None:
        """List these sites' queues now, for `rows` to take later. Safe on another
        thread while the caller's thread makes no listing and takes none."""
        for site in dict.fromkeys(sites):
            if site in self._facts.queues or site in self._ahead:
                continue
            try:
                self._ahead[site] = self._clients[site[0]].queues(site[1])
            except RmqSparkError as exc:
                self._ahead[site] = exc
