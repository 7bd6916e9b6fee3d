"""AMQP connection settings, and the driver's exact queue depths.

The management API's message counts are sampled (every few seconds), so anything
that proves a transfer uses AMQP passive queue.declare, whose count is exact.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable
from urllib.parse import urlsplit

import pika
import pika.exceptions

from rmq_spark.config import ClusterConfig, TlsConfig
from rmq_spark.errors import AccessRefusedError, BrokerUnreachableError, DiscoveryError

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 60
# A connection.blocked (memory/disk alarm) longer than this closes the connection.
BLOCKED_CONNECTION_TIMEOUT_SECONDS = 300
SOCKET_TIMEOUT_SECONDS = 10


def connection_parameters(
    cluster_name: str, cluster: ClusterConfig, vhost: str, *, purpose: str
) -> list[pika.ConnectionParameters]:
    """One parameter set per configured AMQP URI, tried in order."""
    result = []
    for uri in cluster.amqp:
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
                blocked_connection_timeout=BLOCKED_CONNECTION_TIMEOUT_SECONDS,
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
    if isinstance(exc, pika.exceptions.ProbableAuthenticationError):
        return AccessRefusedError(f"{where}: the broker refused the username or password")
    if isinstance(exc, pika.exceptions.ProbableAccessDeniedError):
        return AccessRefusedError(f"{where}: the user may not access this vhost (or it is missing)")
    return BrokerUnreachableError(f"{where}: cannot connect ({type(exc).__name__}: {exc})")


def blocking_connection(
    cluster_name: str, cluster: ClusterConfig, vhost: str, *, purpose: str
) -> pika.BlockingConnection:
    """A short-lived blocking connection, for driver-side checks only."""
    last: Exception | None = None
    for params in connection_parameters(cluster_name, cluster, vhost, purpose=purpose):
        try:
            return pika.BlockingConnection(params)
        except pika.exceptions.AMQPError as exc:
            last = open_error(cluster_name, vhost, params, exc)
            log.warning("%s", last)
    assert last is not None
    raise last


def queue_depths(
    cluster_name: str, cluster: ClusterConfig, vhost: str, queues: Iterable[str]
) -> dict[str, int]:
    """Exact ready-message counts, by passive queue.declare on one connection."""
    depths: dict[str, int] = {}
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="depth check")
    try:
        channel = connection.channel()
        for queue in queues:
            try:
                ok = channel.queue_declare(queue, passive=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                raise DiscoveryError(
                    f"cluster {cluster_name} vhost {vhost!r} queue {queue!r}: "
                    f"cannot read its depth ({exc.reply_code} {exc.reply_text})"
                ) from exc
            depths[queue] = ok.method.message_count
    finally:
        if connection.is_open:
            connection.close()
    return depths


def _ssl_options(tls: TlsConfig, server_hostname: str) -> pika.SSLOptions:
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
    if tls.cert_file:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file) if tls.key_file else None)
    if not tls.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return pika.SSLOptions(context, server_hostname)
