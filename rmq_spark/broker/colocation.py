"""Co-location: connect to the node that hosts a queue, when it can be reached.

A consumer attached to the node hosting a classic queue (its home node) or a quorum
queue (its leader) reads without an extra intra-cluster hop; a publisher attached to
the destination queue's leader writes without one. The node name → AMQP address map
comes from the config (`clusters.<name>.nodes`) or, by default, from the cluster's
own listeners (management API overview). The cluster URIs stay as the fallback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rmq_spark.broker.management import ManagementClient
from rmq_spark.config import JobConfig
from rmq_spark.errors import RmqSparkError

log = logging.getLogger(__name__)

_SCHEMES = {"amqp": "amqp", "amqp/ssl": "amqps"}
_WILDCARDS = {"::", "0.0.0.0", ""}


def listener_uris(listeners: list[dict[str, Any]]) -> dict[str, str]:
    """node name -> AMQP URI, from the overview's `listeners` (TLS preferred if both).

    A listener bound to every interface says nothing about the address to use, so
    the host part of the node name stands in (rabbit@host-1 -> host-1).
    """
    uris: dict[str, str] = {}
    for listener in sorted(listeners, key=lambda item: item.get("protocol") != "amqp/ssl"):
        scheme = _SCHEMES.get(str(listener.get("protocol")))
        node = str(listener.get("node") or "")
        if scheme is None or not node or node in uris:
            continue
        host = str(listener.get("ip_address") or "")
        if host in _WILDCARDS:
            host = node.partition("@")[2]
        if ":" in host:
            host = f"[{host}]"  # IPv6 literal
        uris[node] = f"{scheme}://{host}:{listener.get('port')}"
    return uris


def node_uris(
    config: JobConfig, clients: Mapping[str, ManagementClient]
) -> dict[str, dict[str, str]]:
    """cluster -> node name -> AMQP URI; configured addresses win over discovered ones."""
    result: dict[str, dict[str, str]] = {}
    for name, cluster in config.clusters.items():
        discovered: dict[str, str] = {}
        try:
            discovered = listener_uris(clients[name].overview().get("listeners") or [])
        except RmqSparkError as exc:
            log.warning("cluster %s: node addresses not discovered (%s)", name, exc)
        result[name] = {**discovered, **cluster.nodes}
    return result


def preferred_uri(uris: Mapping[str, Mapping[str, str]], cluster: str, node: str) -> str | None:
    return uris.get(cluster, {}).get(node) if node else None
