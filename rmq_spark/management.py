"""A small client for the RabbitMQ management HTTP API (driver side only).

Retries connection failures and 5xx answers with backoff (urllib3's Retry, through
requests), times out every call, and turns failures into errors that name the
cluster and what was asked. The password is held by requests' auth, never logged.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from rmq_spark.config import ClusterConfig
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
QUEUE_COLUMNS = (
    "name,vhost,type,durable,auto_delete,exclusive,arguments,policy,node,"
    "messages,messages_ready,message_bytes,message_bytes_ready,consumers"
)


class ManagementClient:
    """Management API of one cluster."""

    def __init__(self, cluster_name: str, cluster: ClusterConfig, *, timeout: float) -> None:
        self.cluster_name = cluster_name
        self._base = cluster.management
        self._timeout = timeout
        self._session = requests.Session()
        self._session.auth = (cluster.username, cluster.password.get_secret_value())
        self._session.mount("http://", HTTPAdapter(max_retries=_RETRY))
        self._session.mount("https://", HTTPAdapter(max_retries=_RETRY))
        if cluster.tls.ca_file:
            self._session.verify = str(cluster.tls.ca_file)
        elif not cluster.tls.verify:
            self._session.verify = False
        if cluster.tls.cert_file:
            self._session.cert = (
                (str(cluster.tls.cert_file), str(cluster.tls.key_file))
                if cluster.tls.key_file
                else str(cluster.tls.cert_file)
            )

    def close(self) -> None:
        self._session.close()

    # -- reads ----------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        result: dict[str, Any] = self._request("GET", "/api/overview", what="overview")
        return result

    def vhosts(self) -> list[str]:
        rows = self._request("GET", "/api/vhosts?columns=name", what="vhosts")
        return sorted(row["name"] for row in rows)

    def vhost_exists(self, vhost: str) -> bool:
        return (
            self._request(
                "GET", f"/api/vhosts/{_q(vhost)}", what=f"vhost {vhost!r}", missing_ok=True
            )
            is not None
        )

    def queues(self, vhost: str) -> list[dict[str, Any]]:
        rows = self._request(
            "GET",
            f"/api/queues/{_q(vhost)}?columns={QUEUE_COLUMNS}",
            what=f"queues of vhost {vhost!r}",
            missing_ok=True,
        )
        if rows is None:
            raise DiscoveryError(f"cluster {self.cluster_name}: vhost {vhost!r} does not exist")
        return list(rows)

    def queue(self, vhost: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self._request(
            "GET",
            f"/api/queues/{_q(vhost)}/{_q(name)}",
            what=f"queue {name!r} in vhost {vhost!r}",
            missing_ok=True,
        )
        return result

    # -- writes ---------------------------------------------------------------------

    def declare_queue(
        self, vhost: str, name: str, *, durable: bool, arguments: dict[str, Any]
    ) -> None:
        self._request(
            "PUT",
            f"/api/queues/{_q(vhost)}/{_q(name)}",
            what=f"declare queue {name!r} in vhost {vhost!r}",
            json={"durable": durable, "auto_delete": False, "arguments": arguments},
        )

    # -- plumbing -------------------------------------------------------------------

    def _request(
        self, method: str, path: str, *, what: str, missing_ok: bool = False, **kwargs: Any
    ) -> Any:
        url = self._base + path
        where = f"cluster {self.cluster_name} management API ({self._base})"
        try:
            response = self._session.request(method, url, timeout=self._timeout, **kwargs)
        except requests.RequestException as exc:
            raise BrokerUnreachableError(
                f"{where}: cannot reach it for {what} ({type(exc).__name__})"
            ) from exc
        if response.status_code == 401:
            raise AccessRefusedError(f"{where}: the username or password was refused ({what})")
        if response.status_code == 403:
            raise AccessRefusedError(f"{where}: the user is not allowed to read {what}")
        if response.status_code == 404 and missing_ok:
            return None
        if response.status_code >= 400:
            raise DiscoveryError(
                f"{where}: {what} failed with HTTP {response.status_code}: {response.text[:200]}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise DiscoveryError(f"{where}: {what} did not answer JSON") from exc


def _q(segment: str) -> str:
    """Quote a path segment; the default vhost '/' becomes %2F as the API expects."""
    return quote(segment, safe="")
