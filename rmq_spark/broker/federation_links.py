"""Waiting for the federation links of paused queues to stop (management API)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from rmq_spark.broker.management import ManagementClient
from rmq_spark.errors import AccessRefusedError, FederationError

log = logging.getLogger(__name__)

# Links stop within a second of their queue's policy change; this only bounds the
# wait when a broker is slow.
LINK_STOP_TIMEOUT_SECONDS = 30.0
_LINK_POLL_SECONDS = 0.1


def linked(
    links: Iterable[Mapping[str, object]], queues: Iterable[tuple[str, str]]
) -> list[tuple[str, str, str, str]]:
    """(vhost, queue, upstream, status) of the links of these queues still listed."""
    wanted = set(queues)
    return sorted(
        (
            str(link.get("vhost")),
            str(link.get("queue")),
            str(link.get("upstream")),
            str(link.get("status")),
        )
        for link in links
        if "queue" in link and (link.get("vhost"), link.get("queue")) in wanted
    )


def wait_for_links_to_stop(
    client: ManagementClient,
    paused: Sequence[tuple[str, str]],
    timeout: float,
    *,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    """A queue's links stop with its policy change; wait until the API lists none."""
    if not paused:
        return
    deadline = clock() + timeout
    while True:
        try:
            links = client.federation_links()
        except AccessRefusedError as exc:
            # Listing links needs the monitoring tag, changing policies policymaker;
            # RabbitMQ stops the links on the policy change, so this only loses the check.
            log.info(
                "cluster %s: not waiting for the federation links to stop: %s",
                client.cluster_name,
                exc,
            )
            return
        if links is None:
            log.info(
                "cluster %s: the federation links are not shown (no "
                "rabbitmq_federation_management plugin); not waiting for them to stop",
                client.cluster_name,
            )
            return
        left = linked(links, paused)
        if not left:
            return
        if clock() >= deadline:
            names = ", ".join(
                f"vhost {v!r} queue {q!r} upstream {u!r} ({s})" for v, q, u, s in left
            )
            raise FederationError(
                f"cluster {client.cluster_name}: federation links still up {timeout:.0f}s "
                f"after their queues' federation was paused: {names}; expected none"
            )
        sleep(_LINK_POLL_SECONDS)
