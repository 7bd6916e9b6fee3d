"""AMQP connection settings, shared by the driver and the executors' movers.

Connection parameters (TLS included) per AMQP URI, the errors a failed connect
becomes, and the driver's short-lived blocking connections (counts.py uses them).
"""

from __future__ import annotations

import logging
import re
import ssl
from urllib.parse import urlsplit

import pika
import pika.exceptions

from rmq_spark.config import ClusterConfig, TlsConfig
from rmq_spark.errors import AccessRefusedError, BrokerUnreachableError

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 60
# Default: a connection.blocked (memory/disk alarm) longer than this closes the connection.
BLOCKED_CONNECTION_TIMEOUT_SECONDS = 300
SOCKET_TIMEOUT_SECONDS = 10


def connection_parameters(
    cluster_name: str,
    cluster: ClusterConfig,
    vhost: str,
    *,
    purpose: str,
    blocked_timeout: float = BLOCKED_CONNECTION_TIMEOUT_SECONDS,
    prefer: str | None = None,
) -> list[pika.ConnectionParameters]:
    """One parameter set per AMQP URI, tried in order: `prefer` (the node hosting the
    queue, see rmq_spark.broker.colocation) first, then the cluster's URIs."""
    result = []
    uris = [prefer] if prefer else []
    uris += [uri for uri in cluster.amqp if uri != prefer]
    for uri in uris:
        parts = urlsplit(uri)
        tls = parts.scheme == "amqps"
        result.append(
            pika.ConnectionParameters(
                host=parts.hostname,
                port=parts.port or (5671 if tls else 5672),
                virtual_host=vhost,
                credentials=pika.PlainCredentials(
                    parts.username or cluster.username, cluster.password.get_secret_value()
                ),
                ssl_options=_ssl_options(cluster.tls, parts.hostname or "") if tls else None,
                heartbeat=HEARTBEAT_SECONDS,
                blocked_connection_timeout=blocked_timeout,
                socket_timeout=SOCKET_TIMEOUT_SECONDS,
                connection_attempts=1,
                client_properties={"connection_name": f"rmq-spark {purpose}"},
            )
        )
    return result


def describe_endpoint(cluster_name: str, vhost: str, params: pika.ConnectionParameters) -> str:
    return f"cluster {cluster_name} ({params.host}:{params.port}) vhost {vhost!r}"


def open_error(
    cluster_name: str, vhost: str, params: pika.ConnectionParameters, exc: BaseException
) -> Exception:
    """Turn a pika connect failure into the error a user can act on."""
    where = describe_endpoint(cluster_name, vhost, params)
    user = getattr(params.credentials, "username", "?")
    if isinstance(exc, pika.exceptions.ProbableAuthenticationError):
        return AccessRefusedError(
            f"{where}: the broker refused the username or password (user {user!r})"
        )
    if isinstance(exc, pika.exceptions.ProbableAccessDeniedError):
        return AccessRefusedError(
            f"{where}: user {user!r} may not open this vhost ({_broker_reason(exc)})"
        )
    return BrokerUnreachableError(f"{where}: cannot connect ({_connect_reason(exc)})")


def amqp_username(cluster: ClusterConfig) -> str:
    """The user AMQP connections log in as: the first URI's, else the cluster's."""
    return urlsplit(cluster.amqp[0]).username or cluster.username


def blocking_connection(
    cluster_name: str, cluster: ClusterConfig, vhost: str, *, purpose: str
) -> pika.BlockingConnection:
    """A short-lived blocking connection, for driver-side checks only.

    Tries each URI in order. When none opens, raises the last URI's kind of error,
    naming every URI tried and why each failed.
    """
    failures: list[tuple[pika.ConnectionParameters, Exception]] = []
    for params in connection_parameters(cluster_name, cluster, vhost, purpose=purpose):
        if failures:
            log.warning("%s; trying the next URI", failures[-1][1])
        try:
            return pika.BlockingConnection(params)
        except pika.exceptions.AMQPError as exc:
            failures.append((params, open_error(cluster_name, vhost, params, exc)))
    last = failures[-1][1]
    if len(failures) == 1:
        raise last
    tried = "; ".join(
        f"{p.host}:{p.port} {str(e).removeprefix(describe_endpoint(cluster_name, vhost, p) + ': ')}"
        for p, e in failures
    )
    raise type(last)(f"cluster {cluster_name} vhost {vhost!r}: no AMQP URI opened it: {tried}")


_BROKER_REPLY = re.compile(r"\((?P<code>\d{3})\)\s*(?P<quote>['\"])(?P<text>.*?)(?P=quote)")


def _broker_reason(exc: BaseException) -> str:
    """'530 NOT_ALLOWED - vhost x not found' out of pika's wrapped connection close."""
    match = _BROKER_REPLY.search(str(exc))
    return f"{match['code']} {match['text']}" if match else type(exc).__name__


def _connect_reason(exc: BaseException) -> str:
    """'connection refused', 'timed out', ... out of pika's wrapped socket errors."""
    text = repr(exc)  # pika's str() of a wrapped connect error is often empty
    for known, said in (
        ("ConnectionRefusedError", "connection refused"),
        ("timeout", "timed out"),
        ("TimeoutError", "timed out"),
        ("gaierror", "host name not resolved"),
        ("SSL", "TLS handshake failed"),
        ("IncompatibleProtocolError", "no AMQP answer; is it the AMQP port?"),
    ):
        if known in text:
            return said
    return text


def _ssl_options(tls: TlsConfig, server_hostname: str) -> pika.SSLOptions:
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file) if tls.key_file else None)
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return pika.SSLOptions(context, server_hostname)
