"""A small client for the RabbitMQ management HTTP API (driver side only).

How it calls the API (retries, timeouts, the errors a failed call raises, the
password held by requests' auth, never logged) is `management_http.py`; here are the
reads and writes pre-flight, topology copy, federation and migrate use.

`whoami` is the pre-flight probe: it retries a connect failure only once, so an
unreachable cluster is reported within seconds instead of after the full backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rmq_spark.broker import paging
from rmq_spark.broker.management_http import _q, addressable
from rmq_spark.broker.management_writes import ManagementWrites
from rmq_spark.config import JobConfig
from rmq_spark.errors import DiscoveryError

__all__ = ["Identity", "ManagementClient", "Permissions", "addressable", "management_clients"]

log = logging.getLogger(__name__)

QUEUE_COLUMNS = (
    "name,vhost,type,durable,auto_delete,exclusive,arguments,policy,"
    "effective_policy_definition,node,leader,"
    "messages,messages_ready,message_bytes,message_bytes_ready,consumers"
)


@dataclass(frozen=True)
class Identity:
    """The logged-in user, as /api/whoami reports it."""

    name: str
    tags: tuple[str, ...]

    @property
    def is_administrator(self) -> bool:
        """Only administrators may read permissions through the API."""
        return "administrator" in self.tags


@dataclass(frozen=True)
class Permissions:
    """A user's permission regexes on one vhost (RabbitMQ's configure/write/read)."""

    configure: str
    write: str
    read: str


class ManagementClient(ManagementWrites):
    """Management API of one cluster: what pre-flight, topology copy, federation and
    migrate read here, and change (`management_writes.ManagementWrites`), through the
    calls of `management_http.ManagementHttp`."""

    # -- reads ----------------------------------------------------------------------

    def whoami(self) -> Identity:
        """Who the API thinks we are: reachability and login in one call."""
        row = self._request(
            "GET", "/api/whoami", what="log in (whoami)", missing_ok=True, session=self._probe
        )
        if not isinstance(row, dict):
            raise DiscoveryError(
                f"cluster {self.cluster_name} management API ({self.endpoint}): expected the "
                f"RabbitMQ management API at {self._base}, but /api/whoami is not there"
            )
        return Identity(name=str(row.get("name", "")), tags=_tags(row))

    def overview(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/api/overview", what="overview")
        return result

    def vhosts(self) -> list[str]:
        """The vhosts this user can see (all of them for an administrator)."""
        rows = self._request("GET", "/api/vhosts?columns=name", what="list vhosts")
        return sorted(row["name"] for row in rows)

    def vhost_exists(self, vhost: str) -> bool:
        """Whether the vhost exists and this user can see it (works for non-admins too)."""
        return vhost in self.vhosts()

    def queues(self, vhost: str, columns: str = QUEUE_COLUMNS) -> list[dict[str, Any]]:
        """Every queue of the vhost (only `columns`), read in pages (`paging`)."""
        what = f"list the queues of vhost {vhost!r}"

        def page(number: int) -> Any:
            answer = self._request(
                "GET",
                f"/api/queues/{_q(vhost)}?{paging.page_query(number)}&columns={columns}",
                what=what,
                missing_ok=True,
            )
            if answer is None:
                raise DiscoveryError(f"cluster {self.cluster_name} vhost {vhost!r}: does not exist")
            return answer

        return paging.read_all(page, f"cluster {self.cluster_name} vhost {vhost!r}: {what}")

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        if not addressable(name):
            return _named(self.queues(vhost), name)
        result: dict[str, Any] | None = self._request(
            "GET",
            f"/api/queues/{_q(vhost)}/{_q(name)}?columns={QUEUE_COLUMNS}",
            what=f"read queue {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )
        return result

    def permissions(self, vhost: str, user: str) -> Permissions | None:
        """The user's permissions on the vhost, None when it has none (administrators only)."""
        row = self._request(
            "GET",
            f"/api/permissions/{_q(vhost)}/{_q(user)}",
            what=f"read the permissions of user {user!r} on vhost {vhost!r}",
            missing_ok=True,
        )
        if row is None:
            return None
        return Permissions(
            configure=str(row["configure"]), write=str(row["write"]), read=str(row["read"])
        )

    def parameters(self, component: str) -> list[dict[str, Any]]:
        """A component's runtime parameters in every vhost (federation upstreams...)."""
        rows = self._request(
            "GET",
            f"/api/parameters/{_q(component)}",
            what=f"list the {component} parameters",
            missing_ok=True,
        )
        return list(rows or [])

    def policies(self) -> list[dict[str, Any]]:
        """Every policy of every vhost."""
        return list(self._request("GET", "/api/policies", what="list the policies") or [])

    def connections(self) -> list[dict[str, Any]]:
        """The cluster's client connections: name and client properties."""
        rows = self._request(
            "GET",
            "/api/connections?columns=name,client_properties",
            what="list the connections",
        )
        return list(rows or [])

    def consumers(self) -> list[dict[str, Any]]:
        """Every consumer of every vhost: its queue and its channel's connection."""
        return list(self._request("GET", "/api/consumers", what="list the consumers") or [])

    def federation_links(self) -> list[dict[str, Any]] | None:
        """Federation links of every vhost; None without rabbitmq_federation_management."""
        rows = self._request(
            "GET", "/api/federation-links", what="list the federation links", missing_ok=True
        )
        return None if rows is None else list(rows)

    def queue_bindings(self, vhost: str, name: str) -> list[dict[str, Any]]:
        """The queue's bindings from exchanges, without the default exchange's implicit one."""
        if not addressable(name):
            return [
                row
                for row in self._vhost_bindings(vhost)
                if row.get("source")
                and row.get("destination_type") == "queue"
                and row.get("destination") == name
            ]
        rows = self._request(
            "GET",
            f"/api/queues/{_q(vhost)}/{_q(name)}/bindings",
            what=f"list the bindings of queue {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )
        return [row for row in rows or [] if row.get("source")]

    def queue_details(self, vhost: str, name: str) -> dict[str, Any] | None:
        """The queue with its consumer details and message rates (None when missing).

        A queue named `.` or `..` comes from the vhost's listing: its message rates,
        no consumer details.
        """
        return self._one("queues", "queue", vhost, name)

    def exchange(self, vhost: str, name: str) -> dict[str, Any] | None:
        """The exchange's definition (type, durability, arguments), None when missing."""
        return self._one("exchanges", "exchange", vhost, name)

    def exchange_bindings_in(self, vhost: str, name: str) -> list[dict[str, Any]]:
        """Bindings whose destination is this exchange (exchange-to-exchange)."""
        if not addressable(name):
            return [
                row
                for row in self._vhost_bindings(vhost)
                if row.get("destination_type") == "exchange" and row.get("destination") == name
            ]
        rows = self._request(
            "GET",
            f"/api/exchanges/{_q(vhost)}/{_q(name)}/bindings/destination",
            what=f"list the bindings into exchange {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )
        return list(rows or [])

    def _one(self, kind: str, noun: str, vhost: str, name: str) -> dict[str, Any] | None:
        """One queue or exchange by name (None when missing). A name the API's URL paths
        cannot hold (`addressable`) is looked up in the vhost's listing instead."""
        if not addressable(name):
            rows = self._request(
                "GET",
                f"/api/{kind}/{_q(vhost)}",
                what=f"list the {kind} of vhost {vhost!r}",
                missing_ok=True,
            )
            return _named(rows or [], name)
        result: dict[str, Any] | None = self._request(
            "GET",
            f"/api/{kind}/{_q(vhost)}/{_q(name)}",
            what=f"read {noun} {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )
        return result

    def _vhost_bindings(self, vhost: str) -> list[dict[str, Any]]:
        rows = self._request(
            "GET",
            f"/api/bindings/{_q(vhost)}",
            what=f"list the bindings of vhost {vhost!r}",
            missing_ok=True,
        )
        return list(rows or [])

    def vhost_policies(self, vhost: str) -> list[dict[str, Any]]:
        """The policies of one vhost (user policies, not operator policies)."""
        rows = self._request(
            "GET",
            f"/api/policies/{_q(vhost)}",
            what=f"list the policies of vhost {vhost!r}",
            missing_ok=True,
        )
        return list(rows or [])

    def vhost_operator_policies(self, vhost: str) -> list[dict[str, Any]]:
        """The operator policies of one vhost (limits an operator enforces on users' queues)."""
        rows = self._request(
            "GET",
            f"/api/operator-policies/{_q(vhost)}",
            what=f"list the operator policies of vhost {vhost!r}",
            missing_ok=True,
        )
        return list(rows or [])

    def exchange_types(self) -> list[str]:
        """The exchange types the cluster offers (plugins add some)."""
        return sorted(str(t["name"]) for t in self.overview().get("exchange_types") or [])

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes: running, alarms, free disk and memory."""
        rows = self._request(
            "GET",
            "/api/nodes?columns=name,running,mem_used,mem_limit,mem_alarm,"
            "disk_free,disk_free_limit,disk_free_alarm",
            what="list the nodes",
        )
        return list(rows or [])


# OpenSSL's reason, as Python's ssl module words it, e.g. "self-signed certificate in
# certificate chain" or "IP address mismatch, certificate is not valid for 'localhost'."


def _tags(whoami: dict[str, Any]) -> tuple[str, ...]:
    """`tags` is a list since RabbitMQ 3.9 and a comma-separated string before."""
    tags = whoami.get("tags") or []
    if isinstance(tags, str):
        return tuple(tag.strip() for tag in tags.split(",") if tag.strip())
    return tuple(str(tag) for tag in tags)


def _named(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The row of that name in a listing; None when there is none."""
    return next((row for row in rows if row.get("name") == name), None)


@contextmanager
def management_clients(config: JobConfig) -> Iterator[dict[str, ManagementClient]]:
    """One client per configured cluster, by name; all closed on the way out."""
    clients = {
        name: ManagementClient(name, cluster, timeout=config.management_timeout_seconds)
        for name, cluster in config.clusters.items()
    }
    try:
        yield clients
    finally:
        for client in clients.values():
            client.close()
