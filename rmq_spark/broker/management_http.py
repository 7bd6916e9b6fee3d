"""How the management client talks to one cluster's HTTP API: sessions, retries,
timeouts, and what a refused or failed call says (driver side only).

Retries connection failures and 5xx answers with backoff (urllib3's Retry, through
requests), times out every call, and turns failures into errors that name the
cluster, its host:port and what was asked. The password is held by requests' auth,
never logged. `management.ManagementClient` builds its reads and writes on this.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from rmq_spark.broker import http_reasons
from rmq_spark.config import ClusterConfig
from rmq_spark.errors import AccessRefusedError, BrokerUnreachableError, DiscoveryError

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
# What the management API's 401 answers mean (its "reason" field).
_LOGIN_FAILED = "Login failed"
_NOT_MANAGEMENT_USER = "Not management user"


class ManagementHttp:
    """Calls to one cluster's management API: `_request` and the errors it raises."""

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


def _q(segment: str) -> str:
    """Quote a path segment; the default vhost '/' becomes %2F as the API expects."""
    return quote(segment, safe="")
