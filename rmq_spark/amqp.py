"""AMQP connection settings, and the driver's exact queue depths.

The management API's message counts are sampled (every few seconds), so anything
that proves a transfer uses AMQP passive queue.declare, whose count is exact, with
one exception: a quorum queue whose leader does not answer within 250 ms (busy, or
unavailable) is reported as "0 messages, 0 consumers" (RabbitMQ 3.10,
`rabbit_quorum_queue:stat/1`). `ready_count` asks again while a reply may be that;
`queue_is_empty` asks the queue itself, for deciding to delete one.
"""

from __future__ import annotations

import logging
import re
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from rmq_spark.config import ClusterConfig, TlsConfig
from rmq_spark.errors import AccessRefusedError, BrokerUnreachableError, DiscoveryError

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 60
# Default: a connection.blocked (memory/disk alarm) longer than this closes the connection.
BLOCKED_CONNECTION_TIMEOUT_SECONDS = 300
SOCKET_TIMEOUT_SECONDS = 10
# A quorum queue's declare-ok is "0 messages, 0 consumers" when its leader has not
# answered within this long; a zero reply that came back sooner is a count.
QUORUM_STAT_TIMEOUT_SECONDS = 0.25
# How long `ready_count` keeps asking while the replies may be such timeouts.
COUNT_DEADLINE_SECONDS = 15.0


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
    queue, see rmq_spark.colocation) first, then the cluster's URIs."""
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


@dataclass(frozen=True)
class VhostProbe:
    """What pre-flight learned from one vhost over AMQP."""

    depths: dict[str, int]  # exact ready count of each queue that answered
    refused: dict[str, str]  # queue -> the broker's reason (e.g. 404 NOT_FOUND)


def probe_vhost(
    cluster_name: str, cluster: ClusterConfig, vhost: str, queues: Iterable[str]
) -> VhostProbe:
    """Pre-flight: log in to the vhost and passive-declare each queue (exact depths).

    Raises AccessRefusedError or BrokerUnreachableError when the connection does not
    open; a queue the broker refuses is reported in `refused`, and the others still
    answer (a fresh channel replaces each one the broker closes).
    """
    depths: dict[str, int] = {}
    refused: dict[str, str] = {}
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="pre-flight")
    try:
        channel = connection.channel()
        for queue in queues:
            try:
                depths[queue] = ready_count(
                    channel, queue, f"cluster {cluster_name} vhost {vhost!r} queue {queue!r}"
                )
            except pika.exceptions.ChannelClosedByBroker as exc:
                refused[queue] = f"{exc.reply_code} {exc.reply_text}"
                channel = connection.channel()
    finally:
        if connection.is_open:
            connection.close()
    return VhostProbe(depths, refused)


def queue_depths(
    cluster_name: str, cluster: ClusterConfig, vhost: str, queues: Iterable[str]
) -> dict[str, int]:
    """Exact ready-message counts, by passive queue.declare on one connection."""
    depths: dict[str, int] = {}
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="depth check")
    try:
        channel = connection.channel()
        for queue in queues:
            where = f"cluster {cluster_name} vhost {vhost!r} queue {queue!r}"
            try:
                depths[queue] = ready_count(channel, queue, where)
            except pika.exceptions.ChannelClosedByBroker as exc:
                raise DiscoveryError(
                    f"{where}: cannot read its depth ({exc.reply_code} {exc.reply_text})"
                ) from exc
    finally:
        if connection.is_open:
            connection.close()
    return depths


def ready_count(channel: BlockingChannel, queue: str, where: str) -> int:
    """The queue's ready messages by passive queue.declare on a blocking channel.

    "0 messages, 0 consumers" that took a quorum leader's stat timeout or longer may
    be that timeout, so it is asked again, up to COUNT_DEADLINE_SECONDS; a leader
    that never answers raises DiscoveryError rather than pass for an empty queue.
    """
    deadline = time.monotonic() + COUNT_DEADLINE_SECONDS
    while True:
        asked = time.monotonic()
        ok = channel.queue_declare(queue, passive=True).method
        answered_in = time.monotonic() - asked
        if ok.message_count or ok.consumer_count or answered_in < QUORUM_STAT_TIMEOUT_SECONDS:
            return int(ok.message_count)
        if time.monotonic() > deadline:
            raise DiscoveryError(
                f"{where}: the broker did not count its messages for "
                f"{COUNT_DEADLINE_SECONDS:.0f} s (a quorum queue whose leader is busy "
                "or unavailable?); try again when the cluster is healthy"
            )
        log.debug("%s: a slow zero count (%.2f s); asking again", where, answered_in)


def queue_is_empty(cluster_name: str, cluster: ClusterConfig, vhost: str, queue: str) -> bool:
    """Whether the queue holds no ready message, by basic.get (then requeued).

    A get goes through the queue itself (a quorum queue's log) and waits for a busy
    leader, so unlike a count it never says empty when the queue is not. The
    requeued message is marked redelivered (and a quorum queue counts a delivery):
    only for rmq-spark's own helper queues, just before deleting them.
    """
    connection = blocking_connection(cluster_name, cluster, vhost, purpose="emptiness check")
    try:
        channel = connection.channel()
        method, _properties, _body = channel.basic_get(queue, auto_ack=False)
        if method is None:
            return True
        channel.basic_nack(method.delivery_tag, requeue=True)
        return False
    finally:
        if connection.is_open:
            connection.close()


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
