"""What must be gone before a crashed run's pause is undone (`restore-federation`).

A queue's federation link pulls from its upstream while the queue has no ready
message and an active consumer. A SIGKILLed run's mover may hold every message
left in a DR queue as unacked prefetch; until the queue drops that consumer
(after its channel is gone), the queue counts as empty with a consumer, so a link
restored then pulls one prefetch of the upstream's messages into it, and the
re-run moves them back (found by `test_federation.py`'s killed run: 100 or 200 of
main's messages, one prefetch per queue).

The management API does not prove the consumer gone: `/api/consumers` drops a
consumer as its channel closes, before the queue itself has dropped it
(`rabbit_mgmt_metrics_gc` on `channel_closed`), and on 3.10 lists neither a consumer
nor its connection until their first statistics (5 s by default): a run killed
within seconds of starting to move was never listed at all. The
queue's own count does: passive `queue.declare` answers from the queue process,
which is what the link's decorator asks. So each paused queue's consumers are
counted there and compared with the consumers the API lists on open connections:
any more are consumers of connections already gone, and restoring waits for them.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import pika.exceptions

from rmq_spark.broker.connection import blocking_connection
from rmq_spark.broker.federation_plan import Policy, pattern_queue_names
from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import ClusterConfig
from rmq_spark.errors import AccessRefusedError

log = logging.getLogger(__name__)

# The connections a mover consumes on (transfer/executor.py names them).
_MOVER_CONSUMER = re.compile(r"rmq-spark \S+ consumer vhost .*", re.DOTALL)


def consuming_movers(client: ManagementClient) -> list[str]:
    """What still consumes for rmq-spark on the cluster, as the management API lists
    it: mover connections, and consumers whose connection is no longer listed."""
    listed = _listed(client)
    if listed is None:
        return []
    connections, consumers = listed
    found = {name for name in connections.values() if _MOVER_CONSUMER.fullmatch(name)}
    for consumer in consumers:
        if _connection_of(consumer) not in connections:
            vhost, queue = _queue_of(consumer)
            found.add(
                f"a consumer of queue {queue!r} in vhost {vhost!r} whose connection is closing"
            )
    return sorted(found)


def lingering_consumers(
    client: ManagementClient, cluster: ClusterConfig, overrides: Iterable[Policy]
) -> list[str]:
    """Consumers the overridden queues still count whose connection is gone: each
    queue's own consumer count (passive queue.declare) beyond the consumers the
    management API lists for it on open connections."""
    wanted: dict[str, set[str]] = {}
    for override in overrides:
        names = pattern_queue_names(override.pattern)
        if names:
            wanted.setdefault(override.vhost, set()).update(names)
    if not wanted:
        return []
    listed = _listed(client)
    if listed is None:
        return []
    connections, consumers = listed
    live = Counter(_queue_of(c) for c in consumers if _connection_of(c) in connections)
    found: list[str] = []
    for vhost, queues in sorted(wanted.items()):
        counted = consumer_counts(client.cluster_name, cluster, vhost, sorted(queues))
        for name, count in sorted(counted.items()):
            ghosts = count - live[(vhost, name)]
            if ghosts > 0:
                found.append(
                    f"queue {name!r} in vhost {vhost!r} still counts {ghosts} consumer(s) "
                    "whose connection is gone"
                )
    return found


def consumer_counts(
    cluster_name: str, cluster: ClusterConfig, vhost: str, queues: Sequence[str]
) -> dict[str, int]:
    """Each queue's consumers as the queue itself counts them (passive queue.declare);
    a queue that does not exist is left out."""
    counts: dict[str, int] = {}
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="consumer check")
    try:
        channel = connection.channel()
        for queue in queues:
            try:
                ok = channel.queue_declare(queue, passive=True).method
                counts[queue] = int(ok.consumer_count)
            except pika.exceptions.ChannelClosedByBroker:
                channel = connection.channel()  # gone (404): nothing consumes it
    finally:
        if connection.is_open:
            connection.close()
    return counts


def _listed(
    client: ManagementClient,
) -> tuple[dict[str, str], list[dict[str, object]]] | None:
    """(connection name -> client-provided name, consumers), None when not allowed."""
    try:
        connections = {
            str(row.get("name")): str(
                (row.get("client_properties") or {}).get("connection_name") or ""
            )
            for row in client.connections()
        }
        consumers = client.consumers()
    except AccessRefusedError as exc:
        # Without `monitoring` a user sees only its own connections; refused, nothing.
        log.info("cluster %s: cannot list the consumers: %s", client.cluster_name, exc)
        return None
    return connections, consumers


def _connection_of(consumer: dict[str, object]) -> object:
    details = consumer.get("channel_details")
    return details.get("connection_name") if isinstance(details, dict) else None


def _queue_of(consumer: dict[str, object]) -> tuple[str, str]:
    queue = consumer.get("queue")
    if not isinstance(queue, dict):
        return ("", "")
    return (str(queue.get("vhost")), str(queue.get("name")))
