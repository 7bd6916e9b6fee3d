"""A small client for the RabbitMQ management HTTP API (driver side only).

Retries connection failures and 5xx answers with backoff (urllib3's Retry, through
requests), times out every call, and turns failures into errors that name the
cluster, its host:port and what was asked. The password is held by requests' auth,
never logged.

`whoami` is the pre-flight probe: it retries a connect failure only once, so an
unreachable cluster is reported within seconds instead of after the full backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from rmq_spark.broker import http_reasons, paging
from rmq_spark.config import ClusterConfig, JobConfig
from rmq_spark.errors import AccessRefusedError, BrokerUnreachableError, DiscoveryError

log = logging.getLogger(__name__)

_RETRY = Retry(
    total=4,
    connect=4,
    read=2,
    status=3,
    backoff_factor=0.3,
    status_forcelist=(500, 502, 503, 504),
    allowed_methods=frozenset({"GET", "PUT", "DELETE"}),
    raise_on_status=False,
)
# The pre-flight probe: one retry, so a closed port or a dead host fails fast.
_PROBE_RETRY = Retry(
    total=1,
    connect=1,
    read=0,
    status=1,
    backoff_factor=0.3,
    status_forcelist=(500, 502, 503, 504),
    allowed_methods=frozenset({"GET"}),
    raise_on_status=False,
)
# Connecting is quick or not at all; only the answer may take the configured timeout.
CONNECT_TIMEOUT_SECONDS = 5.0
QUEUE_COLUMNS = (
    "name,vhost,type,durable,auto_delete,exclusive,arguments,policy,"
    "effective_policy_definition,node,leader,"
    "messages,messages_ready,message_bytes,message_bytes_ready,consumers"
)
# What the management API's 401 answers mean (its "reason" field).
_LOGIN_FAILED = "Login failed"
_NOT_MANAGEMENT_USER = "Not management user"


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


class ManagementClient:
    """Management API of one cluster."""

    def __init__(self, cluster_name: str, cluster: ClusterConfig, *, timeout: float) -> None:
        self.cluster_name = cluster_name
        self.username = cluster.username
        self._base = cluster.management
        self._timeout = (min(timeout, CONNECT_TIMEOUT_SECONDS), timeout)
        self._session = _session(cluster, _RETRY)
        self._probe = _session(cluster, _PROBE_RETRY)
        parts = urlsplit(self._base)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.endpoint = f"{parts.hostname}:{port}"

    def close(self) -> None:
        self._session.close()
        self._probe.close()

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

    # -- writes ---------------------------------------------------------------------

    def bind_queue(
        self, vhost: str, exchange: str, queue: str, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        """Bind the queue to the exchange; binding twice is a no-op in RabbitMQ."""
        self._require_addressable(vhost, exchange, queue)
        self._request(
            "POST",
            f"/api/bindings/{_q(vhost)}/e/{_q(exchange)}/q/{_q(queue)}",
            what=f"bind queue {queue!r} to exchange {exchange!r} in vhost {vhost!r}",
            json={"routing_key": routing_key, "arguments": arguments},
        )

    def unbind_queue(self, vhost: str, exchange: str, queue: str, properties_key: str) -> None:
        """Delete one binding (named by the API's properties_key); a missing one is fine."""
        self._require_addressable(vhost, exchange, queue)
        self._request(
            "DELETE",
            f"/api/bindings/{_q(vhost)}/e/{_q(exchange)}/q/{_q(queue)}/{_q(properties_key)}",
            what=f"unbind queue {queue!r} from exchange {exchange!r} in vhost {vhost!r}",
            missing_ok=True,
        )

    def delete_queue(self, vhost: str, name: str, *, if_empty: bool = True) -> None:
        """Delete a queue; refused by the broker when `if_empty` and it holds messages.

        A queue that is already gone is fine.
        """
        self._require_addressable(vhost, name)
        self._request(
            "DELETE",
            f"/api/queues/{_q(vhost)}/{_q(name)}{'?if-empty=true' if if_empty else ''}",
            what=f"delete queue {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )

    def put_parameter(self, component: str, vhost: str, name: str, value: dict[str, Any]) -> None:
        """Create or replace a runtime parameter.

        The value is never logged: it may hold a password (a federation upstream's URI).
        """
        self._request(
            "PUT",
            f"/api/parameters/{_q(component)}/{_q(vhost)}/{_q(name)}",
            what=f"define {component} {name!r} in vhost {vhost!r}",
            json={"component": component, "vhost": vhost, "name": name, "value": value},
        )

    def delete_parameter(self, component: str, vhost: str, name: str) -> None:
        """Delete a runtime parameter; one that is already gone is fine."""
        self._request(
            "DELETE",
            f"/api/parameters/{_q(component)}/{_q(vhost)}/{_q(name)}",
            what=f"delete {component} {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )

    def declare_exchange(
        self,
        vhost: str,
        name: str,
        *,
        type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any],
    ) -> None:
        self._require_addressable(vhost, name)
        self._request(
            "PUT",
            f"/api/exchanges/{_q(vhost)}/{_q(name)}",
            what=f"declare exchange {name!r} in vhost {vhost!r}",
            json={
                "type": type,
                "durable": durable,
                "auto_delete": auto_delete,
                "internal": internal,
                "arguments": arguments,
            },
        )

    def put_policy(
        self,
        vhost: str,
        name: str,
        *,
        pattern: str,
        apply_to: str,
        priority: int,
        definition: dict[str, Any],
    ) -> None:
        """Create or replace a policy; the broker validates the definition (400 if not)."""
        self._request(
            "PUT",
            f"/api/policies/{_q(vhost)}/{_q(name)}",
            what=f"define policy {name!r} in vhost {vhost!r}",
            json={
                "pattern": pattern,
                "apply-to": apply_to,
                "priority": priority,
                "definition": definition,
            },
        )

    def delete_policy(self, vhost: str, name: str) -> None:
        """Delete a policy; one that is already gone is fine."""
        self._request(
            "DELETE",
            f"/api/policies/{_q(vhost)}/{_q(name)}",
            what=f"delete policy {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )

    def declare_queue(
        self, vhost: str, name: str, *, durable: bool, arguments: dict[str, Any]
    ) -> None:
        """Declare a queue (migrate's helper queues; pre-flight declares over AMQP)."""
        self._require_addressable(vhost, name)
        self._request(
            "PUT",
            f"/api/queues/{_q(vhost)}/{_q(name)}",
            what=f"declare queue {name!r} in vhost {vhost!r}",
            json={"durable": durable, "auto_delete": False, "arguments": arguments},
        )

    # -- plumbing -------------------------------------------------------------------

    def _require_addressable(self, vhost: str, *names: str) -> None:
        """A write naming `.` or `..` in its path would reach another resource, or none."""
        for name in names:
            if not addressable(name):
                raise DiscoveryError(
                    f"cluster {self.cluster_name} vhost {vhost!r}: the management API cannot "
                    f"name {name!r} in a URL path (a dot segment, removed before the broker "
                    "sees it); expected a name other than '.' or '..' here"
                )

    def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        missing_ok: bool = False,
        session: requests.Session | None = None,
        **kwargs: Any,
    ) -> Any:
        url = self._base + path
        where = f"cluster {self.cluster_name} management API ({self.endpoint})"
        try:
            session = session or self._session
            # verify per request: requests lets REQUESTS_CA_BUNDLE (set on many
            # machines) override a session's own CA file, but not a request's.
            response = session.request(
                method, url, timeout=self._timeout, verify=session.verify, **kwargs
            )
        except requests.RequestException as exc:
            raise BrokerUnreachableError(
                f"{where}: cannot reach it to {what} ({http_reasons.reason(exc)})"
            ) from exc
        if response.status_code in (401, 403):
            raise self._refused(where, what, response)
        if response.status_code == 404 and missing_ok:
            return None
        if response.status_code >= 400:
            raise DiscoveryError(
                f"{where}: {what} failed: expected HTTP 2xx, got {response.status_code}: "
                f"{response.text[:200]}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise DiscoveryError(f"{where}: {what}: expected JSON, got something else") from exc

    def _refused(self, where: str, what: str, response: requests.Response) -> AccessRefusedError:
        """401/403: the API says why in its JSON `reason`; the fix differs per reason."""
        reason = http_reasons.json_reason(response)
        user = f"user {self.username!r}"
        if reason == _LOGIN_FAILED:
            return AccessRefusedError(f"{where}: the username or password was refused ({user})")
        if reason == _NOT_MANAGEMENT_USER:
            return AccessRefusedError(
                f"{where}: {user} may not use the management API; expected the tag "
                "'management', 'monitoring' or 'administrator'"
            )
        return AccessRefusedError(
            f"{where}: {user} may not {what} (HTTP {response.status_code}: {reason or 'refused'})"
        )


def _session(cluster: ClusterConfig, retry: Retry) -> requests.Session:
    session = requests.Session()
    session.auth = (cluster.username, cluster.password.get_secret_value())
    session.mount("http://", HTTPAdapter(max_retries=retry))
    session.mount("https://", HTTPAdapter(max_retries=retry))
    if cluster.tls.ca_file:
        session.verify = str(cluster.tls.ca_file)
    elif not cluster.tls.verify:
        session.verify = False
    if cluster.tls.cert_file:
        session.cert = (
            (str(cluster.tls.cert_file), str(cluster.tls.key_file))
            if cluster.tls.key_file
            else str(cluster.tls.cert_file)
        )
    return session


# OpenSSL's reason, as Python's ssl module words it, e.g. "self-signed certificate in
# certificate chain" or "IP address mismatch, certificate is not valid for 'localhost'."


def _tags(whoami: dict[str, Any]) -> tuple[str, ...]:
    """`tags` is a list since RabbitMQ 3.9 and a comma-separated string before."""
    tags = whoami.get("tags") or []
    if isinstance(tags, str):
        return tuple(tag.strip() for tag in tags.split(",") if tag.strip())
    return tuple(str(tag) for tag in tags)


def addressable(name: str) -> bool:
    """Whether a name can be a management API URL path segment.

    `.` and `..` are dot segments (RFC 3986): requests and the broker's HTTP server
    remove them, so `/api/queues/%2F/.` asks for the vhost's list and
    `/api/queues/%2F/..` for every vhost's; percent-encoding them (%2E) does not
    help, requests decodes it back. Such names are read from the listings instead.

    >>> addressable("orders"), addressable("."), addressable(".."), addressable("...")
    (True, False, False, True)
    """
    return name not in (".", "..")


def _named(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The row of that name in a listing; None when there is none."""
    return next((row for row in rows if row.get("name") == name), None)


def _q(segment: str) -> str:
    """Quote a path segment; the default vhost '/' becomes %2F as the API expects."""
    return quote(segment, safe="")


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
